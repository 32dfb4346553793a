"""The round's sample and score phases: our own groups, G completions of each question scored with
our own rewards, and DAPO's dynamic sampling (`round.refill_passes`).

Seeds derive from (node seed, identity, round, question): nodes at the same round draw different
per-token randomness, and a refill's draws differ from the round's first.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, NamedTuple

from sapo_core.config import NodeConfig
from sapo_core.figures import PhaseTimer
from sapo_core.hooks import RoundHooks
from sapo_core.policy import Policy
from sapo_core.rollouts import Completion, Group
from sapo_core.sampler import SampledSequence, SamplingParams
from sapo_core.sampler.resilient import ResilientSampler
from sapo_core.tasks import TaskSet

log = logging.getLogger(__name__)

ADOPT_PART = 1000  # the sampling seeds' part for peers' adopted questions (refills use 1, 2, ...)


def mixed_seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest(), "little")


class Refill(NamedTuple):
    """Our groups with reward spread after dynamic sampling, their prompts, and its figures."""

    groups: list[Group]  # ours with spread, the first draw's then the refills'
    prompts: list[list[int]]
    extra: list[Group]  # the refills' groups with spread
    figures: dict[str, float]


class OwnGroups:
    """Our groups of questions: sampled through the node's sampler, scored by its tasks."""

    def __init__(
        self,
        cfg: NodeConfig,
        tasks: TaskSet,
        policy: Policy,
        sampler: ResilientSampler,
        hooks: RoundHooks,
        identity: str,
    ) -> None:
        self.cfg, self.tasks, self.policy, self.sampler, self.hooks = cfg, tasks, policy, sampler, hooks
        self.identity = identity

    def prompt(self, question) -> list[int]:
        return self.policy.encode_prompt(self.tasks.messages(question))

    def sample_and_score(
        self, r: int, questions, timer: PhaseTimer, group_size: int, part: int = 0
    ) -> tuple[list[Group], list[list[int]], list[list[SampledSequence]]]:
        """Our groups of `questions` (`group_size` completions each, scored with our own rewards,
        fed to the curriculum unless they are peers' questions: part ADOPT_PART), their encoded
        prompts and the raw samples."""
        cfg, hooks, policy = self.cfg, self.hooks, self.policy
        with timer("sample"):
            prompts = [self.prompt(q) for q in questions]
            # the identity too: nodes at the same round must not draw the same per-token randomness
            seeds = [mixed_seed(cfg.seed, self.identity, r, k) for k in range(len(questions))]
            if part:  # a refill's draws must differ from the round's first
                seeds = [mixed_seed(s, "refill", part) for s in seeds]
            params = SamplingParams.for_config(cfg.sampler, n=group_size, stop_token_ids=policy.eos_ids)
            samples = self.sampler.sample(prompts, seeds, params, hooks)
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

    def refill(
        self, r: int, local: list[Group], prompts: list[list[int]], timer: PhaseTimer, want: int, group_size: int
    ) -> Refill | None:
        """DAPO's dynamic sampling (arXiv 2503.14476): while fewer of our groups than `want` (I)
        have reward spread, draw as many new questions as are missing, at most round.refill_passes
        times (None with no passes). What trains is the groups with spread; the round's reward
        figures stay the first draw's."""
        if not self.cfg.round.refill_passes:
            return None
        groups = [g for g in local if g.has_signal()]
        prompts = [p for g, p in zip(local, prompts) if g.has_signal()]
        extra: list[Group] = []
        sampled = 0
        for part in range(1, self.cfg.round.refill_passes + 1):
            missing = want - len(groups) - len(extra)
            if missing <= 0:
                break
            more, more_prompts, _ = self.sample_and_score(
                r, self.tasks.sample_questions(r, missing, part), timer, group_size, part
            )
            sampled += len(more)
            extra += [g for g in more if g.has_signal()]
            prompts += [p for g, p in zip(more, more_prompts) if g.has_signal()]
        figures = {"groups/refill_sampled": float(sampled), "groups/refill_with_signal": float(len(extra))}
        return Refill(groups + extra, prompts, extra, figures)


__all__ = ["ADOPT_PART", "OwnGroups", "Refill", "mixed_seed"]
