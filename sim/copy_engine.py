"""The host-to-device copy engine and the shared working buffers.

One copy at a time crosses the link (a GPU has one host-to-device copy engine), by the copy-queue rules of
``sim/copy_queue.py`` (demand before prefetch, working buffers and their reserve, upgrades and drops), the rules the
validator's copy thread follows too. This module adds simulated time.

Hand-off: the copy engine is driven by a host thread that issues one copy at a time and waits for it to land;
when the link is idle, a copy asked for by the compute stream (a submission, or a freed buffer) starts ``handoff``
seconds later, the time that thread takes to wake up; a copy already queued when the last one lands starts
``gap`` seconds after that landing, the time the thread takes to notice the landing and issue the next one while
the compute thread keeps the host busy (both 0 unless calibrated: ``handoff_us``, ``copy_gap_us``).

Interference: a copy that starts while the compute stream computes (``computing``, kept by the engine) takes
``slowdown`` times longer (copies and compute share memory bandwidth; 1 on a machine calibrated without it).
"""

from __future__ import annotations

import simpy
from simpy.core import NORMAL

from sim.copy_queue import CopyJob, CopyQueue, QueueCounters

__all__ = ["CopyEngine", "CopyJob"]


class Landing:
    """The event the compute stream waits on for a layer's next landed copy, as a marker: ``succeed`` (when the copy
    lands) draws the id SimPy would give that event and keeps its (time, priority, id) key in ``key``; the stream
    then resumes after every event ordered before it (``sim/engine.py``)."""

    __slots__ = ("env", "key")

    def __init__(self, env: simpy.Environment):
        self.env, self.key = env, None

    def succeed(self) -> None:
        env = self.env
        self.key = (env.now, NORMAL, next(env._eid))


class CopyEngine(QueueCounters):
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
        self.queue = q = CopyQueue(buffers, reserve)
        self.demand, self.prefetch, self.ready = q.demand, q.prefetch, q.ready   # read by the engine
        self.waiter: dict[int, Landing] = {}
        self.timeline = timeline
        self.current: CopyJob | None = None  # the copy on the link

    # ---------------------------------------------------------------------------------------------- requests
    def submit(self, layer: int, expert: int, prefetch: bool) -> CopyJob:
        job = self.queue.submit(layer, expert, prefetch)
        if self.current is None:
            self._wake()
        return job

    def upgrade(self, job: CopyJob) -> None:
        """A prefetched expert is needed now: if its copy has not started, it joins the demand queue."""
        if self.queue.upgrade(job) and self.current is None:
            self._wake()

    def drop(self, job: CopyJob) -> None:
        """A prefetched expert went unused: cancel its copy, or free its buffer once it has landed."""
        if self.queue.drop(job) and self.current is None:
            self._wake()

    def release(self, job: CopyJob) -> None:
        """``job``'s working buffer is free again."""
        self.queue.release(job.buffer)
        if self.current is None:
            self._wake()

    def wait_landing(self, layer: int) -> "Landing":
        """What the compute stream waits on: the next copy for ``layer`` to land."""
        w = self.waiter[layer] = Landing(self.env)
        return w

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

    def _woken(self, _event) -> None:
        self.waking = False
        if self.current is None:
            self._start_next()

    def _start_next(self) -> None:
        q = self.queue
        if not q.demand and not q.prefetch:
            return
        job = q.start_next()
        if job is None:
            return
        job.start = self.env.now
        duration = self.copy_s * self.slowdown if self.computing else self.copy_s
        job.end = job.start + duration  # planned; the engine reads it to stretch overlapping compute
        self.busy_s += duration
        self.current = job
        self.env.timeout(duration).callbacks.append(self._land)

    def _land(self, _event) -> None:
        job = self.current
        self.current = None
        if self.timeline is not None:
            kind = "prefetch" if job.was_prefetch else "demand"
            self.timeline.append(("copy", f"L{job.layer} E{job.expert} {kind}", job.start, job.end - job.start))
        if self.queue.land(job):
            w = self.waiter.pop(job.layer, None)
            if w is not None:
                w.succeed()
        if self.gap and self.queue.has_next():  # the copy thread notices the landing, then issues the next copy
            self.waking = True
            self.env.timeout(self.gap).callbacks.append(self._woken)
        else:
            self._start_next()

    # ---------------------------------------------------------------------------------------------- counters
    @property
    def pcie_bytes(self) -> int:
        return self.queue.copies * self.nbytes
