"""The packaged app's one executable: PyInstaller's entry script (installer/sapo-swarm.spec).

A package carries one executable, `sapo-swarm`, and links to it named `sapo-node`, `sapo-bench`
and `sapo-experiment`: the name it is started by picks the command, as the console scripts of a
pip install do. In a package `sys.executable` is this executable, and the app starts its helpers
the way it starts them from a source install, `sys.executable -m sapo_core.cli ...` (the node,
doctor, the hardware scan) or `sys.executable -c CODE` (doctor's checks): those two forms run
here as Python runs them. multiprocessing's children (`sapo-experiment --jobs N`) come back
through `freeze_support`.
"""

from __future__ import annotations

import importlib
import multiprocessing
import runpy
import sys

ENTRIES = {
    "sapo-swarm": "app.main:main",
    "sapo-node": "sapo_core.cli:main",
    "sapo-bench": "sapo_core.bench.cli:main",
    "sapo-experiment": "sapo_core.experiment:main",
}
# Options the interpreter takes before -m/-c that change nothing a package can change.
_NO_VALUE = {"-u", "-B", "-s", "-E", "-I", "-O", "-OO", "-S", "-q"}


def command_name(argv0: str) -> str:
    name = argv0.replace("\\", "/").rsplit("/", 1)[-1]  # either separator: the spec builds for Windows too
    name = name[:-4] if name.lower().endswith(".exe") else name
    return name if name in ENTRIES else "sapo-swarm"


def main() -> int | str | None:
    multiprocessing.freeze_support()
    args = sys.argv[1:]
    while args and (args[0] in _NO_VALUE or args[0] == "-X"):
        del args[: 2 if args[0] == "-X" else 1]
    if len(args) >= 2 and args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return None
    if len(args) >= 2 and args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102
        return None
    module, _, function = ENTRIES[command_name(sys.argv[0])].partition(":")
    return getattr(importlib.import_module(module), function)()


if __name__ == "__main__":
    sys.exit(main())
