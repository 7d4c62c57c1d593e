"""The host-to-device copy engine and the shared working buffers.

One copy at a time crosses the link (a GPU has one host-to-device copy engine), by the copy-queue rules of
``sim/core/copy_queue.py`` (demand before prefetch, working buffers and their reserve, upgrades and drops), the rules
the
validator's copy thread follows too. This module adds simulated time.

Hand-off: the copy engine is driven by a host thread that issues one copy at a time and waits for it to land;
when the link is idle, a copy asked for by the compute stream (a submission, or a freed buffer) starts ``handoff``
seconds later, the time that thread takes to wake up; a copy already queued when the last one lands starts
``gap`` seconds after that landing, the time the thread takes to notice the landing and issue the next one while
the compute thread keeps the host busy (both 0 unless calibrated: ``handoff_us``, ``copy_gap_us``).

Interference: a copy that starts while the compute stream computes (``computing``, kept by the engine) takes
``slowdown`` times longer (copies and compute share memory bandwidth; 1 on a machine calibrated without it).

Software (a serving-system profile, ``sim/config/system.py``; both off by default): with ``writeback`` seconds set,
each eviction the engine reports (``evicted``) is written back device->host over the link before the next copy
starts, taking that long on the link (one copy and one write-back at a time: mixtral-offloading swaps on one
stream); with ``serial``, a copy never starts while the compute stream computes: copies queue until the stream waits
(the engine calls :meth:`CopyEngine.kick` then), as on one stream where a copy and compute never overlap.

Events: a copy's landing and the copy thread's wake-up are events of the requesting stream's clock (``clock``, a
:class:`sim.timing.clock.StreamClock`: the stream runs them in order of time with the SimPy environment's events,
and nothing but the stream waits on them), or SimPy timeouts with callbacks when the engine runs on SimPy's own
clock (:class:`sim.timing.clock.EnvClock`, the default). At most one of them is pending at a time (the copy on the
link, or the thread waking up to start one), due at ``due``; ``events`` counts the ones processed. A request of the
compute stream happens at the stream's time (``clock.now``); an event lands at exactly that time plus its delay,
and its callback happens at its own time. Copies that can only run back to back
(:meth:`sim.timing.engine.ComputeStream.runs_back_to_back`) are timed by the engine without events and counted here
(:meth:`CopyEngine.served`): a change to when a copy starts or how long it takes changes that path, or its
conditions, too.
"""

from __future__ import annotations

from collections import deque

import simpy

from sim.core.cache import LPC
from sim.core.copy_queue import CopyJob, CopyQueue, QueueCounters
from sim.timing.clock import NEVER, EnvClock

__all__ = ["CopyEngine", "CopyJob"]


