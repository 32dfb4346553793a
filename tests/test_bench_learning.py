"""`sapo-bench learning`'s one line: the gain, each dataset's, and the gain per CPU-hour."""

from sapo_core.bench.learning import summary_line


def test_the_line_names_every_dataset_and_the_gain_per_cpu_hour():
    last = {
        "eval/solve_rate_base": 0.15,
        "eval/solve_rate": 0.37,
        "eval/gain": 0.22,
        "eval/gain_ci_low": 0.14,
        "eval/gain_ci_high": 0.31,
        "eval/basic_arithmetic/solve_rate": 0.63,
        "eval/basic_arithmetic/gain": 0.48,
        "eval/basic_arithmetic/gain_ci_low": 0.38,
        "eval/basic_arithmetic/gain_ci_high": 0.58,
        "eval/calendar_arithmetic/gain": 0.02,
        "eval/calendar_arithmetic/gain_ci_low": -0.06,
        "eval/calendar_arithmetic/gain_ci_high": 0.10,
    }
    line = summary_line(last, 150, 56.2, 2.0)
    assert line.startswith("learning: solved base 0.15 -> 0.37 after 150 rounds, gain +0.22 (95% CI +0.14..+0.31)")
    assert "+0.11 per CPU-hour" in line
    assert "basic_arithmetic +0.48 (+0.38..+0.58); calendar_arithmetic +0.02 (-0.06..+0.10)" in line
    assert line.endswith("56 min, 2.00 CPU-hours")
