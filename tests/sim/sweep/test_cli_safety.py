"""`sim sweep`, `sim run` and `sim compare` hold their inputs to the command-line contract: a bad sweep file, a
bad argument or an output place that is not a folder ends in exit 2 and ONE bounded line naming the file or
field, before any point or policy runs, with nothing written (in the --out folder, nor anywhere else).

Classes covered, each tested as a class (many instances, hypothesis where the input varies):

- paths from files stay in their folder: a sweep's ``name`` is a plain name (its default results folder stays in
  runs/), point ids, plot names and shipped file names are plain names made by the code;
- outputs: --out (and every file written in it) that is a FIFO, a device, a file where a folder goes, a folder
  where a file goes, is refused before any work; the Ray task's cache copies never replace such a thing;
- sweep files: wrong types, unknown checks, an axis swept twice, empty or uneven axes, odd or huge values, and
  more points than ``MAX_POINTS`` (counted without expanding the axes, so refused at once);
- --workers, --attempts and --address bounded; a pool never has more processes than points; a local Ray
  instance that fails to start is one line;
- lru_monotone_in_cache groups by every field that is not a numeric cache size (cache.organization...);
- compare's --policies and --baseline checked before any policy runs, with bounded messages.
"""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
import time
import types
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.cli import main
from tests.support.fuzz import fuzz_settings
from tests.support.paths import ROOT

BASE = ROOT / "configs" / "switch_xxl.yaml"
TINY = "set: {workload.requests: 2, workload.max_decode_tokens: 2, workload.prefill: false}\n"
MAX_LINE = 760  # "error: " + a field of at most 200 characters + ": " + a problem of at most 500 (+ a file name)
FUZZ = fuzz_settings(60)


# --------------------------------------------------------------------------------------------- helpers
def _cli(capsys, *args) -> tuple[int, str, str]:
    """``python -m sim ARGS`` in this process: (exit status, stdout, stderr)."""
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exc:  # argparse
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _refused(rc: int, err: str, *words: str) -> None:
    """Exit 2 and one bounded error line holding each of ``words``."""
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and len(err) <= MAX_LINE, err
    for w in words:
        assert w in err, (w, err)


def _sweep_file(folder: Path, body: str, name: str = "s.yaml") -> Path:
    path = folder / name
    path.write_text(f"base: {BASE}\n{body}")
    return path


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh current folder (the default results folders runs/... land here) holding the sweep file."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def no_runs(monkeypatch):
    """Any simulation started is a test failure (bad input must be refused before anything runs)."""

    def refuse(*a, **k):
        raise AssertionError("a simulation ran before the input was checked")

    import sim.compare
    import sim.sweep.worker

    monkeypatch.setattr(sim.compare, "simulate", refuse)
    monkeypatch.setattr(sim.sweep.worker, "run_point", refuse)


# --------------------------------------------------------------------------------------------- names
ESCAPING_NAMES = [
    "x/../../../escaped",
    "/tmp/escaped-abs",
    "",
    "a" * 5000,
    "a\x01b",
    "..",
    ".hidden",
    "a b",
    "nul\x00l",
    "x\\..\\y",
    "tab\tname",
    "é",
    7,
    ["a"],
    {"a": 1},
    True,
]


@pytest.mark.parametrize("name", ESCAPING_NAMES, ids=range(len(ESCAPING_NAMES)))
def test_a_sweep_name_that_is_not_a_plain_name_is_refused_and_nothing_is_written(workdir, capsys, name, no_runs):
    path = workdir / "s.yaml"
    path.write_text(yaml.safe_dump({"base": str(BASE), "name": name, "grid": {"policy.name": ["lru"]}}))
    before = _tree(workdir.parent)
    rc, _, err = _cli(capsys, "sweep", path)
    _refused(rc, err, str(path), "sweep.name")
    assert _tree(workdir.parent) == before  # nothing in runs/, nothing beside or above it


