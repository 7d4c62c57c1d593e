"""The host-to-device copy engine and the shared working buffers.

One copy at a time crosses the link (a GPU has one host-to-device copy engine). Demand copies (a layer waits for
them now) are served before queued prefetches; a copy in flight is never preempted. Every copy lands in a
working buffer (the LPC) and needs a free one before it starts: demand copies may take any free buffer,
prefetches leave ``reserve`` buffers free so that a demand copy can always make progress (at least one buffer is
always reserved when prefetching, whatever the config says, or prefetches for the next layer could hold every
buffer while the current layer waits). A buffer is freed when the expert in it has computed (and been promoted,
if it is), or at once for a prefetch nobody used.

Finished copies are queued per layer, in completion order, for the compute stream to take.

Hand-off: the copy engine is driven by a host thread that issues one copy at a time and waits for it to land;
when the link is idle, a copy asked for by the compute stream (a submission, or a freed buffer) starts ``handoff``
seconds later, the time that thread takes to wake up; a copy already queued when the last one lands starts
``gap`` seconds after that landing, the time the thread takes to notice the landing and issue the next one while
the compute thread keeps the host busy (both 0 unless calibrated: ``handoff_us``, ``copy_gap_us``).

Interference: a copy that starts while the compute stream computes (``computing``, kept by the engine) takes
``slowdown`` times longer (copies and compute share memory bandwidth; 1 on a machine calibrated without it).
"""

from __future__ import annotations

from collections import deque

import simpy


class CopyJob:
    """One expert's copy from host into a working buffer, for one MoE layer."""

    __slots__ = ("layer", "expert", "was_prefetch", "started", "finished", "dropped", "start", "end")

    def __init__(self, layer: int, expert: int, prefetch: bool):
        self.layer, self.expert, self.was_prefetch = layer, expert, prefetch
        self.started = self.finished = self.dropped = False
        self.start = self.end = 0.0


class CopyEngine:
    """Callback-driven: a copy is one SimPy timeout whose callback lands it and starts the next; no process."""

    def __init__(self, env: simpy.Environment, copy_s: float, nbytes: int, buffers: int, reserve: int,
                 timeline: list | None = None, slowdown: float = 1.0, handoff: float = 0.0, gap: float = 0.0):
        self.env = env
        self.handoff = handoff
        self.gap = gap
        self.waking = False  # the copy thread is waking up to start the next copy
        self.copy_s = copy_s
        self.slowdown = slowdown
        self.computing = True  # the compute stream is busy (not stalled on a copy)
        self.busy_s = 0.0
        self.nbytes = nbytes
        self.capacity = buffers
        self.free = buffers
        self.reserve = max(1, reserve)  # with one buffer, prefetches wait until their layer needs them
        self.demand: deque[CopyJob] = deque()
        self.prefetch: deque[CopyJob] = deque()
        self.ready: dict[int, deque[CopyJob]] = {}
        self.waiter: dict[int, simpy.Event] = {}
        self.timeline = timeline
        self.current: CopyJob | None = None  # the copy on the link
        # counters
        self.copies = 0
        self.prefetch_copies = 0
        self.max_in_use = 0

    # ---------------------------------------------------------------------------------------------- requests
    def submit(self, layer: int, expert: int, prefetch: bool) -> CopyJob:
        job = CopyJob(layer, expert, prefetch)
        (self.prefetch if prefetch else self.demand).append(job)
        if self.current is None:
            self._wake()
        return job

    def upgrade(self, job: CopyJob) -> None:
        """A prefetched expert is needed now: if its copy has not started, it joins the demand queue."""
        if not job.started and job in self.prefetch:
            self.prefetch.remove(job)
            self.demand.append(job)
            if self.current is None:
                self._wake()

    def drop(self, job: CopyJob) -> None:
        """A prefetched expert went unused: cancel its copy, or free its buffer once it has landed."""
        job.dropped = True
        if not job.started:
            (self.prefetch if job in self.prefetch else self.demand).remove(job)
        elif job.finished:
            q = self.ready.get(job.layer)
            if q is not None and job in q:
                q.remove(job)
            self.release()
        # in flight: released when it lands (see _land)

    def release(self) -> None:
        """A working buffer is free again."""
        self.free += 1
        if self.free > self.capacity:
            raise AssertionError("working buffer released twice")
        if self.current is None:
            self._wake()

    def wait_ready(self, layer: int) -> simpy.Event:
        """An event that fires when the next copy for ``layer`` lands."""
        ev = self.env.event()
        self.waiter[layer] = ev
        return ev

    # -------------------------------------------------------------------------------------------- the link
    def _wake(self) -> None:
        """The compute stream asks the idle copy thread for a copy: it starts after the hand-off."""
        if self.waking:
            return
        if not self.handoff:
            self._start_next()
        else:
            self.waking = True
            self.env.timeout(self.handoff).callbacks.append(self._woken)

    def _queue(self) -> deque | None:
        """The queue the next copy may come from now (demand first; prefetches leave the reserve free), or None."""
        if self.demand and self.free >= 1:
            return self.demand
        if self.prefetch and self.free > self.reserve:
            return self.prefetch
        return None

    def _woken(self, _event) -> None:
        self.waking = False
        if self.current is None:
            self._start_next()

    def _start_next(self) -> None:
        queue = self._queue()
        if queue is None:
            return
        job = queue.popleft()
        self.free -= 1
        in_use = self.capacity - self.free
        if in_use > self.max_in_use:
            self.max_in_use = in_use
        job.started = True
        job.start = self.env.now
        duration = self.copy_s * self.slowdown if self.computing else self.copy_s
        job.end = job.start + duration  # planned; the engine reads it to stretch overlapping compute
        self.busy_s += duration
        self.current = job
        self.env.timeout(duration).callbacks.append(self._land)

    def _land(self, _event) -> None:
        job = self.current
        self.current = None
        job.finished = True
        self.copies += 1
        if job.was_prefetch:
            self.prefetch_copies += 1
        if self.timeline is not None:
            kind = "prefetch" if job.was_prefetch else "demand"
            self.timeline.append(("copy", f"L{job.layer} E{job.expert} {kind}", job.start, job.end - job.start))
        if job.dropped:
            self.free += 1
        else:
            q = self.ready.get(job.layer)
            if q is None:
                q = self.ready[job.layer] = deque()
            q.append(job)
            w = self.waiter.pop(job.layer, None)
            if w is not None:
                w.succeed()
        if self.gap and self._queue() is not None:  # the copy thread notices the landing, then issues the next copy
            self.waking = True
            self.env.timeout(self.gap).callbacks.append(self._woken)
        else:
            self._start_next()

    @property
    def pcie_bytes(self) -> int:
        return self.copies * self.nbytes
