"""The engine's layer loop under ``full_collections_deferred`` (sim/timing/engine.py): full garbage collections put
off while it runs and the thresholds restored after it, even when it fails; and the loop makes no garbage cycles
(what it frees, reference counting frees), so putting off the full collections keeps no garbage of its own."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import sim.timing.engine as engine
from sim.run import simulate
from sim.timing.engine import DEFERRED_FULL_COLLECTIONS, full_collections_deferred
from tests.support.engine import config_for
from tests.support.traces import random_trace
from traces.io import save_trace


def test_full_collections_deferred_then_thresholds_restored():
    before = gc.get_threshold()
    with full_collections_deferred():
        young, middle, old = gc.get_threshold()
        assert (young, middle) == before[:2] and old >= DEFERRED_FULL_COLLECTIONS
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), full_collections_deferred():
        raise RuntimeError("a failing run")
    assert gc.get_threshold() == before


@pytest.mark.parametrize(
    ("policy", "predictor", "batch"),
    [("lru", "transition", 1), ("diffmoe", "transition", 1), ("lru", "oracle", 3), ("lru", "none", 2)],
)
def test_layer_loop_makes_no_garbage_cycles(tmp_path, monkeypatch, policy, predictor, batch):
    trace = random_trace(np.random.default_rng(5), tokens=120, layers=4, experts=8, k=2, requests=4)
    path = save_trace(trace, tmp_path / "t.npz")
    cycles: list[int] = []
    loop = engine.Simulation.layer_loop

    def counted(self, records, totals):
        gc.collect()
        gc.disable()  # nothing collected while it runs: what is left in cycles after it is what it made
        try:
            loop(self, records, totals)
        finally:
            gc.set_debug(gc.DEBUG_SAVEALL)
            cycles.append(gc.collect())
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()

    monkeypatch.setattr(engine.Simulation, "layer_loop", counted)
    out = simulate(config_for(path, trace, policy=policy, predictor=predictor, batch=batch, buffers=3))
    assert out.summary["iterations"] > 0
    assert cycles == [0]