@FUZZ
@given(name=st.text(max_size=300) | st.text(alphabet="./-_aZ09", max_size=120))
def test_every_accepted_sweep_name_keeps_the_default_folder_inside_runs(tmp_path_factory, name):
    from sim.sweep.cli import default_out
    from sim.sweep.spec import is_safe_name, load_sweep

    folder = tmp_path_factory.mktemp("n")
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump({"base": str(BASE), "name": name, "grid": {"policy.name": ["lru"]}}))
    try:
        sweep = load_sweep(path)
    except ConfigError as exc:
        assert "sweep.name" in str(exc) and str(path) in str(exc) and len(str(exc)) <= MAX_LINE
        return
    assert is_safe_name(sweep.name) and sweep.name == name
    out = (Path("/r") / default_out(sweep.name)).resolve()
    assert out.parent == Path("/r/runs") and out.name == f"sweep-{name}"


@FUZZ
@given(stem=st.text(min_size=1, max_size=200).filter(lambda s: "/" not in s and "\0" not in s))
def test_a_name_made_from_any_text_is_plain(stem):
    from sim.sweep.report import plot_file
    from sim.sweep.spec import is_safe_name, safe_name

    assert is_safe_name(safe_name(stem))
    assert is_safe_name(plot_file(stem)) and "/" not in plot_file(stem)


def test_a_sweep_files_own_name_gives_a_plain_default_name(workdir):
    from sim.sweep.spec import is_safe_name, load_sweep

    for stem in ("..x", "a b c", "é" * 120, "-", "b" * 240):
        sweep = load_sweep(_sweep_file(workdir, "grid: {policy.name: [lru]}\n", f"{stem}.yaml"))
        assert is_safe_name(sweep.name)


def test_row_files_are_named_by_plain_point_ids_only(tmp_path):
    from sim.sweep.spec import load_sweep
    from sim.sweep.store import row_file

    sweep = load_sweep(_sweep_file(tmp_path, "grid: {policy.name: [lru, lfu], workload.batch_size: [1, 2]}\n"))
    for p in sweep.points:
        assert row_file(tmp_path, p.id).parent == tmp_path / "rows"
    for bad in ("../x", "/etc/passwd", "", ".hidden", "a/b", "x" * 200):
        with pytest.raises(ValueError):
            row_file(tmp_path, bad)


@FUZZ
@given(name=st.text(min_size=1, max_size=300).filter(lambda s: "\0" not in s))
def test_shipped_files_land_inside_the_node_cache(tmp_path_factory, name):
    from sim.sweep.ray.ship import ship_name
    from sim.sweep.ray.task import cache_dir, cache_path

    shipped = ship_name(Path("/data") / name)
    path = cache_path("ab" * 32, shipped)
    assert path.parent.parent == cache_dir() and path.name == shipped


def test_the_node_cache_refuses_paths_that_leave_it():
    from sim.sweep.ray.task import CacheError, cache_path

    for sha, name in (
        ("ab" * 32, "../escape"),
        ("ab" * 32, "/etc/passwd"),
        ("../..", "x.npz"),
        ("ab" * 32, ".."),
        ("ab" * 32, ""),
        ("AB" * 32, "x.npz"),
        ("ab" * 32, "a/b"),
    ):
        with pytest.raises(CacheError):
            cache_path(sha, name)


# --------------------------------------------------------------------------------------------- outputs
def _special(kind: str, path: Path) -> Path:
    """A FIFO, a regular file, or a character device (/dev/null) standing where a folder or file goes."""
    if kind == "fifo":
        os.mkfifo(path)
        return path
    if kind == "file":
        path.write_text("keep me")
        return path
    return Path("/dev/null")


OUT_KINDS = ["fifo", "file", "device"]


