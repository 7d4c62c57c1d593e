"""The layout keeps its promises (docs/architecture.md, section 3a): every import, at module level or inside a
function (``if TYPE_CHECKING:`` blocks aside), goes to its own floor or one below; no imports form a cycle; the
decision code imports neither SimPy nor torch; engines touch no private SimPy attribute; no test module imports
another."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGES = ("moebase", "sim", "traces", "validate")

#: The floors, lowest first, each the module prefixes it holds (the longest prefix names a module's floor). A
#: module imports its own floor and the floors below, never one above.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("moebase: errors, file safety, checks, model profiles, registries", ("moebase",)),
    ("traces: trace formats, importers, recording, statistics", ("traces",)),
    ("config: run configs, hardware, systems, the part registries", ("sim.config",)),
    ("state: cache tiers, workloads, copy queue, records", ("sim.core",)),
    ("costs: the cost model", ("sim.costs",)),
    ("predictors", ("sim.predictors",)),
    ("policies and their admission driver", ("sim.policies",)),
    ("decisions: the protocol, building and replaying a run's decisions", ("sim.decisions",)),
    ("engine: SimPy time", ("sim.timing",)),
    (
        "runs: one simulation and its results",
        ("sim.run", "sim.results", "sim.request_results", "sim.plot_style", "sim.capacity", "sim.capacity_plot"),
    ),
    ("sweeps", ("sim.sweep",)),
    # the simulator's commands and package root (which loads the parts), and the trace tools' entry point (it hands
    # them the simulator's run-config maker: the one place they meet)
    ("commands", ("sim", "traces.__main__")),
    ("validator", ("validate",)),
)


def _modules(*folders: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``folders`` (relative to the root)."""
    out = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations only, never run)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


