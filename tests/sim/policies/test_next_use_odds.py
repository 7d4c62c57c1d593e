"""Our policy `next-use-odds` (and its causal `cross-layer` predictor): the rule against a plain restatement on
hand-made and random traces, determinism, and the train/evaluate split (training never reads the evaluated requests).
Engine invariants and the Belady bound, as for every policy: tests/sim/policies/test_policy_properties.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.core.workload import build_iterations
from sim.policies import next_use_odds as nuo
from sim.policies.base import selection_counts
from sim.predictors import PREDICTORS, PredictorContext
from sim.run import simulate
from tests.reference.next_use_odds import plain_next_use_odds
from tests.support.engine import comparable, config_for
from tests.support.paths import ROOT
from tests.support.policies import (
    BOUNDED,
    TWO_LAYER_HAND_MADE,
    cache_hits,
    drive,
    policy_for,
    steps_of,
)
from tests.support.traces import make_trace, random_trace
from traces.io import save_trace

NAME = "next-use-odds"
#: Simple weights for the restatement tests (exact in binary, so both sides add the same floats).
SIMPLE = (-1.0, -0.5, 0.25, 0.0, 0.5, 1.0, 0.75, 0.5)


def odds_policy(trace, its, hpc, mpc, params=None, extra=None):
    """`next-use-odds` set up on ``trace`` and its workload ``its``."""
    return policy_for(NAME, trace, its, hpc, mpc, params, extra=extra)


# ------------------------------------------------------------------------------------- the plain restatement


def check_against_plain(trace, its, cap, weights, params=None):
    pol = odds_policy(trace, its, 0, cap, params)
    pol._w = np.array(weights, dtype=np.float64)
    decisions, snaps = drive(trace, its, pol)
    want = {layer: iter(plain_next_use_odds(s, cap, weights)) for layer, s in steps_of(trace, its).items()}
    for d, snap in zip(decisions, snaps):
        src, after = next(want[d.layer])
        assert dict(d.sources) == src, (d.iteration, d.layer)
        assert snap[d.layer] == after, (d.iteration, d.layer)
    return pol


@pytest.mark.parametrize("weights", [SIMPLE, nuo.DEFAULT_WEIGHTS])
@pytest.mark.parametrize("cap", [1, 2, 3, 5])
@pytest.mark.parametrize("batch", [1, 2])
def test_matches_its_plain_restatement_on_a_hand_made_trace(weights, cap, batch):
    trace = make_trace(TWO_LAYER_HAND_MADE, lengths=[5, 6, 4], num_experts=8)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    pol = check_against_plain(trace, its, cap, weights)
    if cap >= 2:
        assert cache_hits(pol) > 0


@settings(max_examples=30, **BOUNDED)
@given(seed=st.integers(0, 10**6), cap=st.integers(1, 6), k=st.integers(1, 3), batch=st.integers(1, 3))
def test_matches_its_plain_restatement_on_random_traces(seed, cap, k, batch):
    trace = random_trace(np.random.default_rng(seed), tokens=60, layers=2, experts=10, k=k, requests=3)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    check_against_plain(trace, its, cap, nuo.DEFAULT_WEIGHTS)


def test_bypass_keeps_a_frequent_set_through_a_one_time_scan():
    """Experts 0 and 1 are used at every step but one; a scan of never-seen experts passes through one per step
    (top-2 with one of 0/1): LRU (admit everything) would let the scan push the idle one of 0/1 out; the model
    scores a first-time expert below the frequent one, so the scan is not admitted."""
    rows = []
    for t in range(40):
        rows.append([[t % 2, 2 + t]] if t >= 10 else [[0, 1]])
    trace = make_trace(rows, num_experts=60)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    pol = odds_policy(trace, its, 0, 2)
    drive(trace, its, pol)
    assert sorted(pol.cache.mpc[0]) == [0, 1]
    assert cache_hits(pol) == 2 * 9 + 30  # from the second step on, 0 and 1 always hit


def test_same_seed_same_results(tmp_path):
    rng = np.random.default_rng(5)
    trace = random_trace(rng, tokens=80, layers=3, experts=8, k=2, requests=4)
    path = save_trace(trace, tmp_path / "t.npz")
    train = str(save_trace(random_trace(rng, tokens=80, layers=3, experts=8, k=2, requests=4), tmp_path / "tr.npz"))
    runs = []
    for _ in range(2):
        cfg = config_for(
            path,
            trace,
            NAME,
            "cross-layer",
            2,
            1,
            2,
            4,
            seed=3,
            policy_params={"train": train},
            predictor_params={"train": train},
        )
        runs.append(comparable(simulate(cfg, trace=trace).summary))
    assert runs[0] == runs[1]


# ---------------------------------------------------------------------------------------- train / evaluate


def test_training_reads_only_the_training_trace(tmp_path, monkeypatch):
    rng = np.random.default_rng(7)
    train = random_trace(rng, tokens=90, layers=2, experts=8, k=2, requests=3)
    evaluated = random_trace(rng, tokens=70, layers=2, experts=8, k=2, requests=2)
    path = save_trace(train, tmp_path / "train.npz")
    seen = []
    real = nuo.training_steps

    def spy(trace, batch, layers):
        seen.append(trace)
        return real(trace, batch, layers)

    monkeypatch.setattr(nuo, "training_steps", spy)
    its, _ = build_iterations(evaluated, 1, "static", None, True, None)
    pol = odds_policy(evaluated, its, 0, 3, {"train": str(path)})
    assert len(seen) == 1 and seen[0] is not evaluated
    assert np.array_equal(seen[0].experts, train.experts)  # the training routing, nothing else
    assert pol.weights_source == str(path) and pol.weights != nuo.DEFAULT_WEIGHTS
    # the weights and the warm start depend on the training trace only
    other = random_trace(rng, tokens=40, layers=2, experts=8, k=2, requests=2)
    its2, _ = build_iterations(other, 1, "static", None, True, None)
    pol2 = odds_policy(other, its2, 0, 3, {"train": str(path)})
    assert pol2.weights == pol.weights and pol2.warm_fill == pol.warm_fill
    counts = selection_counts(train.experts, 8)
    for layer in range(2):
        assert pol.warm_fill[layer] == sorted(range(8), key=lambda e: (-counts[layer, e], e))[:3]
    # and the fit is the logistic regression of the documented samples, recomputed here
    steps = nuo.training_steps(train, 1, [0, 1])
    xs, ys = zip(*(nuo.layer_samples(s, 8) for s in steps.values()))
    assert pol.weights == nuo.fit_logistic(np.concatenate(xs), np.concatenate(ys))


def test_label_is_the_next_step_and_features_use_only_the_past():
    steps = [(0, 1), (1, 2), (0, 2), (3,)]
    x, y = nuo.layer_samples(steps, 4)
    # samples: step 1 (experts 0, 1), step 2 (0, 1, 2), step 3 (0, 1, 2) -> labels = used at the next step
    assert y.tolist() == [0, 1, 1, 0, 1, 0, 0, 0]
    # expert 0 at step 2: age 1, share 1/2; at step 3: age 0, share 2/3
    assert x[2, 1] == pytest.approx(math.log2(2)) and x[2, 7] == pytest.approx(math.sqrt(1 / 2))
    assert x[5, 1] == 0.0 and x[5, 2] == 1.0 and x[5, 7] == pytest.approx(math.sqrt(2 / 3))


def test_refuses_the_evaluated_trace_and_another_model(tmp_path):
    trace = random_trace(np.random.default_rng(1), tokens=50, layers=2, experts=8, k=2, requests=2)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    same = save_trace(trace, tmp_path / "copy.npz")
    with pytest.raises(ConfigError, match=r"^policy\.params\.train:.*is the evaluated trace"):
        odds_policy(trace, its, 0, 3, {"train": str(same)})
    wider = save_trace(
        random_trace(np.random.default_rng(2), tokens=50, layers=2, experts=10, k=2, requests=2), tmp_path / "wider.npz"
    )
    with pytest.raises(ConfigError, match=r"^policy\.params\.train:"):
        odds_policy(trace, its, 0, 3, {"train": str(wider)})
    pred = PREDICTORS.get("cross-layer")
    with pytest.raises(ConfigError, match=r"^predictor\.params\.train:.*is the evaluated trace"):
        pred({"train": str(same)}, PredictorContext(2, 8, 0, trace=trace))
    pol = odds_policy(trace, its, 0, 3)  # no training: the documented default weights, a cold cache
    assert pol.weights == nuo.DEFAULT_WEIGHTS and pol.weights_source == "default" and not pol.warm_fill


def test_cross_layer_predicts_from_the_current_layer_only(tmp_path):
    # training: expert a in layer 0 is always followed by expert a + 4 in layer 1
    rows = [[[a], [a + 4]] for a in [0, 1, 2, 3] * 10]
    train = save_trace(make_trace(rows, num_experts=8), tmp_path / "train.npz")
    evaluated = make_trace([[[2], [0]], [[1], [7]]], num_experts=8)
    its, _ = build_iterations(evaluated, 1, "static", None, True, None)
    pred = PREDICTORS.get("cross-layer")({"train": str(train)}, PredictorContext(2, 8, 0, trace=evaluated))
    got = []
    for it in its:
        pred.start_iteration(it)
        got.append(pred.predict(it.index, 1, frozenset({5}), frozenset()))  # truth is ignored
    assert got == [frozenset({6}), frozenset({5})]
    blank = PREDICTORS.get("cross-layer")(None, PredictorContext(2, 8, 0, trace=evaluated))
    blank.start_iteration(its[0])
    assert blank.predict(0, 1, frozenset({0}), frozenset()) == frozenset()


def test_origin_and_default_predictor():
    from sim.compare import default_predictor, origin_of

    assert origin_of(NAME) == "ours" and default_predictor(NAME) == "cross-layer"


def test_default_weights_are_the_fit_on_the_gpt_oss_training_half():
    """DEFAULT_WEIGHTS come from the even-numbered requests of the bundled gpt-oss-20b trace only (the odd ones are
    the evaluation half of docs/our_policy.md)."""
    import dataclasses

    from traces.io import load_trace
    from traces.synthetic.fit import subset

    path = ROOT / "traces" / "data" / "gpt_oss_20b.npz"
    if not path.is_file():
        pytest.skip("bundled gpt-oss-20b trace absent")
    full = load_trace(path)
    keep = list(range(0, full.num_requests, 2))
    train = subset(full, keep)
    info = {k: [v[r] for r in keep] for k, v in train.meta.request_info.items()}
    train = dataclasses.replace(train, meta=dataclasses.replace(train.meta, request_info=info))
    w = nuo.fit_weights(train, range(full.num_layers), 1)
    assert tuple(round(v, 3) for v in w) == nuo.DEFAULT_WEIGHTS
