"""A stream's own clock over a SimPy environment, through SimPy's public API only (``now``, ``peek``, ``step``,
``timeout``).

The compute stream waits a lot (dense work, each expert, host costs), and most of its waits have nothing of the
environment due before they end. Such a wait needs no event: nothing can happen in between, so the stream's clock
moves alone and SimPy's stays where it was (:meth:`StreamClock.wait`). SimPy's clock catches up when it matters:

- a wait with an event due by its end is a SimPy timeout, and the environment runs until it is processed, then on
  through every event due by then (one scheduled during the wait for that very instant comes after the timeout in
  SimPy's order, and runs before the stream goes on all the same);
- the stream waiting on an event of another party (a copy landing) runs the environment (``env.step``) from where
  it is until that event's callbacks have run, then takes SimPy's time: nothing was due before the stream's time,
  so the order of events is SimPy's;
- an event scheduled at the stream's time (:meth:`StreamClock.timeout_at`: a copy it asks for) is a timeout from
  SimPy's clock that lands exactly at the stream's time plus its delay.

Times are floats and ``a + (b - a)`` is not always ``b``: the stream's clock moves alone only to a time that a
timeout from SimPy's clock lands on exactly (checked), so that every later event lands exactly where a process that
waited on every timeout would have had it. :meth:`StreamClock.catch_up` brings SimPy's clock to the stream's.
"""

from __future__ import annotations

import simpy

__all__ = ["EnvClock", "StreamClock"]


class EnvClock:
    """SimPy's own clock, for a party that keeps none of its own (the interface of :class:`StreamClock` that the
    copy engine uses)."""

    def __init__(self, env: simpy.Environment):
        self.env = env

    @property
    def now(self) -> float:
        return self.env.now

    def timeout_at(self, start: float, delay: float) -> simpy.Timeout:
        """A timeout of ``delay`` from ``start`` (which is SimPy's now)."""
        return self.env.timeout(delay)

    def catch_up(self) -> None:
        """Nothing to catch up: this clock is SimPy's."""


class StreamClock:
    """The clock of one stream of work (``now``) over ``env``: equal to SimPy's, or ahead of it while no event of
    the environment is due in between. ``waits`` counts the stream's waits."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.step = env.step
        self.now = env.now
        self.waits = 0

    def wait(self, dt: float) -> None:
        """The stream is busy for ``dt`` seconds: every event of the environment due by ``now + dt`` runs, then the
        stream goes on at ``now + dt``."""
        self.waits += 1
        end = self.now + dt
        env = self.env
        if env.peek() > end:
            at = env.now
            if at + (end - at) == end:  # a timeout from SimPy's clock can land there exactly later
                self.now = end
                return
        ev = self.timeout_at(self.now, dt)
        step = self.step
        while ev.callbacks is not None:
            step()
        while env.peek() <= end:  # due at this very instant, scheduled during the wait
            step()
        self.now = end

    def timeout_at(self, start: float, delay: float) -> simpy.Timeout:
        """A timeout due at ``start + delay`` (the float sum), ``start`` being this stream's time (while SimPy's
        clock may lag it) or SimPy's own."""
        env = self.env
        at = env.now
        if at != start:
            due = start + delay
            d = due - at
            if at + d == due:
                return env.timeout(d)
            self.catch_up()  # SimPy's clock at the stream's: start + delay from there
        return env.timeout(delay)

    def catch_up(self) -> None:
        """Bring SimPy's clock to the stream's: a timeout that is the next event due (the stream's clock moved alone
        only while none was), of a delay checked to land exactly there."""
        env, now = self.env, self.now
        at = env.now
        if at == now:
            return
        ev = env.timeout(now - at)
        while ev.callbacks is not None:
            self.step()
        if env.now != now:
            raise RuntimeError(f"the stream's clock {now!r} and SimPy's {env.now!r} disagree")
