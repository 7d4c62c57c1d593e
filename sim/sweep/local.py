"""Running a sweep's points and storing each row as it finishes: in this process (``workers == 1``), in a process
pool that survives dying workers, or as Ray tasks.

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
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from sim.sweep.spec import Point, Sweep
from sim.sweep.store import row_of, write_row
from sim.sweep.worker import DONE, attempt, attempt_in_worker, exit_with_parent, task_options

MAX_ATTEMPTS = 2
START_METHOD = "fork" if sys.platform.startswith("linux") else "spawn"  # the pool's; see the module docstring
Result = tuple  # (status, metrics or None, error or None, wall seconds), as returned by sim.sweep.worker.attempt


class Progress:
    """points done / failed / left and time left, on one stderr line."""

    def __init__(self, total: int, quiet: bool = False):
        self.total, self.done, self.failed, self.t0 = total, 0, 0, time.perf_counter()
        self.quiet = quiet or not sys.stderr.isatty()

    def update(self, status: str) -> None:
        self.done += 1
        self.failed += status not in DONE  # a point that does not fit in the GPU's memory is a result
        if self.quiet:
            return
        elapsed = time.perf_counter() - self.t0
        left = (self.total - self.done) * elapsed / self.done if self.done else 0.0
        print(
            f"\r  sweep: {self.done}/{self.total} points, {self.failed} failed, ~{left:.0f} s left   ",
            end="" if self.done < self.total else "\n",
            file=sys.stderr,
            flush=True,
        )

    def note(self, message: str) -> None:
        """A line on stderr about the run (a dead worker, a retry), shown even when the progress line is not."""
        lead = "\n" if not self.quiet and 0 < self.done < self.total else ""
        print(f"{lead}  sweep: {message}", file=sys.stderr, flush=True)


class Recorder:
    """Stores the row of each point as it finishes, counting it in the progress line."""

    def __init__(self, sweep: Sweep, out: Path, progress: Progress):
        self.sweep, self.out, self.progress = sweep, Path(out), progress

    def finish(self, point: Point, result: Result, attempts: int) -> None:
        status, metrics, error, wall = result
        write_row(self.out, row_of(self.sweep, point, status, metrics, error, wall, attempts))
        self.progress.update(status)

    def died(self, point: Point, attempts: int, why: str) -> None:
        """The point's worker died in each of its ``attempts``: a failed row."""
        why = why.splitlines()[0][:300] if why else "no detail"
        self.finish(point, ("failed", None, f"worker died in {attempts} attempt(s): {why}", 0.0), attempts)


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


def run_ray(
    sweep: Sweep,
    todo: list[Point],
    out: Path,
    workers: int | None,
    progress: Progress,
    address: str | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    session=None,
) -> None:
    """Run points as Ray tasks (``sim.sweep.ray.executor.run_ray``: a local Ray instance, or the cluster at ``address``,
    with the code and the traces shipped to it)."""
    from sim.sweep.ray.executor import run_ray as run

    run(sweep, todo, out, workers, progress, address, max_attempts, session)
