"""The executor's copy engine: a thread that copies experts from host memory into the shared working buffers, one
at a time, by the copy-queue rules the simulator's copy engine follows (``sim/core/copy_queue.py``): demand copies
before queued prefetches, a copy in flight is never preempted, every copy needs a free working buffer, prefetches leave
``reserve`` buffers free, a buffer is free again once the expert in it has computed (and been promoted), or at once
for an unused prefetch. Landed copies wait per layer, in landing order, for the compute thread to take.

What it counts, timed on the device (CUDA events on a GPU) and read once the copier is closed (reading an event's
time takes the interpreter lock, which the copy thread must not wait for between copies): :meth:`timings` gives
the copies' own time, not the host's wait for them, and how long the link stood idle between a copy landing and
the start of the next one that was already queued: the copy thread's wake-up and hand-off, under whatever load the
run puts on the host (the simulator's ``copy_gap_us``).
"""

from __future__ import annotations

import threading

from sim.core.copy_queue import CopyJob, CopyQueue, QueueCounters

Job = CopyJob  # the executor's name for it


class Copier(QueueCounters):
    """Runs ``backend.copy_in`` on its own thread. ``source(layer, expert)`` gives the host buffer of an expert;
    ``buffers`` are the device working buffers."""

    def __init__(self, backend, source, buffers: list, reserve: int = 1):
        self.backend = backend
        self.source = source
        self.buffers = buffers
        self.queue = CopyQueue(len(buffers), reserve)
        self.cond = threading.Condition()
        self.stopping = False
        self.error: BaseException | None = None
        self._spans: list[tuple] = []  # (landed, previous landing's end, buffer's release marker, was queued)
        self._queued_at_landing = False
        self._last_end = None
        self.thread = threading.Thread(target=self._loop, name="copier", daemon=True)
        self.thread.start()

    # ---------------------------------------------------------------------------------- compute thread side
    def submit(self, layer: int, expert: int, prefetch: bool) -> Job:
        with self.cond:
            job = self.queue.submit(layer, expert, prefetch)
            self.cond.notify_all()
        return job

    def upgrade(self, job: Job) -> None:
        """A prefetched expert is needed now: if its copy has not started, it joins the demand queue."""
        with self.cond:
            if self.queue.upgrade(job):
                self.cond.notify_all()

    def drop(self, job: Job) -> None:
        """A prefetched expert went unused: cancel its copy, or free its buffer once it has landed."""
        with self.cond:
            if self.queue.drop(job):
                self.cond.notify_all()

    def take(self, layer: int) -> Job:
        """The next landed copy for ``layer`` (blocks until one lands)."""
        with self.cond:
            while True:
                self._raise()
                job = self.queue.take(layer)
                if job is not None:
                    return job
                self.cond.wait()

    def release(self, job: Job, after) -> None:
        """``job``'s buffer is free once the work marked by ``after`` is done."""
        buffer = job.buffer
        assert buffer is not None, "a copy handed over by take holds its working buffer until released"
        with self.cond:
            self.queue.release(buffer, after)
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join()
        self._raise()

    def timings(self) -> tuple[float, float, int]:
        """(seconds of copies, seconds the link idled before copies queued when the last one landed, how many such
        copies), timed on the device; call once the copier is closed."""
        elapsed = self.backend.elapsed
        copy_s = gap_s = 0.0
        gaps = 0
        for landed, last_end, after, queued in self._spans:
            copy_s += elapsed(landed.start, landed.end)
            if queued and last_end is not None:  # idle from the later of: the last landing, the buffer's release
                gap = elapsed(last_end, landed.start)
                if after is not None:
                    gap = min(gap, elapsed(after, landed.start))
                gap_s += max(0.0, gap)
                gaps += 1
        return copy_s, gap_s, gaps

    def _raise(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the copy thread failed: {self.error!r}") from self.error

    # ------------------------------------------------------------------------------------- copy thread
    def _loop(self) -> None:
        queue = self.queue
        try:
            while True:
                with self.cond:
                    job = queue.start_next()
                    while job is None:
                        if self.stopping:
                            return
                        self.cond.wait()
                        job = queue.start_next()
                    back_to_back, last_end = self._queued_at_landing, self._last_end
                buffer = job.buffer
                assert buffer is not None, "start_next hands out a copy with its working buffer taken"
                landed = self.backend.copy_in(self.buffers[buffer], self.source(job.layer, job.expert), job.after)
                with self.cond:
                    self._spans.append((landed, last_end, job.after, back_to_back))
                    self._last_end = landed.end
                    job.landed = landed
                    queue.land(job)
                    self._queued_at_landing = queue.has_next()
                    self.cond.notify_all()
        except BaseException as exc:  # surfaced on the compute thread's next take/close
            with self.cond:
                self.error = exc
                self.cond.notify_all()
