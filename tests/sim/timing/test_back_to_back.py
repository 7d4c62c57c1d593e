"""Copies served back to back (sim/timing/engine.py: ``ComputeStream.runs_back_to_back``, ``serve_back_to_back``): a
layer's demand copies asked for with the link idle, nothing queued or prefetched and their buffers free are timed
without the copy engine's events. Every figure of a run must be the one the event path gives (the same float sums,
counts and peak of working buffers)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.run import simulate
from sim.timing.engine import ComputeStream
from tests.support.engine import POLICY_NAMES, config_for, engine_figures
from tests.support.traces import random_trace
from tests.support.validate import with_hardware
from traces.io import save_trace


def run_both(monkeypatch, cfg, trace) -> tuple[dict, dict, int]:
    """(figures with copies served back to back where they may be, figures with every copy an event, how many
    layers were served back to back)."""
    served = []
    original = ComputeStream.serve_back_to_back

    def counted(self, step, asked):
        served.append(asked)
        original(self, step, asked)

    with monkeypatch.context() as m:
        m.setattr(ComputeStream, "serve_back_to_back", counted)
        fast = engine_figures(simulate(cfg, trace=trace).engine)
    with monkeypatch.context() as m:
        m.setattr(ComputeStream, "runs_back_to_back", lambda self, step: False)
        events = engine_figures(simulate(cfg, trace=trace).engine)
    return fast, events, len(served)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10**6),
    policy=st.sampled_from(POLICY_NAMES),
    predictor=st.sampled_from(["none", "none", "oracle", "noisy"]),
    batch=st.integers(1, 4),
    hpc=st.integers(0, 2),
    mpc=st.integers(0, 3),
    buffers=st.integers(1, 5),
    host=st.sampled_from([{}, {"expert_issue_us": 40.0}, {"copy_issue_us": 7.0, "layer_roundtrip_us": 30.0}]),
)
def test_back_to_back_copies_give_the_event_paths_figures(
    monkeypatch, tmp_path, seed, policy, predictor, batch, hpc, mpc, buffers, host
):
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, tokens=40, layers=3, experts=8, k=2, requests=3)
    path = save_trace(trace, tmp_path / f"t{seed}.npz")
    params = {"recall": 0.7, "precision": 0.5} if predictor == "noisy" else None
    cfg = config_for(path, trace, policy, predictor, batch, hpc, mpc, buffers, seed=seed, predictor_params=params)
    if host:
        cfg = with_hardware(cfg, **host)
    fast, events, _ = run_both(monkeypatch, cfg, trace)
    assert fast == events


@pytest.mark.parametrize("buffers", [1, 2, 6])
def test_an_lru_run_without_prefetch_is_served_back_to_back_with_the_same_figures(monkeypatch, tmp_path, buffers):
    """Without a predictor nothing is prefetched: every layer with misses whose buffers are free is served back to
    back (with one buffer, only layers of one miss), and the run's figures, the peak of buffers in use among them,
    are the event path's."""
    trace = random_trace(np.random.default_rng(5), tokens=120, layers=4, experts=12, k=3, requests=3)
    path = save_trace(trace, tmp_path / "t.npz")
    cfg = config_for(path, trace, "lru", "none", 2, 0, 2, buffers)
    fast, events, served = run_both(monkeypatch, cfg, trace)
    assert served > 0 and fast["copies"] > 0
    assert fast == events
    assert 1 <= fast["max_buffers_in_use"] <= buffers


def test_a_slowed_machine_or_a_timeline_keeps_every_copy_an_event(monkeypatch, tmp_path):
    """Slowdowns stretch compute by the copy on the link, and a timeline records each copy: neither is served back
    to back."""
    trace = random_trace(np.random.default_rng(6), tokens=60, layers=3, experts=10, k=2, requests=2)
    path = save_trace(trace, tmp_path / "t.npz")
    cfg = with_hardware(config_for(path, trace, "lru", "none", 1, 0, 2, 4), compute_slowdown=1.3)
    assert run_both(monkeypatch, cfg, trace)[2] == 0
    served = []
    monkeypatch.setattr(ComputeStream, "serve_back_to_back", lambda self, step, asked: served.append(step))
    simulate(config_for(path, trace, "lru", "none", 1, 0, 2, 4), trace=trace, timeline=True)
    assert served == []


@pytest.mark.parametrize(
    "held,lands,ends,peak",
    [
        (0, [1.0], [1.5], 1),
        (0, [1.0, 2.0, 3.0], [1.5, 2.5, 3.5], 2),  # each buffer back before the next-but-one copy starts
        (0, [1.0, 2.0, 3.0], [2.0, 2.5, 3.5], 3),  # a release at the very time a copy starts comes after it
        (0, [1.0, 2.0, 3.0], [2.5, 3.5, 4.5], 3),
        (2, [1.0, 2.0, 3.0, 4.0], [1.2, 2.2, 3.2, 4.2], 4),
    ],
)
def test_the_buffers_peak_counts_a_release_at_a_copys_start_after_it(held, lands, ends, peak):
    """Copy ``i`` starts as copy ``i - 1`` lands, holding one more buffer; the buffers of experts computed strictly
    before then are free again (the event path lands a copy due at a compute's very end before that compute's
    buffer is released)."""
    assert ComputeStream.buffers_peak(held, lands, ends) == peak
