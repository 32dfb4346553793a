"""The engine's modules import each other in one direction: no import cycle in sapo_core.

Imports inside functions count too: a cycle hidden in a function-level import still ties two
layers together (run_probe, which drives a Node, once sat in probe.py, which node.py's model
resolution read). docs/architecture.md describes the layers.

Rooms stay small (STYLE.md, habit 10): no module of sapo_core/ or app/ over 500 lines, the round
loop's node.py within 400, no function over 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str = "sapo_core") -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in its source (absolute imports)."""
    files = {_module_name(p): p for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:  # `from pkg import module` names a module, else the package
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in files else node.module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_that():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_sapo_core_has_no_import_cycle():
    graph = import_graph()
    assert "sapo_core.node" in graph and "sapo_core.modelfiles" in graph["sapo_core.node"]
    assert cycles(graph) == []


GUI_MODULES = ("PySide6", "shiboken6", "pyqtgraph", "app")


def test_sapo_core_never_imports_qt_or_the_app():
    """The engine runs without a display (the node, the benchmarks, a seed): whatever needs the
    app's window lives in app/ and is started as a process (app.soakwatch, app.guibench)."""
    offenders = []
    for path in (ROOT / "sapo_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in GUI_MODULES]
    assert offenders == []


MAX_MODULE_LINES = 500
MAX_NODE_LINES = 400  # the round loop should read on a few screens; its helpers live beside it
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(p for package in ("sapo_core", "app") for p in (ROOT / package).rglob("*.py"))


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_500_lines():
    offenders = [f"{p.relative_to(ROOT)}: {n}" for p in _sources() if (n := _line_count(p)) > MAX_MODULE_LINES]
    assert offenders == [], f"modules over {MAX_MODULE_LINES} lines, split by concern: {offenders}"


def test_the_node_module_is_within_400_lines():
    n = _line_count(ROOT / "sapo_core" / "node.py")
    assert n <= MAX_NODE_LINES, f"sapo_core/node.py has {n} lines, more than {MAX_NODE_LINES}"


def test_no_function_is_over_80_lines():
    """Counted from the `def` line to the last line of the body, docstring included; nested
    functions on their own as well as inside their parent."""
    offenders = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n}")
    assert offenders == [], f"functions over {MAX_FUNCTION_LINES} lines, split into named steps: {offenders}"
