"""The command lines explain themselves.

- Every argument of every sub-command of ``python -m sim``, ``python -m traces`` and ``python -m validate`` has a
  help text, every sub-command a one-line help, and ``--help`` of each exits 0 and prints its usage.
- ``python -m sim policies`` lists every registered policy and predictor from the registries (a newly registered
  one with no other edit), and the help of ``sim``, ``sim run`` and ``sim compare`` points to it.
- The sweep file's keys (``SWEEP_KEYS``, the list the loader accepts) are each documented in ``docs/sweeps.md`` and
  in ``sim sweep --help``; the limits table of the page holds the values of ``sim/sweep/spec.py``; the page's
  example loads with the loader.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import sim.cli
import traces.cli
import validate.cli
from sim import listing
from sim.policies import POLICIES, Policy
from sim.predictors import PREDICTORS, Predictor
from sim.sweep import cli as sweep
from sim.sweep import spec as sweep_spec
from tests.support.paths import ROOT

DOC = ROOT / "docs" / "sweeps.md"
CLIS = {"sim": sim.cli.build_parser, "traces": traces.cli.build_parser, "validate": validate.cli.build_parser}


# ------------------------------------------------------------------------------------------------ walking
def parsers(cli: str):
    """(path, parser) of the command line ``cli`` and every sub-command under it, at any depth."""
    todo = [((cli,), CLIS[cli]())]
    while todo:
        path, parser = todo.pop(0)
        yield path, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(path + (name,), sub) for name, sub in action.choices.items()]


def missing_help(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    """(path..., argument) of every argument of ``parser`` (-h aside) whose help is empty or suppressed, and of
    every sub-command listed without a help."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helped = {a.dest: a.help for a in action._choices_actions}
            out += [path + (name, "(sub-command help)") for name in action.choices if not helped.get(name)]
            continue
        if not action.help or action.help == argparse.SUPPRESS or not str(action.help).strip():
            out.append(
                path
                + ((action.option_strings or [action.dest])[-1].lstrip("-") if action.option_strings else action.dest,)
            )
    return out


def subcommand_paths() -> list[tuple[str, ...]]:
    return [path for cli in CLIS for path, _ in parsers(cli)]


