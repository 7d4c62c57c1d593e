"""A stream's own clock over a SimPy environment, through SimPy's public API only (``now``, ``peek``, ``step``,
``timeout``).

The compute stream waits a lot (dense work, each expert, host costs), and the copy engine that serves it has at
most one event to come (a copy landing, or its thread waking up). Nothing but the stream waits on those events, and
the environment's other processes (if any) share nothing with either, so neither the stream's waits nor the copy
engine's events need to be SimPy events: the stream's clock (``now``) runs them itself, in order of time with the
environment's events:

- the copy engine's one pending event is the clock's own (:meth:`StreamClock.call_at`: a callback due at a time,
  the float sum ``start + delay`` that a SimPy timeout started then would land on);
- a wait (:meth:`StreamClock.wait`) runs every event due by its end, the own one and the environment's, in order
  of time (the environment's first at a tie; they share nothing, so a tie's order changes nothing), also one
  scheduled during the wait for that very end, then the stream goes on at ``now + dt``; with nothing due by then
  (the usual case) it is a float sum and nothing else;
- waiting for a copy (:meth:`StreamClock.run_next`) runs the environment's events due up to the own event's time,
  then the own event, and the stream takes that time.

The stream's times are therefore those of a SimPy process that waits on one timeout per wait (the same float
sums), and the copy engine's those of timeouts started at its requests. An environment event runs at its own time
(SimPy's clock then), with the stream's clock at or behind it, never ahead. SimPy's clock lags the stream's
while nothing of the environment is due; :meth:`StreamClock.catch_up` brings it exactly to the stream's (by one
timeout, or a short chain of them where one float sum cannot land there exactly).

:class:`EnvClock` is SimPy's own clock for a copy engine driven without a stream: its events are SimPy timeouts.
"""

from __future__ import annotations

import simpy

__all__ = ["NEVER", "EnvClock", "StreamClock"]

NEVER = float("inf")


class EnvClock:
    """SimPy's own clock, for a party that keeps none of its own (the interface of :class:`StreamClock` that the
    copy engine uses): its events are SimPy timeouts."""

    def __init__(self, env: simpy.Environment):
        self.env = env

    @property
    def now(self) -> float:
        return self.env.now

    def call_at(self, start: float, delay: float, callback) -> float:
        """``callback()`` after ``delay`` from ``start`` (SimPy's now) as a SimPy timeout; returns its time."""
        self.env.timeout(delay).callbacks.append(lambda _event: callback())
        return start + delay

    def catch_up(self) -> None:
        """Nothing to catch up: this clock is SimPy's."""


class StreamClock:
    """The clock of one stream of work (``now``) over ``env``: at or ahead of SimPy's, which runs only the
    environment's other events. ``waits`` counts the stream's waits; ``due`` is the time of the clock's own pending
    event (:meth:`call_at`), ``NEVER`` when there is none; ``env_next`` the time of the environment's next event
    as last read (``env.peek``): the clock reads it again after every step it runs, so that a stream that lets
    nothing else touch the environment (the engine, during a run) may test it instead of peeking at every wait;
    :meth:`sync` reads it afresh."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.step = env.step
        self.peek = env.peek
        self.now = env.now
        self.waits = 0
        self.due = NEVER
        self._callback = None  # the own pending event's
        self.env_next = env.peek()

    def sync(self) -> None:
        """Read the time of the environment's next event afresh (``env_next``)."""
        self.env_next = self.peek()

    def call_at(self, start: float, delay: float, callback) -> float:
        """``callback()`` at ``start + delay`` (the float sum; ``start`` at or after SimPy's time): the clock's own
        event, at most one at a time; returns its time."""
        if self._callback is not None:
            raise RuntimeError("the stream clock holds one pending event at a time")
        due = self.due = start + delay
        self._callback = callback
        return due

    def run_own(self) -> None:
        """Run the own pending event (its callback may schedule the next one), nothing of the environment being due
        before it."""
        callback = self._callback
        assert callback is not None, "an own event is pending"
        self._callback, self.due = None, NEVER
        callback()

    def run_until(self, end: float) -> None:
        """Run every event due by ``end``, the own one and the environment's, in order of time (the environment's
        first at a tie), also those scheduled meanwhile."""
        peek, step = self.peek, self.step
        while True:
            at = peek()
            if at <= self.due:
                if at > end:
                    break
                step()
            elif self.due <= end:
                self.run_own()
            else:
                break
        self.env_next = at

    def wait(self, dt: float) -> None:
        """The stream is busy for ``dt`` seconds: every event due by ``now + dt`` runs, then the stream goes on at
        ``now + dt``."""
        self.waits += 1
        end = self.now + dt
        if self.due <= end or self.peek() <= end:
            self.run_until(end)
        self.now = end

    def work(self, dt: float) -> None:
        """:meth:`wait` for a stream that lets nothing else touch the environment (the engine during a run), which
        tests ``env_next`` instead of peeking: every event due by ``now + dt`` runs, then the stream goes on at
        ``now + dt``."""
        self.waits += 1
        end = self.now + dt
        if self.due <= end or self.env_next <= end:
            self.run_until(end)
        self.now = end

    def run_next(self) -> float:
        """Run the environment's events due up to the own pending event's time, then that event; returns its time
        (the stream's clock does not move: the caller decides)."""
        due = self.due
        if due == NEVER:
            raise RuntimeError("simulation deadlocked: the compute stream waits on a copy that never comes")
        peek, step = self.peek, self.step
        at = peek()
        while at <= due:
            step()
            at = peek()
        self.env_next = at
        callback = self._callback
        if self.due != due or callback is None:  # an environment event cannot touch the stream's own events
            raise RuntimeError("the stream clock's own event moved while the environment ran")
        self.run_own()
        return due

    def catch_up(self) -> None:
        """Bring SimPy's clock exactly to the stream's, nothing of the environment being due before it: one timeout
        of the difference, or (where that float sum would not land exactly) a chain of them, each to a time that
        the next difference from it reaches exactly (halving: ``x - y`` is exact for ``y/2 <= x <= 2y``)."""
        env, now, step = self.env, self.now, self.step
        if self.peek() < now:
            raise RuntimeError("an event of the environment is due before the stream's time")
        while env.now != now:
            at = env.now
            if at > now:
                raise RuntimeError(f"SimPy's clock {at!r} is ahead of the stream's {now!r}")
            to = now
            while at + (to - at) != to:
                to /= 2
            ev = env.timeout(to - at)
            while ev.callbacks is not None:
                step()
            if env.now != to:
                raise RuntimeError(f"the stream's clock {to!r} and SimPy's {env.now!r} disagree")
        self.env_next = self.peek()
