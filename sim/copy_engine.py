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

Software (a serving-system profile, ``sim/system_spec.py``; both off by default): with ``writeback`` seconds set,
each eviction the engine reports (``evicted``) is written back device->host over the link before the next copy
starts, taking that long on the link (one copy and one write-back at a time: mixtral-offloading swaps on one
stream); with ``serial``, a copy never starts while the compute stream computes: copies queue until the stream waits
(the engine calls :meth:`CopyEngine.kick` then), as on one stream where a copy and compute never overlap.

Events: a copy's landing and the copy thread's wake-up are entries ``(time, priority, id, callback)`` on the SimPy
environment's event heap, with the ids SimPy would give their timeouts (``env._eid``); the engine
(``sim/engine.py``) steps that heap by hand and calls ``callback()``. At most one of them is pending at a time
(the copy on the link, or the thread waking up to start one).
"""

from __future__ import annotations

from heapq import heappush

import simpy
from simpy.core import NORMAL

from sim.copy_queue import CopyJob, CopyQueue, QueueCounters

__all__ = ["CopyEngine", "CopyJob"]


class CopyEngine(QueueCounters):
    """Callback-driven: a copy is one heap entry whose callback lands it and starts the next; no process."""

    def __init__(self, env: simpy.Environment, copy_s: float, nbytes: int, buffers: int, reserve: int,
                 timeline: list | None = None, slowdown: float = 1.0, handoff: float = 0.0, gap: float = 0.0,
                 writeback: float = 0.0, serial: bool = False):
        self.env = env
        self.writeback = writeback   # seconds one evicted expert's write-back takes on the link (0: none)
        self.writebacks = 0          # write-backs done
        self.owed = 0                # evictions not yet written back
        self.serial = serial         # copies start only while the compute stream waits
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
        self.timeline = timeline
        self.current: CopyJob | None = None  # the copy on the link
        self._heap, self._eid = env._queue, env._eid
        # the idle copy thread (not already waking) is asked for a copy: it starts now, or after the hand-off
        self._wake = self._wake_later if handoff else self._start_next
        self._landed, self._woke = self._land, self._woken   # the callbacks, bound once

    # ---------------------------------------------------------------------------------------------- requests
    def submit(self, layer: int, expert: int, prefetch: bool) -> CopyJob:
        job = self.queue.submit(layer, expert, prefetch)
        if self.current is None and not self.waking:
            self._wake()
        return job

    def upgrade(self, job: CopyJob) -> None:
        """A prefetched expert is needed now: if its copy has not started, it joins the demand queue."""
        if self.queue.upgrade(job) and self.current is None and not self.waking:
            self._wake()

    def drop(self, job: CopyJob) -> None:
        """A prefetched expert went unused: cancel its copy, or free its buffer once it has landed."""
        if self.queue.drop(job) and self.current is None and not self.waking:
            self._wake()

    def release(self, job: CopyJob) -> None:
        """``job``'s working buffer is free again."""
        q = self.queue
        q.release(job.buffer)
        if self.current is None and not self.waking and (self.handoff or q.demand or q.prefetch):
            self._wake()

    # -------------------------------------------------------------------------------------------- the link
    def _wake_later(self) -> None:
        self.waking = True
        heappush(self._heap, (self.env._now + self.handoff, NORMAL, next(self._eid), self._woke))

    def _woken(self) -> None:
        self.waking = False
        if self.current is None:
            self._start_next()

    def evicted(self, n: int) -> None:
        """``n`` experts were evicted: each is written back before the next copy (with ``writeback`` set)."""
        if self.writeback and n > 0:
            self.owed += n

    def kick(self) -> None:
        """The compute stream waits (serial): start the next queued copy if the link is idle."""
        if self.current is None and not self.waking and self.queue.has_next():
            self._wake()

    def _duration(self) -> float:
        """The next copy's time on the link, its owed write-backs first (software: write-back, serial)."""
        duration = self.copy_s * self.slowdown if self.computing else self.copy_s
        if self.owed:
            duration += self.owed * self.writeback
            self.writebacks += self.owed
            self.owed = 0
        return duration

    def _start_next(self) -> None:
        if self.serial and self.computing:
            return
        job = self.queue.start_next()
        if job is None:
            return
        job.start = now = self.env._now
        if self.serial or self.writeback:
            duration = self._duration()
        else:
            duration = self.copy_s * self.slowdown if self.computing else self.copy_s
        job.end = end = now + duration  # planned; the engine reads it to stretch overlapping compute
        self.busy_s += duration
        self.current = job
        heappush(self._heap, (end, NORMAL, next(self._eid), self._landed))

    def _land(self) -> None:
        """The copy on the link lands: it waits in ``ready`` for its layer (or frees its buffer if dropped)."""
        job = self.current
        self.current = None
        if self.timeline is not None:
            kind = "prefetch" if job.was_prefetch else "demand"
            self.timeline.append(("copy", f"L{job.layer} E{job.expert} {kind}", job.start, job.end - job.start))
        q = self.queue
        q.land(job)
        if not q.demand and not q.prefetch:
            return
        if self.gap and q.has_next():  # the copy thread notices the landing, then issues the next copy
            self.waking = True
            heappush(self._heap, (self.env._now + self.gap, NORMAL, next(self._eid), self._woke))
            return
        if self.serial or self.writeback:  # the software's rules are in _start_next
            self._start_next()
            return
        job = q.start_next()   # as _start_next, inline (once per copy)
        if job is None:
            return
        job.start = now = self.env._now
        duration = self.copy_s * self.slowdown if self.computing else self.copy_s
        job.end = end = now + duration
        self.busy_s += duration
        self.current = job
        heappush(self._heap, (end, NORMAL, next(self._eid), self._landed))

    # ---------------------------------------------------------------------------------------------- counters
    @property
    def pcie_bytes(self) -> int:
        """Bytes over the link: the copies, and the write-backs of evicted experts."""
        if self.writebacks:
            return (self.queue.copies + self.writebacks) * self.nbytes
        return self.queue.copies * self.nbytes
