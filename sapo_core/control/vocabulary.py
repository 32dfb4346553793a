"""The round's vocabulary, declared once: its phases, and the keys of the figures it records.

**Phases.** A round runs these in order (docs/architecture.md follows one round through them;
`Node.run_round` has one section per phase):

    sample → score → share → gather → likelihood → prepare → update → sync → eval → save

A phase's name is what `figures.PhaseTimer` times (the figure `time/<phase>`) and what
`Progress.phase` reports; `Phase.words` is how the app's status line and `sapo-node run` say it,
`Phase.band` the band of the dashboard's time-per-round plot it is counted in. `eval` runs only
every `eval.every_rounds` (and before round 1, for the base model) and has no band: `time/round`
leaves it out.

**Figures.** Every figure of a round has a namespaced key (`reward/mean`, `swarm/peers`; cleanrl
keeps its `charts/...` and `losses/...` the same way); the constants below are every key that a
module writes or reads by name, and the functions after them build the keys that carry a name (a
task, a dataset, a phase). The keys land in the run store's rows as they are: renaming one here
would hide every earlier run's history of it, so names here stay.

Standard library only: the desktop app imports this module, and must never pull in torch,
transformers, llama_cpp or hivemind (as `protocol.py`; a test asserts so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# --- the round's phases, in the order a round runs them -----------------------------------------
SAMPLE = "sample"
SCORE = "score"
SHARE = "share"
GATHER = "gather"
LIKELIHOOD = "likelihood"
PREPARE = "prepare"
UPDATE = "update"
SYNC = "sync"
EVAL = "eval"
SAVE = "save"
DOWNLOAD = "download"  # not a phase of a round: the model's download before the first (Progress.round 0)

# the dashboard's time-per-round plot stacks the phases in these bands; the small ones share one
SAMPLING_BAND = "sampling"
TRAINING_BAND = "training"
SHARING_BAND = "sharing with peers"
OTHER_BAND = "other"
TIME_BANDS = (SAMPLING_BAND, TRAINING_BAND, SHARING_BAND, OTHER_BAND)


@dataclass(frozen=True)
class Phase:
    """One phase of a round."""

    name: str  # PhaseTimer's and Progress.phase's name
    words: str  # as the app's status line and `sapo-node run` say it
    does: str  # what happens in it, in a few words
    band: str | None  # the dashboard's time band; None: not part of the round's time (eval)
    unit: str = ""  # what Progress.done and .total count, where they count something (a sampler's
    # step adds the sequences still alive, one token each)


PHASES: tuple[Phase, ...] = (
    Phase(SAMPLE, "sampling", "I questions drawn and prompted, G completions each", SAMPLING_BAND, "tokens"),
    Phase(SCORE, "scoring", "each completion scored with our own rewards", OTHER_BAND, "questions"),
    Phase(SHARE, "sharing", "our groups and receipts published in the DHT", SHARING_BAND),
    Phase(GATHER, "gathering", "J peers' groups read and verified", SHARING_BAND),
    Phase(LIKELIHOOD, "checking peers' answers", "peers' completions our policy finds unlikely dropped", SHARING_BAND),
    Phase(PREPARE, "preparing", "group-normalised advantages and the training batch", OTHER_BAND),
    Phase(UPDATE, "training", "clipped-surrogate steps on the LoRA adapter", TRAINING_BAND, "micro-batches"),
    Phase(SYNC, "syncing", "the sampler loads the new adapter", TRAINING_BAND),
    Phase(EVAL, "evaluating", "held-out solve rate against the base model", None),
    Phase(SAVE, "saving", "checkpoint and the run store's row", OTHER_BAND),
)
PHASE_NAMES = tuple(p.name for p in PHASES)
PHASE_WORDS = {p.name: p.words for p in PHASES}
PHASE_UNITS = {p.name: p.unit for p in PHASES if p.unit}
# (band, its phases), in TIME_BANDS' order: what the dashboard stacks
PHASE_BANDS: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (band, tuple(p.name for p in PHASES if p.band == band)) for band in TIME_BANDS
)

# --- the figures of a round ----------------------------------------------------------------------
# our own groups (figures.round_figures); reward/sum is per question, as the SAPO paper sums rewards
REWARD_MEAN = "reward/mean"
REWARD_SUM = "reward/sum"
REWARD_EXTERNAL_MEAN = "reward/external_mean"
ACCURACY_MEAN = "accuracy/mean"
GROUPS_LOCAL = "groups/local"
GROUPS_LOCAL_WITH_SIGNAL = "groups/local_with_signal"
GROUPS_EXTERNAL = "groups/external"
GROUPS_EXTERNAL_SHARE = "groups/external_share"
GROUPS_TRAINED = "groups/trained"
GROUPS_REFILL_SAMPLED = "groups/refill_sampled"
GROUPS_REFILL_WITH_SIGNAL = "groups/refill_with_signal"
ROUND_LOCAL_GROUPS = "round/local_groups"
ROUND_EXTERNAL_GROUPS = "round/external_groups"
ROUND_GROUP_SIZE = "round/group_size"
TOKENS_SAMPLED = "tokens/sampled"
COMPLETIONS_MEAN_TOKENS = "completions/mean_tokens"
COMPLETIONS_FINISHED_FRAC = "completions/finished_frac"
SAMPLER_TOK_PER_S = "sampler/tok_per_s"
SAMPLER_BACKEND_LLAMACPP = "sampler/backend_llamacpp"
SAMPLER_LOGPROB_DRIFT = "sampler/logprob_drift"  # the trainer's: sampler against policy log-probs
SAMPLER_SWITCHED_TO_F16 = "sampler/switched_to_f16"  # the drift switched the sampler to the F16 export
TIME_ROUND = "time/round"  # the round without its evaluation: what auto-scaling sizes
CPU_SECONDS = "cpu/seconds"  # CPU given since the previous round (the run store adds it)

# the update (trainer.py)
LOSS_POLICY = "loss/policy"
LOSS_KL = "loss/kl"
TRAIN_STEPS = "train/steps"
TRAIN_SEQUENCES = "train/sequences"
TRAIN_TOKENS = "train/tokens"
TRAIN_COMPLETION_TOKENS = "train/completion_tokens"
TRAIN_TOK_PER_S = "train/tok_per_s"
TRAIN_CLIP_LOW_FRAC = "train/clip_low_frac"
TRAIN_CLIP_HIGH_FRAC = "train/clip_high_frac"
TRAIN_RATIO_MEAN = "train/ratio_mean"
TRAIN_GRAD_NORM = "train/grad_norm"
TRAIN_PEER_TOKENS = "train/peer_tokens"
TRAIN_PEER_UNCORRECTED = "train/peer_uncorrected"
TRAIN_PEER_WEIGHT_MEAN = "train/peer_weight_mean"
TRAIN_PEER_DROPPED = "train/peer_dropped"
TRAIN_PEER_TRUNCATED_FRAC = "train/peer_truncated_frac"
TRAIN_PEER_KL_MEAN = "train/peer_kl_mean"
TRAIN_GUIDE_TOKENS = "train/guide_tokens"  # tokens of peers' right answers trained as guides (swarm.take = mixed)

# the held-out evaluation (evaluation.py): the start level's set against the base model, and
# "capability", every level's cells alike
EVAL_SOLVE_RATE = "eval/solve_rate"
EVAL_SOLVE_RATE_BASE = "eval/solve_rate_base"
EVAL_REWARD_MEAN = "eval/reward_mean"
EVAL_QUESTIONS = "eval/questions"
EVAL_SAMPLES = "eval/samples"
EVAL_GREEDY_SOLVE_RATE = "eval/greedy_solve_rate"
EVAL_GREEDY_SOLVE_RATE_BASE = "eval/greedy_solve_rate_base"
EVAL_GAIN = "eval/gain"
EVAL_GAIN_CI_LOW = "eval/gain_ci_low"
EVAL_GAIN_CI_HIGH = "eval/gain_ci_high"
EVAL_LEVEL_SOLVE_RATE = "eval/level_solve_rate"  # at each dataset's current curriculum level
EVAL_CAPABILITY = "eval/capability"
EVAL_CAPABILITY_BASE = "eval/capability_base"
EVAL_CAPABILITY_GAIN = "eval/capability_gain"
EVAL_CAPABILITY_GAIN_CI_LOW = "eval/capability_gain_ci_low"
EVAL_CAPABILITY_GAIN_CI_HIGH = "eval/capability_gain_ci_high"

# the swarm: the source's counters (swarm/source.py `stats`), its DHT's (swarm/dht.py `figures`)
# and the node's counts of swarm steps that failed
SWARM_PEERS = "swarm/peers"
SWARM_DHT_PEERS = "swarm/dht_peers"
SWARM_IGNORED_PEERS = "swarm/ignored_peers"
SWARM_PEERS_NEWER = "swarm/peers_newer"
SWARM_PUBLISHED = "swarm/published"
SWARM_RECEIVED = "swarm/received"
SWARM_ACCEPTED = "swarm/accepted"
SWARM_USED = "swarm/used"
SWARM_REJECTED = "swarm/rejected"
SWARM_RECORDS = "swarm/records"
SWARM_BYTES_IN = "swarm/bytes_in"
SWARM_BYTES_OUT = "swarm/bytes_out"
SWARM_PUBLISH_S = "swarm/publish_s"
SWARM_GATHER_S = "swarm/gather_s"
SWARM_INDEX_S = "swarm/index_s"
SWARM_FETCH_S = "swarm/fetch_s"
SWARM_VERIFY_S = "swarm/verify_s"
SWARM_REACHABLE = "swarm/reachable"  # 1 reachable, 0 not, -1 unknown
SWARM_RELAYED = "swarm/relayed"
SWARM_CLIENT_MODE = "swarm/client_mode"
SWARM_LAN_PEERS = "swarm/lan_peers"
SWARM_UNLIKELY = "swarm/unlikely"  # peers' completions the likelihood floor dropped
SWARM_JUDGED = "swarm/judged"  # peers' completions it scored: unlikely / judged is its drop rate
SWARM_UNLIKELY_GROUPS = "swarm/unlikely_groups"
SWARM_EXTERNAL_TOKENS_CAPPED = "swarm/external_tokens_capped"
SWARM_PUBLISH_RAISED = "swarm/publish_raised"  # (swarm/publish_failed is the DHT's failed stores)
SWARM_GATHER_FAILED = "swarm/gather_failed"
SWARM_STATS_FAILED = "swarm/stats_failed"
SWARM_REJECT_FAILED = "swarm/reject_failed"
# swarm.take = mixed (adopt.py): peers' questions adopted, answered by us or guided by the peer's answer
SWARM_ADOPT_OFFERED = "swarm/adopt_offered"
SWARM_ADOPT_ON_POLICY = "swarm/adopt_on_policy"
SWARM_ADOPT_GUIDED = "swarm/adopt_guided"
SWARM_ADOPT_SOLVED = "swarm/adopt_solved"

# namespaces whose keys carry a name (built by the functions below)
REWARD_PREFIX = "reward/"
ACCURACY_PREFIX = "accuracy/"
CURRICULUM_PREFIX = "curriculum/"
TIME_PREFIX = "time/"
EVAL_PREFIX = "eval/"
SWARM_PREFIX = "swarm/"
SWARM_REJECTED_PREFIX = "swarm/rejected/"
SWARM_DHT_REJECTED_PREFIX = "swarm/dht_rejected/"


def reward_of(task: str) -> str:
    """`reward/<task>`: the mean reward of our groups of one dataset."""
    return f"{REWARD_PREFIX}{task}"


def accuracy_of(task: str) -> str:
    """`accuracy/<task>`: the share of our completions of one dataset fully right."""
    return f"{ACCURACY_PREFIX}{task}"


def curriculum_level_of(task: str) -> str:
    """`curriculum/<task>_level`: a dataset's curriculum level in this round."""
    return f"{CURRICULUM_PREFIX}{task}_level"