@pytest.mark.parametrize("kind", OUT_KINDS)
@pytest.mark.parametrize("command", ["run", "compare", "sweep"])
def test_an_out_that_is_not_a_folder_is_refused_before_any_work(workdir, capsys, no_runs, kind, command):
    out = _special(kind, workdir / "out")
    sweep = _sweep_file(workdir, TINY + "grid: {policy.name: [lru, on-demand]}\n")
    args = {
        "run": ["run", BASE],
        "compare": ["compare", BASE, "--policies", "lru,on-demand"],
        "sweep": ["sweep", sweep],
    }[command]
    before = _tree(workdir)
    rc, _, err = _cli(capsys, *args, "--out", out)
    _refused(rc, err, str(out), "--out")
    assert _tree(workdir) == before
    if kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(out).st_mode)
    if kind == "file":
        assert out.read_text() == "keep me"


@pytest.mark.parametrize(
    "command, inner",
    [
        ("run", "summary.json"),
        ("run", "iterations.csv"),
        ("compare", "compare.md"),
        ("sweep", "rows"),
        ("sweep", "report.md"),
        ("sweep", "results.parquet"),
        ("sweep", "hit_rate_per_tier.png"),
    ],
)
def test_a_fifo_or_folder_where_an_output_goes_is_refused_before_any_work(workdir, capsys, no_runs, command, inner):
    sweep = _sweep_file(workdir, TINY + "grid: {policy.name: [lru, on-demand]}\n")
    args = {
        "run": ["run", BASE],
        "compare": ["compare", BASE, "--policies", "lru,on-demand"],
        "sweep": ["sweep", sweep],
    }[command]
    for kind in ("fifo", "folder"):
        out = workdir / f"out-{kind}"
        out.mkdir()
        target = out / inner
        if kind == "fifo":
            os.mkfifo(target)
        elif inner == "rows":
            target.write_text("not a folder")
        else:
            target.mkdir()
        before = _tree(workdir)
        rc, _, err = _cli(capsys, *args, "--out", out)
        _refused(rc, err, inner)
        assert _tree(workdir) == before, (kind, inner)


def test_a_row_that_is_not_a_regular_file_is_refused_before_resuming(workdir, capsys, no_runs):
    sweep = _sweep_file(workdir, TINY + "grid: {policy.name: [lru, on-demand]}\n")
    out = workdir / "out"
    (out / "rows").mkdir(parents=True)
    os.mkfifo(out / "rows" / "0123456789abcdef.parquet")
    rc, _, err = _cli(capsys, "sweep", sweep, "--out", out, "--resume")
    _refused(rc, err, "0123456789abcdef.parquet", "not a row file")
    (out / "rows" / "0123456789abcdef.parquet").unlink()
    (out / "rows" / "0123456789abcdef.parquet").write_bytes(b"PAR1 not really")
    rc, _, err = _cli(capsys, "sweep", sweep, "--out", out, "--resume")
    _refused(rc, err, "0123456789abcdef.parquet", "cannot be read as a sweep row")


def test_the_node_cache_never_replaces_a_fifo_or_a_folder(tmp_path, monkeypatch):
    from sim.sweep.ray.task import CACHE_ENV, CacheError, _write, cache_path

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    for i, make in enumerate((os.mkfifo, os.makedirs)):
        path = cache_path(f"{i}" * 64, "trace.npz")
        path.parent.mkdir(parents=True)
        make(path)
        with pytest.raises(CacheError):
            _write(path, b"data")
        assert not path.is_file() and len(list(path.parent.iterdir())) == 1  # no temporary file left


def test_a_run_writes_nothing_when_one_of_its_files_cannot_be_written(tmp_path):
    from moebase.errors import InputError
    from sim.results import write_outputs

    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "iterations.csv")
    with pytest.raises(InputError):
        write_outputs(out, {"a": 1}, {"b": 2}, [], None)
    assert sorted(p.name for p in out.iterdir()) == ["iterations.csv"]


