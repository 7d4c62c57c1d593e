"""`traces synth`: determinism, the knobs doing what they say, encoder/decoder layout, and --fit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.cli import run_module
from tests.support.paths import ROOT
from traces.analysis import stats
from traces.io import load_trace, trace_bytes
from traces.synthetic.generator import SynthKnobs, generate, locality

SMALL = SynthKnobs(num_experts=16, top_k=2, decoder_layers=4, requests=24, prompt_len=(2, 6), decode_len=(20, 60))


@settings(max_examples=25, deadline=None)
@given(
    experts=st.integers(1, 40),
    k=st.integers(1, 4),
    enc=st.integers(0, 3),
    dec=st.integers(0, 3),
    stick=st.floats(0, 1),
    corr=st.floats(0, 1),
    skew=st.floats(0, 3),
    seed=st.integers(0, 1000),
)
def test_any_valid_knobs_give_a_valid_trace_with_the_right_layout(experts, k, enc, dec, stick, corr, skew, seed):
    if k > experts or enc + dec == 0:
        return
    knobs = SynthKnobs(
        num_experts=experts,
        top_k=k,
        encoder_layers=enc,
        decoder_layers=dec,
        requests=5,
        prompt_len=(1, 5),
        decode_len=(0, 7),
        skew=skew,
        stickiness=stick,
        correlation=corr,
    )
    t = generate(knobs, seed)
    t.validate()  # ids in range, no repeated expert within a token
    routed = (t.experts >= 0).all(2)
    assert ((t.experts >= 0).any(2) == routed).all()  # a token is routed in all k slots or none
    decode = t.decode_mask()
    roles = np.array([x.role for x in t.meta.model.layers])
    if enc and dec:
        assert (routed[:, roles == "encoder"] == ~decode[:, None]).all()
        assert (routed[:, roles == "decoder"] == decode[:, None]).all()
    else:
        assert routed.all()


def test_same_seed_gives_byte_identical_files_and_another_seed_does_not(tmp_path):
    a, b, c = (tmp_path / f"{n}.npz" for n in "abc")
    args = ["synth", "--experts", "16", "--top-k", "2", "--layers", "3", "--requests", "10", "--skew", "1"]
    for out, seed in ((a, 7), (b, 7), (c, 8)):
        assert run_module("traces", *args, "--seed", seed, "--out", out).returncode == 0
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert trace_bytes(generate(SMALL, 3)) == trace_bytes(generate(SMALL, 3))


def test_stickiness_raises_overlap_and_lru_hits():
    low = locality(generate(dataclasses.replace(SMALL, stickiness=0.0, correlation=0.0, skew=0.0), 1), 4)
    high = locality(generate(dataclasses.replace(SMALL, stickiness=0.7, correlation=0.0, skew=0.0), 1), 4)
    # uniform routing, 2 of 16 experts: each of a token's experts is among the previous token's 2 with p = 2/16
    assert low["overlap_prev"] == pytest.approx(2 / 16, abs=0.02)
    assert high["overlap_prev"] > 0.6 and high["lru_hit_rate"] > low["lru_hit_rate"] + 0.3


def test_skew_concentrates_popularity_and_correlation_makes_layers_predictable():
    flat = stats.popularity_skew(generate(dataclasses.replace(SMALL, skew=0.0), 2))[0]
    steep = stats.popularity_skew(generate(dataclasses.replace(SMALL, skew=2.0), 2))[0]
    assert flat == pytest.approx(0.125, abs=0.03) and steep > 0.5  # top 10% of 16 experts = 2 experts
    loose = stats.transition_accuracy(generate(dataclasses.replace(SMALL, correlation=0.0), 2))[0]
    tight = stats.transition_accuracy(generate(dataclasses.replace(SMALL, correlation=0.9), 2))[0]
    assert tight > loose + 0.5


@pytest.mark.parametrize(
    "args, field",
    [
        (["--top-k", "9", "--experts", "8"], "--top-k"),
        (["--stickiness", "1.5"], "--stickiness"),
        (["--prompt-len", "9,3"], "--prompt-len"),
        (["--decode-len", "x"], "--decode-len"),
        (["--layers", "2", "--encoder-layers", "1"], "--layers"),
    ],
)
def test_bad_knobs_exit_2_naming_the_flag(tmp_path, args, field):
    out = tmp_path / "s.npz"
    res = run_module("traces", "synth", *args, "--out", out)
    assert res.returncode == 2 and field in res.stderr and res.stderr.count("\n") == 1
    assert not out.exists()


@pytest.mark.slow
def test_fit_reproduces_the_real_trace_locality(mixtral_real, tmp_path):
    """`synth --fit` on the real HumanEval trace: overlap_prev and lru_hit_rate@4 within 0.03. Without the held-out
    check (a second fit, on half the requests; its CLI path: test_fit.py's test_cli_fit_prints_the_held_out_table...,
    its figures on real routing: test_real_gpt_oss_fit_on_half_matches_the_other_half)."""
    out = tmp_path / "fit.npz"
    res = run_module(
        "traces", "synth", "--fit", mixtral_real["humaneval"], "--requests", "16", "--no-holdout", "--out", out
    )
    assert res.returncode == 0, res.stderr
    real = stats.compute_stats(load_trace(mixtral_real["humaneval"]), capacities=[4])
    synth = stats.compute_stats(load_trace(out), capacities=[4])
    assert abs(synth["overlap_prev"] - real["overlap_prev"]) < 0.03
    assert abs(synth["lru_hit_rate"]["4"] - real["lru_hit_rate"]["4"]) < 0.03
    assert load_trace(out).meta.model.num_experts == 8


def test_bundled_workloads_load_and_regenerate_byte_for_byte():
    sw = ROOT / "traces" / "data" / "switch_xxl_128.npz"
    t = load_trace(sw)
    assert t.meta.model.name == "switch-xxl-128" and t.num_requests >= 128 and t.num_layers == 24
    # fitted to the real switch-base-128 logs, stretched over 12 + 12 layers; the metadata regenerate it
    extra = t.meta.extra
    assert extra["fitted_to"]["model"] == "switch-base-128" and len(extra["fitted_to"]["layers_from"]) == 24
    again = generate(
        SynthKnobs.from_dict(extra["knobs"]),
        t.meta.seed,
        (t.prefill_lengths, t.request_lengths - t.prefill_lengths),
        None,
        {"fitted_to": extra["fitted_to"]},
        dataset=t.meta.provenance.dataset,
    )
    assert trace_bytes(again) == sw.read_bytes()
    base = ROOT / "traces" / "data" / "switch_base_128.npz"  # the assumed-knob trace stays, for comparison
    b = load_trace(base)
    knobs = SynthKnobs(
        **{
            **b.meta.extra["knobs"],
            "prompt_len": tuple(b.meta.extra["knobs"]["prompt_len"]),
            "decode_len": tuple(b.meta.extra["knobs"]["decode_len"]),
        }
    )
    assert trace_bytes(generate(knobs, b.meta.seed)) == base.read_bytes()
    mx = load_trace(ROOT / "traces" / "data" / "mixtral_8x7b.npz")
    assert mx.meta.model.num_experts == 8 and mx.top_k == 2 and mx.num_layers == 32


@given(
    requests=st.integers(-2, 1 << 24),
    lo=st.integers(-1, 1 << 22),
    span=st.integers(0, 1 << 22),
    layers=st.integers(1, 200),
    top_k=st.integers(1, 16),
)
@settings(max_examples=200, deadline=None)
def test_knobs_are_refused_unless_the_largest_trace_they_can_make_is_one_a_reader_takes(
    requests, lo, span, layers, top_k
):
    """Checked before anything is drawn: a typo costs one line, never the machine's memory."""
    from moebase.errors import InputError
    from traces.format import MAX_CONTEXT, MAX_REQUESTS
    from traces.io import MAX_ARRAY_BYTES

    knobs = SynthKnobs(
        num_experts=64,
        top_k=top_k,
        decoder_layers=layers,
        requests=requests,
        prompt_len=(lo, lo + span),
        decode_len=(1, 1),
    )
    try:
        knobs.check()
    except InputError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400
        return
    assert 1 <= requests <= MAX_REQUESTS and lo + span <= MAX_CONTEXT
    assert requests * (lo + span + 1) * layers * top_k * 2 <= MAX_ARRAY_BYTES


@pytest.mark.parametrize(
    "args, words",
    [
        (["--requests", "100000000"], "--requests"),
        (["--requests", "1000000", "--decode-len", "1000,2000"], "GiB"),
        (["--seed", "-5"], "--seed"),
        (["--seed", "99999999999999999999999"], "--seed"),
        (["--tokens", "99999999999", "--fit", "traces/data/gpt_oss_20b.npz"], "--tokens"),
    ],
)
def test_a_synthetic_trace_too_large_or_a_bad_seed_is_one_line_before_any_work(tmp_path, args, words):
    out = tmp_path / "s.npz"
    res = run_module("traces", "synth", *args, "--out", out)
    assert res.returncode == 2 and words in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert "fitting" not in res.stderr and not out.exists()
