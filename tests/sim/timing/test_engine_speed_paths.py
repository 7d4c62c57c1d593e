"""The stream clock's own events (``sim/timing/clock.py``): the copy engine's landings and wake-ups run by the
compute stream's clock instead of SimPy, in order of time with the environment's other events, and SimPy's clock
caught up exactly at the end. Each test compares against plain SimPy (a process per wait, a timeout per copy
event), so the fast paths give SimPy's own times and order."""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.timing.clock import NEVER, StreamClock
from sim.timing.copy_engine import CopyEngine

DELAYS = [0.0, 1e-9, 3e-7, 1e-3, 0.05, 1 / 3, 0.7, 1e-6 / 7, 2.0]


def simpy_reference(waits, owns, others):
    """Plain SimPy: a stream process that yields one timeout per wait and, before wait ``i``, starts a timeout of
    ``owns[i]`` (when none of its own is pending; a landing starts the next of ``chain`` at once), beside another
    process of timeouts ``others``. Returns (the stream's times, the own landings' times, the other's times)."""
    env = simpy.Environment()
    stream_t, own_t, other_t = [], [], []
    pending = [False]

    def own(delay):
        pending[0] = True
        ev = env.timeout(delay)

        def landed(_ev):
            pending[0] = False
            own_t.append(env.now)

        ev.callbacks.append(landed)

    def other():
        for d in others:
            yield env.timeout(d)
            other_t.append(env.now)

    def stream():
        for dt, d in zip(waits, owns):
            if d is not None and not pending[0]:
                own(d)
            yield env.timeout(dt)
            while env.peek() <= env.now:  # every event due by the wait's end runs before the stream goes on
                yield env.timeout(0)  # (queued behind them: the same time)
            stream_t.append(env.now)

    env.process(other())
    env.run(until=env.process(stream()))
    return stream_t, [t for t in own_t if t <= stream_t[-1]], [t for t in other_t if t <= stream_t[-1]]


@settings(max_examples=80, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(DELAYS), st.one_of(st.none(), st.sampled_from(DELAYS))), min_size=1, max_size=40
    ),
    others=st.lists(st.sampled_from([1e-9, 3e-7, 1e-3, 0.05, 1 / 3, 2.0]), max_size=12),
)
def test_own_events_land_at_simpys_times_in_order_with_the_environments(steps, others):
    """The clock's own events land where SimPy timeouts started at the stream's time would (the same float sums),
    each one due by a wait's end runs before the stream goes on, the other process keeps its times and never sees
    the stream ahead of SimPy, and SimPy's clock ends at the stream's."""
    waits = [w for w, _ in steps]
    owns = [d for _, d in steps]
    ref_stream, ref_own, ref_other = simpy_reference(waits, owns, others)

    env = simpy.Environment()
    clock = StreamClock(env)
    stream_t, own_t, other_t, log = [], [], [], []

    def other():
        for d in others:
            yield env.timeout(d)
            other_t.append(env.now)
            log.append((env.now, clock.now))

    def landed():
        own_t.append(due[0])

    due = [NEVER]
    env.process(other())
    for dt, d in steps:
        if d is not None and clock.due == NEVER:
            due[0] = clock.call_at(clock.now, d, landed)
        clock.wait(dt)
        stream_t.append(clock.now)
    clock.catch_up()

    assert stream_t == ref_stream
    assert own_t == ref_own and own_t == sorted(own_t)
    assert other_t == ref_other
    assert all(stream_now <= now for now, stream_now in log)
    assert env.now == clock.now == ref_stream[-1]


def test_catch_up_lands_exactly_where_one_float_sum_cannot():
    """SimPy's clock at 0.1 (another process's event), the stream's ahead at a time that 0.1 plus the difference
    misses: the catch-up still lands exactly there (a chain of timeouts)."""
    target = next(x / 7 for x in range(1, 2000) if 0.1 + (x / 7 - 0.1) != x / 7)
    env = simpy.Environment()
    env.timeout(0.1)
    clock = StreamClock(env)
    clock.wait(target)  # the other event runs on the way (SimPy's clock at 0.1)
    assert env.now == 0.1 and clock.now == target and 0.1 + (target - 0.1) != target
    clock.catch_up()
    assert env.now == target


def test_a_copy_engine_on_a_stream_clock_puts_nothing_on_simpys_queue():
    """The copy engine's landings are the stream clock's own events: SimPy's queue stays empty while copies are on
    the link, and waiting for one lands it at ``copy_s`` after its request, at the stream's time."""
    env = simpy.Environment()
    clock = StreamClock(env)
    copy = CopyEngine(env, copy_s=0.5, nbytes=10, buffers=2, reserve=1, clock=clock)
    clock.wait(0.25)
    copy.submit(0, 3, False)
    copy.submit(0, 4, False)
    assert env.peek() == NEVER and clock.due == 0.75
    assert clock.run_next() == 0.75 and [j.expert for j in copy.ready[0]] == [3]
    assert clock.due == 1.25  # the second started as the first landed
    clock.wait(2.0)
    assert [j.expert for j in copy.ready[0]] == [3, 4] and clock.due == NEVER and copy.events == 2
    assert env.now == 0.0  # SimPy's clock never moved
    clock.catch_up()
    assert env.now == clock.now == 2.25


def test_the_stream_clock_holds_one_own_event_and_names_a_deadlock():
    env = simpy.Environment()
    clock = StreamClock(env)
    try:
        clock.run_next()
    except RuntimeError as e:
        assert "deadlocked" in str(e)
    else:
        raise AssertionError("run_next without a pending event must fail")
    clock.call_at(0.0, 1.0, lambda: None)
    try:
        clock.call_at(0.0, 2.0, lambda: None)
    except RuntimeError as e:
        assert "one pending event" in str(e)
    else:
        raise AssertionError("a second pending own event must be refused")
