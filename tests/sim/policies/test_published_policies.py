"""Published caching policies beyond LRU/LFU/MoE-Infinity/Diff-MoE (`least-stale`, `arc`, `s3fifo`, `learned-rf`,
`reuse-distance`; sim/policies/least_stale.py, arc.py, s3fifo.py, learned_rf.py, reuse_distance.py): each against a
plain restatement of its rule (tests/reference/published.py, independent, with lists), and hand-traced examples (engine
invariants and the Belady bound, as for every policy: tests/sim/policies/test_policy_properties.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.core.cache import MPC
from sim.core.workload import build_iterations
from sim.policies import POLICIES
from tests.reference.lru import plain_lru
from tests.reference.published import PLAIN, plain_learned_rf, plain_reuse_distance, plain_s3fifo
from tests.support.policies import BOUNDED, TWO_LAYER_HAND_MADE, cache_hits, drive, policy_for, steps_of
from tests.support.traces import make_trace, random_trace
from traces.io import save_trace

#: The published policies this file checks against the restatements in tests/reference/published.py, named on
#: purpose (lru, lfu, moe-infinity and diffmoe have their own files).
NEW = ("least-stale", "arc", "s3fifo", "learned-rf", "reuse-distance")


def check_against_plain(name, trace, its, cap, params=None, plain=None):
    pol = policy_for(name, trace, its, 0, cap, params)
    decisions, snaps = drive(trace, its, pol)
    plain = plain or PLAIN[name]
    want = {layer: iter(plain(s, cap)) for layer, s in steps_of(trace, its).items()}
    for d, snap in zip(decisions, snaps):
        src, after = next(want[d.layer])
        assert dict(d.sources) == src, (name, d.iteration, d.layer)
        assert snap[d.layer] == after, (name, d.iteration, d.layer)
    return pol


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("cap", [1, 2, 3, 5])
@pytest.mark.parametrize("batch", [1, 2])
def test_each_policy_matches_its_plain_restatement_on_a_hand_made_trace(name, cap, batch):
    trace = make_trace(TWO_LAYER_HAND_MADE, lengths=[5, 6, 4], num_experts=8)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    pol = check_against_plain(name, trace, its, cap)
    if cap >= 2:
        assert pol.cache.counters.evictions > 0 and cache_hits(pol) > 0


@pytest.mark.parametrize("name", NEW)
@settings(max_examples=40, **BOUNDED)
@given(seed=st.integers(0, 10**6), cap=st.integers(1, 6), k=st.integers(1, 3), batch=st.integers(1, 3))
def test_each_policy_matches_its_plain_restatement_on_random_traces(name, seed, cap, k, batch):
    trace = random_trace(np.random.default_rng(seed), tokens=60, layers=2, experts=10, k=k, requests=3)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    check_against_plain(name, trace, its, cap)


def test_params_of_reuse_distance_and_s3fifo_reach_their_rules():
    trace = random_trace(np.random.default_rng(5), tokens=80, layers=2, experts=10, k=2, requests=2)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    check_against_plain(
        "reuse-distance", trace, its, 4, {"window": 2}, lambda s, c: plain_reuse_distance(s, c, window=2)
    )
    check_against_plain("s3fifo", trace, its, 4, {"move_to_main": 1}, lambda s, c: plain_s3fifo(s, c, threshold=1))


def hits_of(decisions):
    return [int(s == MPC) for d in decisions for _, s in d.sources]


def single(seq, experts):
    """A one-layer top-1 trace of ``seq`` (one expert per step at batch 1) and its iterations."""
    trace = make_trace([[e] for e in seq], num_experts=experts)
    return trace, build_iterations(trace, 1, "static", None, True, None)[0]


def test_least_stale_hand_traced_example():
    """3 slots, A B C A B C A D A B C D (every interval 3 at first): at D (step 8) A, predicted back at 7 + 3, is
    furthest and goes; at A's return (9) C (6 + 3) and D (8 + 1) tie at 9 and D, used last, goes; at D's return
    (12) C (11 + 3.5) is furthest. The same hits as a third-party hand trace of this rule."""
    trace, its = single([1, 2, 3, 1, 2, 3, 1, 4, 1, 2, 3, 4], 5)
    pol = policy_for("least-stale", trace, its, 0, 3)
    assert hits_of(drive(trace, its, pol)[0]) == [0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0]


def test_s3fifo_hand_traced_example():
    """2 slots: S and M hold 1 each, G 1 id. 0 is hit twice in S, so when 2 arrives it moves to M and 1 (never hit)
    leaves for G; 1 comes back through G into M (2 leaves S for G); 2 comes back through G: M's clock gives 0 its
    second chance and evicts 1 (an eviction from M leaves no ghost)."""
    trace, its = single([0, 0, 0, 1, 2, 0, 1, 2], 3)
    pol = policy_for("s3fifo", trace, its, 0, 2)
    decisions, snaps = drive(trace, its, pol)
    assert hits_of(decisions) == [0, 1, 1, 0, 0, 1, 0, 0]
    assert [s[0] for s in snaps] == [[0], [0], [0], [0, 1], [0, 2], [0, 2], [0, 1], [0, 2]]
    q = pol.s3[0]
    assert list(q.m) == [0, 2] and not q.s and not q.g


@pytest.mark.parametrize("name, scan_survivors", [("arc", 6), ("s3fifo", 6), ("lru", 4)])
def test_a_one_time_scan_does_not_flush_arc_or_s3fifo(name, scan_survivors):
    """Two hot experts used again and again, a scan of new ones, then the hot ones again (3 slots): ARC keeps them
    in T2, S3-FIFO in M; LRU loses them to the scan."""
    seq = [0, 1] * 6 + list(range(2, 9)) + [0, 1] * 3
    trace, its = single(seq, 10)
    decisions = drive(trace, its, policy_for(name, trace, its, 0, 3))[0]
    assert sum(hits_of(decisions)[-6:]) == scan_survivors


def test_interval_predictions_beat_lru_on_a_loop_one_larger_than_the_cache():
    """A loop over 3 experts in 2 slots: LRU (and ARC) always evict the expert needed next and never hit; the
    interval-based rules learn the period and keep one loop member, hitting every other step."""
    trace, its = single([0, 1, 2] * 6, 3)
    hits = {
        name: hits_of(drive(trace, its, policy_for(name, trace, its, 0, 2))[0])
        for name in ("lru", "arc", "reuse-distance", "least-stale")
    }
    assert sum(hits["lru"]) == sum(hits["arc"]) == 0
    assert hits["reuse-distance"][4:] == [1, 0] * 7
    assert hits["least-stale"][3:] == [1, 0] * 7 + [1]


def test_reuse_distance_prediction_is_the_mean_residual_or_the_age_when_overdue():
    from sim.policies.reuse_distance import predicted_distance

    assert predicted_distance([3, 3, 6], 2) == 2.0  # (1 + 1 + 4) / 3
    assert predicted_distance([3, 3, 6], 4) == 2.0  # only 6 is longer than 4
    assert predicted_distance([3, 3, 6], 7) == 7.0  # overdue: as long again
    assert predicted_distance([3, 3, 6], 20) == 20.0  # and it grows with the absence


def test_arc_adapts_p_on_ghost_hits():
    """2 slots: 0 twice (into T2), 1 and 2 (REPLACE sends 1 to B1), 1 again (B1 hit: p 0 -> 1, T2's 0 to B2),
    0 again (B2 hit: p 1 -> 0, T1's 2 to B1)."""
    trace, its = single([0, 0, 1, 2, 1], 3)
    pol = policy_for("arc", trace, its, 0, 2)
    drive(trace, its, pol)
    arc = pol.arc[0]
    assert (arc.p, list(arc.t1), list(arc.t2), list(arc.b1), list(arc.b2)) == (1.0, [2], [1], [], [0])
    trace, its = single([0, 0, 1, 2, 1, 0], 3)
    pol = policy_for("arc", trace, its, 0, 2)
    drive(trace, its, pol)
    arc = pol.arc[0]
    assert (arc.p, list(arc.t1), list(arc.t2), list(arc.b1), list(arc.b2)) == (0.0, [], [1, 0], [2], [])


# ------------------------------------------------------------------------------------------- learned-rf training


def plain_fit(trace, batch=1):
    """Least squares over every (step, expert used before but not now) of each layer, by plain enumeration
    (decode-only trace, batch 1: one step per token, requests in order)."""
    rows, ys = [], []
    for layer in range(trace.num_layers):
        steps = [sorted({int(x) for x in trace.experts[t, layer] if x >= 0}) for t in range(trace.num_tokens)]
        n = len(steps)
        for t in range(1, n + 1):
            for e in range(trace.num_experts):
                past = [i for i in range(1, t + 1) if e in steps[i - 1]]
                if not past or e in steps[t - 1]:
                    continue
                later = [i for i in range(t + 1, n + 1) if e in steps[i - 1]]
                nxt = later[0] if later else n + 1
                rows.append([1.0, math.log2(1 + t - past[-1]), math.log2(len(past) / t)])
                ys.append(math.log2(nxt - t))
    return np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)[0]


def test_learned_rf_fits_its_weights_on_the_training_trace_only(tmp_path):
    rng = np.random.default_rng(7)
    train = random_trace(rng, tokens=90, layers=2, experts=8, k=2, requests=3)
    evaluated = random_trace(rng, tokens=70, layers=2, experts=8, k=2, requests=2)
    path = save_trace(train, tmp_path / "train.npz")
    its, _ = build_iterations(evaluated, 1, "static", None, True, None)
    pol = policy_for("learned-rf", evaluated, its, 0, 3, {"train": str(path)})
    assert pol.weights_source == str(path)
    assert np.allclose(pol.weights, plain_fit(train), atol=1e-9)
    # the evaluated trace does not enter the fit: another evaluated trace, the same weights
    other = random_trace(rng, tokens=40, layers=2, experts=8, k=2, requests=2)
    its2, _ = build_iterations(other, 1, "static", None, True, None)
    assert policy_for("learned-rf", other, its2, 0, 3, {"train": str(path)}).weights == pol.weights
    # and the policy applies them as the plain rule does
    check_against_plain(
        "learned-rf", evaluated, its, 3, {"train": str(path)}, lambda s, c: plain_learned_rf(s, c, pol.weights)
    )


def one_layer(rng, tokens, experts, pick):
    """A one-layer top-2 trace whose token ``t`` routes to ``pick(t)``'s two distinct draws."""
    rows = []
    for t in range(tokens):
        chosen = []
        while len(chosen) < 2:
            e = pick(t)
            if e not in chosen:
                chosen.append(e)
        rows.append([sorted(chosen)])
    return make_trace(rows, num_experts=experts)


def test_learned_rf_learns_recency_where_popularity_drifts_and_frequency_where_it_stays(tmp_path):
    rng = np.random.default_rng(0)
    hot = {}

    def drifting(t):  # a new hot set of 3 every 30 tokens, 90% of picks
        if t // 30 not in hot:
            hot[t // 30] = rng.choice(12, 3, replace=False)
        return int(rng.choice(hot[t // 30])) if rng.random() < 0.9 else int(rng.integers(12))

    skew = 1.0 / np.arange(1, 13)

    def steady(t):  # one fixed skewed popularity, no memory
        return int(rng.choice(12, p=skew / skew.sum()))

    evaluated = one_layer(rng, 40, 12, steady)
    its, _ = build_iterations(evaluated, 1, "static", None, True, None)
    weights = {}
    for name, pick in (("drifting", drifting), ("steady", steady)):
        path = save_trace(one_layer(rng, 300, 12, pick), tmp_path / f"{name}.npz")
        weights[name] = policy_for("learned-rf", evaluated, its, 0, 3, {"train": str(path)}).weights
    assert weights["drifting"][1] > 0.2  # long unused -> back later
    assert weights["steady"][2] < -0.2  # frequent -> back sooner
    assert abs(weights["steady"][1]) < 0.1  # and recency says nothing there


def test_learned_rf_refuses_the_evaluated_trace_and_a_different_model(tmp_path):
    trace = random_trace(np.random.default_rng(1), tokens=50, layers=2, experts=8, k=2, requests=2)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    same = save_trace(trace, tmp_path / "copy.npz")  # a copy of the evaluated routing
    with pytest.raises(ConfigError, match=r"^policy\.params\.train:.*is the evaluated trace"):
        policy_for("learned-rf", trace, its, 0, 3, {"train": str(same)})
    wider = save_trace(
        random_trace(np.random.default_rng(2), tokens=50, layers=2, experts=10, k=2, requests=2), tmp_path / "wider.npz"
    )
    with pytest.raises(ConfigError, match=r"^policy\.params\.train:.*10 experts"):
        policy_for("learned-rf", trace, its, 0, 3, {"train": str(wider)})
    pol = policy_for("learned-rf", trace, its, 0, 3)
    assert pol.weights == (0.0, 1.0, -1.0) and pol.weights_source == "default"


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("learned-rf", {"train": "/nonexistent/train.npz"}, "policy.params.train"),
        ("learned-rf", {"train_batch": 0}, "policy.params.train_batch"),
        ("reuse-distance", {"window": 0}, "policy.params.window"),
        ("s3fifo", {"move_to_main": 4}, "policy.params.move_to_main"),
        ("s3fifo", {"small_ratio": 1.5}, "policy.params.small_ratio"),
        ("arc", {"window": 3}, "policy.params.window"),
        ("least-stale", {"pin_hot": "yes"}, "policy.params.pin_hot"),
    ],
)
def test_bad_params_name_the_field(name, params, field):
    with pytest.raises(ConfigError, match="^" + field.replace(".", r"\.") + ":"):
        POLICIES.get(name).check_params(params)


@pytest.mark.parametrize("name", NEW)
def test_origin_is_published_and_the_default_cache_is_plain(name):
    import importlib

    cls = POLICIES.get(name)
    assert cls.origin == "published" == importlib.import_module(cls.__module__).ORIGIN
    trace = random_trace(np.random.default_rng(0), tokens=10, layers=2, experts=8, k=2)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    pol = policy_for(name, trace, its, 2, 3)
    assert pol.promotion_is_free and pol.params["pin_hot"] is False
    assert (pol.cache.hpc_slots, pol.cache.mpc_slots) == (0, 5) and not any(pol.cache.mpc)
    pinned = policy_for(name, trace, its, 2, 3, {"pin_hot": True})
    assert (pinned.cache.hpc_slots, pinned.cache.mpc_slots) == (2, 3)
    assert list(pinned.cache.hpc) == [frozenset(pinned.ctx.hot_ranking[layer][:2]) for layer in range(2)]


def test_at_one_slot_every_new_policy_is_lru():
    """With one slot and top-1 there is no choice: the newcomer replaces the only occupant."""
    trace = random_trace(np.random.default_rng(3), tokens=120, layers=2, experts=6, k=1, requests=3)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    want = sum(plain_lru([(t, s) for t, s in enumerate(st_)], 1) for st_ in steps_of(trace, its).values())
    for name in NEW:
        pol = policy_for(name, trace, its, 0, 1)
        drive(trace, its, pol)
        assert cache_hits(pol) == want, name
