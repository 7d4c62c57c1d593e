"""The transition predictor's guesses of a one-token iteration read first from ``one_token_guesses`` (by phase,
fold and layer predicted) are those that :meth:`TransitionPredictor.guess` gives: over random traces, batches of
one and two tokens, and both kinds of training, a predictor without that first read guesses the same."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.workload import build_iterations
from sim.predictors import PredictorContext
from sim.predictors.transition import TransitionPredictor
from tests.support.policies import ask_predictor
from tests.support.traces import random_trace
from traces.io import save_trace


class WithoutMemo(TransitionPredictor):
    """Every guess through ``guess``."""

    def start_iteration(self, iteration) -> None:
        super().start_iteration(iteration)
        self.one_memo = None


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 10**6),
    batch=st.integers(1, 2),
    k=st.integers(1, 3),
    trained=st.booleans(),
    unrouted=st.sampled_from([0.0, 0.2]),
)
def test_one_token_memo_guesses_as_guess(tmp_path_factory, seed, batch, k, trained, unrouted):
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, tokens=40, layers=3, experts=6, k=k, requests=4)
    trace.experts[rng.random(trace.experts.shape) < unrouted] = -1  # tokens of fewer experts
    params = {}
    if trained:
        other = random_trace(np.random.default_rng(seed + 1), tokens=40, layers=3, experts=6, k=k, requests=4)
        params = {"train": str(save_trace(other, tmp_path_factory.mktemp("t") / "train.npz"))}
    ctx = PredictorContext(trace.num_layers, trace.num_experts, 0, trace=trace)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    memo = ask_predictor(trace, its, TransitionPredictor(params, ctx))
    plain = ask_predictor(trace, its, WithoutMemo(params, ctx))
    assert memo == plain
    assert any(guess for _, _, guess, _ in memo)
