"""The transition predictor's ``learn_blocks`` (every pair of layers of a phase scored at once, the guesses made once
each) against the per-pair scoring it restates (one pair's sets scored from ``ranking_keys`` alone, each guess a
new frozenset): over random traces, decoder-only and encoder-decoder, batches of one and three tokens, both kinds of
training and tokens of fewer experts, the same guesses, and each guess's experts iterate in the same order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.workload import build_iterations
from sim.predictors import PredictorContext
from sim.predictors.transition import BLOCK, TransitionPredictor
from tests.support.policies import ask_predictor
from tests.support.traces import enc_dec_trace, random_trace
from traces.io import save_trace


class PerPair(TransitionPredictor):
    """``learn_blocks`` and ``best`` as they were written before the pairs of a phase were scored together."""

    def learn_blocks(self, rows, src, dst, source):
        key = (src, dst, source)
        done = self.blocks_done.setdefault(key, set())
        blocks = [b for b in dict.fromkeys((rows // BLOCK).tolist()) if b not in done]
        done.update(blocks)
        n = self.trace.experts.shape[0]
        near = np.concatenate([np.arange(b * BLOCK, min((b + 1) * BLOCK, n)) for b in blocks])
        if self.group is not None:
            near = near[self.group[near] == source]
        known = self.guesses[key]
        sets = dict.fromkeys(map(tuple, np.sort(self.trace.experts[near, src, :], axis=1).tolist()))
        new = [c for c in sets if c not in known]
        routed = [c for c in new if c[-1] >= 0]
        known.update((c, frozenset()) for c in new if c[-1] < 0)
        if routed:
            table, tie = self.ranking_keys(src, dst, source)
            ids = np.asarray(routed, dtype=np.int64)
            score = np.where(ids[:, :, None] >= 0, table[np.maximum(ids, 0)], 0.0).sum(axis=1) + tie
            known.update(zip(routed, self.best(score)))

    def best(self, score):
        order = np.argsort(-score, axis=1, kind="stable")[:, : self.top].tolist()
        kept = np.minimum((score > 0).sum(axis=1), self.top).tolist()
        return [frozenset(ids[:n]) for ids, n in zip(order, kept)]


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 10**6),
    batch=st.sampled_from([1, 3]),
    k=st.integers(1, 3),
    trained=st.booleans(),
    unrouted=st.sampled_from([0.0, 0.2]),
    enc_dec=st.booleans(),
)
def test_blocks_of_every_pair_guess_as_each_pair(tmp_path_factory, seed, batch, k, trained, unrouted, enc_dec):
    rng = np.random.default_rng(seed)

    def make(r):
        if enc_dec:
            return enc_dec_trace(r, tokens=300, experts=7, k=k, requests=5)
        return random_trace(r, tokens=300, layers=4, experts=7, k=k, requests=5)

    trace = make(rng)
    trace.experts[rng.random(trace.experts.shape) < unrouted] = -1  # tokens of fewer experts
    params = {}
    if trained:
        other = make(np.random.default_rng(seed + 1))
        params = {"train": str(save_trace(other, tmp_path_factory.mktemp("t") / "train.npz"))}
    ctx = PredictorContext(trace.num_layers, trace.num_experts, 0, trace=trace)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    fast, slow = TransitionPredictor(params, ctx), PerPair(params, ctx)
    got, want = ask_predictor(trace, its, fast), ask_predictor(trace, its, slow)
    assert got == want
    assert [list(g) for _, _, g, _ in got] == [list(g) for _, _, g, _ in want]  # the same order too
    assert any(guess for _, _, guess, _ in got)
    for key, guesses in slow.guesses.items():  # every set asked for, learned alike
        assert {c: fast.guesses[key][c] for c in guesses} == guesses