def help_text(path: tuple[str, ...]) -> str:
    """What ``python -m PATH... --help`` prints (run in this process); asserts it exits 0."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        CLIS[path[0]]().parse_args([*path[1:], "--help"])
    assert exc.value.code == 0, f"{' '.join(path)} --help exited {exc.value.code}"
    return out.getvalue()


# ------------------------------------------------------------------------------------------------ every argument
def test_the_walk_finds_every_command_line_and_nested_sub_command():
    paths = set(subcommand_paths())
    assert {
        ("sim", "run"),
        ("sim", "compare"),
        ("sim", "sweep"),
        ("sim", "fit-system"),
        ("sim", "policies"),
        ("traces", "stats"),
        ("traces", "synth"),
        ("traces", "record"),
        ("traces", "validate"),
        ("traces", "import", "vllm"),
        ("traces", "import", "mixtral-jsonl"),
        ("validate", "compare"),
        ("validate", "microbench"),
        ("validate", "gpu"),
        ("validate", "cpu"),
    } <= paths


def test_missing_help_finds_an_argument_without_help():
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("file")
    parser.add_argument("--quiet", action="store_true", help="")
    parser.add_argument("--fine", help="has one")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("bare")
    assert sorted(missing_help(("x",), parser)) == [("x", "bare", "(sub-command help)"), ("x", "file"), ("x", "quiet")]


@pytest.mark.parametrize("cli", sorted(CLIS))
def test_every_argument_and_sub_command_has_help(cli):
    missing = [m for path, parser in parsers(cli) for m in missing_help(path, parser)]
    assert not missing, f"arguments without help: {[' '.join(m) for m in missing]}"


@pytest.mark.parametrize("path", subcommand_paths(), ids=" ".join)
def test_help_of_every_sub_command_exits_0_and_prints_its_usage(path):
    text = help_text(path)
    assert text.startswith("usage: "), text[:200]
    assert "show this help message and exit" in text


# ------------------------------------------------------------------------------------------------ sim policies
def _rows(text: str, section: str) -> dict[str, list[str]]:
    """name -> the words of its row, in one section (``policies`` or ``predictors``) of the listing."""
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(f"{section} ("))
    rows = {}
    for line in lines[start + 2 :]:  # the section's title, then its column header
        if not line.startswith("  "):
            break
        if line.startswith("   "):  # a long description's next line
            continue
        words = line.split()
        rows[words[0]] = words
    return rows


def test_policies_lists_every_registered_policy_and_predictor_with_its_attributes():
    text = listing.format_listing(listing.policy_rows(), listing.predictor_rows())
    policies, predictors = _rows(text, "policies"), _rows(text, "predictors")
    assert sorted(policies) == POLICIES.names() and len(policies) == len(POLICIES.names())
    assert sorted(predictors) == PREDICTORS.names()
    for name, words in policies.items():
        cls = POLICIES.get(name)
        assert words[1:3] == [cls.origin, cls.default_predictor or listing.CONFIG_PREDICTOR], words


def test_every_description_is_its_own_not_the_base_class_docstring():
    inherited = {listing.first_sentence(c.__doc__) for c in (Policy, Predictor, *Policy.__mro__, *Predictor.__mro__)}
    for row in listing.policy_rows() + listing.predictor_rows():
        assert row["description"] and "\n" not in row["description"], row
        assert row["description"] not in inherited, row
        assert not row["description"].startswith("`"), row  # the module docstring's leading name is dropped


def test_description_is_the_first_sentence():
    assert listing.first_sentence("Keep the hottest. Then ``more``.\n\nAnother paragraph.") == "Keep the hottest."
    assert (
        listing.first_sentence("A cache (Xue et al. 2024) on\n   per-layer slots.")
        == "A cache (Xue et al. 2024) on per-layer slots."
    )
    assert listing.first_sentence(None) == ""


@pytest.fixture
def dummy_parts():
    """A policy and a predictor registered for one test (and taken out again)."""

    class DummyPolicy(Policy):
        """Keep every third expert, for the listing test. Nothing more."""

        origin = "ours"
        default_predictor = "oracle"

    class DummyPredictor(Predictor):
        """Guess expert seven, for the listing test."""

    POLICIES.register("zz-dummy-policy")(DummyPolicy)
    PREDICTORS.register("zz-dummy-predictor")(DummyPredictor)
    try:
        yield
    finally:
        POLICIES._items.pop("zz-dummy-policy", None)
        PREDICTORS._items.pop("zz-dummy-predictor", None)


def test_a_newly_registered_policy_and_predictor_are_listed(dummy_parts, capsys):
    assert listing.cmd_policies(argparse.Namespace(json=False)) == 0
    text = capsys.readouterr().out
    assert (
        " ".join(_rows(text, "policies")["zz-dummy-policy"])
        == "zz-dummy-policy ours oracle Keep every third expert, for the listing test."
    )
    assert (
        " ".join(_rows(text, "predictors")["zz-dummy-predictor"])
        == "zz-dummy-predictor Guess expert seven, for the listing test."
    )
    assert listing.cmd_policies(argparse.Namespace(json=True)) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in data["policies"]].count("zz-dummy-policy") == 1
    assert sorted(p["name"] for p in data["predictors"]) == PREDICTORS.names()


def test_python_m_sim_policies_runs():
    done = subprocess.run(
        [sys.executable, "-m", "sim", "policies", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert sorted(p["name"] for p in data["policies"]) == POLICIES.names()
    assert sorted(p["name"] for p in data["predictors"]) == PREDICTORS.names()


@pytest.mark.parametrize("path", [("sim",), ("sim", "run"), ("sim", "compare")], ids=" ".join)
def test_the_help_that_takes_policy_names_points_to_the_listing(path):
    assert "python -m sim policies" in " ".join(help_text(path).split())


# ------------------------------------------------------------------------------------------------ the sweep schema
def _keys_the_loader_reads() -> set[str]:
    """The top-level keys ``sim/sweep/spec.py`` reads from a sweep file's mapping ``d``."""
    source = Path(sweep_spec.__file__).read_text()
    return set(re.findall(r'\bd(?:\.get\(|\[)"(\w+)"', source)) | set(
        re.findall(r'_optional_mapping\(d, "(\w+)"', source)
    )