# --------------------------------------------------------------------------------------------- sweep files
BAD_SPECS = [  # (body after base:, key the line names)
    ("grid: {policy.name: [lru]}\nchecks: 5\n", "sweep.checks"),
    ("grid: {policy.name: [lru]}\nchecks: [[belady_bound]]\n", "sweep.checks"),
    ("grid: {policy.name: [lru]}\nchecks: [{a: 1}]\n", "sweep.checks"),
    ("grid: {policy.name: [lru]}\nchecks: belady_bound\n", "sweep.checks"),
    ("grid: {policy.name: [lru]}\nchecks: [belady_bound, belady_bound]\n", "sweep.checks"),
    ("grid: {policy.name: [lru]}\nchecks: [no_such_check]\n", "sweep.checks"),
    (
        "grid: {cache.hpc_slots: [0, 1]}\nzip: {cache.hpc_slots: [1, 2], cache.mpc_slots: [2, 3]}\n",
        "sweep.zip.cache.hpc_slots",
    ),
    ("zip: [{cache.hpc_slots: [1, 2]}, {cache.hpc_slots: [3, 4]}]\n", "sweep.zip[1].cache.hpc_slots"),
    ("grid: {policy: [{name: lru}], policy.name: [lfu]}\n", "sweep.grid.policy.name"),
    ("set: {policy.name: lru}\ngrid: {policy.name: [lru, lfu]}\n", "sweep.set.policy.name"),
    ("zip: {cache.hpc_slots: [1, 2], cache.mpc_slots: [3]}\n", "sweep.zip"),
    ("zip: [{}]\n", "sweep.zip[0]"),
    ("grid: {policy.name: []}\n", "sweep.grid.policy.name"),
    ("grid: {policy.name: lru}\n", "sweep.grid.policy.name"),
    ("grid: {policy.name: null}\n", "sweep.grid.policy.name"),
    ("grid: [policy.name]\n", "sweep.grid"),
    ("grid: 0\n", "sweep.grid"),
    ("set: 5\ngrid: {policy.name: [lru]}\n", "sweep.set"),
    ("zip: 5\n", "sweep.zip"),
    ("grid: {}\n", "sweep.grid"),
    ("grid: {policy.name: [" + "x" * 5000 + "]}\n", "sweep.grid.policy.name"),
    ("set: {policy.name: " + "x" * 200_000 + "}\ngrid: {workload.batch_size: [1]}\n", "sweep.set.policy.name"),
    ("grid: {policy.params.day: [2020-01-01]}\n", "sweep.grid.policy.params.day"),
    ("grid: {'a=b': [1]}\n", "sweep.grid"),
    ("grid: {'../../x': [1]}\n", "sweep.grid"),
    (yaml.safe_dump({"grid": {"k" * 5000: [1]}}), "sweep.grid"),
    ("grid: {1: [1]}\n", "sweep.grid"),
    ("grid: {policy.name: [lru]}\n7: 8\n", "sweep"),
    ("grid: {policy.name: [lru]}\nplots: [nowhere]\n", "sweep.plots"),
    ("grid: {policy.name: [lru]}\nplots: 3\n", "sweep.plots"),
    ("grid: {workload.batch_size: [1, 2]}\nplots: [workload.batch_size, workload.batch_size]\n", "sweep.plots"),
    ("grid: {" + ", ".join(f"a{i}.b: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]" for i in range(12)) + "}\n", "sweep.grid"),
    (
        "zip: {workload.max_decode_tokens: [" + ", ".join(map(str, range(1, 20_001))) + "]}\n",
        "sweep.zip.workload.max_decode_tokens",
    ),
    ("grid: {" + ", ".join(f"a{i}: [1]" for i in range(40)) + "}\n", "sweep.grid"),
]


@pytest.mark.parametrize("body, key", BAD_SPECS, ids=range(len(BAD_SPECS)))
def test_a_bad_sweep_file_is_refused_at_once_with_one_line_naming_the_file_and_key(workdir, capsys, no_runs, body, key):
    path = _sweep_file(workdir, body)
    out = workdir / "out"
    t0 = time.perf_counter()
    rc, _, err = _cli(capsys, "sweep", path, "--out", out)
    assert time.perf_counter() - t0 < 10, "refused only after expanding the axes"
    _refused(rc, err, str(path), key)
    assert not out.exists() and not (workdir / "runs").exists()


