"""The layout keeps its promises (docs/architecture.md, section 3a): the decision code imports neither SimPy nor
torch, `traces` takes from `sim` only its config and errors, imports at module level form no cycle, engines touch no
private SimPy attribute, and no test module imports another."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGES = ("sim", "traces", "validate")


def _modules(*folders: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``folders`` (relative to the root)."""
    out = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path, module_level_only: bool = False) -> set[str]:
    """The absolute module names ``path`` imports (``from a import b`` gives ``a`` and ``a.b``)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _roots(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("folder", ["sim/core", "sim/policies", "sim/predictors"])
def test_the_decision_code_imports_neither_simpy_nor_torch(folder):
    """The validator runs the same decisions on a machine with torch only, and the simulator without torch."""
    for name, path in _modules(folder).items():
        assert not _roots(_imports(path)) & {"simpy", "torch"}, f"{name} imports SimPy or torch"


def test_traces_takes_from_sim_only_its_config_and_errors():
    for name, path in _modules("traces").items():
        from_sim = {n for n in _imports(path) if n == "sim" or n.startswith("sim.")}
        stray = {n for n in from_sim if not re.match(r"sim\.(config(\.|$)|errors(\.|$))", n)}
        assert not stray, f"{name} imports {sorted(stray)}"


def test_module_level_imports_form_no_cycle():
    mods = _modules(*PACKAGES)
    graph = {name: {n for n in _imports(path, module_level_only=True) if n in mods} for name, path in mods.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep) :] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, path + [dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_no_code_touches_private_simpy_state():
    """SimPy's public API only (``now``, ``peek``, ``step``, ``timeout``, ``process``, events): another process may
    share the environment."""
    private = re.compile(r"\b(env|environment|self\.env)\._(now|queue|eid)\b")
    for name, path in _modules(*PACKAGES).items():
        hits = [i + 1 for i, line in enumerate(path.read_text().splitlines()) if private.search(line)]
        assert not hits, f"{name}: private SimPy state at lines {hits}"


def test_no_test_module_imports_another():
    """Shared helpers live in tests/support/, restated reference rules in tests/reference/."""
    tests = {n: p for n, p in _modules("tests").items() if p.name.startswith("test_")}
    for name, path in tests.items():
        wrong = {n for n in _imports(path) if n.split(".")[-1].startswith("test_") and n in tests}
        assert not wrong, f"{name} imports test modules {sorted(wrong)}"


def test_every_code_folder_has_a_test_folder():
    """tests/ mirrors the code: each package of sim/ and traces/ with modules of its own has a test folder."""
    for folder in ("sim/core", "sim/timing", "sim/config", "sim/sweep", "sim/policies", "sim/predictors"):
        assert list((ROOT / "tests" / folder).glob("test_*.py")), f"no tests/{folder}/test_*.py"
    for folder in ("traces/importers", "traces/record", "traces/synthetic", "traces/analysis"):
        assert list((ROOT / "tests" / folder).glob("test_*.py")), f"no tests/{folder}/test_*.py"