class CopyEngine(QueueCounters):
    """Callback-driven: a copy is one event of its clock whose callback lands it and starts the next; no process."""

    def __init__(
        self,
        env: simpy.Environment,
        copy_s: float,
        nbytes: int,
        buffers: int,
        reserve: int,
        timeline=None,
        slowdown: float = 1.0,
        handoff: float = 0.0,
        gap: float = 0.0,
        writeback: float = 0.0,
        serial: bool = False,
        clock=None,
    ):
        """``timeline``: a :class:`sim.timing.timeline.Timeline` that records each landed copy, or None; ``clock``: the
        requesting stream's :class:`sim.timing.clock.StreamClock` (default: SimPy's own clock)."""
        self.env = env
        self.clock = clock if clock is not None else EnvClock(env)
        self.writeback = writeback  # seconds one evicted expert's write-back takes on the link (0: none)
        self.writebacks = 0  # write-backs done
        self.owed = 0  # evictions not yet written back
        self.serial = serial  # copies start only while the compute stream waits
        self.handoff = handoff
        self.gap = gap
        self.waking = False  # the copy thread is waking up to start the next copy
        self.copy_s = copy_s
        self.slowdown = slowdown
        self.computing = True  # the compute stream is busy (not stalled on a copy)
        self.busy_s = 0.0
        self.nbytes = nbytes
        self.queue = q = CopyQueue(buffers, reserve)
        self.demand, self.prefetch, self.ready = q.demand, q.prefetch, q.ready  # read by the engine
        self.timeline = timeline
        self.current: CopyJob | None = None  # the copy on the link
        self.due = NEVER  # the time of the landing or wake-up to come (at most one), NEVER when none is
        self.events = 0  # landings and wake-ups processed
        # ``_wake(now)``: the idle copy thread (not already waking) is asked for a copy at the stream's time ``now``:
        # it starts it now, or after the hand-off
        self._wake = self._wake_later if handoff else self._start_next
        self._submit, self._start, self._landed = q.submit, q.start_next, q.land  # the queue's, once per copy
        #: a copy's time on the link is ``copy_s`` whoever asks, and nothing but the queue decides when it starts
        #: (no hand-off, gap, write-back, serial stream, slowdown or timeline): see
        #: :meth:`sim.timing.engine.ComputeStream.runs_back_to_back`
        self.plain = not (handoff or gap or writeback or serial or timeline is not None) and slowdown == 1.0
        # the callbacks, bound once: a landing on a plain machine starts the next copy at once (``_land_plain``)
        self._on_land = self._land_plain if self.plain else self._land
        self._on_woken = self._woken

    @property
    def busy(self) -> bool:
        """A copy is on the link, or the copy thread is waking up to start one."""
        return self.current is not None or self.waking

    # ---------------------------------------------------------------------------------------------- requests
    def submit(self, layer: int, expert: int, prefetch: bool) -> CopyJob:
        job = self._submit(layer, expert, prefetch)
        if self.current is None and not self.waking:
            self._wake(self.clock.now)
        return job

    def submit_layer(self, layer: int, copied, jobs: dict, next_layer, prefetch) -> tuple[int, int]:
        """A layer's copies at once: its demand copies in active order (``copied``: (expert, source), a needed
        prefetch moving up to demand, its job taken from ``jobs``), then the next layer's prefetches (their jobs
        put in ``jobs``); then the idle link is asked once. The same as asking at each request: no time passes
        in between, and the link starts the head of the same queues. Returns (copies submitted, prefetches
        used). Each copy joins its queue as :meth:`CopyQueue.submit` does it (inline: once per copy)."""
        q = self.queue
        upgrade, demand, queued = q.upgrade, q.demand, q.prefetch
        submitted = used = 0
        asked = False
        for e, src in copied:
            if src == LPC:
                asked = upgrade(jobs.pop((layer, e))) or asked
                used += 1
            else:
                demand.append(CopyJob(layer, e, False))
                submitted += 1
        for e in prefetch:
            job = jobs[(next_layer, e)] = CopyJob(next_layer, e, True)
            queued.append(job)
        submitted += len(prefetch)
        if (submitted or asked) and self.current is None and not self.waking:
            self._wake(self.clock.now)
        return submitted, used

    def drop(self, job: CopyJob) -> None:
        """A prefetched expert went unused: cancel its copy, or free its buffer once it has landed."""
        if self.queue.drop(job) and self.current is None and not self.waking:
            self._wake(self.clock.now)

    def release(self, job: CopyJob) -> None:
        """``job``'s working buffer is free again."""
        q = self.queue
        assert job.buffer is not None  # a landed copy holds a buffer
        q.release(job.buffer)
        if self.current is None and not self.waking and (self.handoff or q.demand or q.prefetch):
            self._wake(self.clock.now)

    def evicted(self, n: int) -> None:
        """``n`` experts were evicted: each is written back before the next copy (with ``writeback`` set)."""
        if self.writeback and n > 0:
            self.owed += n

    def kick(self) -> None:
        """The compute stream waits (serial): start the next queued copy if the link is idle."""
        if self.current is None and not self.waking and self.queue.has_next():
            self._wake(self.clock.now)

    def served(self, n: int, in_use: int) -> None:
        """``n`` copies were served back to back (:meth:`sim.timing.engine.ComputeStream.runs_back_to_back`): their
        time on the link, summed copy by copy as each started, their landings (events), and the queue's account of
        them (``in_use``: the most working buffers in use as one started, or any figure between that and the queue's
        peak so far)."""
        copy_s = self.copy_s
        for _ in range(n):
            self.busy_s += copy_s
        self.events += n
        self.queue.served(n, in_use)

    # -------------------------------------------------------------------------------------------- the link
    def _wake_later(self, now: float, delay: float | None = None) -> None:
        """The copy thread wakes up after the hand-off (or ``delay``) from ``now``, then starts the next copy."""
        self.waking = True
        self.due = self.clock.call_at(now, self.handoff if delay is None else delay, self._on_woken)

    def _woken(self) -> None:
        self.events += 1
        now = self.due  # this event's time
        self.due = NEVER
        self.waking = False
        if self.current is None:
            self._start_next(now)

    def _duration(self) -> float:
        """The next copy's time on the link, its owed write-backs first (software: write-back, serial)."""
        duration = self.copy_s * self.slowdown if self.computing else self.copy_s
        if self.owed:
            duration += self.owed * self.writeback
            self.writebacks += self.owed
            self.owed = 0
        return duration

    def _start_next(self, now: float) -> None:
        """Start the next queued copy at ``now`` (the compute stream's time for a request, else the event's), if the
        queue has one that may start (and, serial, the stream waits)."""
        if self.serial and self.computing:
            return
        job = self._start()
        if job is None:
            return
        job.start = now
        if self.serial or self.writeback:
            duration = self._duration()
        else:
            duration = self.copy_s * self.slowdown if self.computing else self.copy_s
        self.busy_s += duration
        self.current = job
        # planned (the event's time too); the engine reads it to stretch compute
        job.end = self.due = self.clock.call_at(now, duration, self._on_land)

    def _land(self) -> None:
        """The copy on the link lands: it waits in ``ready`` for its layer (or frees its buffer if dropped)."""
        self.events += 1
        now = self.due  # this event's time
        self.due = NEVER
        job = self.current
        assert job is not None  # the copy on the link
        self.current = None
        if self.timeline is not None:
            self.timeline.copy(job)
        self._landed(job)
        q = self.queue
        if not q.demand and not q.prefetch:
            return
        if self.gap and q.has_next():  # the copy thread notices the landing, then issues the next copy
            self._wake_later(now, self.gap)
            return
        self._start_next(now)

    def _land_plain(self) -> None:
        """:meth:`_land` on a plain machine (``plain``: the time on the link is ``copy_s``, and the next copy starts
        as one lands), with the queue's :meth:`~CopyQueue.land` and :meth:`_start_next` inline (once per copy, the
        predictors' path: ``tests/sim/timing/test_inline_copies.py`` compares it with them); which copy starts next
        is the queue's rule (:meth:`~CopyQueue.start_next`, called)."""
        self.events += 1
        now, job, q = self.due, self.current, self.queue
        assert job is not None  # the copy on the link
        job.finished = True  # CopyQueue.land
        q.copies += 1
        if job.was_prefetch:
            q.prefetch_copies += 1
        assert job.buffer is not None  # a started copy holds a buffer
        if job.dropped:
            q.free.append((job.buffer, None))
        else:
            ready = q.ready.get(job.layer)
            if ready is None:
                ready = q.ready[job.layer] = deque()
            ready.append(job)
        nxt = self._start()  # the queue's rule picks the next copy (demand first, the reserve kept from prefetches)
        if nxt is None:
            self.current, self.due = None, NEVER
            return
        job = nxt
        job.start = now  # _start_next
        self.busy_s += self.copy_s
        self.current = job
        job.end = self.due = self.clock.call_at(now, self.copy_s, self._on_land)

    # ---------------------------------------------------------------------------------------------- counters
    @property
    def pcie_bytes(self) -> int:
        """Bytes over the link: the copies, and the write-backs of evicted experts."""
        if self.writebacks:
            return (self.queue.copies + self.writebacks) * self.nbytes
        return self.queue.copies * self.nbytes
