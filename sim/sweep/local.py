"""Running a sweep's points and storing each row as it finishes: in this process (``workers == 1``), in a process
pool that survives dying workers (Ray tasks: ``sim.sweep.ray.executor``).

A worker that dies (kill -9, the out-of-memory killer) takes the points it was running with it. An attempt is
one start of a point; a point is started at most ``max_attempts`` times (default 2) before it is recorded as
failed with "worker died" (``--resume`` tries it again later). In the process pool a dead worker breaks the whole
pool, and every point in flight then is a suspect: the pool is replaced, the points not yet started run in the
new pool, and then the suspects run again one at a time, so a point that kills its worker every time cannot
take others down with it, and fails after ``max_attempts`` starts instead of looping. A Ray worker's (or node's)
death fails only its own task, which is submitted again (``sim.sweep.ray.executor``).

The pool's processes are started with ``fork`` on Linux (the default there before Python 3.14: a worker starts
with the sweep's modules loaded) and ``spawn`` elsewhere, never ``forkserver``: either way a worker's parent is
the sweep process itself, so ``sim.sweep.worker.exit_with_parent`` ends the workers when it dies (an orphaned
worker would otherwise wait forever for work, holding its memory, and, forked, the lock on the sweep's folder).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from sim.sweep.recorder import MAX_ATTEMPTS, Progress, Recorder, Result
from sim.sweep.spec import Point, Sweep
from sim.sweep.worker import attempt, attempt_in_worker, exit_with_parent, task_options

START_METHOD = "fork" if sys.platform.startswith("linux") else "spawn"  # the pool's; see the module docstring


def run_local(
    sweep: Sweep, todo: list[Point], out: Path, workers: int, progress: Progress, max_attempts: int = MAX_ATTEMPTS
) -> None:
    """Run points in a process pool (or in this process when workers == 1), storing each row as it finishes. The
    pool never has more processes than points to run."""
    rec = Recorder(sweep, out, progress)
    options = task_options(sweep)
    if workers <= 1:
        for p in todo:
            rec.finish(p, attempt(sweep.base, p.overrides, sweep.source, options=options), 1)
        return
    fresh: deque[Point] = deque(todo)
    suspects: deque[Point] = deque()
    attempts: Counter[str] = Counter()
    while fresh or suspects:
        retrying = not fresh  # the points never started go first, at full width; then the suspects, alone
        lost, why = _run_pool(suspects if retrying else fresh, 1 if retrying else workers, sweep, rec, attempts)
        if not lost:
            continue
        again = [p for p in lost if attempts[p.id] < max_attempts]
        given_up = [p for p in lost if attempts[p.id] >= max_attempts]
        for p in given_up:
            rec.died(p, attempts[p.id], why)
        suspects.extend(again)
        news = ([f"{len(again)} to retry one at a time"] if again else []) + (
            [f"{len(given_up)} given up after {max_attempts} attempt(s)"] if given_up else []
        )
        progress.note(
            f"a worker died with {len(lost)} point(s) in flight: {', '.join(news)}"
            + ("; starting a new pool" if fresh or suspects else "")
        )


def _run_pool(queue: deque, width: int, sweep: Sweep, rec: Recorder, attempts: Counter) -> tuple[list[Point], str]:
    """Run the points of ``queue`` in a new pool of ``width`` processes, at most ``width`` at a time (so every
    point handed to the pool is running), storing each finished row. Returns ([], "") when the queue ran dry, or,
    when a worker died, the points that were in flight (each charged one attempt) and why the pool broke."""
    inflight: dict = {}
    options = task_options(sweep)  # what each task does besides its run (a capacity search)
    width = max(1, min(width, len(queue)))  # a process per point at most: never idle workers
    pool = _new_pool(width)
    try:
        while queue or inflight:
            while queue and len(inflight) < width:
                p = queue.popleft()
                attempts[p.id] += 1
                try:
                    fut = pool.submit(attempt_in_worker, sweep.base, p.overrides, sweep.source, None, options)
                    inflight[fut] = p
                except BrokenProcessPool as exc:  # broke while idle: this point was handed to a dead pool
                    return [p, *_harvest(inflight, rec, attempts)], str(exc)
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            broken = [f.exception() for f in done if isinstance(f.exception(), BrokenProcessPool)]
            if broken:
                return _harvest(inflight, rec, attempts), str(broken[0])
            for fut in done:
                p = inflight.pop(fut)
                rec.finish(p, _result(fut), attempts[p.id])
        return [], ""
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _new_pool(width: int) -> ProcessPoolExecutor:
    """A pool of ``width`` processes, children of this one, that die when it dies. (Linux ties that to the thread
    that forks them: this one, which outlives the pool, since every pool is shut down before ``run_local``
    returns.)"""
    return ProcessPoolExecutor(
        max_workers=width,
        mp_context=multiprocessing.get_context(START_METHOD),
        initializer=exit_with_parent,
        initargs=(os.getpid(),),
    )


def _harvest(inflight: dict, rec: Recorder, attempts: Counter) -> list[Point]:
    """After the pool broke: store the points that finished anyway; return the ones lost with the pool."""
    wait(inflight)  # a broken pool fails every pending future at once
    lost = []
    for fut, p in inflight.items():
        if isinstance(fut.exception(), BrokenProcessPool):
            lost.append(p)
        else:
            rec.finish(p, _result(fut), attempts[p.id])
    return lost


def _result(fut) -> Result:
    exc = fut.exception()
    if exc is None:
        return fut.result()
    if not isinstance(exc, Exception):  # KeyboardInterrupt in a worker: the user stops the sweep
        raise exc
    return "failed", None, f"{type(exc).__name__}: {exc}".splitlines()[0][:500], 0.0
