"""The executor's copy engine: a thread that copies experts from host memory into the shared working buffers, one
at a time, by the simulator's rules (``sim/copy_engine.py``): demand copies before queued prefetches, a copy in
flight is never preempted, every copy needs a free working buffer, prefetches leave ``reserve`` buffers free, a
buffer is free again once the expert in it has computed (and been promoted), or at once for an unused prefetch.

Landed copies are queued per layer, in landing order, for the compute thread to take.

What it counts, timed on the device (CUDA events on a GPU) and read once the copier is closed (reading an event's
time takes the interpreter lock, which the copy thread must not wait for between copies): :meth:`timings` gives
the copies' own time, not the host's wait for them, and how long the link stood idle between a copy landing and
the start of the next one that was already queued: the copy thread's wake-up and hand-off, under whatever load the
run puts on the host (the simulator's ``copy_gap_us``).
"""

from __future__ import annotations

import threading
from collections import deque


class Job:
    """One expert's copy into a working buffer, for one MoE layer."""

    __slots__ = ("layer", "expert", "was_prefetch", "started", "finished", "dropped", "buffer", "landed")

    def __init__(self, layer: int, expert: int, prefetch: bool):
        self.layer, self.expert, self.was_prefetch = layer, expert, prefetch
        self.started = self.finished = self.dropped = False
        self.buffer = None   # index of the working buffer it lands in
        self.landed = None   # the backend's Landed (start and end timestamps of the copy)


class Copier:
    """Runs ``backend.copy_in`` on its own thread. ``source(layer, expert)`` gives the host buffer of an expert;
    ``buffers`` are the device working buffers."""

    def __init__(self, backend, source, buffers: list, reserve: int = 1):
        self.backend = backend
        self.source = source
        self.buffers = buffers
        self.reserve = max(1, reserve)
        self.free: deque[tuple[int, object]] = deque((i, None) for i in range(len(buffers)))  # (buffer, after)
        self.demand: deque[Job] = deque()
        self.prefetch: deque[Job] = deque()
        self.ready: dict[int, deque[Job]] = {}
        self.cond = threading.Condition()
        self.stopping = False
        self.error: BaseException | None = None
        self.copies = 0
        self._spans: list[tuple] = []  # (landed, previous landing's end, buffer's release marker, was queued)
        self._queued_at_landing = False
        self._last_end = None
        self.prefetch_copies = 0
        self.max_in_use = 0
        self.thread = threading.Thread(target=self._loop, name="copier", daemon=True)
        self.thread.start()

    # ---------------------------------------------------------------------------------- compute thread side
    def submit(self, layer: int, expert: int, prefetch: bool) -> Job:
        job = Job(layer, expert, prefetch)
        with self.cond:
            (self.prefetch if prefetch else self.demand).append(job)
            self.cond.notify_all()
        return job

    def upgrade(self, job: Job) -> None:
        """A prefetched expert is needed now: if its copy has not started, it joins the demand queue."""
        with self.cond:
            if not job.started and job in self.prefetch:
                self.prefetch.remove(job)
                self.demand.append(job)
                self.cond.notify_all()

    def drop(self, job: Job) -> None:
        """A prefetched expert went unused: cancel its copy, or free its buffer once it has landed."""
        with self.cond:
            job.dropped = True
            if not job.started:
                (self.prefetch if job in self.prefetch else self.demand).remove(job)
            elif job.finished:
                q = self.ready.get(job.layer)
                if q is not None and job in q:
                    q.remove(job)
                self.free.append((job.buffer, None))
                self.cond.notify_all()

    def take(self, layer: int) -> Job:
        """The next landed copy for ``layer`` (blocks until one lands)."""
        with self.cond:
            while True:
                self._raise()
                q = self.ready.get(layer)
                if q:
                    return q.popleft()
                self.cond.wait()

    def release(self, job: Job, after) -> None:
        """``job``'s buffer is free once the work marked by ``after`` is done."""
        with self.cond:
            self.free.append((job.buffer, after))
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
    def _queue(self) -> deque | None:
        """The queue the next copy may come from now (demand first; prefetches leave the reserve free), or None."""
        if self.demand and self.free:
            return self.demand
        if self.prefetch and len(self.free) > self.reserve:
            return self.prefetch
        return None

    def _next(self):
        queue = self._queue()
        return None if queue is None else queue.popleft()

    def _loop(self) -> None:
        try:
            while True:
                with self.cond:
                    job = self._next()
                    while job is None:
                        if self.stopping:
                            return
                        self.cond.wait()
                        job = self._next()
                    buffer, after = self.free.popleft()
                    job.buffer, job.started = buffer, True
                    self.max_in_use = max(self.max_in_use, len(self.buffers) - len(self.free))
                    back_to_back, last_end = self._queued_at_landing, self._last_end
                landed = self.backend.copy_in(self.buffers[buffer], self.source(job.layer, job.expert), after)
                with self.cond:
                    self._spans.append((landed, last_end, after, back_to_back))
                    self._last_end = landed.end
                    job.landed, job.finished = landed, True
                    self.copies += 1
                    self.prefetch_copies += job.was_prefetch
                    if job.dropped:
                        self.free.append((buffer, None))
                    else:
                        self.ready.setdefault(job.layer, deque()).append(job)
                    self._queued_at_landing = self._queue() is not None
                    self.cond.notify_all()
        except BaseException as exc:  # surfaced on the compute thread's next take/close
            with self.cond:
                self.error = exc
                self.cond.notify_all()
