"""ReasoningGYM's nine paper datasets without the other ninety: `create_dataset`.

`import reasoning_gym` imports every task family it has (games, graphs, ARC, cognition...) and,
through cellpylib, numpy and matplotlib: 110 MB of RSS and a second of start-up in every process
that regenerates or scores a question (the node, its worker, the seed's page). SAPO Swarm uses
the nine datasets of `config.PAPER_SPECIALTIES` and only `create_dataset`. A dataset registers
itself when its own module is imported, so `create_dataset` here loads the package's registry
(`reasoning_gym.factory`) and those nine modules under empty package modules (their families'
`__init__` is not run): 17 MB (measured on reasoning-gym 0.1.19).

This leans on reasoning-gym's module layout (`_MODULES`), so it checks itself: a failure undoes
the empty packages, logs why, and falls back to the whole package (it works, only heavier). Where
the whole package was imported already (a test, a notebook), it is used as it is.
`tests/test_gym.py` checks every dataset's items against the whole package's, byte for byte.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from typing import Any

from sapo_core import leanimport, paths
from sapo_core.config import PAPER_SPECIALTIES

log = logging.getLogger(__name__)

# dataset -> the module (under reasoning_gym) that registers it
_MODULES = {
    "base_conversion": "algorithmic.base_conversion",
    "basic_arithmetic": "arithmetic.basic_arithmetic",
    "arc_1d": "arc.arc_1d",
    "bf": "code.bf",
    "propositional_logic": "logic.propositional_logic",
    "fraction_simplification": "arithmetic.fraction_simplification",
    "decimal_arithmetic": "arithmetic.decimal_arithmetic",
    "calendar_arithmetic": "arithmetic.calendar_arithmetic",
    "binary_matrix": "algorithmic.binary_matrix",
}
assert set(_MODULES) == set(PAPER_SPECIALTIES), "a paper dataset without its module here"

_lock = threading.Lock()
_factory: Any = None


def create_dataset(name: str, **kwargs: Any) -> Any:
    """`reasoning_gym.create_dataset` for one of the paper's nine datasets."""
    return _load().create_dataset(name, **kwargs)


def is_lean() -> bool:
    """Whether this process loaded only the nine datasets (False: the whole package, or not yet)."""
    return leanimport.is_lean("reasoning_gym")


def _load() -> Any:
    global _factory
    with _lock:
        if _factory is None:
            paths.keep_matplotlib_cache_in_ours()  # the fallback imports matplotlib
            _factory = _lean() or importlib.import_module("reasoning_gym")
        return _factory


def _lean() -> Any:
    """reasoning_gym.factory with the nine datasets registered, or None (whole package wanted)."""
    if "reasoning_gym" in sys.modules:
        return None  # imported already, whole or by us: use it as it is
    root = leanimport.package_dir("reasoning_gym")
    if root is None:
        return None  # not installed: the usual import says so
    try:
        families = sorted({f"reasoning_gym.{m.split('.')[0]}" for m in _MODULES.values()})
        leanimport.empty_packages("reasoning_gym", root, ["reasoning_gym", *families])
        importlib.import_module("reasoning_gym.coaching")  # before factory: the package's own order
        factory = importlib.import_module("reasoning_gym.factory")
        sys.modules["reasoning_gym"].create_dataset = factory.create_dataset
        for module in _MODULES.values():
            importlib.import_module(f"reasoning_gym.{module}")
        missing = set(_MODULES) - set(factory.DATASETS)
        if missing:
            raise ImportError(f"{', '.join(sorted(missing))} not registered (reasoning-gym's layout changed)")
    except Exception as e:  # noqa: BLE001 (any failure: fall back to the whole package)
        leanimport.forget("reasoning_gym")
        log.warning("ReasoningGYM's nine datasets did not load alone (%s); importing the whole package", e)
        return None
    return factory
