"""`sapo-bench contention` compares the same work: rates, not the seconds of rounds that drew
different questions."""

import math

import pytest

from sapo_core.bench.contention import slowdown


def test_a_smaller_round_beside_load_is_not_faster_than_the_quiet_one():
    # what the benchmark once read as 0.4x: a quiet 21.5 s round of ~1,350 trained tokens against a
    # contended 8.1 s round of ~550; the rates say the contended work ran slower, not faster
    quiet = {"sample": 4.9, "update": 16.5, "sample_tok_s": 60.0, "train_tok_s": 82.0}
    busy = {"sample": 2.0, "update": 6.1, "sample_tok_s": 50.0, "train_tok_s": 77.0}
    assert slowdown(quiet, busy) == pytest.approx((4.9 * 60 / 50 + 16.5 * 82 / 77) / 21.4)
    assert slowdown(quiet, busy) > 1


def test_a_phase_that_did_not_run_is_left_out():
    quiet = {"sample": 3.0, "update": 0.0, "sample_tok_s": 60.0, "train_tok_s": 0.0}
    busy = {"sample": 5.0, "update": 9.0, "sample_tok_s": 30.0, "train_tok_s": 70.0}
    assert slowdown(quiet, busy) == pytest.approx(2.0)
    assert math.isnan(slowdown({**quiet, "sample": 0.0}, busy))
