"""What a sweep's executors share: how many times a point is started at most, the progress line, and storing each
point's row as it finishes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sim.sweep.spec import Point, Sweep
from sim.sweep.store import row_of, write_row
from sim.sweep.worker import DONE

MAX_ATTEMPTS = 2
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
