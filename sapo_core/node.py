"""The SAPO round, top to bottom: sample -> score -> share -> gather -> advantages -> update -> record.

`Node.run_round()` is SAPO's Algorithm 1 for one node and one round (docs/architecture.md maps
each step to its module). Where we depart from the SAPO paper (arXiv 2509.08721) or GRPO:
- Rounds are not clocked by anyone: each node runs at its own pace and the swarm layer
  publishes into and gathers from DHT time windows (rl-swarm uses a smart contract).
- External groups are verified, not believed: the swarm layer regenerates every question
  from its id and re-scores every completion with our own rewards (paper §3: "scores
  everything with its own reward function"; rl-swarm trusts the sender's answer).
- Local groups with zero reward variance are kept for the figures but not trained on
  (their advantage is exactly 0; with no KL term they change no weight). The paper drops
  them only from the external pool.
- K optimizer steps per round (config train.steps_per_round, default 2) so the asymmetric
  clip can act; old log-probs come from the first step's own forward (see trainer.py).
- I, J and G shrink, never below I=1, J=1, G=4, when a round takes much longer than
  round.target_round_seconds on this machine (roundshape.py), and grow back when it is fast.
- Completions that stopped by themselves are trained with their stop token, so the policy
  learns when to stop; a peer's completion gets it only when the peer says it finished and
  we did not cut it to our max_new_tokens (record v2). Peers' completions are scored on
  exactly the text that is trained (cut to our limit, verify.py).
- Peers' completions our current policy finds implausible are dropped as `unlikely` before
  advantages (swarm/likelihood.py): a right answer with an injected link or a garbage preamble
  is not text to imitate (docs/swarm.md, 'Hostile peers'). Each peer group is trained at most once, and at most
  swarm.max_external_tokens tokens of them per update.
- A held-out evaluation (`evaluation.py`) runs before round 1, every eval.every_rounds rounds
  (within eval.max_share of the node's time) and after the last round of a run of set length;
  training never draws its questions. The reward is correctness (1 right, 0 wrong) unless
  tasks.partial_credit.
- The default task mix and difficulty are easy ones a 135M model can sometimes solve (it
  scores about 0 on the paper's full mix: docs/environment.md, 'The embedded model'), with a curriculum
  that raises them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import sqlite3
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

from sapo_core import paths
from sapo_core.adopt import adopt, right_completions
from sapo_core.batch import BatchRules, external_token_ids, training_batch
from sapo_core.checkpoint import Checkpoints, CheckpointState
from sapo_core.config import NodeConfig, dump_config
from sapo_core.control.threads import starting_threads
from sapo_core.cpu import trim_heap, tune_heap
from sapo_core.evaluation import EvalSettings, HeldOut, eval_within_share, held_out_line
from sapo_core.evaluator import Evaluator
from sapo_core.figures import PhaseTimer, round_figures
from sapo_core.fsutil import atomic_write_bytes, write_trouble
from sapo_core.hardware import training_device
from sapo_core.hooks import Interrupted, NullHooks, RoundHooks
from sapo_core.modelfiles import file_stamp, fingerprint, resolve_model
from sapo_core.policy import Policy, load_policy
from sapo_core.rollouts import Completion, Group
from sapo_core.roundshape import RoundShape
from sapo_core.sampler import SamplerError, SamplingParams
from sapo_core.sampler.resilient import ResilientSampler
from sapo_core.store import STORE_NAME, RunStore, StoreError
from sapo_core.swarm.likelihood import filter_unlikely
from sapo_core.tasks import TaskSet
from sapo_core.trainer import Trainer, TrainSequence

log = logging.getLogger(__name__)


class BaseFile(NamedTuple):
    """The model file a run trains on, as the node found it at its start."""

    path: Path
    stamp: tuple[int, int]  # size, modification time (modelfiles.file_stamp)
    sha256: str


ADOPT_PART = 1000  # the sampling seeds' part for peers' adopted questions (refills use 1, 2, ...)


class Refill(NamedTuple):
    """Our groups with reward spread after dynamic sampling, their prompts, and its figures."""

    groups: list[Group]  # ours with spread, the first draw's then the refills'
    prompts: list[list[int]]
    extra: list[Group]  # the refills' groups with spread
    figures: dict[str, float]


class NodeError(RuntimeError):
    """The node cannot run; the message says what to change."""


def mixed_seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest(), "little")


class Node:
    def __init__(self, cfg: NodeConfig, hooks: RoundHooks | None = None, source=None, sampler_factory=None) -> None:
        """`source`: a RolloutSource to use instead of opening the configured swarm;
        `sampler_factory(node) -> Sampler`: a sampler to use instead of the configured one."""
        self.cfg = cfg
        self.hooks = hooks or NullHooks()
        self.run_dir = Path(cfg.run_dir).expanduser() if cfg.run_dir else paths.default_run_dir()
        self.policy: Policy | None = None
        self.next_round = 1
        self.shape = RoundShape(cfg.round.local_groups, cfg.round.external_groups, cfg.sampler.group_size)
        self._source = source
        self._sampler: ResilientSampler | None = None
        self._sampler_factory = sampler_factory
        self._receipts: list[tuple[str, int, int]] = []  # peers' groups trained last round: named in our next record
        self._evaluator = None
        self._identity = "alone"
        self.threads = 0  # the compute threads in use (set in setup)
        self._base: BaseFile | None = None  # the model file trained on (None: tiny-random)
        self._base_changed_said = False

    # --- start-up -----------------------------------------------------------------------
    def setup(self) -> None:
        cfg, hooks = self.cfg, self.hooks
        tune_heap()  # before the model loads: large tensors get pages of their own
        self.run_dir.mkdir(parents=True, exist_ok=True)
        trouble = write_trouble(self.run_dir)
        if trouble:  # said before any work, not after the first round's
            raise NodeError(f"the run directory {self.run_dir} cannot take the node's progress: {trouble}")
        self.store = self._open_store()
        self.checkpoints = Checkpoints(self.run_dir)
        self.threads = threads = self.choose_threads()
        torch.set_num_threads(threads)
        plan = resolve_model(cfg, hooks)
        log.info(f"model: {plan.why}")
        if plan.micro_batch_size < cfg.train.micro_batch_size:
            log.info(f"micro-batch {cfg.train.micro_batch_size} -> {plan.micro_batch_size} to fit memory")
            self.cfg = cfg = cfg.replace(**{"train.micro_batch_size": plan.micro_batch_size})
        hf_cache, gguf, tokenizer_gguf = paths.cache_dir() / "hf", plan.gguf, plan.tokenizer_gguf
        self._base = None if gguf is None else BaseFile(gguf, file_stamp(gguf), fingerprint(gguf, paths.cache_dir()))
        self.policy = load_policy(cfg.model, gguf, hf_cache, cfg.seed, tokenizer_gguf, plan.model_id)
        device = training_device(cfg.train.device)
        if device.value != "cpu":
            self.policy.model.to(device.value)
        log.info(f"update on {device.value}: {device.reason}")
        self.trainer = Trainer(self.policy, cfg.train, temperature=cfg.sampler.temperature)
        log.info(f"update: {self.trainer.precision.why}")
        if self._source is None:
            self._source = self._open_source()
        self._identity = identity = getattr(self._source, "node_id", "alone") if self._source else "alone"
        # nodes of one swarm must not all draw the same questions: the seed mixes in the identity;
        # training skips the held-out evaluation's questions, also with evaluation off: what we
        # train on we share, and peers evaluate on the same set
        self.tasks = TaskSet(cfg.tasks, seed=mixed_seed(cfg.seed, identity), held_out=HeldOut(cfg.eval.questions))
        self._resume()
        self._write_config_snapshot()
        if self._source is not None and hasattr(self._source, "describe"):
            self._source.describe(model=plan.model_id)
            rounds, _ = self.store.series("eval/solve_rate")
            if rounds:  # what we last measured, said again after a restart
                row = self.store.rounds(since=rounds[-1] - 1, limit=1)
                self._describe_self(rounds[-1], row[0].metrics if row else {})
        given = self._sampler_factory(self) if self._sampler_factory is not None else None
        self._sampler = ResilientSampler(cfg.sampler, self.policy, paths.cache_dir(), given, "given by the caller")
        self._sampler.set_threads(threads)
        self._sampler.sync_policy(self.policy)
        trim_heap()  # what converting and exporting the model freed
        log.info(f"sampler: {self._sampler.reason}")
        self._evaluator = None
        if cfg.eval.enabled:
            settings = EvalSettings.for_config(cfg)
            self._evaluator = Evaluator(
                self.tasks,
                settings,
                cfg.eval.questions,
                paths.cache_dir(),
                min(cfg.eval.level_questions, cfg.eval.questions),
            )

    def _open_source(self):
        if not self.cfg.swarm.enabled or self.cfg.round.external_groups == 0:
            return None
        from sapo_core.swarm.source import open_swarm

        verifying, cutter = self.tasks_for_verification(), self.completion_cutter()
        return open_swarm(self.cfg.swarm, verifying, paths.identity_dir(), self.hooks, cutter=cutter)

    def completion_cutter(self):
        """Our tokenizer and max_new_tokens, for scoring peers' text exactly as it is trained."""
        from sapo_core.swarm.verify import CompletionCutter

        return CompletionCutter.for_tokenizer(self.policy.tokenizer, self.cfg.sampler.max_new_tokens)

    def tasks_for_verification(self) -> TaskSet:
        # the verifier regenerates peers' questions: its own seed is irrelevant there
        return TaskSet(self.cfg.tasks, seed=self.cfg.seed)

    def _resume(self) -> None:
        if not self.checkpoints.exists():
            return
        state, trainable, optimizer = self.checkpoints.load()
        if state.model_id != self.policy.model_id or state.lora_rank != self.policy.lora_rank:
            raise NodeError(
                f"{self.run_dir} holds a run of {state.model_id} (LoRA rank {state.lora_rank}); this config "
                f"trains {self.policy.model_id} (rank {self.policy.lora_rank}). Use another --run-dir."
            )
        was = state.extra.get("base_sha256")
        if was and self._base is not None and was != self._base.sha256:
            raise NodeError(
                f"the model file {self._base.path} changed since this run's last checkpoint (SHA-256 {was[:12]}… "
                f"then, {self._base.sha256[:12]}… now): what was trained belongs to the file before. Put that "
                f"file back to go on, or start a new run (another --run-dir; the app: Settings, Setup again)."
            )
        self.policy.load_trainable_state_dict(trainable)
        self.trainer.load_state_dict(optimizer)
        self.policy.version = state.policy_version
        self.next_round = state.round + 1
        shape = state.extra.get("shape")
        if shape:
            self.shape = RoundShape(**shape)
        if "tasks" in state.extra:
            self.tasks.load_state_dict(state.extra["tasks"])
        self._receipts = [tuple(x) for x in state.extra.get("receipts", [])]
        if not self.store.has_round(state.round) and "metrics" in state.extra:
            # the crash fell between the checkpoint and the store row: restore the row
            self.store.record_round(state.round, state.extra["metrics"], state.extra.get("started", time.time()))
        log.info(f"resumed after round {state.round}")

    def _write_config_snapshot(self) -> None:
        atomic_write_bytes(self.run_dir / "config.toml", dump_config(self.cfg).encode())
        self.store.set_meta("model_id", self.policy.model_id)

    # --- the round ----------------------------------------------------------------------
    def run_round(self, final: bool = False) -> dict[str, float]:
        """One round; `final`: the run stops after it (a set number of rounds), so the held-out
        evaluation runs at its end whatever eval.every_rounds says."""
        assert self.policy is not None, "call setup() first"
        cfg, hooks, policy, shape = self.cfg, self.hooks, self.policy, self.shape
        r = self.next_round
        started = time.time()
        timer = PhaseTimer()
        rng = random.Random(mixed_seed(cfg.seed, "round", r))
        evaluated: dict[str, float] = {}
        if r == 1 and self._evaluator is not None:  # round 0: the base model, before any update
            with timer("eval"):
                evaluated = self.evaluate()
                self._describe_self(0, evaluated)

        # 1. sample: I questions of our own, G completions each; 2. score with our own rewards
        local, prompts, samples = self._sample_and_score(r, self.tasks.sample_questions(r, shape.local), timer)
        refill = self._refill(r, local, prompts, timer) if cfg.round.refill_passes else None
        shared = local if refill is None else local + refill.extra  # what we publish: refills with spread too

        # 3. share our groups with the swarm, 4. gather J verified groups from peers
        # (neither may stop the round: a failure is counted, logged and costs this round's sharing)
        external: list[Group] = []
        swarm_failures: dict[str, float] = {}
        if self._source is not None:
            with timer("share"):
                hooks.progress("share", 0, 1)
                self._swarm_step("publish", swarm_failures, self._source.publish, r, shared, self._receipts)
            with timer("gather"):
                hooks.progress("gather", 0, 1)
                external = self._swarm_step("gather", swarm_failures, self._source.gather, r, shape.external, rng) or []
            with timer("likelihood"):  # a forward pass over peers' completions: work, not waiting
                hooks.progress("likelihood", 0, 1)
                external = self._keep_likely(external, swarm_failures)
        adopted = None
        if external and cfg.swarm.take == "mixed":  # their questions, our answers, their right one where we fail
            adopted = adopt(external, shape.external, lambda qs: self._sample_and_score(r, qs, timer, ADOPT_PART)[:2])
            swarm_failures.update(adopted.figures(len(external)))
            external = []

        # 5. advantages, group by group (the receipts name the peers' groups that train)
        with timer("prepare"):
            trained_local, trained_prompts = (local, prompts) if refill is None else (refill.groups, refill.prompts)
            mixed = []
            if adopted is not None:
                trained_local, trained_prompts = trained_local + adopted.own, trained_prompts + adopted.prompts
                mixed = adopted.mixed
            batch = training_batch(
                policy, self._prompt, trained_local, trained_prompts, external, BatchRules.for_config(cfg), mixed
            )
            if batch.capped:
                swarm_failures["swarm/external_tokens_capped"] = float(batch.capped)

        # 6. update the policy, then let the sampler follow it
        with timer("update"):
            figures = self.trainer.update(batch.sequences, hooks) if batch.sequences else {"train/steps": 0.0}
        with timer("sync"):
            if batch.sequences:
                if self._sampler.check_drift(figures.get("sampler/logprob_drift")):
                    # the sampler's own state, not the run's config (config.toml stays what it ran with)
                    figures["sampler/switched_to_f16"] = 1.0
                    self.store.set_meta("sampler_switched", f"f16 export after round {r} (log-prob drift)")
                self._sampler.sync_policy(policy)

        # 7. held-out evaluation every eval.every_rounds (within eval.max_share) and at the end of the run
        if self._evaluator is not None and (final or self._eval_due(r)):
            with timer("eval"):
                evaluated.update(self.evaluate())
                self._describe_self(r, evaluated)

        # 8. record: figures, the next round's size, checkpoint (atomic), store row
        levels = {d: self.tasks.curriculum.level(d) for d in self.tasks.datasets}
        metrics = round_figures(
            local, external, batch.groups, samples, timer.seconds, shape, levels, self._sampler.name
        )
        metrics.update(figures)
        if refill is not None:
            metrics.update(refill.figures)
        if adopted is not None:  # the peers' groups that taught: their questions, and their answers where we failed
            metrics["groups/external"] = float(len(adopted.own) + len(adopted.mixed))
        metrics.update(evaluated)
        if self._source is not None:
            self._swarm_step("stats", swarm_failures, lambda: metrics.update(self._source.stats()))
            # peers' signed receipts naming our groups: what `sapo-node stats` counts as credit
            self._swarm_step(
                "stats", swarm_failures, lambda: self.store.record_receipts(r, self._source.receipts_for_us())
            )
            metrics.update(swarm_failures)
        # the round's own time, without the evaluation: that is what auto-scaling sizes
        metrics["time/round"] = time.time() - started - timer.seconds.get("eval", 0.0)
        self._autoscale(metrics["time/round"])  # before the checkpoint: a resumed node runs at the new size
        self._receipts = batch.receipts  # named in our next round's record (and checkpointed for it)
        saved = False
        try:
            with timer("save"):
                hooks.progress("save", 0, 1)
                self._save(r, metrics, started)
            saved = True
            metrics["time/save"] = timer.seconds["save"]
            self.store.record_round(r, metrics, started)
        except Interrupted:
            raise
        except Exception as e:  # the disk: full, turned read-only, failing
            raise NodeError(self._save_failed(r, e, saved)) from e
        self.next_round = r + 1
        trim_heap()  # what the round freed goes back to the system, not kept for the next
        return metrics

    def _sample_and_score(self, r: int, questions, timer: PhaseTimer, part: int = 0):
        """Our groups of `questions` (G completions each, scored with our own rewards, fed to the
        curriculum unless they are peers' questions: part ADOPT_PART), their encoded prompts and
        the raw samples."""
        cfg, hooks, policy = self.cfg, self.hooks, self.policy
        with timer("sample"):
            prompts = [self._prompt(q) for q in questions]
            # the identity too: nodes at the same round must not draw the same per-token randomness
            seeds = [mixed_seed(cfg.seed, self._identity, r, k) for k in range(len(questions))]
            if part:  # a refill's draws must differ from the round's first
                seeds = [mixed_seed(s, "refill", part) for s in seeds]
            params = SamplingParams.for_config(cfg.sampler, n=self.shape.group_size, stop_token_ids=policy.eos_ids)
            samples = self._sampler.sample(prompts, seeds, params, hooks)
        with timer("score"):
            hooks.progress("score", 0, len(questions))
            local: list[Group] = []
            for q, seqs in zip(questions, samples):
                comps = [Completion(policy.decode(s.token_ids), s.token_ids, s.logprobs, s.finished) for s in seqs]
                for c, reward in zip(comps, self.tasks.score(q, [c.text for c in comps])):
                    c.reward = float(reward)
                local.append(Group(question=q, completions=comps, source="local", round=r))
            for g in local if part != ADOPT_PART else ():  # the curriculum follows our own questions
                change = self.tasks.observe(g)
                if change is not None:
                    log.info(f"curriculum: {change}")
        return local, prompts, samples

    def _refill(self, r: int, local: list[Group], prompts: list[list[int]], timer: PhaseTimer) -> Refill:
        """DAPO's dynamic sampling (arXiv 2503.14476): while fewer of our groups than I have reward
        spread, draw as many new questions as are missing, at most round.refill_passes times. What
        trains is the groups with spread; the round's reward figures stay the first draw's."""
        want = self.shape.local
        groups = [g for g in local if g.has_signal()]
        prompts = [p for g, p in zip(local, prompts) if g.has_signal()]
        extra: list[Group] = []
        sampled = 0
        for part in range(1, self.cfg.round.refill_passes + 1):
            missing = want - len(groups) - len(extra)
            if missing <= 0:
                break
            more, more_prompts, _ = self._sample_and_score(
                r, self.tasks.sample_questions(r, missing, part), timer, part
            )
            sampled += len(more)
            extra += [g for g in more if g.has_signal()]
            prompts += [p for g, p in zip(more, more_prompts) if g.has_signal()]
        figures = {"groups/refill_sampled": float(sampled), "groups/refill_with_signal": float(len(extra))}
        return Refill(groups + extra, prompts, extra, figures)

    def _save_failed(self, r: int, error: Exception, saved: bool) -> str:
        why = write_trouble(self.run_dir, error) or f"{type(error).__name__}: {error}"
        done = r if saved else r - 1
        return (
            f"round {r} could not be saved in {self.run_dir}: {why}. Nothing finished is lost: the next "
            f"start resumes after round {done}"
            + (f" (round {r}'s figures come back from its checkpoint)." if saved else ".")
        )

    def _open_store(self) -> RunStore:
        """The run store; a damaged one (not a database any more, malformed) is set aside and a new
        one started: the progress is the checkpoint's, the store holds the figures."""
        path = self.run_dir / STORE_NAME
        try:
            return RunStore(path)
        except StoreError as e:
            cause = e.__cause__
            if type(cause) is not sqlite3.DatabaseError:  # exactly: not OperationalError (locked, read-only)
                raise NodeError(str(e)) from e
            aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
            for suffix in ("", "-wal", "-shm"):
                if Path(f"{path}{suffix}").exists():
                    os.replace(f"{path}{suffix}", f"{aside}{suffix}")
            log.warning(
                f"run store {path} is damaged ({cause}): set aside as {aside.name} and a new one started; "
                "training goes on from the last checkpoint, the figures of earlier rounds stay in the damaged file"
            )
            return RunStore(path)

    # metric counting a swarm step that raised (swarm/publish_failed is taken: failed DHT stores)
    _SWARM_FAILURE_METRIC = {
        "publish": "swarm/publish_raised",
        "gather": "swarm/gather_failed",
        "stats": "swarm/stats_failed",
        "reject": "swarm/reject_failed",
    }

    def _swarm_step(self, what: str, failures: dict[str, float], fn, *args):
        """fn(*args), or None after counting it (_SWARM_FAILURE_METRIC) and logging: whatever a
        peer sent or the network did, the round goes on. Stopping still stops."""
        metric = self._SWARM_FAILURE_METRIC[what]
        failures.setdefault(metric, 0.0)
        try:
            return fn(*args)
        except Interrupted:
            raise
        except Exception as e:
            failures[metric] += 1.0
            log.error(f"swarm: {what} failed, this round goes on without sharing: {type(e).__name__}: {e}")
            return None

    def _eval_due(self, r: int) -> bool:
        every = self.cfg.eval.every_rounds
        if not every or r % every:
            return False
        eval_rounds, eval_seconds = self.store.series("time/eval")
        if not eval_rounds:
            return True
        since = [t for x, t in zip(*self.store.series("time/round")) if x > eval_rounds[-1]]
        return eval_within_share(eval_seconds[-1], sum(since), self.cfg.eval.max_share)

    def _describe_self(self, after_round: int, m: dict) -> None:
        """Our latest held-out figure, in our next index entries (the swarm's page shows it,
        labelled self-reported)."""
        if self._source is None or not hasattr(self._source, "describe") or "eval/solve_rate" not in m:
            return
        n = max(1, int(m.get("eval/samples", 1)) * int(m.get("eval/questions", 1)))
        self._source.describe(held_out=(after_round, float(m["eval/solve_rate"]), n))

    def evaluate(self) -> dict[str, float]:
        """The held-out figures (`eval/...`) of the policy as the sampler now follows it."""
        if self._evaluator is None:
            return {}
        t0 = time.perf_counter()
        try:
            # the backend itself: a crash skips this evaluation, and the next round's sampling falls back
            m = self._evaluator.run(self._sampler.inner, self.policy, self.hooks)
        except SamplerError as e:
            log.error(f"held-out evaluation skipped: sampler {self._sampler.name} failed ({e})")
            return {}
        m["time/eval"] = time.perf_counter() - t0
        log.info(held_out_line(m, untrained=self.policy.version == 0))
        return m

    def _prompt(self, question) -> list[int]:
        return self.policy.encode_prompt(self.tasks.messages(question))

    def _keep_likely(self, external: list[Group], failures: dict[str, float]) -> list[Group]:
        """Peers' groups less the completions our judge finds implausible (swarm/likelihood.py),
        counted as `unlikely`; a peer most of whose completions were is struck. Under swarm.take =
        mixed a group stays while it holds a right completion (we adopt its question)."""
        s = self.cfg.swarm
        judges = {
            "policy": [self._peer_logprobs],
            "base": [self._base_logprobs],
            "either": [self._peer_logprobs, self._base_logprobs],
        }[s.likelihood_judge if self.policy.lora else "policy"]
        keeps = (lambda g: bool(right_completions(g))) if s.take == "mixed" else None
        verdict = filter_unlikely(external, judges, s.likelihood_floor, s.likelihood_window, keeps)
        failures["swarm/unlikely"] = float(verdict.unlikely)
        if verdict.groups_dropped:
            failures["swarm/unlikely_groups"] = float(verdict.groups_dropped)
        for peer, (bad, strike) in verdict.peers.items():
            self._swarm_step("reject", failures, self._source.reject, peer, "unlikely", bad, strike)
        return verdict.kept

    def _peer_logprobs(self, pairs) -> list[list[float]]:
        """Our policy's per-token log-probs of peers' completions, exactly as they would train."""
        max_new, prompts = self.cfg.sampler.max_new_tokens, {}  # a group's prompt encoded once, not per completion
        for g, _ in pairs:
            if id(g) not in prompts:
                prompts[id(g)] = self._prompt(g.question)
        seqs = [TrainSequence(prompts[id(g)], external_token_ids(self.policy, c, max_new), 0.0) for g, c in pairs]
        return self.trainer.completion_logprobs(seqs, self.hooks)

    def _base_logprobs(self, pairs) -> list[list[float]]:
        """The base model's per-token log-probs of peers' completions (the LoRA adapter off)."""
        with self.policy.model.disable_adapter():
            return self._peer_logprobs(pairs)

    def _save(self, r: int, metrics: dict[str, float], started: float) -> None:
        p, receipts = self.policy, [list(x) for x in self._receipts]
        extra = dict(metrics=metrics, started=started, shape=dict(self.shape.__dict__), tasks=self.tasks.state_dict())
        if self._base is not None:
            extra["base_sha256"] = self._base.sha256
            self._check_base_file()
        state = CheckpointState(r, p.model_id, p.lora_rank, p.version, extra={**extra, "receipts": receipts})
        self.checkpoints.save(state, p.trainable_state_dict(), self.trainer.state_dict())

    def _check_base_file(self) -> None:
        """Say once if the model file changed on disk while the node runs. The node goes on with
        the model it loaded (in memory; the sampler's copy is its own); the next start compares
        the file with the checkpoint's record of it."""
        path, stamp = self._base.path, self._base.stamp
        try:
            now = file_stamp(path)
        except OSError:
            now = None
        if now != stamp and not self._base_changed_said:
            self._base_changed_said = True
            log.warning(
                f"the model file {path} changed on disk (or went) while the node runs: this run goes on "
                "with the model it loaded; the next start checks the file against this run's checkpoint"
            )

    def _autoscale(self, seconds: float) -> None:
        c = self.cfg
        limit = RoundShape(c.round.local_groups, c.round.external_groups, c.sampler.group_size)
        change = self.shape.rescale(seconds, c.round.target_round_seconds, limit) if c.round.auto_scale else None
        if change:
            log.info(change)

    # --- control ------------------------------------------------------------------------
    def choose_threads(self) -> int:
        """sampler.threads when set; else what the CPU has free now, within the user's limit
        (the worker's governor adapts it while running)."""
        c = self.cfg.control
        choice = starting_threads(self.cfg.sampler.threads, c.max_cpus_percent, c.leave_cores)
        if not self.cfg.sampler.threads:
            log.info(f"threads: {choice.reason}")
        return choice.threads

    def set_threads(self, n: int) -> None:
        n = n or self.choose_threads()
        self.threads = n
        torch.set_num_threads(n)
        if self._sampler is not None:
            self._sampler.set_threads(n)

    @property
    def sampler_name(self) -> str:
        return self._sampler.name if self._sampler else ""

    @property
    def source(self):
        return self._source

    def close(self) -> None:
        for part in (self._sampler, self._source):
            if part is not None:
                try:
                    part.close()
                except Exception as e:  # closing must not mask the reason we are closing
                    log.warning(f"while closing {type(part).__name__}: {e}")
        if hasattr(self, "store"):
            self.store.close()


__all__ = ["Node", "NodeError", "mixed_seed"]
