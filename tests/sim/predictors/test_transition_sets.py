"""The transition predictor's distinct sets of a block of rows (``TransitionPredictor.distinct_sets``: each sorted row
read as one int64, then ``np.unique``) against the plain way it restates (``distinct_sets_by_rows``: a tuple per
row, deduplicated by a dict): the same sets, over random routing with tokens of fewer experts (-1) too."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.predictors import PREDICTORS, PredictorContext
from tests.support.traces import random_trace


def predictor(trace):
    ctx = PredictorContext(trace.num_layers, trace.num_experts, 0, trace=trace)
    return PREDICTORS.get("transition")({}, ctx)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 10**6),
    experts=st.integers(2, 12),
    k=st.integers(1, 3),
    unrouted=st.floats(0.0, 0.5),
    rows=st.integers(1, 60),
)
def test_distinct_sets_are_those_of_the_rows(seed, experts, k, unrouted, rows):
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, tokens=60, layers=2, experts=experts, k=min(k, experts), requests=2)
    trace.experts[rng.random(trace.experts.shape) < unrouted] = -1  # tokens with fewer experts, or none
    pred = predictor(trace)
    assert pred.set_digits is not None
    picked = rng.choice(60, size=rows)
    for src in range(2):
        got = pred.distinct_sets(picked, src)
        want = pred.distinct_sets_by_rows(picked, src)
        assert len(got) == len(set(got))
        assert set(got) == set(want)


def test_sets_too_large_for_int64_are_read_row_by_row():
    trace = random_trace(np.random.default_rng(1), tokens=20, layers=2, experts=8, k=2, requests=2)
    pred = predictor(trace)
    pred.set_digits = None  # as for experts + 1 to the power k at or above 2**62
    rows = np.arange(20)
    assert pred.distinct_sets(rows, 0) == pred.distinct_sets_by_rows(rows, 0)


def test_every_set_of_a_small_layer_is_told_apart():
    # every sorted set of 3 of 6 experts, and of fewer (-1 first): one number each, so none is lost
    combos = [c for n in range(4) for c in itertools.combinations(range(6), n)]
    rows = np.array([(-1,) * (3 - len(c)) + c for c in combos], dtype=np.int16)
    trace = random_trace(np.random.default_rng(2), tokens=len(rows), layers=2, experts=6, k=3, requests=2)
    trace.experts[:, 0, :] = rows[np.random.default_rng(3).permutation(len(rows))]
    got = predictor(trace).distinct_sets(np.arange(len(rows)), 0)
    assert sorted(got) == sorted(map(tuple, rows.tolist()))


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
