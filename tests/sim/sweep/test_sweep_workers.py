"""A sweep's pool workers die with the sweep process: killed with SIGKILL (as the out-of-memory killer does), it
leaves no worker behind and no lock on its folder (``sim.sweep.worker.exit_with_parent``, the pool's initializer).

Processes are found through /proc (Linux only). The workers are made to sit in a point for minutes with the
``SIM_SWEEP_TEST_DELAY`` hook of ``sim.sweep.worker``, so that an orphan would still be there when checked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.support.cli import sweep_process
from tests.support.paths import ROOT

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds processes through /proc")

SWEEP = f"""base: {ROOT / "configs" / "switch_xxl.yaml"}
set: {{workload.requests: 2, workload.max_decode_tokens: 2, workload.prefill: false}}
grid:
  policy.name: [on-demand, lru, lfu]
"""
LIVENESS_S = 30.0  # a dead parent's workers are gone well within this (a bound on the wait, not a timing claim)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), or None when there is no such
    process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rsplit(")", 1)[1].split()


def _children(pid: int) -> dict[int, str]:
    """The live children of ``pid``: {pid: start time}, the start time telling a process from a later one that
    reuses its pid."""
    kids = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields and int(fields[1]) == pid and fields[0] != "Z":
            kids[int(entry.name)] = fields[19]
    return kids


def _alive(pid: int, start: str) -> bool:
    """Whether the process ``pid`` started at ``start`` still runs (a zombie has ended: it holds no memory)."""
    fields = _stat(pid)
    return fields is not None and fields[19] == start and fields[0] != "Z"


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _kill_left(procs: dict[int, str]) -> None:
    """Clean-up after a failed check: SIGKILL the processes of ``procs`` that still run."""
    for pid, start in procs.items():
        if _alive(pid, start):
            os.kill(pid, signal.SIGKILL)


def test_killing_the_sweep_process_ends_its_workers_and_frees_its_folder(tmp_path):
    sweep, out = tmp_path / "s.yaml", tmp_path / "out"
    sweep.write_text(SWEEP)
    proc = sweep_process(sweep, "--out", out, "--workers", "2", delay=600)  # each worker sits in its first point
    workers: dict[int, str] = {}
    try:
        assert _wait_for(lambda: len(_children(proc.pid)) == 2, 60), "the pool's 2 workers never started"
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)  # the sweep process only, as the out-of-memory killer does
        proc.wait(timeout=30)
        gone = _wait_for(lambda: not any(_alive(p, s) for p, s in workers.items()), LIVENESS_S)
        assert gone, f"workers {sorted(workers)} outlived the sweep process"
    finally:
        proc.kill()
        proc.wait()
        _kill_left(workers)
    assert not list((out / "rows").glob("*.parquet"))  # killed in flight: no point finished
    again = sweep_process(sweep, "--out", out, "--workers", "1")  # the lock died with them: the folder is free
    assert again.wait(timeout=300) == 0, again.stderr.read() if again.stderr else ""
    assert (pd.read_parquet(out / "results.parquet")["status"] == "ok").sum() == 3


WATCHED = """
import os, sys, threading, time
from sim.sweep.worker import _watch_parent
parent = os.getpid()
child = os.fork()
if child == 0:
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    time.sleep(600)
    os._exit(0)
print(child, flush=True)
time.sleep(600)
"""


def test_the_watcher_thread_alone_ends_a_worker_whose_parent_died():
    """The belt beside prctl (and the only guard off Linux): no death signal asked for, the thread does it."""
    proc = subprocess.Popen([sys.executable, "-c", WATCHED], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child: dict[int, str] = {}
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        fields = _stat(pid)
        assert fields is not None and int(fields[1]) == proc.pid
        child = {pid: fields[19]}
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert _wait_for(lambda: not _alive(pid, child[pid]), LIVENESS_S), "the orphan kept running"
    finally:
        proc.kill()
        proc.wait()
        _kill_left(child)


CHECK = """
import ctypes, os, sys
from sim.sweep.worker import exit_with_parent
exit_with_parent(int(sys.argv[1]))
sig = ctypes.c_int(0)
ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
print(sig.value)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_worker_asks_for_sigkill_with_its_parent_and_exits_if_its_parent_is_already_another():
    def run(parent: int) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-c", CHECK, str(parent)]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)

    mine = run(os.getpid())  # its parent is this process: it goes on, with the death signal set
    assert mine.returncode == 0 and mine.stdout.split() == [str(int(signal.SIGKILL))], mine.stderr
    for other in (1, os.getppid()):  # as when the sweep died before prctl: it was reparented
        late = run(other)
        assert late.returncode == 1 and late.stdout == "", late.stderr
