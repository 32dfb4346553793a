"""The SAPO round, top to bottom: sample -> score -> share -> gather -> advantages -> update -> record.

`Node.run_round()` is SAPO's Algorithm 1 for one node and one round. Where we depart from
the SAPO paper (arXiv 2509.08721) or GRPO:
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
  round.target_round_seconds on this machine (auto_scale), and grow back when it is fast.
- Completions that stopped by themselves are trained with their stop token, so the policy
  learns when to stop; a peer's completion gets it only when the peer says it finished and
  we did not cut it to our max_new_tokens (record v2). Peers' completions are scored on
  exactly the text that is trained (cut to our limit, verify.py).
- Peers' completions our current policy finds implausible (mean log-likelihood per token
  under swarm.likelihood_floor) are dropped as `unlikely` before advantages: a right answer
  with an injected link or a garbage preamble is not text to imitate (issue 10). Each peer
  group is trained at most once, and at most swarm.max_external_tokens tokens of them per
  update.
- A held-out evaluation (`evaluation.py`) runs before round 1, every eval.every_rounds rounds
  (within eval.max_share of the node's time) and after the last round of a run of set length; training never draws its questions. The
  reward is correctness (1 right, 0 wrong) unless tasks.partial_credit (issue 11).
- The default task mix and difficulty are easy ones a 135M model can sometimes solve
  (FACTS.md: it scores ~0 on the paper's full mix), with a curriculum that raises them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sapo_core import grpo, paths
from sapo_core.checkpoint import CheckpointState, Checkpoints
from sapo_core.config import NodeConfig, dump_config
from sapo_core.downloads import DownloadReport
from sapo_core.evaluation import Evaluator, EvalSettings, HeldOut
from sapo_core.fsutil import atomic_write_bytes
from sapo_core.hooks import Interrupted, NullHooks, RoundHooks
from sapo_core.policy import TINY_RANDOM, Policy, load_policy
from sapo_core.rollouts import Completion, Group
from sapo_core.sampler import SamplerError, SamplingParams, make_fallback_sampler, make_sampler
from sapo_core.sampler.llamacpp import DRIFT_LIMIT
from sapo_core.store import STORE_NAME, RunStore
from sapo_core.tasks import TaskSet
from sapo_core.swarm.verify import likelihood_score
from sapo_core.trainer import Trainer, TrainSequence

log = logging.getLogger(__name__)


class NodeError(RuntimeError):
    """The node cannot run; the message says what to change."""


@dataclass
class RoundShape:
    """What a round holds after auto-scaling: I local groups, J external, G per group."""

    local: int
    external: int
    group_size: int

    def shrink(self) -> bool:
        if self.local > 1 or self.external > 1:
            self.local, self.external = max(1, self.local // 2), max(1 if self.external else 0, self.external // 2)
            return True
        if self.group_size > 4:
            self.group_size = max(4, self.group_size // 2)
            return True
        return False

    def grow(self, limit: "RoundShape") -> bool:
        if self.group_size < limit.group_size:
            self.group_size = min(limit.group_size, self.group_size * 2)
            return True
        if self.local < limit.local or self.external < limit.external:
            self.local = min(limit.local, self.local * 2)
            self.external = min(limit.external, max(1, self.external * 2) if limit.external else 0)
            return True
        return False


def mixed_seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest(), "little")


class Node:
    def __init__(self, cfg: NodeConfig, hooks: RoundHooks | None = None, source=None,
                 sampler_factory=None) -> None:
        """`source`: a RolloutSource to use instead of opening the configured swarm;
        `sampler_factory(node) -> Sampler`: a sampler to use instead of the configured one."""
        self.cfg = cfg
        self.hooks = hooks or NullHooks()
        self.run_dir = Path(cfg.run_dir).expanduser() if cfg.run_dir else paths.default_run_dir()
        self.policy: Policy | None = None
        self.next_round = 1
        self.shape = RoundShape(cfg.round.local_groups, cfg.round.external_groups, cfg.sampler.group_size)
        self._source = source
        self._sampler = None
        self._sampler_reason = ""
        self._sampler_factory = sampler_factory
        self._receipts: list[tuple[str, int, int]] = []  # external groups trained last round
        self._evaluator = None
        self._identity = "alone"
        self.threads = 0  # the compute threads in use (set in setup)

    # --- start-up -----------------------------------------------------------------------
    def setup(self) -> None:
        cfg, hooks = self.cfg, self.hooks
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.store = RunStore(self.run_dir / STORE_NAME)
        self.checkpoints = Checkpoints(self.run_dir)
        self.threads = threads = self.choose_threads()
        torch.set_num_threads(threads)
        plan = resolve_model(cfg, hooks)
        log.info(f"model: {plan.why}")
        if plan.micro_batch_size < cfg.train.micro_batch_size:
            log.info(f"micro-batch {cfg.train.micro_batch_size} -> {plan.micro_batch_size} to fit memory")
            self.cfg = cfg = cfg.replace(**{"train.micro_batch_size": plan.micro_batch_size})
        self.policy = load_policy(cfg.model, plan.gguf, paths.cache_dir() / "hf", seed=cfg.seed,
                                  tokenizer_gguf=plan.tokenizer_gguf, model_id=plan.model_id)
        self.trainer = Trainer(self.policy, cfg.train, temperature=cfg.sampler.temperature)
        if self._source is None:
            self._source = self._open_source()
        identity = getattr(self._source, "node_id", "alone") if self._source else "alone"
        self._identity = identity
        # nodes of one swarm must not all draw the same questions: the seed mixes in the identity;
        # training skips the held-out evaluation's questions, also with evaluation off: what we
        # train on we share, and peers evaluate on the same set
        self.tasks = TaskSet(cfg.tasks, seed=mixed_seed(cfg.seed, identity), held_out=HeldOut(cfg.eval.questions))
        self._resume()
        self._write_config_snapshot()
        if self._sampler_factory is not None:
            self._sampler, self._sampler_reason = self._sampler_factory(self), "given by the caller"
        else:
            self._sampler, self._sampler_reason = make_sampler(cfg.sampler, self.policy, paths.cache_dir())
        self._sampler.set_threads(threads)
        self._sampler.sync_policy(self.policy)
        log.info(f"sampler: {self._sampler_reason}")
        self._evaluator = None
        if cfg.eval.enabled:
            settings = EvalSettings(samples=cfg.eval.samples, greedy=cfg.eval.greedy,
                                    temperature=cfg.sampler.temperature, top_p=cfg.sampler.top_p,
                                    max_new_tokens=cfg.sampler.max_new_tokens)
            self._evaluator = Evaluator(self.tasks, settings, cfg.eval.questions, paths.cache_dir())

    def _open_source(self):
        if not self.cfg.swarm.enabled or self.cfg.round.external_groups == 0:
            return None
        from sapo_core.swarm.source import open_swarm

        return open_swarm(self.cfg.swarm, self.tasks_for_verification(), paths.identity_dir(), self.hooks,
                          cutter=self.completion_cutter())

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
        self.policy.load_trainable_state_dict(trainable)
        self.trainer.load_state_dict(optimizer)
        self.policy.version = state.policy_version
        self.next_round = state.round + 1
        shape = state.extra.get("shape")
        if shape:
            self.shape = RoundShape(**shape)
        if "tasks" in state.extra:
            self.tasks.load_state_dict(state.extra["tasks"])
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
        timer = _PhaseTimer()
        rng = random.Random(mixed_seed(cfg.seed, "round", r))
        evaluated: dict[str, float] = {}
        if r == 1 and self._evaluator is not None:  # round 0: the base model, before any update
            with timer("eval"):
                evaluated = self.evaluate()

        # 1. sample: I questions of our own, G completions each
        with timer("sample"):
            questions = self.tasks.sample_questions(r, shape.local)
            prompts = [policy.encode_prompt(self.tasks.messages(q)) for q in questions]
            # the identity too: nodes at the same round must not draw the same per-token randomness
            seeds = [mixed_seed(cfg.seed, self._identity, r, k) for k in range(len(questions))]
            params = SamplingParams(n=shape.group_size, max_new_tokens=cfg.sampler.max_new_tokens,
                                    temperature=cfg.sampler.temperature, top_p=cfg.sampler.top_p,
                                    stop_token_ids=policy.eos_ids)
            samples = self._sample(prompts, seeds, params)

        # 2. score with our own rewards
        with timer("score"):
            hooks.progress("score", 0, len(questions))
            local: list[Group] = []
            for q, seqs in zip(questions, samples):
                comps = [Completion(text=policy.decode(s.token_ids), token_ids=s.token_ids,
                                    sample_logprobs=s.logprobs, finished=s.finished) for s in seqs]
                for c, reward in zip(comps, self.tasks.score(q, [c.text for c in comps])):
                    c.reward = float(reward)
                local.append(Group(question=q, completions=comps, source="local", round=r))
            for g in local:  # the curriculum follows our own accuracy
                change = self.tasks.observe(g)
                if change is not None:
                    log.info(f"curriculum: {change}")

        # 3. share our groups with the swarm, 4. gather J verified groups from peers
        # (neither may stop the round: a failure is counted, logged and costs this round's sharing)
        external: list[Group] = []
        swarm_failures: dict[str, float] = {}
        if self._source is not None:
            with timer("share"):
                hooks.progress("share", 0, 1)
                self._swarm_step("publish", swarm_failures, self._source.publish, r, local, self._receipts)
            with timer("gather"):
                hooks.progress("gather", 0, 1)
                external = self._swarm_step("gather", swarm_failures, self._source.gather, r, shape.external, rng) or []
            with timer("likelihood"):
                external = self._drop_unlikely(external, swarm_failures)

        # 5. advantages, group by group
        with timer("prepare"):
            train_seqs, trained_groups = self._training_sequences(local, prompts, external, swarm_failures)

        # 6. update the policy, then let the sampler follow it
        with timer("update"):
            figures = self.trainer.update(train_seqs, hooks) if train_seqs else {"train/steps": 0.0}
        with timer("sync"):
            if train_seqs:
                self._check_drift(figures.get("sampler/logprob_drift"))
                self._sampler.sync_policy(policy)

        # 7. held-out evaluation every eval.every_rounds (within eval.max_share) and at the end of the run
        if self._evaluator is not None and (final or self._eval_due(r)):
            with timer("eval"):
                evaluated.update(self.evaluate())

        # 8. record: figures, the next round's size, checkpoint (atomic), store row
        metrics = self._round_figures(local, external, trained_groups, samples, timer)
        metrics.update(figures)
        metrics.update(evaluated)
        if self._source is not None:
            self._swarm_step("stats", swarm_failures, lambda: metrics.update(self._source.stats()))
            # peers' signed receipts naming our groups: what `sapo-node stats` counts as credit
            self._swarm_step("stats", swarm_failures,
                             lambda: self.store.record_receipts(r, self._source.receipts_for_us()))
            metrics.update(swarm_failures)
        # the round's own time, without the evaluation: that is what auto-scaling sizes
        metrics["time/round"] = time.time() - started - timer.seconds.get("eval", 0.0)
        self._autoscale(metrics["time/round"])  # before the checkpoint: a resumed node runs at the new size
        with timer("save"):
            hooks.progress("save", 0, 1)
            self._save(r, metrics, started)
        metrics["time/save"] = timer.seconds["save"]
        self.store.record_round(r, metrics, started)
        self.next_round = r + 1
        return metrics

    # metric counting a swarm step that raised (swarm/publish_failed is taken: failed DHT stores)
    _SWARM_FAILURE_METRIC = {"publish": "swarm/publish_raised", "gather": "swarm/gather_failed",
                             "stats": "swarm/stats_failed", "reject": "swarm/reject_failed"}

    def _swarm_step(self, what: str, failures: dict[str, float], fn, *args):
        """fn(*args), or None after counting it (_SWARM_FAILURE_METRIC) and logging: whatever a
        peer sent or the network did, the round goes on (issue 10). Stopping still stops."""
        metric = self._SWARM_FAILURE_METRIC[what]
        failures.setdefault(metric, 0.0)
        try:
            return fn(*args)
        except Interrupted:
            raise
        except Exception as e:
            failures[metric] += 1.0
            log.error(f"swarm: {what} failed, this round goes on without sharing: "
                      f"{type(e).__name__}: {e}")
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

    def evaluate(self) -> dict[str, float]:
        """The held-out figures (`eval/...`) of the policy as the sampler now follows it."""
        if self._evaluator is None:
            return {}
        t0 = time.perf_counter()
        try:
            m = self._evaluator.run(self._sampler, self.policy, self.hooks)
        except SamplerError as e:  # the next round's sampling falls back to transformers; skip this one
            log.error(f"held-out evaluation skipped: sampler {self._sampler.name} failed ({e})")
            return {}
        m["time/eval"] = time.perf_counter() - t0
        if self.policy.version == 0:  # untrained: the base model's own figure, no gain to speak of
            gain = " (the base model)"
        elif "eval/gain" in m:
            gain = f", gain {m['eval/gain']:+.3f} ({m['eval/gain_ci_low']:+.3f}..{m['eval/gain_ci_high']:+.3f})"
        else:
            gain = ""
        log.info(f"held-out: solve rate {m['eval/solve_rate']:.3f}{gain}, {m['time/eval']:.0f} s")
        return m

    def _check_drift(self, drift: float | None) -> None:
        """Sampler and trainer disagree on the sampled tokens' log-probs beyond DRIFT_LIMIT: the
        importance ratios are then off from the first step. Sample from the F16 export instead."""
        if drift is None or not drift > DRIFT_LIMIT or self._sampler.name != "llamacpp":
            return
        if self.cfg.sampler.quantization == "f16":
            log.warning(f"sampler log-probs drift {drift:.3f} nats/token from the trainer's "
                        f"(limit {DRIFT_LIMIT}) even on the F16 export")
            return
        log.warning(f"sampler log-probs drift {drift:.3f} nats/token from the trainer's (limit "
                    f"{DRIFT_LIMIT}) with sampler.quantization = {self.cfg.sampler.quantization}: "
                    "switching to the F16 export (set sampler.quantization = \"f16\" to keep it)")
        self.cfg = self.cfg.replace(**{"sampler.quantization": "f16"})
        old = self._sampler
        try:
            self._sampler, self._sampler_reason = make_sampler(self.cfg.sampler, self.policy, paths.cache_dir())
        except SamplerError as e:
            log.error(f"could not start the F16 sampler ({e}); keeping the old one")
            return
        old.close()
        self._sampler.set_threads(self.cfg.sampler.threads or _physical_cores())

    def _sample(self, prompts, seeds, params):
        try:
            return self._sampler.sample(prompts, seeds, params, self.hooks)
        except SamplerError as e:
            # a native crash in llama.cpp must not kill the node: continue on transformers
            log.error(f"sampler {self._sampler.name} failed ({e}); falling back to transformers")
            self._sampler.close()
            self._sampler = make_fallback_sampler(self.policy)
            self._sampler_reason = f"transformers (fallback after: {e})"
            return self._sampler.sample(prompts, seeds, params, self.hooks)

    def _external_ids(self, c: Completion) -> list[int]:
        """A peer's completion as we train it: our token ids of exactly the text we scored (the
        source cut it to our max_new_tokens), with our stop token only if the peer says it
        finished and it was not cut (record v2)."""
        max_new = self.cfg.sampler.max_new_tokens
        full = list(c.token_ids) if c.token_ids is not None else self.policy.encode_completion(c.text)
        ids = full[:max_new]
        return ids + [self.policy.tokenizer.eos_token_id] if c.finished and len(full) <= max_new else ids

    def _drop_unlikely(self, external: list[Group], failures: dict[str, float]) -> list[Group]:
        """Peers' completions under the likelihood floor dropped (counted as `unlikely`, per peer);
        a group left with fewer than two completions or no reward spread goes whole."""
        floor = self.cfg.swarm.likelihood_floor
        failures.setdefault("swarm/unlikely", 0.0)
        if not external or floor >= 0:
            return external
        seqs, owners = [], []
        for gi, g in enumerate(external):
            prompt = self.policy.encode_prompt(self.tasks.messages(g.question))
            for c in g.completions:
                seqs.append(TrainSequence(prompt, self._external_ids(c), 0.0))
                owners.append(gi)
        window = self.cfg.swarm.likelihood_window
        scores = [likelihood_score(lps, window) for lps in self.trainer.completion_logprobs(seqs, self.hooks)]
        by_group: dict[int, list[float]] = defaultdict(list)
        for gi, m in zip(owners, scores):
            by_group[gi].append(m)
        kept: list[Group] = []
        per_peer: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # peer -> [unlikely, completions]
        for gi, g in enumerate(external):
            likely = [c for c, m in zip(g.completions, by_group[gi]) if not m < floor]  # NaN: no tokens, kept
            dropped = len(g.completions) - len(likely)
            per_peer[g.source][0] += dropped
            per_peer[g.source][1] += len(g.completions)
            failures["swarm/unlikely"] += dropped
            if dropped:
                g = Group(g.question, likely, source=g.source, round=g.round, index=g.index)
            if len(g.completions) >= 2 and g.has_signal():
                kept.append(g)
            else:
                failures["swarm/unlikely_groups"] = failures.get("swarm/unlikely_groups", 0.0) + 1
        for peer, (bad, total) in per_peer.items():
            if bad:  # a few honest completions fall under the floor too: a strike only for mostly-unlikely
                self._swarm_step("reject", failures, self._source.reject, peer, "unlikely", bad, 2 * bad > total)
        return kept

    def _training_sequences(self, local: list[Group], prompts: list[list[int]], external: list[Group],
                            failures: dict[str, float] | None = None):
        policy = self.policy
        eos = policy.tokenizer.eos_token_id
        seqs: list[TrainSequence] = []
        trained = 0
        skip_flat = self.cfg.train.kl_beta == 0  # zero advantage and no KL: no gradient at all
        for g, prompt in zip(local, prompts):
            adv = grpo.group_advantages(torch.tensor([g.rewards]))[0].tolist()
            if skip_flat and not g.has_signal():
                continue
            trained += 1
            for c, a in zip(g.completions, adv):
                ids, lps = list(c.token_ids or []), list(c.sample_logprobs or [])
                if c.finished:  # learn to stop: the stop token is part of what was sampled
                    ids, lps = ids + [eos], lps + [float("nan")]  # its sampling log-prob is not reported
                seqs.append(TrainSequence(prompt, ids, a, lps if c.sample_logprobs is not None else None))
        budget = self.cfg.swarm.max_external_tokens or float("inf")
        receipts: list[tuple[str, int, int]] = []
        for g in external:
            adv = grpo.group_advantages(torch.tensor([g.rewards]))[0].tolist()
            if skip_flat and not g.has_signal():
                continue
            # re-tokenised with our tokenizer, as if our policy had written it (paper §3)
            ids = [self._external_ids(c) for c in g.completions]
            tokens = sum(len(x) for x in ids)
            if tokens > budget:  # whole groups only: a group's advantages need all of it
                if failures is not None:
                    failures["swarm/external_tokens_capped"] = failures.get("swarm/external_tokens_capped", 0) + 1
                continue
            budget -= tokens
            trained += 1
            receipts.append((g.source, g.round, g.index))
            prompt = policy.encode_prompt(self.tasks.messages(g.question))
            for x, a in zip(ids, adv):
                seqs.append(TrainSequence(prompt, x, a, None))
        self._receipts = receipts  # published with next round's record
        return seqs, trained

    def _round_figures(self, local, external, trained_groups, samples, timer) -> dict[str, float]:
        per_task: dict[str, list[float]] = defaultdict(list)
        for g in local:
            per_task[g.question.id.dataset].extend(g.rewards)
        rewards = [x for g in local for x in g.rewards]
        m: dict[str, float] = {
            "reward/mean": _mean(rewards),
            "reward/sum": float(sum(rewards)) / max(1, self.shape.group_size),  # per question, as the paper sums
            "accuracy/mean": _mean([1.0 if x >= 1.0 else 0.0 for x in rewards]),
            "groups/local": float(len(local)),
            "groups/local_with_signal": float(sum(g.has_signal() for g in local)),
            "groups/external": float(len(external)),
            "groups/external_share": len(external) / max(1, len(local) + len(external)),
            "groups/trained": float(trained_groups),
            "round/local_groups": float(self.shape.local),
            "round/external_groups": float(self.shape.external),
            "round/group_size": float(self.shape.group_size),
        }
        for task in self.tasks.datasets:
            m[f"curriculum/{task}_level"] = float(self.tasks.curriculum.level(task))
        for task, xs in per_task.items():
            m[f"reward/{task}"] = _mean(xs)
            m[f"accuracy/{task}"] = _mean([1.0 if x >= 1.0 else 0.0 for x in xs])
        if external:
            m["reward/external_mean"] = _mean([x for g in external for x in g.rewards])
        n_tok = sum(len(s.token_ids) for group in samples for s in group)
        n_seq = sum(len(group) for group in samples)
        m["tokens/sampled"] = float(n_tok)
        m["completions/mean_tokens"] = n_tok / max(1, n_seq)
        m["completions/finished_frac"] = _mean([1.0 if s.finished else 0.0 for group in samples for s in group])
        m["sampler/tok_per_s"] = n_tok / timer.seconds["sample"] if timer.seconds["sample"] > 0 else 0.0
        m["sampler/backend_llamacpp"] = 1.0 if self._sampler.name == "llamacpp" else 0.0
        for phase, secs in timer.seconds.items():
            m[f"time/{phase}"] = secs
        return m

    def _save(self, r: int, metrics: dict[str, float], started: float) -> None:
        state = CheckpointState(
            round=r, model_id=self.policy.model_id, lora_rank=self.policy.lora_rank,
            policy_version=self.policy.version,
            extra={"metrics": metrics, "started": started, "shape": self.shape.__dict__.copy(),
                   "tasks": self.tasks.state_dict()},
        )
        self.checkpoints.save(state, self.policy.trainable_state_dict(), self.trainer.state_dict())

    def _autoscale(self, seconds: float) -> None:
        if not self.cfg.round.auto_scale:
            return
        target = self.cfg.round.target_round_seconds
        limit = RoundShape(self.cfg.round.local_groups, self.cfg.round.external_groups, self.cfg.sampler.group_size)
        before = dict(self.shape.__dict__)
        if seconds > 1.5 * target and self.shape.shrink():
            why = f"round took {seconds:.0f} s, target {target:.0f} s"
        elif seconds < 0.4 * target and self.shape.grow(limit):
            why = f"round took {seconds:.0f} s, well under {target:.0f} s"
        else:
            return
        log.info(f"round size {before} -> {self.shape.__dict__}: {why}")

    # --- control ------------------------------------------------------------------------
    def choose_threads(self) -> int:
        """sampler.threads when set; else what the CPU has free now, within the user's limit
        (threadplan.py; the worker's governor adapts it while running)."""
        if self.cfg.sampler.threads:
            return self.cfg.sampler.threads
        from sapo_core.control.threads import others_now
        from sapo_core.threadplan import choose_threads, cpu_limit

        cores, c = _physical_cores(), self.cfg.control
        limit, why = cpu_limit(cores, c.max_cpus_percent, c.leave_cores)
        choice = choose_threads(cores, others_now(0.5), limit)
        log.info(f"threads: {choice.reason}; {why}")
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


@dataclass(frozen=True)
class ModelPlan:
    gguf: Path | None  # the GGUF to train (None for tiny-random)
    tokenizer_gguf: Path | None  # the GGUF whose tokenizer tiny-random borrows
    model_id: str
    micro_batch_size: int
    why: str


def resolve_model(cfg: NodeConfig, hooks: RoundHooks | None = None) -> ModelPlan:
    """Which model this node trains, from which file, at which micro-batch, and why. A model not
    downloaded yet is fetched here, its progress reported through `hooks` (downloads.py)."""
    micro = cfg.train.micro_batch_size
    if cfg.model.gguf_path:
        p = Path(cfg.model.gguf_path).expanduser()
        if not p.is_file():
            raise NodeError(f"model.gguf_path {p} does not exist")
        name = cfg.model.name if cfg.model.name != "auto" else p.stem
        return ModelPlan(p, None, name, micro, f"{p.name} (model.gguf_path)")
    from sapo_core import modelfiles

    if cfg.model.name == TINY_RANDOM:
        return ModelPlan(None, modelfiles.embedded_gguf_path(), TINY_RANDOM, micro,
                         "tiny-random (test model, random weights)")
    hooks = hooks or NullHooks()
    # the worker's Controller has `stop_reason`: a stop asked mid-download ends it (other hooks: never)
    report = DownloadReport(hooks.progress,
                            should_stop=lambda: getattr(hooks, "stop_reason", None) is not None)
    sel = modelfiles.model_for_config(cfg, report)
    return ModelPlan(sel.path, None, sel.model_id, sel.micro_batch_size, sel.why)


def eval_within_share(last_eval_seconds: float, rounds_seconds_since: float, share: float) -> bool:
    """Whether one more evaluation as long as the last keeps evaluation within `share` of the
    node's time: the rounds since the last one took at least (1 - share) / share times as long."""
    return share >= 1 or rounds_seconds_since * share >= last_eval_seconds * (1 - share)


class _PhaseTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t0


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def _physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


__all__ = ["Node", "NodeError", "ModelPlan", "RoundShape", "resolve_model", "mixed_seed"]
