"""Diff-MoE's ``held`` marks (an expert in the layer's slot array) are the layer's HPC and MPC, which never share an
expert: the exact decay takes its second step over those two tiers (``DiffMoE._decayed``)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.core.workload import build_iterations
from sim.decisions.replay import replay
from tests.support.policies import policy_for, predictor_for
from tests.support.traces import random_trace


@pytest.mark.parametrize(
    "params",
    [{}, {"fill": "expert0"}, {"victim_order": "legacy"}, {"reset_per_batch": False}, {"in_cache_check": "artifact"}],
)
def test_held_is_the_hpc_and_the_mpc_after_every_step(params):
    trace = random_trace(np.random.default_rng(3), tokens=80, layers=3, experts=8, k=2, requests=4)
    policy = policy_for("diffmoe", trace, hpc=1, mpc=3, params=params)
    its, _ = build_iterations(trace, 2, "static", None, True, None)
    checked = []

    def after(p):
        for layer in p.ctx.cached_layers:
            hpc, mpc = p.cache.hpc[layer], set(p.cache.mpc[layer])
            assert not hpc & mpc
            assert {x for x, h in enumerate(p.held[layer]) if h} == hpc | mpc
        checked.append(1)

    replay(trace, its, policy, predictor_for("none", trace), after_step=after)
    assert checked