def time_of(phase: str) -> str:
    """`time/<phase>`: wall seconds of one phase in this round."""
    return f"{TIME_PREFIX}{phase}"


def per_dataset(key: str, dataset: str, level: str | None = None) -> str:
    """An `eval/...` figure of one dataset, or of one of its levels: (`eval/gain`, `basic_arithmetic`)
    -> `eval/basic_arithmetic/gain`; (`eval/solve_rate`, d, `level_2`) -> `eval/d/level_2/solve_rate`."""
    assert key.startswith(EVAL_PREFIX), key
    scope = dataset if level is None else f"{dataset}/{level}"
    return f"{EVAL_PREFIX}{scope}/{key[len(EVAL_PREFIX) :]}"


def swarm_of(counter: str) -> str:
    """`swarm/<counter>`: one of the swarm source's counters."""
    return f"{SWARM_PREFIX}{counter}"


def swarm_rejected(reason: str) -> str:
    """`swarm/rejected/<reason>`: peers' groups or records we refused, by reason."""
    return f"{SWARM_REJECTED_PREFIX}{reason}"


def swarm_dht_rejected(reason: str) -> str:
    """`swarm/dht_rejected/<reason>`: stores our DHT node refused in this round, by reason."""
    return f"{SWARM_DHT_REJECTED_PREFIX}{reason}"


