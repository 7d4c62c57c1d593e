"""Every error line stays bounded however long the names in it (README, "Bad input, untrusted files and limits"):
through the main entry points (`sim run`, `compare`, `sweep`, `fit-system`, `advise`; `traces import`, `record`,
`synth`, `stats`, `validate`; `validate compare`), a model, policy, predictor, system or hardware name, a key, a value,
or a file name of hundreds or thousands of characters ends in exit status 2 and ONE line on stderr:

- at most MAX_ERROR_LINE characters (``error: `` and the message, at most ``moebase.errors.MAX_MESSAGE_CHARS``);
- never cut: the line ends with its own words, not with the "..." of a message cut at its bound (a message that
  needed cutting lost its end: the file, the shapes, what to do);
- of a length that does not grow with the name: a name shown is abbreviated past its bound (a name whole up to 60
  characters, a model name up to the 130 of its rule, a path up to 200), so a name 3 times longer gives the same
  line but for the digits of its length.

Also the one message that names two long names and a file at once, the trace-model mismatch, is whole at the names'
longest.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from moebase.errors import MAX_MESSAGE_CHARS
from sim.cli import main as sim_main
from tests.support.cli import traces_main
from validate.cli import main as validate_main

#: The longest error line (README): "error: " and a message of at most MAX_MESSAGE_CHARS characters.
MAX_ERROR_LINE = len("error: ") + MAX_MESSAGE_CHARS
LENGTHS = (300, 1000)  # YAML reads a plain key of at most 1024 characters
RUN = ("run", "configs/mixtral.yaml")


def _name(n: int) -> str:
    return "n" * n


def _path(tmp: Path, n: int, suffix: str) -> str:
    """A path of about ``n`` characters that does not exist (folders of 200-character names)."""
    parts, left = [], n
    while left > 0:
        parts.append("d" * min(200, left))
        left -= 201
    return str(tmp.joinpath(*parts)) + suffix


def _file(tmp: Path, name: str, text: str) -> str:
    """``text`` written to ``tmp/name``; its path."""
    path = tmp / name
    path.write_text(text)
    return str(path)


def _deep(tmp: Path, n: int, name: str, data: bytes) -> str:
    """A file holding ``data`` whose path is about ``n`` characters long (in folders of 200-character names)."""
    path = Path(_path(tmp / f"deep-{len(str(n))}", n, "")) / name  # a folder per length, named alike
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


ROOT = Path(__file__).resolve().parents[2]

#: case -> (main, arguments given a name of n characters and a scratch folder)
CASES: dict[str, tuple[Callable, Callable[[int, Path], list[str]]]] = {
    "sim run: config file": (sim_main, lambda n, t: ["run", _path(t, n, ".yaml")]),
    "sim run: model": (sim_main, lambda n, t: [*RUN, "--set", f"model={_name(n)}"]),
    "sim run: model file": (sim_main, lambda n, t: [*RUN, "--set", f"model={_path(t, n, '.yaml')}"]),
    "sim run: model.name": (sim_main, lambda n, t: [*RUN, "--set", f"model.name={_name(n)}"]),
    "sim run: policy": (sim_main, lambda n, t: [*RUN, "--set", f"policy.name={_name(n)}"]),
    "sim run: predictor": (sim_main, lambda n, t: [*RUN, "--set", f"predictor.name={_name(n)}"]),
    "sim run: hardware": (sim_main, lambda n, t: [*RUN, "--set", f"hardware={_name(n)}"]),
    "sim run: system": (sim_main, lambda n, t: [*RUN, "--set", f"system={_name(n)}"]),
    "sim run: system file": (sim_main, lambda n, t: [*RUN, "--set", f"system={_path(t, n, '.yaml')}"]),
    "sim run: key": (sim_main, lambda n, t: [*RUN, "--set", f"{_name(n)}=1"]),
    "sim run: nested key": (sim_main, lambda n, t: [*RUN, "--set", f"workload.{_name(n)}=1"]),
    "sim run: policy param": (sim_main, lambda n, t: [*RUN, "--set", f"policy.params.{_name(n)}=1"]),
    "sim run: placement key": (sim_main, lambda n, t: [*RUN, "--set", f"system.placement.{_name(n)}=1"]),
    "sim run: value": (sim_main, lambda n, t: [*RUN, "--set", f"workload.batching={_name(n)}"]),
    "sim run: trace file": (sim_main, lambda n, t: [*RUN, "--set", f"workload.trace={_path(t, n, '.npz')}"]),
    "sim run: hot profile file": (
        sim_main,
        lambda n, t: [*RUN, "--set", f"cache.hot_profile={_path(t, n, '.npz')}"],
    ),
    "sim run: out": (sim_main, lambda n, t: [*RUN, "--out", _path(Path("/dev/null"), n, "")]),
    "sim run: key in a profile": (
        sim_main,
        lambda n, t: [
            *RUN,
            "--set",
            f"model={_file(t, 'm.yaml', f'base: mixtral-8x7b{chr(10)}{_name(n)}: 1{chr(10)}')}",
        ],
    ),
    "sim run: base of a profile": (
        sim_main,
        lambda n, t: [*RUN, "--set", f"hardware={_file(t, 'h.yaml', f'base: {_name(n)}{chr(10)}')}"],
    ),
    "sim run: predictor of a system": (
        sim_main,
        lambda n, t: [
            *RUN,
            "--set",
            f"system={_file(t, 's.yaml', f'base: ideal{chr(10)}predictor: {_name(n)}{chr(10)}')}",
        ],
    ),
    "sim sweep: grid key": (
        sim_main,
        lambda n, t: [
            "sweep",
            _file(t, "s.yaml", f"name: x\nbase: {ROOT}/configs/mixtral.yaml\ngrid:\n  {_name(n)}: [1, 2]\n"),
            "--out",
            str(t / "out"),
        ],  # fmt: skip
    ),
    "sim compare: policy": (sim_main, lambda n, t: ["compare", RUN[1], "--policies", f"lru,{_name(n)}"]),
    "sim compare: predictor": (sim_main, lambda n, t: ["compare", RUN[1], "--policies", f"lru@{_name(n)}"]),
    "sim compare: baseline": (sim_main, lambda n, t: ["compare", RUN[1], "--policies", "lru", "--baseline", _name(n)]),
    "sim sweep: file": (sim_main, lambda n, t: ["sweep", _path(t, n, ".yaml")]),
    "sim fit-system: system": (
        sim_main,
        lambda n, t: [
            "fit-system",
            "--measured",
            "m.csv",
            "--system",
            _name(n),
            "--hardware",
            "h200",
            "--out",
            "o.yaml",
        ],
    ),
    "sim fit-system: hardware": (
        sim_main,
        lambda n, t: ["fit-system", "--measured", "m.csv", "--system", "fiddler", "--hardware", _name(n), "--out", "o"],
    ),
    "sim fit-system: model": (
        sim_main,
        lambda n, t: [
            "fit-system",
            "--measured",
            "m.csv",
            "--system",
            "fiddler",
            "--hardware",
            "h200",
            "--model",
            _name(n),
            "--out",
            "o.yaml",
        ],  # fmt: skip
    ),
    "sim fit-system: measured file": (
        sim_main,
        lambda n, t: [
            "fit-system",
            "--measured",
            _path(t, n, ".csv"),
            "--system",
            "fiddler",
            "--hardware",
            "h200",
            "--out",
            str(t / "o.yaml"),
        ],  # fmt: skip
    ),
    "sim advise: policy": (sim_main, lambda n, t: ["advise", RUN[1], "--policies", _name(n)]),
    "traces import: model": (
        traces_main,
        lambda n, t: ["import", "vllm", "x.npy", "--model", _name(n), "--num-experts", "8", "--out", "o.npz"],
    ),
    "traces import: file": (
        traces_main,
        lambda n, t: ["import", "vllm", _path(t, n, ".npy"), "--model", "toy", "--num-experts", "8", "--out", "o.npz"],
    ),
    "traces import: out": (
        traces_main,
        lambda n, t: ["import", "expert-arrays", "x.npz", "--model", "toy", "--out", _path(Path("/dev/null"), n, "")],
    ),
    "traces import: hf-config": (
        traces_main,
        lambda n, t: [
            "import",
            "vllm",
            "x.npy",
            "--model",
            "toy",
            "--num-experts",
            "8",
            "--hf-config",
            _path(t, n, ".json"),
            "--out",
            str(t / "o.npz"),
        ],  # fmt: skip
    ),
    "traces import: bad mixtral-jsonl file": (
        traces_main,
        lambda n, t: ["import", "mixtral-jsonl", _deep(t, n, "r.jsonl", b"{not json\n"), "--out", str(t / "o.npz")],
    ),
    "traces import: bad ft-log file": (
        traces_main,
        lambda n, t: [
            "import",
            "ft-log",
            _deep(t, n, "log.txt", b"hello\n"),
            "--model",
            "toy",
            "--batch",
            "1",
            "--num-experts",
            "8",
            "--out",
            str(t / "o.npz"),
        ],  # fmt: skip
    ),
    "traces import: bad kt-parquet file": (
        traces_main,
        lambda n, t: [
            "import",
            "kt-parquet",
            _deep(t, n, "s.parquet", b"nonsense"),
            "--model",
            "toy",
            "--out",
            str(t / "o.npz"),
        ],  # fmt: skip
    ),
    "traces import: bad vllm file": (
        traces_main,
        lambda n, t: [
            "import",
            "vllm",
            _deep(t, n, "r.npy", b"nonsense"),
            "--model",
            "toy",
            "--num-experts",
            "8",
            "--out",
            str(t / "o.npz"),
        ],  # fmt: skip
    ),
    "traces import: bad expert-arrays file": (
        traces_main,
        lambda n, t: [
            "import",
            "expert-arrays",
            _deep(t, n, "r.npz", b"PK"),
            "--model",
            "toy",
            "--out",
            str(t / "o.npz"),
        ],  # fmt: skip
    ),
    "traces stats: bad file": (traces_main, lambda n, t: ["stats", _deep(t, n, "t.npz", b"PK")]),
    "sim run: bad config file": (sim_main, lambda n, t: ["run", _deep(t, n, "c.yaml", b"model: [\n")]),
    "sim sweep: bad sweep file": (sim_main, lambda n, t: ["sweep", _deep(t, n, "s.yaml", b"name: [\n")]),
    "sim fit-system: bad rows file": (
        sim_main,
        lambda n, t: [
            "fit-system",
            "--measured",
            _deep(t, n, "m.csv", b"a,b\n1,2\n"),
            "--system",
            "fiddler",
            "--hardware",
            "h200",
            "--out",
            str(t / "o.yaml"),
        ],  # fmt: skip
    ),
    "traces record: tiny": (
        traces_main,
        lambda n, t: ["record", "--tiny", _name(n), "--prompts", "p.txt", "--out", str(t / "o.npz")],
    ),
    "traces record: name": (
        traces_main,
        lambda n, t: ["record", "--tiny", "mixtral", "--name", _name(n), "--prompts", "p.txt", "--out", "o.npz"],
    ),
    "traces synth: model": (traces_main, lambda n, t: ["synth", "--model", _name(n), "--out", str(t / "o.npz")]),
    "traces stats: file": (traces_main, lambda n, t: ["stats", _path(t, n, ".npz")]),
    "traces validate: file": (traces_main, lambda n, t: ["validate", _path(t, n, ".npz")]),
    "validate compare: folder": (validate_main, lambda n, t: ["compare", _path(t, n, "")]),
}


def _error_line(main: Callable, args: list[str]) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(args)
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
    lines = err.getvalue().splitlines()
    assert code == 2 and len(lines) == 1, (code, err.getvalue()[:3000])
    return lines[0]


def check_line(line: str) -> None:
    """One printable line of at most MAX_ERROR_LINE characters that was not cut at a message's bound."""
    assert line.startswith("error: ") and line.isprintable(), line[:300]
    assert len(line) <= MAX_ERROR_LINE, f"{len(line)} characters: {line[:300]}"
    assert not line.endswith("..."), f"cut at its bound ({len(line)} characters): {line[-300:]}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_error_with_a_long_name_is_one_bounded_line_that_does_not_grow_with_it(tmp_path, monkeypatch, case):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    main, argv = CASES[case]
    lines = [_error_line(main, argv(n, tmp_path)) for n in LENGTHS]
    for line in lines:
        check_line(line)
    digits = [re.sub(r"\d+", "N", line) for line in lines]  # the name's length as digits ("(1000 characters)")
    assert len(digits[0]) == len(digits[1]), f"grows with the name: {lines[0][:200]} ... / {lines[1][:200]} ..."


def test_the_trace_model_mismatch_is_whole_with_the_longest_names(tmp_path, monkeypatch):
    """A trace whose model name is as long as the name rule allows (128), run with a profile whose name is as long
    as a profile's may be (256), and a trace file of a long path: one line with the differing shapes, both names
    and the file, not cut."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    trace_name = "org/" + "m" * 124
    folder = tmp_path / ("f" * 200)
    folder.mkdir()
    trace = folder / ("t" * 200 + ".npz")
    with contextlib.redirect_stdout(io.StringIO()):
        synth = ["synth", "--model", trace_name, "--experts", "8", "--top-k", "2", "--layers", "4", "--requests", "2"]
        assert traces_main([*synth, "--out", str(trace)]) == 0
    for model_name in ("mixtral-8x7b", "p" * 256, trace_name):
        line = _error_line(sim_main, [*RUN, "--set", f"workload.trace={trace}", "--set", f"model.name={model_name}"])
        check_line(line)
        assert line.startswith("error: workload.trace: ") and "4 decoder MoE layers" in line, line
        assert "32 decoder MoE layers" in line and trace.name[:40] in line, line
