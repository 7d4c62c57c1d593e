"""The hot path's inline copies that stay (sim/timing/engine.py), each against the function it restates.

They stay because they run once per copy and calling the function costs the predictors' path several per cent
(measured with benchmarks/bench_decisions.py, lru with the transition predictor: every inline copy of the engine
called instead ~9% slower, the per-copy ones alone ~7%). The others (the one-pass plan and the least-recent victim it
inlines) are tested in tests/sim/policies/test_admission_plan_ranked.py.

- ``ComputeStream.copied_experts`` restates ``ComputeStream.wait_copy`` (the stall until the next copy lands, with
  ``StreamClock.run_own``), ``StreamClock.work`` (the expert's compute) and ``CopyEngine.release`` (the buffer freed):
  a run whose copied experts call them gives every figure the same.
- ``ComputeStream.resident_time`` reads a one-token step's cached experts' compute from a table (``one_each``): a
  run whose steps sum it expert by expert gives every figure the same.
- ``CopyEngine.submit_layer`` restates ``CopyQueue.submit`` (a copy joins its queue): a run whose layers submit
  each copy by it gives every figure, and the events, the same.
- ``CopyQueue.start_next`` restates ``CopyQueue._queue`` (which queue the next copy comes from): over random
  queues, the one it takes from is the one ``_queue`` names (None: it starts nothing).
- ``CopyEngine._land_plain`` (a landing on a plain machine) restates ``CopyEngine._land`` with the queue's ``land``
  and ``start_next``: a run whose landings call ``_land`` gives every figure, and the events, the same.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.cache import LPC
from sim.core.copy_queue import CopyQueue
from sim.run import simulate
from sim.timing.copy_engine import CopyEngine
from sim.timing.engine import ComputeStream
from tests.support.engine import config_for, engine_figures
from tests.support.traces import random_trace
from tests.support.validate import with_hardware
from traces.io import save_trace


def copied_experts_by_the_functions(self, step) -> None:
    """``ComputeStream.copied_experts`` with ``wait_copy`` and ``work`` called where it inlines them."""
    copy, tl, layer = self.copy, self.timeline, step.layer
    ready = copy.ready.get(layer)
    if ready is None:
        ready = copy.ready[layer] = deque()
    for _ in step.copied:
        if not ready or (self.serial and copy.busy):
            self.wait_copy(ready)
        job = ready.popleft()
        e = job.expert
        t = self.expert_of[step.counts[e]]
        if e in step.plan.promote:
            t += self.promote_d2d
        if self.slowed:
            t = self.stretch(t, self.slow)
        if self.expert_issue:
            t = max(t, self.expert_issue)
        if tl is not None:
            tl.expert(layer, e, "copied", self.now, t)
        self.work(t)
        self.busy += t
        self._release(job)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10**6),
    policy=st.sampled_from(["lru", "diffmoe", "lfu", "arc"]),
    predictor=st.sampled_from(["none", "oracle", "noisy"]),
    batch=st.integers(1, 3),
    buffers=st.integers(1, 4),
    machine=st.sampled_from(
        [{}, {"handoff_us": 7.0, "copy_gap_us": 3.0}, {"compute_slowdown": 1.3, "copy_slowdown": 1.2}]
    ),
)
def test_copied_experts_equals_wait_copy_and_work(
    monkeypatch, tmp_path, seed, policy, predictor, batch, buffers, machine
):
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, tokens=30, layers=3, experts=8, k=2, requests=3)
    path = save_trace(trace, tmp_path / f"t{seed}.npz")
    params = {"recall": 0.7, "precision": 0.5} if predictor == "noisy" else None
    cfg = config_for(path, trace, policy, predictor, batch, 1, 2, buffers, seed=seed, predictor_params=params)
    if machine:
        cfg = with_hardware(cfg, **machine)
    inline = engine_figures(simulate(cfg, trace=trace).engine)
    with monkeypatch.context() as m:
        m.setattr(ComputeStream, "copied_experts", copied_experts_by_the_functions)
        called = engine_figures(simulate(cfg, trace=trace).engine)
    assert inline["copies"] > 0
    assert inline == called


def resident_time_by_the_sum(self, step) -> float:
    """``ComputeStream.resident_time`` without a timeline, summed expert by expert."""
    resident_s = 0.0
    for e in step.resident:
        resident_s += self.expert_of[step.counts[e]] + self.hit_d2d
    return resident_s


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10**6),
    policy=st.sampled_from(["lru", "diffmoe", "lfu"]),
    batch=st.integers(1, 2),
    k=st.integers(1, 3),
    unrouted=st.sampled_from([0.0, 0.3]),
)
def test_resident_time_equals_the_sum(monkeypatch, tmp_path, seed, policy, batch, k, unrouted):
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, tokens=30, layers=3, experts=6, k=k, requests=3)
    trace.experts[rng.random(trace.experts.shape) < unrouted] = -1  # tokens of fewer experts
    path = save_trace(trace, tmp_path / f"t{seed}.npz")
    cfg = config_for(path, trace, policy, "none", batch, 1, 2, 3, seed=seed)
    table = engine_figures(simulate(cfg, trace=trace).engine)
    with monkeypatch.context() as m:
        m.setattr(ComputeStream, "resident_time", resident_time_by_the_sum)
        summed = engine_figures(simulate(cfg, trace=trace).engine)
    assert table == summed


def submit_layer_by_the_function(self, layer, copied, jobs, next_layer, prefetch):
    """``CopyEngine.submit_layer`` with ``CopyQueue.submit`` called where it inlines it."""
    q = self.queue
    submitted = used = 0
    asked = False
    for e, src in copied:
        if src == LPC:
            asked = q.upgrade(jobs.pop((layer, e))) or asked
            used += 1
        else:
            q.submit(layer, e, False)
            submitted += 1
    for e in prefetch:
        jobs[(next_layer, e)] = q.submit(next_layer, e, True)
    submitted += len(prefetch)
    if (submitted or asked) and self.current is None and not self.waking:
        self._wake(self.clock.now)
    return submitted, used


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10**6),
    policy=st.sampled_from(["lru", "diffmoe"]),
    predictor=st.sampled_from(["oracle", "noisy", "transition"]),
    buffers=st.integers(1, 4),
    machine=st.sampled_from([{}, {"handoff_us": 7.0, "copy_gap_us": 3.0}]),
)
def test_submit_layer_equals_submit(monkeypatch, tmp_path, seed, policy, predictor, buffers, machine):
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, tokens=30, layers=3, experts=8, k=2, requests=3)
    path = save_trace(trace, tmp_path / f"t{seed}.npz")
    params = {"recall": 0.7, "precision": 0.5} if predictor == "noisy" else None
    cfg = config_for(path, trace, policy, predictor, 1, 1, 2, buffers, seed=seed, predictor_params=params)
    if machine:
        cfg = with_hardware(cfg, **machine)
    inline = simulate(cfg, trace=trace).engine
    with monkeypatch.context() as m:
        m.setattr(CopyEngine, "submit_layer", submit_layer_by_the_function)
        called = simulate(cfg, trace=trace).engine
    assert inline.copies > 0
    assert engine_figures(inline) == engine_figures(called)
    assert inline.events == called.events


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10**6),
    policy=st.sampled_from(["lru", "diffmoe", "lfu", "arc"]),
    predictor=st.sampled_from(["oracle", "noisy", "transition"]),
    batch=st.integers(1, 3),
    buffers=st.integers(1, 4),
    reserve=st.integers(0, 2),
)
def test_land_plain_equals_land(monkeypatch, tmp_path, seed, policy, predictor, batch, buffers, reserve):
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, tokens=30, layers=3, experts=8, k=2, requests=3)
    path = save_trace(trace, tmp_path / f"t{seed}.npz")
    params = {"recall": 0.7, "precision": 0.5} if predictor == "noisy" else None
    cfg = config_for(path, trace, policy, predictor, batch, 1, 2, buffers, seed=seed, predictor_params=params)
    cfg = dataclasses.replace(cfg, cache=dataclasses.replace(cfg.cache, prefetch_reserve=min(reserve, buffers)))
    landed: list[int] = []
    plain = CopyEngine._land_plain

    def counted(self) -> None:
        landed.append(1)
        plain(self)

    with monkeypatch.context() as m:
        m.setattr(CopyEngine, "_land_plain", counted)
        fused = simulate(cfg, trace=trace).engine
    with monkeypatch.context() as m:
        m.setattr(CopyEngine, "_land_plain", CopyEngine._land)
        called = simulate(cfg, trace=trace).engine
    assert landed  # landings took the plain path (copies served back to back land without one)
    assert engine_figures(fused) == engine_figures(called)
    assert fused.events == called.events


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(
    buffers=st.integers(1, 6),
    reserve=st.integers(0, 3),
    demand=st.integers(0, 3),
    prefetch=st.integers(0, 3),
    taken=st.integers(0, 6),
)
def test_start_next_takes_from_the_queue_named_by_queue(buffers, reserve, demand, prefetch, taken):
    q = CopyQueue(buffers, reserve)
    for _ in range(min(taken, buffers)):  # buffers held by copies in flight or computing
        q.free.popleft()
    for e in range(demand):
        q.submit(0, e, False)
    for e in range(prefetch):
        q.submit(1, e, True)
    named = q._queue()
    head = named[0] if named else None
    job = q.start_next()
    assert job is head
    if job is not None:
        assert job.started and job.buffer is not None