def test_a_bad_base_is_refused_naming_sweep_base(workdir, capsys, no_runs):
    os.mkfifo(workdir / "fifo.yaml")
    (workdir / "list.yaml").write_text("[1, 2]\n")
    (workdir / "bad.yaml").write_text("a: [\n")
    for base in (
        "null",
        "5",
        "''",
        "no-such.yaml",
        "fifo.yaml",
        f"'{'b' * 5000}.yaml'",
        "[a]",
        "list.yaml",
        "bad.yaml",
        "/etc/passwd",
        "/proc/self/environ",
        "/dev/zero",
        str(workdir),
    ):
        path = workdir / "s.yaml"
        path.write_text(f"base: {base}\ngrid: {{policy.name: [lru]}}\n")
        rc, _, err = _cli(capsys, "sweep", path, "--out", workdir / "out")
        _refused(rc, err, str(path), "sweep.base")
        assert "root:" not in err and not (workdir / "out").exists()


@FUZZ
@given(
    lengths=st.lists(st.integers(1, 10**6), max_size=30),
    groups=st.lists(st.integers(1, 10**6), max_size=5),
    limit=st.integers(1, 10**6),
)
def test_points_are_counted_without_expanding_and_without_big_numbers(lengths, groups, limit):
    import math

    from sim.sweep.spec import count_points

    class Axis:  # a list's length, without the list
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

    grid = {f"a{i}": Axis(n) for i, n in enumerate(lengths)}
    zipped = [{f"z{i}": Axis(n)} for i, n in enumerate(groups)]
    exact = math.prod(lengths) * math.prod(groups)
    assert count_points(grid, zipped, limit) == (exact if exact <= limit else limit + 1)


# --------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    "args, field",
    [
        (["--workers", "0"], "--workers"),
        (["--workers", "257"], "--workers"),
        (["--workers", "10" * 30], "--workers"),
        (["--workers", "-3"], "--workers"),
        (["--attempts", "0"], "--attempts"),
        (["--attempts", "11"], "--attempts"),
        (["--attempts", "9" * 40], "--attempts"),
        (["--workers", "x"], "--workers"),
        (["--executor", "ray", "--address", "a" * 300 + ":6379"], "--address"),
        (["--executor", "ray", "--address", "b" * 64 + ".example:6379"], "--address"),
        (["--executor", "ray", "--address", "héllo.example:6379"], "--address"),
        (["--executor", "ray", "--address", "host:0"], "--address"),
        (["--executor", "ray", "--address", "host:65536"], "--address"),
        (["--executor", "ray", "--address", "host:٦٣٧٩"], "--address"),
        (["--executor", "ray", "--address", "[nothex]:6379"], "--address"),
        (["--executor", "ray", "--address", "-bad-.example:6379"], "--address"),
        (["--address", "127.0.0.1:6379"], "--address"),
    ],
)
def test_bad_sweep_arguments_exit_2_before_anything(workdir, capsys, no_runs, args, field):
    sweep = _sweep_file(workdir, TINY + "grid: {policy.name: [lru, on-demand]}\n")
    rc, _, err = _cli(capsys, "sweep", sweep, "--out", workdir / "out", *args)
    assert rc == 2 and err.count("\n") == 1 and len(err) <= 400 and field in err, err
    assert not (workdir / "out").exists()


@FUZZ
@given(text=st.text(max_size=400) | st.from_regex(r"\A(ray://)?[a-z0-9.\-\[\]:]{0,300}:[0-9]{1,6}\Z"))
def test_any_address_parses_or_is_one_bounded_line(text):
    from sim.sweep.ray.connect import Address, parse_address

    if text.strip() == "auto":
        return
    try:
        addr = parse_address(text)
    except ConfigError as exc:
        assert str(exc).startswith("--address: expected HOST:PORT") and len(str(exc)) <= 300
        return
    assert isinstance(addr, Address) and 0 < addr.port < 65536 and len(addr.host) <= 253
    addr.host.encode("idna" if addr.host.isascii() else "ascii")  # what the name lookup does with it


