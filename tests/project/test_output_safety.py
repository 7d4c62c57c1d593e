"""Every command that writes refuses an output place that is not what it writes, before any work: a FIFO, a socket,
a link to a FIFO, a regular file where a folder goes or a folder where a file goes. The thing in the way is left
exactly as it was (a rename over a FIFO or a device would replace it: as root, ``/dev/full`` itself), the error is
one line naming the place, and nothing else appears beside it.

The commands are listed here once, so a new command with an ``--out`` is one more row of ``COMMANDS``."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import stat
from pathlib import Path

import numpy as np
import pytest

from tests.support.paths import ROOT


def _expert_arrays(tmp: Path) -> Path:
    path = tmp / "routing.npz"
    np.savez(path, expert_ids=np.zeros((4, 3, 2), dtype=np.int8) + np.array([0, 1], dtype=np.int8))
    return path


def _prompts(tmp: Path) -> Path:
    path = tmp / "prompts.txt"
    path.write_text("hello\n")
    return path


#: name -> (the command line's main, its arguments given the output place and a scratch folder, "file"|"folder")
COMMANDS = {
    "sim run": (
        "sim",
        lambda out, tmp: ["run", "configs/switch_xxl.yaml", "--set", "workload.requests=1", "--out", out],
        "folder",
    ),
    "sim compare": (
        "sim",
        lambda out, tmp: [
            "compare",
            "configs/switch_xxl.yaml",
            "--policies",
            "on-demand,lru",
            "--set",
            "workload.requests=1",
            "--out",
            out,
        ],
        "folder",
    ),
    "sim sweep": ("sim", lambda out, tmp: ["sweep", "configs/sweeps/ci.yaml", "--out", out], "folder"),
    "sim advise": (
        "sim",
        lambda out, tmp: ["advise", "configs/switch_base_real.yaml", "--policies", "lru", "--quick", "--json", out],
        "file",
    ),
    "traces synth": (
        "traces",
        lambda out, tmp: ["synth", "--experts", "8", "--top-k", "2", "--layers", "2", "--requests", "1", "--out", out],
        "file",
    ),
    "traces import expert-arrays": (
        "traces",
        lambda out, tmp: [
            "import",
            "expert-arrays",
            _expert_arrays(tmp),
            "--model",
            "toy",
            "--num-experts",
            "16",
            "--out",
            out,
        ],
        "file",
    ),
    "traces import ft-log": (
        "traces",
        lambda out, tmp: [
            "import",
            "ft-log",
            tmp / "log.txt",
            "--model",
            "switch-base-128",
            "--batch",
            "1",
            "--out",
            out,
        ],
        "file",
    ),
    "traces record": (
        "traces",
        lambda out, tmp: ["record", "--tiny", "mixtral", "--prompts", _prompts(tmp), "--out", out],
        "file",
    ),
    "validate microbench": (
        "validate",
        lambda out, tmp: ["microbench", "--model", "switch-base-128", "--device", "cpu", "--out", out],
        "file",
    ),
    "validate cpu": ("validate", lambda out, tmp: ["cpu", "--out", out], "folder"),
}


def _main(package: str):
    if package == "sim":
        from sim.cli import main
    elif package == "traces":
        from tests.support.cli import traces_main as main
    else:
        from validate.cli import main
    return main


def _make_hazard(path: Path, hazard: str, writes: str) -> None:
    if hazard == "fifo":
        os.mkfifo(path)
    elif hazard == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif hazard == "link to a fifo":
        os.mkfifo(path.with_name("target-fifo"))
        path.symlink_to(path.with_name("target-fifo"))
    elif hazard == "the other kind":
        if writes == "folder":
            path.write_text("a file the user keeps\n")
        else:
            path.mkdir()
            (path / "kept.txt").write_text("kept\n")


def _state(folder: Path) -> dict:
    out = {}
    for p in sorted(folder.rglob("*")):
        s = os.lstat(p)
        out[str(p.relative_to(folder))] = (stat.S_IFMT(s.st_mode), s.st_size if stat.S_ISREG(s.st_mode) else 0)
    return out


@pytest.mark.parametrize("hazard", ["fifo", "socket", "link to a fifo", "the other kind"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_output_place_of_the_wrong_kind_is_refused_and_left_as_it_was(tmp_path, monkeypatch, command, hazard):
    package, argv, writes = COMMANDS[command]
    monkeypatch.chdir(ROOT)
    scratch = tmp_path / "in"
    scratch.mkdir()
    place = tmp_path / "out" / ("result" if writes == "folder" else "result.npz")
    place.parent.mkdir()
    _make_hazard(place, hazard, writes)
    args = [str(a) for a in argv(place, scratch)]
    before = _state(tmp_path / "out")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = _main(package)(args)
        except SystemExit as exc:  # argparse
            code = exc.code
    lines = err.getvalue().strip().splitlines()
    assert code == 2, err.getvalue()
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) <= 800, err.getvalue()
    assert str(place) in lines[0] or "--out" in lines[0], lines[0]
    assert _state(tmp_path / "out") == before  # the thing in the way is untouched, nothing new beside it
