"""The node's side of the round's swarm phases (share, gather, likelihood): opening the configured
swarm, running its steps so that a failure costs the round its sharing and nothing more, and the
likelihood judges of peers' completions.

Peer data is untrusted and the network unreliable: a step that raises is counted under its
`swarm/...` failure figure and logged; stopping (`Interrupted`) still stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from sapo_core.adopt import right_completions
from sapo_core.batch import external_token_ids
from sapo_core.config import NodeConfig, SwarmConfig
from sapo_core.control import vocabulary as K
from sapo_core.hooks import Interrupted, RoundHooks
from sapo_core.policy import Policy
from sapo_core.rollouts import Group
from sapo_core.swarm.likelihood import filter_unlikely
from sapo_core.tasks import TaskSet
from sapo_core.trainer import Trainer, TrainSequence

log = logging.getLogger(__name__)

# metric counting a swarm step that raised (swarm/publish_failed is taken: failed DHT stores)
FAILURE_METRIC = {
    "publish": "swarm/publish_raised",
    "gather": "swarm/gather_failed",
    "stats": "swarm/stats_failed",
    "reject": "swarm/reject_failed",
}


def open_source(cfg: NodeConfig, policy: Policy, identity_dir: Path, hooks: RoundHooks):
    """The configured swarm's rollout source, or None when this node runs alone."""
    if not cfg.swarm.enabled or cfg.round.external_groups == 0:
        return None
    from sapo_core.swarm.selection import NeedChoice
    from sapo_core.swarm.source import open_swarm
    from sapo_core.swarm.verify import CompletionCutter

    # the verifier regenerates peers' questions: its own seed is irrelevant there; the cutter
    # is our tokenizer and max_new_tokens, to score peers' text exactly as it is trained
    verifying = TaskSet(cfg.tasks, seed=cfg.seed)
    cutter = CompletionCutter.for_tokenizer(policy.tokenizer, cfg.sampler.max_new_tokens)
    choice = NeedChoice() if cfg.swarm.choice == "need" else None  # None: the paper's UniformChoice
    return open_swarm(cfg.swarm, verifying, identity_dir, hooks, cutter=cutter, choice=choice)


def swarm_step(what: str, failures: dict[str, float], fn, *args):
    """fn(*args), or None after counting it (FAILURE_METRIC) and logging: whatever a peer sent or
    the network did, the round goes on. Stopping still stops."""
    metric = FAILURE_METRIC[what]
    failures.setdefault(metric, 0.0)
    try:
        return fn(*args)
    except Interrupted:
        raise
    except Exception as e:
        failures[metric] += 1.0
        log.error(f"swarm: {what} failed, this round goes on without sharing: {type(e).__name__}: {e}")
        return None


def describe_self(source, after_round: int, m: dict) -> None:
    """Our latest held-out figure, in our next index entries (the swarm's page shows it, labelled
    self-reported)."""
    if source is None or not hasattr(source, "describe") or "eval/solve_rate" not in m:
        return
    n = max(1, int(m.get("eval/samples", 1)) * int(m.get("eval/questions", 1)))
    source.describe(held_out=(after_round, float(m["eval/solve_rate"]), n))


class PeerJudges:
    """Per-token log-probs of peers' (group, completion) pairs, exactly as they would train: under
    our policy, or under the base model (the LoRA adapter off)."""

    def __init__(
        self, policy: Policy, trainer: Trainer, prompt: Callable, max_new_tokens: int, hooks: RoundHooks
    ) -> None:
        self.policy, self.trainer, self.prompt, self.max_new, self.hooks = (
            policy,
            trainer,
            prompt,
            max_new_tokens,
            hooks,
        )

    def policy_logprobs(self, pairs) -> list[list[float]]:
        prompts = {}  # a group's prompt encoded once, not per completion
        for g, _ in pairs:
            if id(g) not in prompts:
                prompts[id(g)] = self.prompt(g.question)
        seqs = [TrainSequence(prompts[id(g)], external_token_ids(self.policy, c, self.max_new), 0.0) for g, c in pairs]
        return self.trainer.completion_logprobs(seqs, self.hooks)

    def base_logprobs(self, pairs) -> list[list[float]]:
        with self.policy.model.disable_adapter():
            return self.policy_logprobs(pairs)

    def keep_likely(self, external: list[Group], s: SwarmConfig, source, failures: dict[str, float]) -> list[Group]:
        """Peers' groups less the completions our judge finds implausible (swarm/likelihood.py),
        counted as `unlikely`; a peer most of whose completions were is struck at `source`. Under
        swarm.take = mixed a group stays while it holds a right completion (we adopt its question)."""
        judges = {
            "policy": [self.policy_logprobs],
            "base": [self.base_logprobs],
            "either": [self.policy_logprobs, self.base_logprobs],
        }[s.likelihood_judge if self.policy.lora else "policy"]
        keeps = (lambda g: bool(right_completions(g))) if s.take == "mixed" else None
        verdict = filter_unlikely(external, judges, s.likelihood_floor, s.likelihood_window, keeps)
        failures[K.SWARM_UNLIKELY] = float(verdict.unlikely)
        if s.likelihood_floor < 0:  # on: every completion of these groups was scored
            failures[K.SWARM_JUDGED] = float(sum(len(g.completions) for g in external))
        if verdict.groups_dropped:
            failures[K.SWARM_UNLIKELY_GROUPS] = float(verdict.groups_dropped)
        for peer, (bad, strike) in verdict.peers.items():
            swarm_step("reject", failures, source.reject, peer, "unlikely", bad, strike)
        return verdict.kept


__all__ = ["FAILURE_METRIC", "PeerJudges", "describe_self", "open_source", "swarm_step"]