def test_a_pool_never_has_more_processes_than_points(workdir, monkeypatch):
    import concurrent.futures

    import sim.sweep.cli
    import sim.sweep.local

    widths = []

    class Pool(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, max_workers=None, **kw):
            widths.append(max_workers)
            super().__init__(max_workers=max_workers, **kw)

    monkeypatch.setattr(sim.sweep.local, "ProcessPoolExecutor", Pool)
    sweep = _sweep_file(workdir, TINY + "grid: {policy.name: [lru, on-demand]}\n")
    args = argparse.Namespace(
        sweep=str(sweep),
        executor="local",
        address=None,
        workers=64,
        resume=False,
        attempts=2,
        out=str(workdir / "out"),
        quiet=True,
    )
    assert sim.sweep.cli.run(args) == 0
    assert widths == [2]


def test_a_local_ray_instance_gets_no_more_cpus_than_points(workdir, monkeypatch, capsys):
    import sim.sweep.cli

    asked = []

    def start_ray(address, workers):
        asked.append((address, workers))
        raise ConfigError("--executor", "stop here")

    monkeypatch.setattr(sim.sweep.cli, "start_ray", start_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sweep = _sweep_file(workdir, TINY + "grid: {policy.name: [lru, on-demand]}\n")
    rc, _, err = _cli(capsys, "sweep", sweep, "--executor", "ray", "--workers", "64", "--out", workdir / "out")
    assert rc == 2 and asked == [(None, 2)]


class _Boom(Exception):
    """Stands for Ray's own exception classes."""


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("The current node timed out during startup."),
        RuntimeError("Failed to start GCS"),
        ConnectionError("refused"),
        _Boom("raylet died\nwith a long log\n" + "x" * 5000),
        Exception(""),
    ],
)
def test_a_local_ray_instance_that_fails_to_start_is_one_line(workdir, monkeypatch, capsys, exc):
    ray = types.ModuleType("ray")
    ray.shutdowns = 0

    def init(**kw):
        raise exc

    def shutdown():
        ray.shutdowns += 1

    ray.init, ray.shutdown = init, shutdown
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sweep = _sweep_file(workdir, TINY + "grid: {policy.name: [lru, on-demand]}\n")
    rc, _, err = _cli(capsys, "sweep", sweep, "--executor", "ray", "--out", workdir / "out")
    _refused(rc, err, "--executor", "could not start a local Ray instance")
    assert len(err) <= 400 and ray.shutdowns == 1 and not (workdir / "out").exists()


# --------------------------------------------------------------------------------------------- checks
def _lru_rows(groups: dict, sizes=((0, 2, 2.0), (2, 6, 8.0), (4, 9, 13.0))) -> pd.DataFrame:
    """lru rows: for each group (other fields -> hit rates along ``sizes``), one row per cache size."""
    rows = []
    for fields, hits in groups.items():
        for (hpc, mpc, slots), h in zip(sizes, hits):
            rows.append(
                {
                    "policy.name": "lru",
                    **dict(fields),
                    "cache.hpc_slots": hpc,
                    "cache.mpc_slots": mpc,
                    "cache_slots": slots,
                    "hit_rate_hpc": 0.0,
                    "hit_rate_mpc": h,
                    "throughput_tok_s": 1.0,
                    "status": "ok",
                }
            )
    return pd.DataFrame(rows)


