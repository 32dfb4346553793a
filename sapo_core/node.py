"""The SAPO round, top to bottom: sample -> score -> share -> gather -> likelihood -> prepare -> update
-> sync -> eval -> save (the phases of control/vocabulary.py).

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

import logging
import random
import time
from pathlib import Path

import torch

from sapo_core import paths
from sapo_core.adopt import Adopted, TopicNeeds, adopt, reference_guided
from sapo_core.batch import Batch, BatchRules, training_batch
from sapo_core.checkpoint import Checkpoints, CheckpointState
from sapo_core.config import NodeConfig, dump_config
from sapo_core.control.threads import starting_threads
from sapo_core.cpu import trim_heap, tune_heap
from sapo_core.evaluation import EvalSettings, HeldOut
from sapo_core.evaluator import Evaluator, eval_due
from sapo_core.figures import PhaseTimer, round_figures
from sapo_core.fsutil import atomic_write_bytes, write_trouble
from sapo_core.hardware import training_device
from sapo_core.hooks import Interrupted, NullHooks, RoundHooks
from sapo_core.modelfiles import file_stamp, fingerprint, resolve_model
from sapo_core.owngroups import ADOPT_PART, OwnGroups, Refill, mixed_seed
from sapo_core.policy import Policy, load_policy
from sapo_core.rollouts import Completion, Group
from sapo_core.roundshape import RoundShape
from sapo_core.rundir import BaseFile, NodeError, keep_run_model, open_store, resume, save_failed
from sapo_core.sampler.resilient import ResilientSampler
from sapo_core.swarmsteps import PeerJudges, describe_self, open_source, swarm_step
from sapo_core.tasks import TaskSet
from sapo_core.trainer import Trainer

log = logging.getLogger(__name__)


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
        self._needs = TopicNeeds()  # what our own groups lack by dataset and level, for swarm.choice = need
        self._evaluator = None
        self._identity = "alone"
        self.threads = 0  # the compute threads in use (set in setup)
        self._base: BaseFile | None = None  # the model file trained on (None: tiny-random)

    # --- start-up -----------------------------------------------------------------------
    def setup(self) -> None:
        cfg, hooks = self.cfg, self.hooks
        tune_heap()  # before the model loads: large tensors get pages of their own
        self.run_dir.mkdir(parents=True, exist_ok=True)
        trouble = write_trouble(self.run_dir)
        if trouble:  # said before any work, not after the first round's
            raise NodeError(f"the run directory {self.run_dir} cannot take the node's progress: {trouble}")
        self.store = open_store(self.run_dir)
        self.cfg, kept = keep_run_model(cfg, self.store.get_meta("model_id"))
        cfg = self.cfg
        if kept:
            log.info(f"model: {kept}")
        self.checkpoints = Checkpoints(self.run_dir)
        self.threads = threads = self.choose_threads()
        torch.set_num_threads(threads)
        plan = resolve_model(cfg, hooks)
        log.info(f"model: {plan.why}")
        if cfg.model.name == "auto" and not cfg.model.gguf_path:
            # the run's record (run_dir/config.toml) names what was chosen: `sapo-node eval` and
            # the export load that model, not the one 'auto' would choose today
            self.cfg = cfg = cfg.replace(**{"model.name": plan.model_id})
        if plan.micro_batch_size < cfg.train.micro_batch_size:
            log.info(f"micro-batch {cfg.train.micro_batch_size} -> {plan.micro_batch_size} to fit memory")
            self.cfg = cfg = cfg.replace(**{"train.micro_batch_size": plan.micro_batch_size})
        hf_cache, gguf, tokenizer_gguf = paths.converted_models_dir(), plan.gguf, plan.tokenizer_gguf
        self._base = None if gguf is None else BaseFile(gguf, file_stamp(gguf), fingerprint(gguf, paths.cache_dir()))
        self.policy = load_policy(cfg.model, gguf, hf_cache, cfg.seed, tokenizer_gguf, plan.model_id)
        device = training_device(cfg.train.device)
        if device.value != "cpu":
            self.policy.model.to(device.value)
        log.info(f"update on {device.value}: {device.reason}")
        self.trainer = Trainer(self.policy, cfg.train, temperature=cfg.sampler.temperature)
        log.info(f"update: {self.trainer.precision.why}")
        if self._source is None:
            self._source = open_source(cfg, self.policy, paths.identity_dir(), hooks)
        self._identity = identity = getattr(self._source, "node_id", "alone") if self._source else "alone"
        # nodes of one swarm must not all draw the same questions: the seed mixes in the identity;
        # training skips the held-out evaluation's questions, also with evaluation off: what we
        # train on we share, and peers evaluate on the same set
        self.tasks = TaskSet(cfg.tasks, seed=mixed_seed(cfg.seed, identity), held_out=HeldOut(cfg.eval.questions))
        self._resume()
        atomic_write_bytes(self.run_dir / "config.toml", dump_config(self.cfg).encode())
        self.store.set_meta("model_id", self.policy.model_id)
        if self._source is not None and hasattr(self._source, "describe"):
            self._source.describe(model=plan.model_id)
            rounds, _ = self.store.series("eval/solve_rate")
            if rounds:  # what we last measured, said again after a restart
                row = self.store.rounds(since=rounds[-1] - 1, limit=1)
                describe_self(self._source, rounds[-1], row[0].metrics if row else {})
        given = self._sampler_factory(self) if self._sampler_factory is not None else None
        self._sampler = ResilientSampler(cfg.sampler, self.policy, paths.cache_dir(), given, "given by the caller")
        self._sampler.set_threads(threads)
        self._sampler.sync_policy(self.policy)
        trim_heap()  # what converting and exporting the model freed
        log.info(f"sampler: {self._sampler.reason}")
        self._groups = OwnGroups(cfg, self.tasks, self.policy, self._sampler, hooks, identity)
        self._judges = PeerJudges(self.policy, self.trainer, self._groups.prompt, cfg.sampler.max_new_tokens, hooks)
        self._evaluator = None
        if cfg.eval.enabled:
            settings, level_questions = EvalSettings.for_config(cfg), min(cfg.eval.level_questions, cfg.eval.questions)
            sha = self._base.sha256 if self._base is not None else ""  # a shipped base result is of one file
            self._evaluator = Evaluator(
                self.tasks, settings, cfg.eval.questions, paths.cache_dir(), level_questions, model_sha256=sha
            )

    def _resume(self) -> None:
        state = resume(self.run_dir, self.checkpoints, self.store, self.policy, self.trainer, self.tasks, self._base)
        if state is None:
            return
        self.next_round = state.round + 1
        shape = state.extra.get("shape")
        if shape:
            self.shape = RoundShape(**shape)
        self._receipts = [tuple(x) for x in state.extra.get("receipts", [])]

    # --- the round ----------------------------------------------------------------------
    def run_round(self, final: bool = False) -> dict[str, float]:
        """One round; `final`: the run stops after it (a set number of rounds), so the held-out
        evaluation runs at its end whatever eval.every_rounds says."""
        assert self.policy is not None, "call setup() first"
        cfg, hooks, shape = self.cfg, self.hooks, self.shape
        r = self.next_round
        started = time.time()
        timer = PhaseTimer()
        rng = random.Random(mixed_seed(cfg.seed, "round", r))
        evaluated: dict[str, float] = {}
        if r == 1 and self._evaluator is not None:  # round 0: the base model, before any update
            with timer("eval"):
                evaluated = self.evaluate()
                describe_self(self._source, 0, evaluated)

        # sample: I questions of our own, G completions each; score: with our own rewards
        local, prompts, samples = self._sample_and_score(r, self.tasks.sample_questions(r, shape.local), timer)
        refill = self._groups.refill(r, local, prompts, timer, shape.local, shape.group_size)
        shared = local if refill is None else local + refill.extra  # what we publish: refills with spread too

        # share our groups with the swarm; gather J verified groups from peers; likelihood: drop what our
        # policy finds implausible (no step may stop the round: a failure is counted, costs its sharing)
        external: list[Group] = []
        failures: dict[str, float] = {}
        if self._source is not None:
            with timer("share"):
                hooks.progress("share", 0, 1)
                swarm_step("publish", failures, self._source.publish, r, shared, self._receipts)
            with timer("gather"):
                hooks.progress("gather", 0, 1)
                need = self._needs.need()  # what our own groups lack, by dataset and level (swarm.choice = need)
                external = swarm_step("gather", failures, self._source.gather, r, shape.external, rng, need) or []
            with timer("likelihood"):  # a forward pass over peers' completions: work, not waiting
                hooks.progress("likelihood", 0, 1)
                external = self._judges.keep_likely(external, cfg.swarm, self._source, failures)
        adopted = None
        if external and cfg.swarm.take == "mixed":  # their questions, our answers, their right one where we fail
            adopted = adopt(external, shape.external, lambda qs: self._sample_and_score(r, qs, timer, ADOPT_PART)[:2])
            failures.update(adopted.figures(len(external)))
            external = []

        # prepare: advantages, group by group (the receipts name the peers' groups that train)
        with timer("prepare"):
            batch = self._training_batch(local, prompts, refill, adopted, external)
            if batch.capped:
                failures["swarm/external_tokens_capped"] = float(batch.capped)

        # update the policy; sync: the sampler follows it
        with timer("update"):
            figures = self.trainer.update(batch.sequences, hooks) if batch.sequences else {"train/steps": 0.0}
        with timer("sync"):
            if batch.sequences:
                self._sync(r, figures)

        # eval: held out, every eval.every_rounds (within eval.max_share) and at the end of the run
        if self._evaluator is not None and (final or eval_due(self.store, cfg.eval, r)):
            with timer("eval"):
                evaluated.update(self.evaluate())
                describe_self(self._source, r, evaluated)

        # save: figures, the next round's size, checkpoint (atomic), store row
        metrics = round_figures(
            local, external, batch.groups, samples, timer.seconds, shape, self._levels(), self._sampler.name
        )
        metrics.update(figures)
        metrics.update(self._what_trained(refill, adopted, batch))
        metrics.update(self.tasks.reask_figures(local))
        metrics.update(evaluated)
        if self._source is not None:
            metrics.update(self._swarm_figures(r, failures))
        # the round's own time, without the evaluation: that is what auto-scaling sizes
        metrics["time/round"] = time.time() - started - timer.seconds.get("eval", 0.0)
        self._autoscale(metrics["time/round"])  # before the checkpoint: a resumed node runs at the new size
        self._receipts = batch.receipts  # named in our next round's record (and checkpointed for it)
        self._save_round(r, metrics, started, timer)
        self.next_round = r + 1
        trim_heap()  # what the round freed goes back to the system, not kept for the next
        return metrics

    def _sample_and_score(self, r: int, questions, timer: PhaseTimer, part: int = 0):
        """Our groups of `questions` at this round's group size, their prompts, the raw samples; the
        groups (ours, and ours on peers' questions) feed what we lack (TopicNeeds)."""
        out = self._groups.sample_and_score(r, questions, timer, self.shape.group_size, part)
        self._needs.observe(out[0])
        return out

    def _training_batch(
        self, local: list[Group], prompts, refill: Refill | None, adopted: Adopted | None, external: list[Group]
    ) -> Batch:
        """What trains: our groups (with spread after a refill), the adopted peers' questions and
        peers' groups as they are."""
        trained, trained_prompts = (local, prompts) if refill is None else (refill.groups, refill.prompts)
        mixed = []
        if self.cfg.train.reference_guide:  # the first draw's groups without a right answer, guided
            mixed = reference_guided(local, prompts, self._reference_guide)
            guided = {id(m.own) for m in mixed}
            kept = [(g, p) for g, p in zip(trained, trained_prompts) if id(g) not in guided]
            trained, trained_prompts = [g for g, _ in kept], [p for _, p in kept]
        if adopted is not None:
            trained, trained_prompts = trained + adopted.own, trained_prompts + adopted.prompts
            mixed = mixed + adopted.mixed
        rules = BatchRules.for_config(self.cfg)
        return training_batch(self.policy, self._groups.prompt, trained, trained_prompts, external, rules, mixed)

    def _what_trained(self, refill: Refill | None, adopted: Adopted | None, batch: Batch) -> dict[str, float]:
        """The round's figures of its refills, its adopted peers' questions and its reference guides."""
        out = dict(refill.figures) if refill is not None else {}
        if self.cfg.train.reference_guide:
            out["groups/reference_guided"] = float(batch.reference_guided)
        if adopted is not None:  # the peers' groups that taught: their questions, and their answers where we failed
            out["groups/external"] = float(len(adopted.own) + len(adopted.mixed))
        return out

    def _reference_guide(self, question) -> Completion:
        """The question's reference answer as a completion, scored by our own rewards (the batch
        tokenises it, as it does a peer's guide)."""
        text = self.tasks.reference_text(question)
        return Completion(text, reward=self.tasks.score(question, [text])[0])

    def _sync(self, r: int, figures: dict[str, float]) -> None:
        """The sampler loads the updated policy, after switching to the F16 export if its log-probs
        drifted from the trainer's (`figures` then say so)."""
        if self._sampler.check_drift(figures.get("sampler/logprob_drift")):
            # the sampler's own state, not the run's config (config.toml stays what it ran with)
            figures["sampler/switched_to_f16"] = 1.0
            self.store.set_meta("sampler_switched", f"f16 export after round {r} (log-prob drift)")
        self._sampler.sync_policy(self.policy)

    def _levels(self) -> dict[str, int]:
        return {d: self.tasks.curriculum.level(d) for d in self.tasks.datasets}

    def _swarm_figures(self, r: int, failures: dict[str, float]) -> dict[str, float]:
        """The swarm source's counters, and the round's failed swarm steps; records peers' signed
        receipts naming our groups (what `sapo-node stats` counts as credit) in the store."""
        m: dict[str, float] = {}
        swarm_step("stats", failures, lambda: m.update(self._source.stats()))
        swarm_step("stats", failures, lambda: self.store.record_receipts(r, self._source.receipts_for_us()))
        m.update(failures)
        return m

    def _save_round(self, r: int, metrics: dict[str, float], started: float, timer: PhaseTimer) -> None:
        """The checkpoint (atomic), then the store's row; a disk that fails either stops the node
        with what survived."""
        saved = False
        try:
            with timer("save"):
                self.hooks.progress("save", 0, 1)
                self._save(r, metrics, started)
            saved = True
            metrics["time/save"] = timer.seconds["save"]
            self.store.record_round(r, metrics, started)
        except Interrupted:
            raise
        except Exception as e:  # the disk: full, turned read-only, failing
            raise NodeError(save_failed(self.run_dir, r, e, saved)) from e

    def evaluate(self) -> dict[str, float]:
        """The held-out figures (`eval/...`) of the policy as the sampler now follows it."""
        if self._evaluator is None:
            return {}
        return self._evaluator.run_timed(self._sampler, self.policy, self.hooks)

    def _save(self, r: int, metrics: dict[str, float], started: float) -> None:
        p, receipts = self.policy, [list(x) for x in self._receipts]
        extra = dict(metrics=metrics, started=started, shape=dict(self.shape.__dict__), tasks=self.tasks.state_dict())
        if self._base is not None:
            extra["base_sha256"] = self._base.sha256
            self._base.check()
        state = CheckpointState(r, p.model_id, p.lora_rank, p.version, extra={**extra, "receipts": receipts})
        self.checkpoints.save(state, p.trainable_state_dict(), self.trainer.state_dict())

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
