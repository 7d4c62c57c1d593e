"""Diff-MoE's exact decay kept as one offset per layer (``DiffMoE._lazy``: the common ``dec_out_cache`` step in
``_off``) restates the eager decay of every score (``DiffMoE._decayed``): over random traces and params, a policy
made eager gives the same decisions and the same scores after every step."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.workload import build_iterations
from sim.decisions.replay import replay
from tests.support.policies import policy_for, predictor_for
from tests.support.traces import random_trace


def decisions_and_scores(trace, its, params, hpc, mpc, lazy):
    """Every decision of a replay, and the scores after each step, with the lazy decay on or off."""
    policy = policy_for("diffmoe", trace, hpc=hpc, mpc=mpc, params=params)
    assert policy._lazy
    policy._lazy = lazy
    scores = []
    decisions = replay(trace, its, policy, predictor_for("none", trace), lambda p: scores.append(p.scores.tolist()))
    return decisions, scores


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 10**6),
    batch=st.integers(1, 3),
    hpc=st.integers(0, 2),
    mpc=st.integers(0, 3),
    victim_order=st.sampled_from(["artifact", "legacy"]),
    in_cache_check=st.sampled_from(["intended", "artifact"]),
    reset=st.booleans(),
    decays=st.sampled_from([(0.5, 1.0), (1.0, 1.0), (0.25, 0.75), (2.0, 0.5)]),
    threshold=st.sampled_from([0.0, 1.0, 2.5]),
)
def test_lazy_decay_equals_the_eager_one(seed, batch, hpc, mpc, victim_order, in_cache_check, reset, decays, threshold):
    trace = random_trace(np.random.default_rng(seed), tokens=40, layers=3, experts=8, k=2, requests=3)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    params = {
        "victim_order": victim_order,
        "in_cache_check": in_cache_check,
        "reset_per_batch": reset,
        "dec_in_cache": decays[0],
        "dec_out_cache": decays[1],
        "threshold": threshold,
    }
    lazy = decisions_and_scores(trace, its, params, hpc, mpc, True)
    eager = decisions_and_scores(trace, its, params, hpc, mpc, False)
    assert lazy[1]  # scores were read after each step
    assert lazy == eager
