"""Import a few modules of a large package without running its package `__init__` files.

A package whose `__init__` imports everything it has (hivemind: torch with its averager;
reasoning-gym: ninety task families with numpy and matplotlib) costs a process that needs one
corner of it the memory of all of it. `empty_packages` puts empty module objects for the named
packages in `sys.modules` (their `__path__` set, their `__init__` not run), so importing a
submodule runs only that module and what it imports itself. It leans on the package's layout:
callers check what they got and `forget` the package to fall back to the usual import
(sapo_core/gym.py, sapo_core/swarm/leandht.py).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterable

LEAN = "__sapo_lean__"  # set on the empty package modules: the process has the lean import


def package_dir(top: str) -> str | None:
    """Where an installed top-level package lives, without importing it (None: not installed)."""
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def empty_packages(top: str, root: str, names: Iterable[str]) -> None:
    """Empty modules for `top` and its subpackages `names` (dotted, e.g. "hivemind.utils"), in
    that order, each set as an attribute of its parent as an import would."""
    for name in names:
        package = types.ModuleType(name)
        package.__path__ = [root + name[len(top) :].replace(".", "/")]
        package.__package__ = name
        setattr(package, LEAN, True)
        sys.modules[name] = package
        if "." in name:
            parent, child = name.rsplit(".", 1)
            setattr(sys.modules[parent], child, package)


def forget(top: str) -> None:
    """Drop `top` and all its submodules from `sys.modules`: the next import starts afresh."""
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def is_lean(top: str) -> bool:
    return getattr(sys.modules.get(top), LEAN, False)
