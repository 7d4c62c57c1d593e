"""One sweep writes into a results folder at a time: while a sweep holds the lock of ``OUT`` (``OUT/.sweep.lock``,
``flock``), a second sweep on it is refused with one line and exit 2 before any point runs, or with ``--wait``
says so in one line, waits, and then runs (still needing ``--resume`` for rows left in the folder). The lock is
held with either executor, and a sweep leaves neither the lock file nor folders it made empty behind.
"""

from __future__ import annotations

import fcntl
import os
import selectors
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from moebase.errors import ConfigError
from sim.cli import main
from tests.support.cli import sweep_process
from tests.support.paths import ROOT

SWEEP = f"""base: {ROOT / "configs" / "switch_xxl.yaml"}
set: {{workload.requests: 2, workload.max_decode_tokens: 2, workload.prefill: false}}
grid:
  policy.name: [on-demand, lru]
"""
LOCK = ".sweep.lock"
WAITING = "waiting for it to end (--wait)"


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP)
    return path


@pytest.fixture
def no_runs(monkeypatch):
    """Any point run is a test failure."""

    def refuse(*a, **k):
        raise AssertionError("a point ran")

    import sim.sweep.worker

    monkeypatch.setattr(sim.sweep.worker, "run_point", refuse)


def _hold(out: Path) -> int:
    """Lock ``out`` as a running sweep does: the descriptor holding the lock."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK, os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _locked(path: Path) -> bool:
    """Whether some open file holds the lock of ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _cli(capsys, *args) -> tuple[int, str]:
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err


def _first_line(proc: subprocess.Popen, seconds: float = 60) -> str:
    """The first line ``proc`` writes on stderr, read with a bounded wait (a liveness bound, not a timing check)."""
    assert proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        assert sel.select(seconds), "no line on stderr"
    return proc.stderr.readline()


@pytest.mark.parametrize("resume", [False, True])
def test_a_second_sweep_on_a_locked_folder_is_refused_in_one_line_and_runs_nothing(
    sweep_file, tmp_path, capsys, no_runs, resume
):
    out = tmp_path / "out"
    fd = _hold(out)
    try:
        before = os.fstat(fd).st_ino
        rc, err = _cli(capsys, "sweep", sweep_file, "--out", out, "--workers", "1", *(["--resume"] * resume))
        assert rc == 2 and err.count("\n") == 1 and err.startswith(f"error: {out}: another sweep is writing there")
        assert "--wait" in err and "--resume" in err and len(err) <= 760, err
        assert sorted(p.name for p in out.iterdir()) == [LOCK]  # no rows, no report, no orphan cleaning
        assert os.stat(out / LOCK).st_ino == before and _locked(out / LOCK)  # the holder's lock is untouched
    finally:
        os.close(fd)


def test_with_wait_a_second_sweep_says_it_waits_and_runs_once_the_lock_is_released(sweep_file, tmp_path):
    out = tmp_path / "out"
    fd = _hold(out)
    proc = sweep_process(sweep_file, "--out", out, "--workers", "2", "--wait")
    try:
        line = _first_line(proc)
        assert line.count("\n") == 1 and str(out) in line and WAITING in line, line
        assert proc.poll() is None and not (out / "rows").exists()  # waiting, nothing run
    finally:
        os.close(fd)  # the first sweep ends
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 2 and (df["status"] == "ok").all()
    assert not (out / LOCK).exists()  # removed when the sweep ended


def _blocked_on(pid: int) -> set[int]:
    """The inodes of the files whose flock ``pid`` waits for (/proc/locks: ``N: -> FLOCK ADVISORY WRITE PID
    MAJ:MIN:INODE ...``)."""
    inodes = set()
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[1] == "->" and parts[2] == "FLOCK" and parts[5] == str(pid):
            inodes.add(int(parts[6].rsplit(":", 1)[1]))
    return inodes


