"""`sapo-bench` lists its benchmarks, and each one's options parse (without running it)."""

from __future__ import annotations

import pytest

from sapo_core.bench.cli import BENCHMARKS, main


def test_help_lists_every_benchmark(capsys) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["--help"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    for name, _help_text in BENCHMARKS:
        assert name in out
    assert "25/50/75%" in out  # argparse's % formatting does not eat the help text


@pytest.mark.parametrize("name", [name for name, _ in BENCHMARKS])
def test_each_benchmark_has_help(name: str, capsys) -> None:
    with pytest.raises(SystemExit) as ex:
        main([name, "--help"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    assert "usage: sapo-bench " + name in out
    assert "%%" not in out  # the description is printed as written, not %-formatted


def test_no_benchmark_named_prints_help_and_fails(capsys) -> None:
    assert main([]) == 2
    assert "BENCHMARK" in capsys.readouterr().out
