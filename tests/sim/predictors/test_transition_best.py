"""The transition predictor's ``best`` (each row's first top experts above 0: they come first, highest first) against
the mask it restates (each of the top experts kept if its score is above 0), over random scores with ties and
zeros."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.predictors import PREDICTORS, PredictorContext
from tests.support.traces import random_trace


def predictor(trace):
    ctx = PredictorContext(trace.num_layers, trace.num_experts, 0, trace=trace)
    return PREDICTORS.get("transition")({}, ctx)


def best_by_mask(score: np.ndarray, top: int) -> list[frozenset[int]]:
    """``TransitionPredictor.best`` as it was written: each of the ``top`` best kept if its score is above 0."""
    order = np.argsort(-score, axis=1, kind="stable")[:, :top]
    positive = np.take_along_axis(score, order, axis=1) > 0
    return [frozenset(e for e, keep in zip(ids, ok) if keep) for ids, ok in zip(order.tolist(), positive.tolist())]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 10**6),
    sets=st.integers(1, 8),
    experts=st.integers(1, 10),
    top=st.integers(1, 10),
    zeros=st.floats(0.0, 1.0),
)
def test_best_keeps_the_top_experts_above_zero(seed, sets, experts, top, zeros):
    rng = np.random.default_rng(seed)
    score = rng.integers(0, 4, size=(sets, experts)).astype(np.float64)  # ties and zeros
    score[rng.random(score.shape) < zeros] = 0.0
    trace = random_trace(rng, tokens=20, layers=2, experts=max(experts, 2), k=1, requests=2)
    pred = predictor(trace)
    pred.top = top
    assert pred.best(score) == best_by_mask(score, top)