def _wait_for(condition, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not condition():
        time.sleep(0.05)
    return condition()


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="sees who waits for a lock through /proc/locks")
def test_a_waiting_sweep_that_wakes_on_a_removed_lock_file_waits_for_the_new_one(sweep_file, tmp_path):
    """The lock file is removed when a sweep ends; a sweep waiting on it must then lock the file in its place (a
    third sweep may hold that one), never run on the stale one."""
    out = tmp_path / "out"
    held = [_hold(out)]
    proc = sweep_process(sweep_file, "--out", out, "--workers", "1", "--wait")
    try:
        assert WAITING in _first_line(proc)
        old = os.fstat(held[0]).st_ino
        assert _wait_for(lambda: _blocked_on(proc.pid) == {old}), _blocked_on(proc.pid)
        os.unlink(out / LOCK)  # the first sweep ends (removing its file), a third one starts and locks a new file
        held.append(_hold(out))
        os.close(held.pop(0))
        new = os.fstat(held[0]).st_ino
        assert _wait_for(lambda: _blocked_on(proc.pid) == {new}), _blocked_on(proc.pid)
        assert proc.poll() is None and not (out / "rows").exists()
    finally:
        for fd in held:
            os.close(fd)
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    assert len(pd.read_parquet(out / "results.parquet")) == 2


def test_a_waiting_sweep_still_needs_resume_for_the_rows_the_first_one_left(sweep_file, tmp_path):
    out = tmp_path / "out"
    fd = _hold(out)
    proc = sweep_process(sweep_file, "--out", out, "--workers", "1", "--wait")
    try:
        assert WAITING in _first_line(proc)
        (out / "rows").mkdir()
        (out / "rows" / "0123456789abcdef.parquet").write_bytes(b"a row of the first sweep")
    finally:
        os.close(fd)
    assert proc.wait(timeout=120) == 2
    err = proc.stderr.read() if proc.stderr else ""
    assert err.count("\n") == 1 and "holds results of an earlier sweep: pass --resume" in err, err
    assert not (out / "results.parquet").exists()


def test_wait_without_resume_on_a_folder_with_rows_is_refused_before_waiting(sweep_file, tmp_path, capsys, no_runs):
    out = tmp_path / "out"
    fd = _hold(out)
    try:
        (out / "rows").mkdir()
        (out / "rows" / "0123456789abcdef.parquet").write_bytes(b"x")
        rc, err = _cli(capsys, "sweep", sweep_file, "--out", out, "--wait")  # would block if it waited
        assert rc == 2 and err.count("\n") == 1 and "pass --resume" in err, err
    finally:
        os.close(fd)


def test_the_lock_is_held_with_the_ray_executor_and_a_refused_start_leaves_nothing(
    sweep_file, tmp_path, capsys, monkeypatch, no_runs
):
    import sim.sweep.cli

    seen = []

    def start_ray(address, workers):
        seen.append(_locked(tmp_path / "new" / "out" / LOCK))
        raise ConfigError("--address", "refused token")

    monkeypatch.setattr(sim.sweep.cli, "start_ray", start_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    rc, err = _cli(capsys, "sweep", sweep_file, "--executor", "ray", "--out", tmp_path / "new" / "out")
    assert rc == 2 and seen == [True] and "refused token" in err
    assert not (tmp_path / "new").exists()  # the folders it made for the lock are gone again


def test_a_finished_sweep_releases_the_lock_and_keeps_the_folder_it_made(sweep_file, tmp_path, capsys):
    out = tmp_path / "a" / "out"
    rc, err = _cli(capsys, "sweep", sweep_file, "--out", out, "--workers", "1", "--quiet")
    assert rc == 0, err
    assert not (out / LOCK).exists() and (out / "results.parquet").exists()
    rc, err = _cli(capsys, "sweep", sweep_file, "--out", out, "--workers", "1", "--quiet", "--resume")
    assert rc == 0 and "2 already done, 0 to run" in err, err


@pytest.mark.parametrize("kind", ["folder", "fifo", "link"])
def test_a_lock_path_that_is_not_a_regular_file_is_refused_in_one_line(sweep_file, tmp_path, capsys, no_runs, kind):
    out = tmp_path / "out"
    out.mkdir()
    target = out / LOCK
    if kind == "folder":
        target.mkdir()
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to(tmp_path / "elsewhere")
    rc, err = _cli(capsys, "sweep", sweep_file, "--out", out, "--workers", "1")
    assert rc == 2 and err.count("\n") == 1 and LOCK in err, err
    assert not (tmp_path / "elsewhere").exists()  # nothing made through the link