@FUZZ
@given(
    others=st.dictionaries(
        st.sampled_from(
            ["cache.organization", "cache.layers", "workload.batch_size", "predictor.name", "cache.lpc_buffers"]
        ),
        st.lists(
            st.one_of(st.sampled_from(["per-layer", "shared", "all", "decoder"]), st.integers(0, 9), st.none()),
            min_size=1,
            max_size=3,
            unique=True,
        ),
        min_size=1,
        max_size=3,
    ),
    data=st.data(),
)
def test_lru_monotone_compares_only_rows_that_differ_in_cache_size(others, data):
    """Hit rates that grow with the cache within every group of other fields pass, however the groups compare
    with each other; one fall within a group fails."""
    import itertools

    from sim.sweep.checks import CHECKS

    keys = list(others)
    combos = [tuple(zip(keys, vals)) for vals in itertools.product(*others.values())]
    groups = {}
    for c in combos:
        start = data.draw(st.floats(0, 0.5))
        groups[c] = [start, start + 0.1, start + 0.3]
    axes = ["policy.name", *keys, "cache.hpc_slots", "cache.mpc_slots"]
    assert CHECKS["lru_monotone_in_cache"](_lru_rows(groups), axes) == []
    broken = data.draw(st.sampled_from(combos))
    groups[broken] = [0.9, 0.2, 0.95]
    assert len(CHECKS["lru_monotone_in_cache"](_lru_rows(groups), axes)) == 1


def test_lru_monotone_is_not_applicable_without_a_cache_size_axis():
    from sim.sweep.checks import CHECKS

    df = _lru_rows(
        {(("cache.organization", "per-layer"),): [0.5, 0.5, 0.5], (("cache.organization", "shared"),): [0.1, 0.1, 0.1]}
    )
    assert CHECKS["lru_monotone_in_cache"](df, ["policy.name", "cache.organization"]) is None


# --------------------------------------------------------------------------------------------- compare
BAD_POLICIES = [
    ("lru,lru", "--policies"),
    ("lru@", "--policies"),
    ("@oracle", "--policies"),
    ("nosuch", "--policies"),
    ("lru@nosuch", "--policies"),
    ("", "--policies"),
    (",", "--policies"),
    ("lru,,lfu", "--policies"),
    ("all,lru", "--policies"),
    ("lru,lru@oracle", "--policies"),
    ("x" * 5000, "--policies"),
    ("lru@" + "p" * 5000, "--policies"),
    ("lru@oracle@x", "--policies"),
]


@pytest.mark.parametrize("policies, field", BAD_POLICIES, ids=range(len(BAD_POLICIES)))
def test_bad_policies_are_refused_before_any_policy_runs(workdir, capsys, no_runs, policies, field):
    rc, _, err = _cli(capsys, "compare", BASE, "--policies", policies, "--out", workdir / "out")
    _refused(rc, err, field)
    assert len(err) <= 320 and not (workdir / "out").exists()


@pytest.mark.parametrize("baseline", ["diffmoe", "", "b" * 5000, "lru@oracle"])
def test_a_baseline_not_among_the_policies_is_refused_before_any_policy_runs(workdir, capsys, no_runs, baseline):
    rc, _, err = _cli(
        capsys, "compare", BASE, "--policies", "lru,lfu", "--baseline", baseline, "--out", workdir / "out"
    )
    _refused(rc, err, "--baseline")
    assert len(err) <= 320 and not (workdir / "out").exists()


@FUZZ
@given(
    parts=st.lists(
        st.sampled_from(
            ["lru", "lfu", "diffmoe", "all", "oracle", "none", "nosuch", "@", "", " ", "lru@oracle", "x" * 400]
        ),
        max_size=8,
    )
)
def test_any_policies_list_parses_or_is_one_bounded_line(parts):
    from sim.compare import parse_entries

    text = ",".join(parts)
    try:
        entries = parse_entries(text)
    except ConfigError as exc:
        assert str(exc).startswith("--policies: ") and len(str(exc)) <= 300, str(exc)
        return
    assert entries and len(set(entries)) == len(entries)


def test_the_command_line_reports_a_bad_sweep_in_one_line_as_a_subprocess(tmp_path):
    path = _sweep_file(tmp_path, "name: x/../../../escaped\ngrid: {policy.name: [lru]}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "sim", "sweep", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    _refused(res.returncode, res.stderr, str(path), "sweep.name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]
