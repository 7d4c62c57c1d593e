"""The `transition` predictor trained on the evaluated trace's other requests (``train: other-requests``, two-fold
cross-fitting): it never uses a token's own request's routing, its tables are the counts of the other fold, its
guesses are those of an independent re-implementation, and the param is checked where the others are."""

from __future__ import annotations

import numpy as np
import pytest

from moebase.errors import ConfigError
from sim.core.workload import build_iterations
from sim.predictors import PREDICTORS, PredictorContext
from sim.predictors.transition import OTHER_REQUESTS, request_folds
from sim.run import simulate
from sim.sweep.ray.ship import file_fields
from tests.support.engine import config_for
from tests.support.policies import ask_predictor
from tests.support.traces import make_trace, random_trace
from traces.io import save_trace

CROSS = {"train": OTHER_REQUESTS}


def cross_fitted(trace, params=None):
    """A transition predictor on ``trace`` with ``train: other-requests`` (as sim.run builds it)."""
    ctx = PredictorContext(trace.num_layers, trace.num_experts, 0, trace=trace)
    return PREDICTORS.get("transition")({**CROSS, **(params or {})}, ctx)


def private_trace(requests=6, tokens=12, layers=4, k=2, per_request=4):
    """Request ``r`` routes only to its own experts ``r * per_request ...`` (random among them, every layer)."""
    rng = np.random.default_rng(7)
    rows = []
    for r in range(requests):
        own = r * per_request + np.argsort(rng.random((tokens, layers, per_request)), axis=2)[:, :, :k]
        rows.append(own)
    return make_trace(np.concatenate(rows), [tokens] * requests, num_experts=requests * per_request)


def request_of_rows(trace, rows):
    return np.searchsorted(trace.request_offsets, rows, side="right") - 1


# ------------------------------------------------------------------------------------- never its own request


def test_a_token_is_never_predicted_from_its_own_requests_routing():
    trace = private_trace()
    per = 4
    own = [set(range(r * per, (r + 1) * per)) for r in range(trace.num_requests)]
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    decisions = ask_predictor(trace, its, cross_fitted(trace))
    assert decisions
    for index, _layer, guess, truth in decisions:
        r = int(request_of_rows(trace, its[index].rows)[0])
        assert guess, "the other fold's popular experts are guessed"
        assert not guess & own[r]  # its own request's experts: never (its routing never reached the tables)
        # only experts of the other fold's requests
        assert guess <= set().union(*(own[q] for q in range(trace.num_requests) if q % 2 != r % 2))
        assert truth <= own[r]
    # in a batch of two requests (one per fold), each token still learns from the other fold only
    its, _ = build_iterations(trace, 2, "static", None, True, None)
    for index, _layer, guess, _ in ask_predictor(trace, its, cross_fitted(trace)):
        batch = set(request_of_rows(trace, its[index].rows).tolist())
        allowed = set().union(*(own[q] for r in batch for q in range(trace.num_requests) if q % 2 != r % 2))
        assert guess and guess <= allowed


def test_through_the_engine_a_private_routing_trace_gets_no_right_guess(tmp_path):
    trace = private_trace()
    path = save_trace(trace, tmp_path / "private.npz")
    out = simulate(config_for(path, trace, "pregated", "transition", predictor_params=CROSS), trace=trace)
    pf = out.summary["prefetch"]
    assert pf["issued"] > 0 and pf["precision"] == 0.0 and pf["recall"] == 0.0


# ----------------------------------------------------------------------------------- an independent re-count


def test_folds_are_even_and_odd_requests():
    trace = make_trace(np.zeros((7, 1, 1)), [2, 1, 3, 1], num_experts=2)
    assert request_folds(trace).tolist() == [0, 0, 1, 0, 0, 0, 1]


def reference_guesses(trace, rows, src, dst, top):
    """The union over ``rows`` of each token's ``top`` experts of ``dst``, counted by plain loops on the tokens
    of the requests whose index has the other parity than the token's own."""
    folds = [r % 2 for r in range(trace.num_requests)]
    req = request_of_rows(trace, np.arange(trace.num_tokens))
    e = trace.num_experts
    out = set()
    for row in rows:
        mine = folds[req[row]]
        table = [[0] * e for _ in range(e)]
        popular = [0] * e
        for t in range(trace.num_tokens):
            if folds[req[t]] == mine:
                continue
            for b in trace.experts[t, dst]:
                if b >= 0:
                    popular[b] += 1
                    for a in trace.experts[t, src]:
                        if a >= 0:
                            table[a][b] += 1
        tie = [0.5 * p / (max(popular) + 1.0) for p in popular]
        srcs = [int(a) for a in trace.experts[row, src] if a >= 0]
        if not srcs:
            continue
        score = [sum(table[a][b] for a in srcs) + tie[b] for b in range(e)]
        ranked = sorted(range(e), key=lambda b: (-score[b], b))[:top]
        out |= {b for b in ranked if score[b] > 0}
    return frozenset(out)


