"""`traces stats`: every vectorised figure against a straightforward re-implementation, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.paths import ROOT
from tests.support.traces import make_trace, random_trace
from traces.analysis import stats


def naive_lru_hit_rate(trace, capacity):
    hits = accesses = 0
    for layer in range(trace.num_layers):
        cache = OrderedDict()
        for t in range(trace.num_tokens):
            for x in trace.experts[t, layer]:
                x = int(x)
                if x < 0:
                    continue
                accesses += 1
                if x in cache:
                    hits += 1
                    cache.move_to_end(x)
                else:
                    cache[x] = True
                    if len(cache) > capacity:
                        cache.popitem(last=False)
    return hits / accesses


def naive_stack_distances(seq):
    stack, out = [], []
    for x in seq:
        if x in stack:
            out.append(stack.index(x))
            stack.remove(x)
        else:
            out.append(-1)
        stack.insert(0, x)
    return out


def naive_overlap(trace):
    num = den = 0.0
    req = trace.request_index()
    for layer in range(trace.num_layers):
        for t in range(1, trace.num_tokens):
            if req[t] != req[t - 1]:
                continue
            cur = {int(x) for x in trace.experts[t, layer] if x >= 0}
            prev = {int(x) for x in trace.experts[t - 1, layer] if x >= 0}
            if cur and prev:
                num += len(cur & prev) / len(cur)
                den += 1
    return num / den


@st.composite
def small_traces(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    experts = draw(st.integers(2, 12))
    k = draw(st.integers(1, min(3, experts)))
    tokens = draw(st.integers(4, 80))
    trace = random_trace(
        rng, tokens=tokens, layers=draw(st.integers(1, 3)), experts=experts, k=k, requests=draw(st.integers(1, 3))
    )
    trace.experts[rng.random(trace.experts.shape[:2]) < 0.1] = -1
    return trace


@settings(max_examples=60, deadline=None)
@given(small_traces(), st.integers(0, 2**31 - 1))
def test_stack_distances_match_a_list_based_lru_stack(trace, seed):
    for layer in range(trace.num_layers):
        seq = stats.layer_accesses(trace, layer)
        assert stats.stack_distances(seq, trace.num_experts).tolist() == naive_stack_distances(seq.tolist())


def test_stack_distances_cross_chunk_boundaries():
    rng = np.random.default_rng(3)
    seq = rng.integers(0, 50, size=3 * stats._STACK_CHUNK + 17)
    assert stats.stack_distances(seq, 50).tolist() == naive_stack_distances(seq.tolist())


@settings(max_examples=60, deadline=None)
@given(small_traces(), st.integers(1, 12))
def test_lru_hit_rate_matches_an_ordered_dict_lru(trace, capacity):
    overall, _ = stats.lru_hit_rates(stats.reuse_profile(trace), [capacity])
    assert overall[capacity] == pytest.approx(naive_lru_hit_rate(trace, capacity))


@settings(max_examples=60, deadline=None)
@given(small_traces())
def test_overlap_prev_matches_a_loop(trace):
    got, _ = stats.overlap_prev(trace)
    try:
        want = naive_overlap(trace)
    except ZeroDivisionError:
        assert np.isnan(got)
    else:
        assert got == pytest.approx(want)


def test_hand_made_figures():
    # one layer, top-1, two requests: [0 0 1 0] and [1 1]
    t = make_trace([[0], [0], [1], [0], [1], [1]], lengths=[4, 2], num_experts=10)
    s = stats.compute_stats(t, capacities=[1, 2], batch_sizes=[1])
    # previous-token overlap: tokens 1..3 of request 0 -> 1, 0, 0; token 1 of request 1 -> 1
    assert s["overlap_prev"] == pytest.approx(2 / 4)
    # LRU over 0 0 1 0 1 1 (cache kept across requests): cap 1 hits at #1, #5 -> 2/6; cap 2 hits #1 #3 #4 #5
    assert s["lru_hit_rate"] == {"1": pytest.approx(2 / 6), "2": pytest.approx(4 / 6)}
    assert s["reuse_distance"] == {"cold": 2, "histogram": [2, 2] + [0] * 8}
    # top 10% of 10 experts = 1 expert (expert 0 or 1, 3 selections each) of 6 selections
    assert s["popularity_skew"] == pytest.approx(0.5)
    assert s["distinct_experts_vs_batch"]["1"] == 1.0


def test_transition_accuracy_is_one_for_a_deterministic_layer_map_and_low_for_noise():
    rng = np.random.default_rng(0)
    first = rng.integers(0, 16, size=500)
    determined = make_trace(np.stack([first, (first * 5 + 3) % 16], axis=1), num_experts=16)
    acc, per_pair, _ = stats.transition_accuracy(determined)
    assert acc == 1.0 and per_pair == [1.0]
    noise = make_trace(rng.integers(0, 16, size=(500, 2)), num_experts=16)
    assert stats.transition_accuracy(noise)[0] < 0.3


def test_encoder_decoder_pairs_without_shared_tokens_are_none():
    e = np.full((6, 2, 1), -1)
    e[:3, 0, 0] = [0, 1, 2]  # prompt tokens in the encoder layer
    e[3:, 1, 0] = [3, 4, 5]  # generated tokens in the decoder layer
    t = make_trace(e, lengths=[6], prefill=[3], num_experts=6, roles=["encoder", "decoder"])
    s = stats.compute_stats(t, batch_sizes=[1, 2])
    assert s["transition_accuracy"] is None and s["per_layer"][0]["transition_accuracy_to_next"] is None
    assert s["distinct_experts_vs_batch"]["1"] == 1.0  # decode steps route one expert in the decoder layer
    assert s["per_layer"][0]["distinct_experts_vs_batch"]["1"] is None


def test_distinct_experts_grow_with_batch_and_reuse_is_reported():
    rng = np.random.default_rng(1)
    t = random_trace(rng, tokens=400, layers=2, experts=32, k=2, requests=4)
    overall, _, reused = stats.distinct_experts_vs_batch(t, [1, 2, 4, 8, 16], samples=4)
    values = [overall[b] for b in (1, 2, 4, 8, 16)]
    assert values[0] == 2.0
    assert all(a < b for a, b in zip(values, values[1:]))
    assert reused == [8, 16]


def test_stats_cli_json_has_the_named_top_level_figures(tmp_path):
    from traces.io import save_trace

    path = save_trace(random_trace(np.random.default_rng(2), tokens=300, layers=3, experts=8, k=2), tmp_path / "t.npz")
    out = subprocess.run(
        [sys.executable, "-m", "traces", "stats", str(path), "--json", "--capacities", "2,4,6"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    s = json.loads(out)
    for key in (
        "overlap_prev",
        "lru_hit_rate",
        "popularity_skew",
        "reuse_distance",
        "distinct_experts_vs_batch",
        "transition_accuracy",
        "per_layer",
    ):
        assert key in s
    assert set(s["lru_hit_rate"]) == {"2", "4", "6"} and len(s["per_layer"]) == 3
    bad = subprocess.run(
        [sys.executable, "-m", "traces", "stats", str(path), "--capacities", "two"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--capacities" in bad.stderr


def test_real_mixtral_figures_match_the_provenance_reference(mixtral_real):
    """PROVENANCE.md: mean share of experts shared with the previous token 0.40 (HumanEval), 0.34 (GSM8K)."""
    from traces.io import load_trace

    he = stats.compute_stats(load_trace(mixtral_real["humaneval"]), capacities=[2, 4, 6])
    gs = stats.compute_stats(load_trace(mixtral_real["gsm8k"]), capacities=[2, 4, 6])
    assert he["overlap_prev"] == pytest.approx(0.40, abs=0.005)
    assert gs["overlap_prev"] == pytest.approx(0.34, abs=0.005)
    for s in (he, gs):
        rates = [s["lru_hit_rate"][c] for c in ("2", "4", "6")]
        assert rates == sorted(rates) and 0 < rates[0] and rates[-1] < 1