def _imports(path: Path, module_level_only: bool = False) -> set[str]:
    """The absolute module names ``path`` imports (``from a import b`` gives ``a`` and ``a.b``), in functions too
    unless ``module_level_only``; imports under ``if TYPE_CHECKING:`` are not counted."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    skip = _type_checking_nodes(tree)
    names = set()
    for node in nodes:
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _roots(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


def floor_of(module: str) -> int:
    """The index in FLOORS of the floor holding ``module`` (its longest matching prefix)."""
    best, length = -1, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = i, len(prefix)
    assert best >= 0, f"{module} is on no floor of FLOORS"
    return best


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project's modules it imports, anywhere in it."""
    return {name: {n for n in _imports(path) if n in mods and n != name} for name, path in mods.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for each import of a module on a higher floor than the importer's."""
    return sorted(
        f"{a} ({FLOORS[floor_of(a)][0]}) -> {b} ({FLOORS[floor_of(b)][0]})"
        for a, deps in graph.items()
        for b in deps
        if floor_of(b) > floor_of(a)
    )


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            found = visit(name, [name])
            if found:
                return found
    return None


def test_every_import_goes_to_its_floor_or_below():
    graph = import_graph(_modules(*PACKAGES))
    wrong = upward_imports(graph)
    assert not wrong, f"{len(wrong)} imports go up a floor:\n" + "\n".join(wrong)


def test_imports_form_no_cycle():
    """Not even through an import inside a function (which only postpones the cycle to the call)."""
    cycle = find_cycle(import_graph(_modules(*PACKAGES)))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_catch_a_cycle_planted_inside_a_function(tmp_path):
    """An import inside a function is seen, a planted pair of them is a cycle, and a planted import of a higher
    floor is named."""
    mods = _modules(*PACKAGES)
    graph = import_graph(mods)
    a, b = "sim.core.cache", "sim.core.copy_queue"
    planted = {**graph, a: graph[a] | {b}, b: graph[b] | {a}}
    plant = tmp_path / "planted.py"
    plant.write_text("def later():\n    from sim.core.copy_queue import CopyQueue\n    return CopyQueue\n")
    assert "sim.core.copy_queue" in _imports(plant), "an import inside a function is seen"
    assert find_cycle(planted) is not None
    up = {**graph, "sim.core.cache": graph["sim.core.cache"] | {"sim.policies.base"}}
    assert sorted(set(upward_imports(up)) - set(upward_imports(graph))) == [
        "sim.core.cache (state: cache tiers, workloads, copy queue, records) -> sim.policies.base (policies and their "
        "admission driver)"
    ]


def test_an_import_for_annotations_only_is_not_counted(tmp_path):
    plant = tmp_path / "annotated.py"
    plant.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sim.policies.base import Policy\n")
    assert "sim.policies.base" not in _imports(plant)


def test_the_engine_talks_only_to_the_protocol():
    """The engine (and the runs' bound) take the decision side through ``sim.decisions.protocol``: no policy or
    predictor module, at run time."""
    for name, path in _modules("sim/timing").items():
        parts = {n for n in _imports(path) if n.startswith(("sim.policies", "sim.predictors", "sim.decisions"))}
        stray = {n for n in parts if not n.startswith("sim.decisions.protocol")}
        assert not stray, f"{name} imports {sorted(stray)}"


def test_traces_imports_nothing_of_sim_but_at_its_entry_point():
    for name, path in _modules("traces", "moebase").items():
        if name == "traces.__main__":
            continue
        assert "sim" not in _roots(_imports(path)), f"{name} imports sim"


@pytest.mark.parametrize("folder", ["sim/core", "sim/policies", "sim/predictors"])
def test_the_decision_code_imports_neither_simpy_nor_torch(folder):
    """The validator runs the same decisions on a machine with torch only, and the simulator without torch."""
    for name, path in _modules(folder).items():
        assert not _roots(_imports(path)) & {"simpy", "torch"}, f"{name} imports SimPy or torch"


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


#: Test folders that mirror no code package: project-wide checks, restated reference rules, shared helpers.
NOT_MIRRORS = ("project", "reference", "support")


def code_packages(root: Path) -> dict[str, list[str]]:
    """Each package of PACKAGES (a folder with modules besides ``__init__.py``), relative to ``root``, -> the
    names of its modules."""
    out = {}
    for top in PACKAGES:
        for folder in sorted([root / top, *(d for d in (root / top).rglob("*") if d.is_dir())]):
            mods = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
            if mods and "__pycache__" not in folder.parts:
                out[folder.relative_to(root).as_posix()] = mods
    return out


def names_a_module(test_file: Path, package: str, modules: list[str]) -> bool:
    """Whether ``test_file`` names a module ``m`` of ``package``: its name is ``test_m.py`` or ``test_m_*.py``,
    or its docstring's first paragraph names ``package/m.py`` or ``package.m`` (dotted)."""
    stem = test_file.stem.removeprefix("test_")
    if any(stem == m or stem.startswith(m + "_") for m in modules):
        return True
    doc = ast.get_docstring(ast.parse(test_file.read_text())) or ""
    first = doc.split("\n\n")[0]
    dotted = package.replace("/", ".")
    return any(
        re.search(rf"(?<![\w/.]){re.escape(package)}/{m}\.py\b", first)
        or re.search(rf"(?<![\w.]){re.escape(dotted)}\.{m}(?![\w])", first)
        for m in modules
    )


def layout_problems(root: Path) -> list[str]:
    """Where ``root/tests`` fails to mirror the code: a package without a test folder (holding test files), a test
    file in no folder, a test folder of no package, a test file that names no module of the package whose folder
    holds it."""
    packages = code_packages(root)
    tests = root / "tests"
    problems = [f"{pkg}/ has no tests/{pkg}/test_*.py" for pkg in packages if not list((tests / pkg).glob("test_*.py"))]
    problems += [f"tests/{p.name} is in no package's test folder" for p in sorted(tests.glob("test_*.py"))]
    for folder in sorted(d for d in tests.rglob("*") if d.is_dir() and "__pycache__" not in d.parts):
        rel = folder.relative_to(tests)
        if rel.parts[0] in NOT_MIRRORS:
            continue
        pkg = rel.as_posix()
        if rel.parts[0] not in PACKAGES or not (root / pkg).is_dir():
            problems.append(f"tests/{pkg}/ mirrors no folder of {', '.join(PACKAGES)}")
            continue
        for test_file in sorted(folder.glob("test_*.py")):
            if not names_a_module(test_file, pkg, packages.get(pkg, [])):
                problems.append(
                    f"tests/{pkg}/{test_file.name} names no module of {pkg}/ (in its name, test_MODULE[_*].py, or "
                    f"its docstring's first paragraph, {pkg}/MODULE.py or {pkg.replace('/', '.')}.MODULE)"
                )
    return problems


def test_tests_mirror_the_code():
    """tests/ mirrors the code: each package has a test folder at the same path, every test folder is a package's,
    and every test file in it names a module of that package (so a reader finds a module's tests by its name)."""
    problems = layout_problems(ROOT)
    assert not problems, f"{len(problems)} test layout problems:\n" + "\n".join(problems)


def test_the_layout_check_catches_a_misplaced_test(tmp_path):
    """A planted tree: a test file of another package's module, a package without tests, a test file in no folder
    and a test folder of no package are each named; a test named by its module, or by the module in its docstring,
    passes."""
    for path, text in {
        "moebase/errors.py": "",
        "sim/core/cache.py": "",
        "sim/core/workload.py": "",
        "sim/timing/engine.py": "",
        "tests/moebase/test_errors.py": "",
        "tests/sim/core/test_cache_tiers.py": "",
        "tests/sim/core/test_batches.py": '"""Batches into iterations\n(sim/core/workload.py)."""\n',
        "tests/sim/core/test_engine.py": '"""The engine (sim/timing/engine.py), not sim/core/cache.pyc."""\n',
        "tests/sim/nowhere/test_x.py": "",
        "tests/test_loose.py": "",
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    problems = layout_problems(tmp_path)
    assert [p.split(" ")[0] for p in problems] == [
        "sim/timing/",
        "tests/test_loose.py",
        "tests/sim/core/test_engine.py",
        "tests/sim/nowhere/",
    ], problems