# every constant key above (not the prefixes)
KEYS = frozenset(
    v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str) and "/" in v and not v.endswith("/")
)
# the keys that carry a name; swarm/<counter>: the swarm source keeps counters of its own
_NAME = r"[A-Za-z0-9_.-]+"
KEY_PATTERNS = tuple(
    re.compile(p)
    for p in (
        rf"reward/{_NAME}",
        rf"accuracy/{_NAME}",
        rf"curriculum/{_NAME}_level",
        rf"time/({'|'.join(PHASE_NAMES)})",
        rf"eval/{_NAME}/(solve_rate|level_solve_rate|gain|gain_ci_low|gain_ci_high)",
        rf"eval/{_NAME}/{_NAME}/solve_rate",
        rf"swarm/(rejected|dht_rejected)/{_NAME}",
        rf"swarm/{_NAME}",
    )
)


def is_known(key: str) -> bool:
    """Whether `key` is a figure of this vocabulary (a constant, or one of the named patterns)."""
    return key in KEYS or any(p.fullmatch(key) for p in KEY_PATTERNS)


__all__ = [name for name in dir() if name.isupper() and not name.startswith("_")] + [
    "Phase",
    "reward_of",
    "accuracy_of",
    "curriculum_level_of",
    "time_of",
    "per_dataset",
    "swarm_of",
    "swarm_rejected",
    "swarm_dht_rejected",
    "is_known",
]
