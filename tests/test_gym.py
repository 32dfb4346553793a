"""sapo_core.gym: the paper's nine ReasoningGYM datasets loaded alone give the same questions,
answers and scores as the whole package, in a fresh process that never imports the rest."""

from __future__ import annotations

import json
import subprocess
import sys

import reasoning_gym  # the whole package, in this process: the reference

from sapo_core.tasks import LEVELS

# items of every level of every dataset, with each reference answer's score, as JSON
_DUMP = r"""
import json, sys
from sapo_core import gym
from sapo_core.tasks import LEVELS
out = {}
for name, levels in sorted(LEVELS.items()):
    for i, config in enumerate(levels):
        data = gym.create_dataset(name, seed=11, size=1000, **config)
        items = [data[k] for k in (0, 1, 999)]
        out[f"{name}/{i}"] = [[x["question"], x["answer"], data.score_answer(x["answer"], x)] for x in items]
print("\n" + json.dumps({"lean": gym.is_lean(), "heavy": sorted(m for m in ("numpy", "matplotlib") if m in sys.modules),
                  "items": out}))  # after the dots bf prints while it builds a program
"""


def _reference() -> dict:
    out = {}
    for name, levels in sorted(LEVELS.items()):
        for i, config in enumerate(levels):
            data = reasoning_gym.create_dataset(name, seed=11, size=1000, **config)
            items = [data[k] for k in (0, 1, 999)]
            out[f"{name}/{i}"] = [[x["question"], x["answer"], data.score_answer(x["answer"], x)] for x in items]
    return json.loads(json.dumps(out))


def _run(code: str) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def test_the_nine_datasets_alone_match_the_whole_package_and_leave_numpy_out():
    got, _ = _run(_DUMP)
    assert got["lean"] is True and got["heavy"] == []
    assert got["items"] == _reference()
    assert len(got["items"]) == sum(len(v) for v in LEVELS.values())


def test_a_changed_layout_falls_back_to_the_whole_package_and_says_so():
    broken = "import sapo_core.gym as g; g._MODULES['bf'] = 'code.no_such_module'\n" + _DUMP
    got, stderr = _run("import logging; logging.basicConfig()\n" + broken)
    assert got["lean"] is False and "numpy" in got["heavy"]  # the whole package, and it works
    assert got["items"] == _reference()
    assert "did not load alone" in stderr and "no_such_module" in stderr
