"""The one decision protocol (``sim/decisions/protocol.py``) and the one set of copy-queue rules
(``sim/core/copy_queue.py``):
the SimPy engine makes exactly the decisions ``replay`` records, and the copy queue keeps its rules under any
sequence of requests."""

from __future__ import annotations

from collections import deque

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.copy_queue import CopyQueue
from sim.core.workload import build_iterations
from sim.decisions.build import build_decisions
from sim.decisions.replay import replay
from sim.run import simulate
from tests.support.engine import config_for
from tests.support.traces import random_trace
from traces.io import save_trace


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10**6),
    batch=st.integers(1, 4),
    mpc=st.integers(0, 3),
    buffers=st.integers(1, 5),
    case=st.sampled_from(
        [
            ("lru", "none"),
            ("diffmoe", "oracle"),
            ("moe-infinity", "moe-infinity"),
            ("pregated", "oracle"),
            ("diffmoe-arc", "noisy"),
            ("belady", "none"),
        ]
    ),
)
def test_the_engine_makes_exactly_the_decisions_replay_records(tmp_path, seed, batch, mpc, buffers, case):
    policy, predictor = case
    trace = random_trace(np.random.default_rng(seed), tokens=40, layers=3, experts=8, k=2, requests=4)
    path = save_trace(trace, tmp_path / "t.npz")
    cfg = config_for(path, trace, policy, predictor, batch=batch, hpc=1, mpc=mpc, buffers=buffers)
    engine = simulate(cfg, trace=trace, record_decisions=True).engine
    w = cfg.workload
    its, _ = build_iterations(trace, w.batch_size, w.batching, w.max_decode_tokens, w.prefill, w.requests)
    pol, pred = build_decisions(cfg, trace, its)
    assert engine.decisions == replay(trace, its, pol, pred)
    assert len(engine.decisions) == sum(len(s) for s in [range(3)] * len(its))  # one per layer of each iteration


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    buffers=st.integers(1, 5),
    reserve=st.integers(0, 4),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["demand", "prefetch", "upgrade", "drop", "start", "land", "take"]), st.integers(0, 9)
        ),
        max_size=60,
    ),
)
def test_copy_queue_keeps_its_rules(buffers, reserve, ops):
    """Demand copies start before prefetches, prefetches leave the reserve free, buffers never overfill, a landed
    copy is taken once, and at the end every buffer comes back."""
    q = CopyQueue(buffers, reserve)
    prefetches, flight, taken = [], deque(), []
    for op, n in ops:
        if op in ("demand", "prefetch"):
            job = q.submit(0, n, op == "prefetch")
            if op == "prefetch":
                prefetches.append(job)
        elif op in ("upgrade", "drop") and prefetches:
            job = prefetches.pop(n % len(prefetches))
            (q.upgrade if op == "upgrade" else q.drop)(job)
        elif op == "start":
            first_demand = q.demand[0] if q.demand else None
            first_prefetch = q.prefetch[0] if q.prefetch else None
            free = len(q.free)
            job = q.start_next()
            if first_demand is not None and free:
                assert job is first_demand  # demand first
            elif first_prefetch is not None and free > max(1, reserve):
                assert job is first_prefetch  # then prefetches, leaving the reserve free
            else:
                assert job is None
            if job is not None:
                flight.append(job)
        elif op == "land" and flight:
            q.land(flight.popleft())
        elif op == "take":
            job = q.take(0)
            if job is not None:
                assert job not in taken and not job.dropped
                taken.append(job)
                q.release(job.buffer)
        assert 0 <= q.in_use <= q.capacity
        assert len({b for b, _ in q.free}) == len(q.free)  # no buffer free twice
    while flight:  # drain: land, take and release everything
        q.land(flight.popleft())
    for _job in list(q.ready.get(0, ())):
        q.release(q.take(0).buffer)
    assert len(q.free) == buffers


@settings(max_examples=80, deadline=None)
@given(
    buffers=st.integers(1, 6),
    held=st.integers(0, 5),
    n=st.integers(1, 6),
    order=st.lists(st.booleans(), max_size=24),
)
def test_copies_served_back_to_back_leave_the_queue_as_one_by_one(buffers, held, n, order):
    """``CopyQueue.served`` leaves the free buffers in the order, and the counts, that submitting, starting,
    landing, taking and releasing each copy gives (whatever the interleaving of starts and releases), with
    ``held`` buffers in use throughout; its peak is the one given."""
    held, n = min(held, buffers - 1), min(n, buffers - min(held, buffers - 1))

    def queue_holding():
        q = CopyQueue(buffers, 1)
        for e in range(held):
            q.submit(0, e, False)
            q.start_next()
        return q

    one_by_one, at_once = queue_holding(), queue_holding()
    started, released, turns, peak = [], 0, iter(order), 0
    for e in range(n):
        one_by_one.submit(1, e, False)
    while released < n:  # start the next, or release the oldest landed, in the order drawn
        if len(started) < n and (released == len(started) or next(turns, True)):
            job = one_by_one.start_next()
            assert job is not None
            one_by_one.land(job)
            started.append(job)
            peak = max(peak, one_by_one.in_use)
        else:
            job = one_by_one.take(1)
            assert job is not None
            one_by_one.release(job.buffer)
            released += 1
    at_once.served(n, peak)
    assert list(at_once.free) == list(one_by_one.free)
    assert (at_once.copies, at_once.max_in_use) == (one_by_one.copies, one_by_one.max_in_use)