def test_tables_are_the_other_folds_counts():
    rng = np.random.default_rng(11)
    trace = random_trace(rng, tokens=40, layers=3, experts=6, k=2, requests=5)
    pred = cross_fitted(trace)
    req = request_of_rows(trace, np.arange(trace.num_tokens))
    for fold in (0, 1):
        table, tie = pred.ranking_keys(0, 1, fold)
        want = np.zeros((6, 6), dtype=np.int64)
        popular = np.zeros(6)
        for t in np.flatnonzero(req % 2 != fold):  # tokens of the other fold only
            for b in trace.experts[t, 1]:
                popular[b] += 1
                for a in trace.experts[t, 0]:
                    want[a, b] += 1
        assert np.array_equal(table, want)
        assert np.allclose(tie, 0.5 * popular / (popular.max() + 1.0))
    assert not np.array_equal(pred.ranking_keys(0, 1, 0)[0], pred.ranking_keys(0, 1, 1)[0])


@pytest.mark.parametrize("batch,top", [(1, None), (3, None), (2, 3)])
def test_guesses_match_a_plain_re_implementation(batch, top):
    rng = np.random.default_rng(12 + batch)
    trace = random_trace(rng, tokens=36, layers=3, experts=6, k=2, requests=5)
    e = trace.experts.copy()
    e[::7, 1] = -1  # some tokens without routing in a layer
    trace = make_trace(e, trace.request_lengths, num_experts=6)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    decisions = ask_predictor(trace, its, cross_fitted(trace, {"top": top}))
    assert len(decisions) == 2 * len(its)
    for index, layer, guess, _ in decisions:
        assert guess == reference_guesses(trace, its[index].rows, layer - 1, layer, top or trace.top_k)


# ------------------------------------------------------------------------------------------------ the param


def test_other_requests_needs_no_file_and_is_checked_when_the_config_loads(tmp_path):
    rng = np.random.default_rng(13)
    trace = random_trace(rng, tokens=30, layers=3, experts=6, k=2, requests=3)
    path = save_trace(trace, tmp_path / "eval.npz")
    cfg = config_for(path, trace, "lru", "transition", predictor_params=CROSS)
    assert cfg.predictor.params["train"] == OTHER_REQUESTS
    assert ("predictor", "params", "train") not in file_fields(cfg.resolved)  # a word, no file to ship
    # a misspelt word is a path that does not exist, and the message names the word
    with pytest.raises(ConfigError, match=r"predictor\.params\.train: .*other-requests"):
        config_for(path, trace, "lru", "transition", predictor_params={"train": "other-request"})
    # one request: nothing to learn from for it
    one = save_trace(random_trace(rng, tokens=10, layers=3, experts=6, k=2, requests=1), tmp_path / "one.npz")
    with pytest.raises(ConfigError, match=r"predictor\.params\.train: other-requests needs a trace of at least 2"):
        config_for(one, trace, "lru", "transition", predictor_params=CROSS)


def test_other_requests_is_the_default_and_null_is_refused(tmp_path):
    rng = np.random.default_rng(14)
    trace = random_trace(rng, tokens=30, layers=3, experts=6, k=2, requests=4)
    path = save_trace(trace, tmp_path / "eval.npz")
    cfg = config_for(path, trace, "lru", "transition")
    assert cfg.predictor.params == {"train": OTHER_REQUESTS, "top": None}
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    assert ask_predictor(trace, its, cross_fitted(trace)) == ask_predictor(
        trace,
        its,
        PREDICTORS.get("transition")(None, PredictorContext(trace.num_layers, trace.num_experts, 0, trace=trace)),
    )
    with pytest.raises(
        ConfigError,
        match=r"predictor\.params\.train: must be a path to a trace file or one of "
        r"other-requests, got null",
    ):
        config_for(path, trace, "lru", "transition", predictor_params={"train": None})


def test_a_fold_without_routing_is_refused():
    e = np.zeros((6, 2, 1), dtype=np.int16)
    e[2:4] = -1  # request 1 (odd): no routed token
    trace = make_trace(e, [2, 2, 2], num_experts=2)
    with pytest.raises(ConfigError, match=r"predictor\.params\.train: other-requests: .*odd-numbered requests"):
        cross_fitted(trace)
