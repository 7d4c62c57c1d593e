"""The copy-queue rules, without time or threads: which copy from host starts next and where it lands. The SimPy
copy engine (``sim/timing/copy_engine.py``) drives them with simulated time; the executor's copy thread
(``validate/copier.py``) drives them with real copies.

- One copy at a time: a copy in flight is never preempted.
- Demand copies (a layer waits for them now) start before queued prefetches; a prefetch needed now moves up to
  the demand queue if it has not started (``upgrade``).
- Every copy lands in a working buffer (the LPC) and needs a free one before it starts: demand copies may take
  any free buffer, prefetches leave ``reserve`` buffers free so that a demand copy can always make progress (at
  least one, whatever the config says, or prefetches for the next layer could hold every buffer while the
  current layer waits).
- A buffer is free again when the expert in it has computed (and been promoted, if it is): ``release``, with the
  engine's marker of that moment; or at once for a prefetch nobody used (``drop``).
- Landed copies wait per layer, in landing order, for the compute side to take.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["CopyJob", "CopyQueue", "QueueCounters"]


class CopyJob:
    """One expert's copy from host into a working buffer, for one MoE layer."""

    __slots__ = (
        "layer",
        "expert",
        "was_prefetch",
        "started",
        "finished",
        "dropped",
        "buffer",
        "after",
        "start",
        "end",
        "landed",
    )

    def __init__(self, layer: int, expert: int, prefetch: bool):
        self.layer, self.expert, self.was_prefetch = layer, expert, prefetch
        self.started = self.finished = self.dropped = False
        self.buffer: int | None = None  # index of the working buffer it lands in
        self.after: object = None  # the engine's marker of when that buffer was freed (None: free from the start)
        self.start = self.end = 0.0  # simulated start and (planned) landing
        self.landed: Any = None  # the executor's device timestamps of the copy (validate.backends.Landed)


class CopyQueue:
    """The demand and prefetch queues, the free working buffers and the landed copies per layer."""

    def __init__(self, buffers: int, reserve: int):
        self.capacity = buffers
        self.reserve = max(1, reserve)  # with one buffer, prefetches wait until their layer needs them
        self.free: deque[tuple[int, object]] = deque((i, None) for i in range(buffers))  # (buffer, freed marker)
        self.demand: deque[CopyJob] = deque()
        self.prefetch: deque[CopyJob] = deque()
        self.ready: dict[int, deque[CopyJob]] = {}
        self.copies = 0
        self.prefetch_copies = 0
        self.max_in_use = 0
        self.marked = False  # a buffer was released with a marker (the executor's): see served()

    # ------------------------------------------------------------------------------------ the compute side
    def submit(self, layer: int, expert: int, prefetch: bool) -> CopyJob:
        job = CopyJob(layer, expert, prefetch)
        (self.prefetch if prefetch else self.demand).append(job)
        return job

    def upgrade(self, job: CopyJob) -> bool:
        """A prefetched expert is needed now: if its copy has not started, it joins the demand queue (True)."""
        if not job.started and job in self.prefetch:
            self.prefetch.remove(job)
            self.demand.append(job)
            return True
        return False

    def drop(self, job: CopyJob) -> bool:
        """A prefetched expert went unused: cancel its copy, or free its buffer if it has landed (True); a copy in
        flight frees its buffer when it lands."""
        job.dropped = True
        if not job.started:
            (self.prefetch if job in self.prefetch else self.demand).remove(job)
        elif job.finished:
            q = self.ready.get(job.layer)
            if q is not None and job in q:
                q.remove(job)
            assert job.buffer is not None  # a started copy holds a buffer
            self.free.append((job.buffer, None))
            return True
        return False

    def take(self, layer: int) -> CopyJob | None:
        """The next landed copy for ``layer``, or None."""
        q = self.ready.get(layer)
        return q.popleft() if q else None

    def release(self, buffer: int, after=None) -> None:
        """A working buffer is free again once the work marked by ``after`` is done."""
        if len(self.free) >= self.capacity:
            raise AssertionError("working buffer released twice")
        if after is not None:
            self.marked = True
        self.free.append((buffer, after))

    # ------------------------------------------------------------------------------------------- the link
    def _queue(self) -> deque | None:
        """The queue the next copy may come from now (demand first; prefetches leave the reserve free), or None."""
        if self.demand and self.free:
            return self.demand
        if self.prefetch and len(self.free) > self.reserve:
            return self.prefetch
        return None

    def has_next(self) -> bool:
        """A copy could start now."""
        return self._queue() is not None

    def start_next(self) -> CopyJob | None:
        """The copy to start now, with its working buffer taken (``job.buffer``, ``job.after``), or None."""
        free = self.free
        if self.demand and free:  # as _queue, inline (the simulator calls this once per copy and more)
            job = self.demand.popleft()
        elif self.prefetch and len(free) > self.reserve:
            job = self.prefetch.popleft()
        else:
            return None
        job.buffer, job.after = free.popleft()
        job.started = True
        in_use = self.capacity - len(free)
        if in_use > self.max_in_use:
            self.max_in_use = in_use
        return job

    def land(self, job: CopyJob) -> bool:
        """A copy landed: it waits for its layer (True), or its buffer is free again if it was dropped (False)."""
        job.finished = True
        self.copies += 1
        if job.was_prefetch:
            self.prefetch_copies += 1
        if job.dropped:
            assert job.buffer is not None  # a started copy holds a buffer
            self.free.append((job.buffer, None))
            return False
        q = self.ready.get(job.layer)
        if q is None:
            q = self.ready[job.layer] = deque()
        q.append(job)
        return True

    def served(self, n: int, in_use: int) -> None:
        """``n`` demand copies, asked for at once with the link idle, nothing queued and ``n`` buffers free, have
        started back to back, landed, been taken and released in the order they were asked for: as if each had
        gone through :meth:`submit`, :meth:`start_next`, :meth:`land`, :meth:`take` and :meth:`release`. Each took
        the first free buffer and gave it back to the end of the free ones; ``in_use``: the most buffers in use as
        one of them started (or any figure between that and the peak so far: the peak stands). Only for buffers
        released without a marker (the simulator's), which rotating the free ones keeps."""
        if len(self.free) < n or self.demand or self.prefetch:
            raise AssertionError("copies served back to back need the link's queues empty and their buffers free")
        if self.marked:
            raise AssertionError("copies served back to back take buffers released without a marker")
        self.free.rotate(-n)  # each marker None, before and after: a release here marks nothing
        self.copies += n
        if in_use > self.max_in_use:
            self.max_in_use = in_use

    @property
    def in_use(self) -> int:
        return self.capacity - len(self.free)


class QueueCounters:
    """The counters of a copy engine that drives a :class:`CopyQueue` (``self.queue``)."""

    queue: CopyQueue

    @property
    def copies(self) -> int:
        return self.queue.copies

    @property
    def prefetch_copies(self) -> int:
        return self.queue.prefetch_copies

    @property
    def max_in_use(self) -> int:
        return self.queue.max_in_use
