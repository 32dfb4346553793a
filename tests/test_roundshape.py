"""Round auto-scaling: I, J and G halve on slow rounds within their floors and grow back on fast ones."""

from __future__ import annotations

from sapo_core.roundshape import RoundShape


def test_round_shape_shrinks_and_grows_within_limits():
    s = RoundShape(4, 4, 8)
    seen = []
    while s.shrink():
        seen.append((s.local, s.external, s.group_size))
    assert seen == [(2, 2, 8), (1, 1, 8), (1, 1, 4)]
    limit = RoundShape(4, 4, 8)
    while s.grow(limit):
        pass
    assert (s.local, s.external, s.group_size) == (4, 4, 8)
    alone = RoundShape(4, 0, 8)
    alone.shrink()
    assert alone.external == 0


def test_rescale_acts_only_outside_the_band_around_the_target():
    limit = RoundShape(4, 4, 8)
    s = RoundShape(4, 4, 8)
    assert s.rescale(150.0, 100.0, limit) is None  # 1.5 x the target: not yet
    assert s.rescale(41.0, 100.0, limit) is None  # over 0.4 x: stays
    said = s.rescale(151.0, 100.0, limit)
    assert (s.local, s.external, s.group_size) == (2, 2, 8)
    assert said == (
        "round size {'local': 4, 'external': 4, 'group_size': 8} -> "
        "{'local': 2, 'external': 2, 'group_size': 8}: round took 151 s, target 100 s"
    )
    assert "well under 100 s" in s.rescale(39.0, 100.0, limit) and (s.local, s.external) == (4, 4)
    assert s.rescale(39.0, 100.0, limit) is None  # at the configured size: nothing to grow
    floor = RoundShape(1, 1, 4)
    assert floor.rescale(1000.0, 100.0, limit) is None  # at the floor: nothing to shrink
