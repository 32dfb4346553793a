"""How much a round holds on this machine: I local groups, J external, G completions each.

A volunteer's computer may be far slower than the one the configuration was written for. With
`round.auto_scale`, a round that took more than 1.5 times `round.target_round_seconds` halves
I and J (never below 1, J kept at 0 when training alone), then G (never below 4); a round under
0.4 times the target grows them back, G first, up to what the configuration asks. The shape is
saved with each checkpoint, so a restarted node runs at the size it had reached.
"""

from __future__ import annotations

from dataclasses import dataclass

SHRINK_ABOVE = 1.5  # x target: a round this slow shrinks the next
GROW_BELOW = 0.4  # x target: a round this fast grows the next


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

    def grow(self, limit: RoundShape) -> bool:
        if self.group_size < limit.group_size:
            self.group_size = min(limit.group_size, self.group_size * 2)
            return True
        if self.local < limit.local or self.external < limit.external:
            self.local = min(limit.local, self.local * 2)
            self.external = min(limit.external, max(1, self.external * 2) if limit.external else 0)
            return True
        return False

    def rescale(self, seconds: float, target: float, limit: RoundShape) -> str | None:
        """Shrink or grow after a round that took `seconds`; the reason when the shape changed."""
        before = dict(self.__dict__)
        if seconds > SHRINK_ABOVE * target and self.shrink():
            why = f"round took {seconds:.0f} s, target {target:.0f} s"
        elif seconds < GROW_BELOW * target and self.grow(limit):
            why = f"round took {seconds:.0f} s, well under {target:.0f} s"
        else:
            return None
        return f"round size {before} -> {self.__dict__}: {why}"


__all__ = ["RoundShape"]
