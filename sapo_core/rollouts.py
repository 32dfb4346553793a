"""The data a round moves around: questions, completions and groups (the paper's "rollouts").

Plain dataclasses, no heavy imports: the swarm encodes them for peers, the store and the
GUI read their figures. A `QuestionId` is enough for any node to regenerate the question
and its answer (ReasoningGYM is deterministic by seed), which is how a node checks what
a peer sends instead of believing it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class QuestionId:
    """(dataset, config digest, seed, index) names one ReasoningGYM question everywhere."""

    dataset: str
    config_digest: str  # hex digest of the dataset's config, see tasks.config_digest
    seed: int
    index: int

    def key(self) -> str:
        return f"{self.dataset}/{self.config_digest}/{self.seed}/{self.index}"

    def topic(self) -> str:
        """The dataset and level (its config digest) the question belongs to."""
        return f"{self.dataset}/{self.config_digest}"


@dataclass(frozen=True)
class Question:
    id: QuestionId
    text: str  # the question as ReasoningGYM words it, before our prompt template
    answer: str  # ReasoningGYM's reference answer (never taken from a peer)
    entry: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # for the scorer


@dataclass
class Completion:
    """One sampled answer. For a peer's: our tokenizer's ids of the scored text, and the peer's
    sampling log-probs where it sent them (swarm/verify.py)."""

    text: str
    token_ids: list[int] | None = None  # ours; for a peer's: our tokenizer's ids of exactly the scored text
    sample_logprobs: list[float] | None = None  # the sampler's log-prob of each token
    finished: bool = True  # ended at EOS (False: cut at max_new_tokens)
    reward: float = 0.0
    # a peer's log-probs that did not line up with our tokens (another tokenizer): their total,
    # spread evenly over our tokens; only the sequence's mean ratio means anything (trainer.py)
    logprobs_spread: bool = False


@dataclass
class Group:
    """A question with its G completions, and where it came from."""

    question: Question
    completions: list[Completion]
    source: str = "local"  # "local" or the peer's id
    round: int = 0  # the producer's round number
    index: int = 0  # the group's position in its producer's record (names it in receipts)

    @property
    def rewards(self) -> list[float]:
        return [c.reward for c in self.completions]

    @property
    def is_local(self) -> bool:
        return self.source == "local"

    def has_signal(self) -> bool:
        """False when all rewards are equal: such a group gives zero advantage (paper's filter)."""
        r = self.rewards
        return len(r) > 1 and max(r) - min(r) > 1e-9


def one_per_question(groups: Iterable[Group]) -> Iterator[Group]:
    """The first group of each question, in the order given: a question taken twice teaches once."""
    seen: set[str] = set()
    for g in groups:
        key = g.question.id.key()
        if key not in seen:
            seen.add(key)
            yield g