def test_the_loader_reads_exactly_the_keys_it_accepts(tmp_path):
    assert _keys_the_loader_reads() == set(sweep_spec.SWEEP_KEYS)
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: configs/switch_xxl.yaml\ngrids: {workload.batch_size: [1]}\n")
    with pytest.raises(Exception) as exc:
        sweep_spec.load_sweep(bad)
    assert "unknown key" in str(exc.value) and all(k in str(exc.value) for k in sweep_spec.SWEEP_KEYS)


def test_every_sweep_key_is_documented_in_the_page_and_in_the_help():
    doc = DOC.read_text()
    epilog = help_text(("sim", "sweep"))
    assert set(sweep.KEY_HELP) == set(sweep_spec.SWEEP_KEYS)
    for key in sweep_spec.SWEEP_KEYS:
        assert re.search(rf"^### `{key}` \((required|optional)", doc, re.M), f"docs/sweeps.md: no section on {key}"
        assert re.search(rf"^  {key} +(required|optional)", epilog, re.M), f"sim sweep --help: no line on {key}"
    assert "docs/sweeps.md" in epilog
    for number in (
        sweep_spec.MAX_POINTS,
        sweep_spec.MAX_AXES,
        sweep_spec.MAX_SET_KEYS,
        sweep_spec.MAX_NAME_CHARS,
        sweep_spec.MAX_VALUE_CHARS,
        sweep_spec.MAX_SET_VALUE_CHARS,
        sweep_spec.MAX_FIELD_CHARS,
    ):
        assert f"{number:,}" in epilog


def test_the_limits_table_holds_the_loaders_limits():
    rows = dict(re.findall(r"^\| `(MAX_\w+)` \| ([\d,]+) \|", DOC.read_text(), re.M))
    limits = {k: v for k, v in vars(sweep_spec).items() if k.startswith("MAX_") and isinstance(v, int)}
    assert set(rows) == set(limits)
    assert {k: int(v.replace(",", "")) for k, v in rows.items()} == limits


def test_every_check_and_plot_is_explained():
    doc = DOC.read_text()
    epilog = " ".join(help_text(("sim", "sweep")).split())
    for name in sweep.CHECKS:
        assert re.search(rf"^\| `{name}` \|", doc, re.M), f"docs/sweeps.md: no row for the check {name}"
        assert name in epilog
    from sim.sweep.report import TIER_PLOT, plot_file

    for text in (TIER_PLOT, plot_file("workload.batch_size"), *sweep_spec.EXTRA_PLOT_AXES):
        assert f"`{text}`" in doc


def _example() -> str:
    blocks = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), re.M | re.S)
    assert blocks, "docs/sweeps.md: no yaml example"
    return blocks[0]


def test_the_example_uses_every_key_and_loads(tmp_path):
    text = _example()
    raw = yaml.safe_load(text)
    assert set(raw) == set(sweep_spec.SWEEP_KEYS), "the example should show every key"
    path = tmp_path / "example.yaml"
    path.write_text(text)
    loaded = sweep_spec.load_sweep(path)
    said = re.search(r"It makes (\d+) points", DOC.read_text())
    assert said and len(loaded.points) == int(said.group(1))
    assert loaded.name == raw["name"] and loaded.checks == raw["checks"] and loaded.plots == raw["plots"]
    assert set(loaded.axes) == set(raw["grid"]) | {k for g in raw["zip"] for k in g}


def test_readme_names_the_listing_and_the_sweep_page():
    readme = (ROOT / "README.md").read_text()
    assert "python -m sim policies" in readme and "docs/sweeps.md" in readme
