"""Fitted knobs moved to another expert count and top-k (traces/synthetic/reshape.py) and `traces synth --from-fit`:
the resampled popularity keeps each top-x% share, lifts follow the rank-fraction map, the identity reshape
changes nothing, and --from-fit traces have the asked shape, are deterministic in the seed, name their source
and drop the opening positions when requests have no prompt rows."""

from __future__ import annotations

import dataclasses
import json
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import InputError
from tests.support.cli import run_module
from tests.support.paths import ROOT
from traces.analysis import stats
from traces.io import load_trace, save_trace
from traces.synthetic import reshape
from traces.synthetic.fit import stretch_layers
from traces.synthetic.generator import SynthKnobs, generate, knobs_sha256


def fitted(e=16, k=4, layers=3, seed=0, prefix=2, requests=6) -> SynthKnobs:
    """Knobs of the fitted model's form (rounded to 6 decimals as a fit stores them)."""
    rng = np.random.default_rng(seed)
    r = lambda a: tuple(float(x) for x in np.round(a, 6))  # noqa: E731
    pop = np.maximum(rng.dirichlet(np.full(e, 0.5), size=layers), 1e-6)
    return SynthKnobs(
        model="tiny-fit",
        num_experts=e,
        top_k=k,
        decoder_layers=layers,
        requests=requests,
        prompt_len=(3, 5),
        decode_len=(10, 20),
        correlation=0.0,
        layer_popularity=tuple(r(w) for w in pop),
        layer_stickiness=r(rng.uniform(0.1, 0.5, layers)),
        request_concentration=r(rng.uniform(1, 50, layers)),
        prefix_popularity=tuple(tuple(r(w) for w in rng.dirichlet(np.ones(e), size=layers)) for _ in range(prefix))
        or None,
        layer_transition=tuple(tuple(r(row) for row in rng.uniform(0.2, 3, (e, e))) for _ in range(layers - 1)),
        transition_power=1.5,
    )


@pytest.fixture(scope="module")
def fit_file(tmp_path_factory):
    """A trace in the form `synth --fit` writes (fitted knobs in extra.knobs, what they came from in fitted_to)."""
    trace = generate(
        fitted(),
        0,
        extra={"fitted_to": {"file": "real.npz", "model": "tiny-real"}},
        dataset="fitted to tiny-real (test)",
    )
    return save_trace(trace, tmp_path_factory.mktemp("reshape") / "fit.npz")


# ------------------------------------------------------------------------------------------------ popularity


@settings(max_examples=60, deadline=None)
@given(old_e=st.integers(1, 64), new_e=st.integers(1, 160), conc=st.floats(0.05, 5.0), seed=st.integers(0, 10**6))
def test_resampled_popularity_keeps_the_share_of_the_top_x_percent(old_e, new_e, conc, seed):
    w = np.random.default_rng(seed).dirichlet(np.full(old_e, conc)) + 1e-12
    new, src = reshape.lorenz_resample(w, new_e)
    assert new.shape == (new_e,) and new.sum() == pytest.approx(1.0, abs=1e-9) and (new >= 0).all()
    assert (np.diff(new) <= 1e-12).all()  # rank order: most popular first
    for j in range(new_e + 1):  # exact at the new experts' rank fractions
        assert reshape.top_share(new, j / new_e) == pytest.approx(reshape.top_share(w, j / new_e), abs=1e-9)
    for x in np.linspace(0, 1, 41):  # in between, off by at most one new expert's share (a chord of a concave curve)
        assert abs(reshape.top_share(new, x) - reshape.top_share(w, x)) <= new.max() + 1e-9
    # each new rank stands for the fitted expert at the same rank fraction
    rank_of = np.argsort(np.argsort(-w, kind="stable"))
    assert (np.diff(rank_of[src]) >= 0).all()
    assert (np.abs((rank_of[src] + 0.5) / old_e - (np.arange(new_e) + 0.5) / new_e) <= 0.5 / old_e + 1e-12).all()


@pytest.mark.parametrize("new_e", [128, 384])
def test_popularity_skew_survives_a_reshape_and_ids_are_relabelled_per_layer(new_e):
    knobs = fitted(e=256, k=8, layers=4, prefix=0)
    out = reshape.reshape_experts(knobs, new_e, 8).knobs
    old, new = np.asarray(knobs.layer_popularity), np.asarray(out.layer_popularity)
    assert new.shape == (4, new_e)
    for layer in range(4):
        for x in (0.05, 0.1, 0.25, 0.5):
            assert reshape.top_share(new[layer], x) == pytest.approx(reshape.top_share(old[layer], x), abs=2e-3)
    hottest = new.argmax(1)
    assert len(set(hottest.tolist())) > 1  # not the same id in every layer


def test_lifts_follow_the_experts_each_new_one_stands_for():
    knobs = fitted(e=16, k=4, layers=3)
    shaped = reshape.reshape_experts(knobs, 24, 2)
    old, new, src = np.asarray(knobs.layer_transition), np.asarray(shaped.knobs.layer_transition), shaped.sources
    assert new.shape == (2, 24, 24)
    for t in range(2):
        for a in range(24):
            assert (new[t, a] == old[t, src[t, a]][src[t + 1]]).all()
    # each new expert stands for a fitted expert of (about) the same popularity rank
    old_pop, new_pop = np.asarray(knobs.layer_popularity), np.asarray(shaped.knobs.layer_popularity)
    for layer in range(3):
        new_rank = np.argsort(np.argsort(-new_pop[layer], kind="stable"))
        old_rank = np.argsort(np.argsort(-old_pop[layer], kind="stable"))
        assert np.abs(old_rank[src[layer]] / 16 - new_rank / 24).max() <= 1 / 16 + 1 / 24
    assert shaped.knobs.layer_stickiness == knobs.layer_stickiness
    assert shaped.knobs.request_concentration == knobs.request_concentration
    assert shaped.knobs.transition_power == knobs.transition_power and shaped.knobs.top_k == 2


def test_split_opening_positions_keep_each_fitted_experts_share():
    knobs = fitted(e=8, k=2, layers=2, prefix=2)
    # layer weights of at least 0.05: the new weights are stored to 6 decimals, so a split share is exact to
    # 4 x 5e-7 / 0.05 of itself
    pop = np.random.default_rng(1).uniform(0.05, 0.3, (2, 8))
    knobs = dataclasses.replace(knobs, layer_popularity=tuple(tuple(np.round(w / w.sum(), 6)) for w in pop))
    shaped = reshape.reshape_experts(knobs, 32, 2)  # every fitted expert split into 4
    old, new = np.asarray(knobs.prefix_popularity), np.asarray(shaped.knobs.prefix_popularity)
    assert new.shape == (2, 2, 32)
    for pos in range(2):
        for layer in range(2):
            src = shaped.sources[layer]
            merged = np.bincount(src, weights=new[pos, layer], minlength=8)
            assert merged == pytest.approx(old[pos, layer] / old[pos, layer].sum(), abs=5e-5)


def test_identity_reshape_returns_the_same_knobs_and_another_top_k_changes_only_top_k():
    knobs = fitted()
    same = reshape.reshape_experts(knobs, knobs.num_experts, knobs.top_k)
    assert same.knobs is knobs and same.sources is None
    other = reshape.reshape_experts(knobs, knobs.num_experts, 2).knobs
    for f in (
        "layer_popularity",
        "layer_stickiness",
        "request_concentration",
        "prefix_popularity",
        "layer_transition",
        "transition_power",
        "num_experts",
    ):
        assert getattr(other, f) == getattr(knobs, f), f
    assert other.top_k == 2


@settings(max_examples=25, deadline=None)
@given(new_e=st.integers(2, 40), new_k=st.integers(1, 6), layers=st.integers(1, 6), seed=st.integers(0, 1000))
def test_any_reshape_generates_a_valid_trace_of_the_asked_shape_deterministically(new_e, new_k, layers, seed):
    new_k = min(new_k, new_e)
    knobs = fitted(e=12, k=3, layers=3, prefix=0, requests=5)
    if layers != 3:
        knobs, _ = stretch_layers(knobs, 0, layers)
    shaped = reshape.reshape_experts(knobs, new_e, new_k).knobs
    a, b = generate(shaped, seed), generate(shaped, seed)
    a.validate()
    assert (a.num_layers, a.num_experts, a.top_k, a.num_requests) == (layers, new_e, new_k, 5)
    assert np.array_equal(a.experts, b.experts) and (a.experts >= 0).all()


def test_reshape_refuses_unfitted_knobs_and_impossible_top_k():
    with pytest.raises(InputError, match="no fitted popularity"):
        reshape.reshape_experts(SynthKnobs(), 16, 2)
    with pytest.raises(InputError, match="--top-k"):
        reshape.reshape_experts(fitted(), 4, 8)


def test_digest_names_the_stored_values():
    a = np.arange(12.0).reshape(3, 4) / 7
    assert knobs_sha256(a) == knobs_sha256(np.round(a, 6).tolist())
    assert knobs_sha256(a) != knobs_sha256(a.reshape(4, 3))
    assert knobs_sha256(a) != knobs_sha256(a + 1e-5)


# ------------------------------------------------------------------------------------------------ --from-fit

ARGS = [
    "--experts",
    "24",
    "--top-k",
    "2",
    "--layers",
    "5",
    "--requests",
    "9",
    "--prompt-len",
    "0,0",
    "--decode-len",
    "6,8",
]


def test_from_fit_writes_the_asked_shape_deterministically(fit_file, tmp_path):
    a, b, c = (tmp_path / f"{n}.npz" for n in "abc")
    for out, seed in ((a, 3), (b, 3), (c, 4)):
        res = run_module("traces", "synth", "--from-fit", fit_file, *ARGS, "--seed", seed, "--out", out)
        assert res.returncode == 0, res.stderr
    assert a.read_bytes() == b.read_bytes() and a.read_bytes() != c.read_bytes()
    t = load_trace(a)
    t.validate()
    assert (t.num_layers, t.num_experts, t.top_k, t.num_requests) == (5, 24, 2, 9)
    assert (t.prefill_lengths == 0).all() and 6 <= t.request_lengths.min() <= t.request_lengths.max() <= 8
    extra = t.meta.extra
    note = extra["from_fit"]
    assert note["file"] == "fit.npz" and len(note["sha256"]) == 64 and note["layers"]["from"] == [0, 0, 1, 1, 2]
    assert note["experts"] == {"from": 16, "to": 24, "mapping": reshape.MAPPING}
    assert note["top_k"] == {"from": 4, "to": 2} and "dropped" in note["prefix"]
    assert extra["fitted_to"]["model"] == "tiny-real"
    k = extra["knobs"]
    assert "prefix_popularity" not in k and len(k["layer_stickiness"]) == 5 and len(k["request_concentration"]) == 5
    # the tables not stored are the ones the mapping gives (stretch, then reshape)
    stretched, _ = stretch_layers(fitted(), 0, 5)
    shaped = reshape.reshape_experts(stretched, 24, 2).knobs
    assert k["layer_transition"] == {"shape": [4, 24, 24], "sha256": knobs_sha256(shaped.layer_transition)}
    assert k["layer_popularity"] == {"shape": [5, 24], "sha256": knobs_sha256(shaped.layer_popularity)}
    assert k["layer_stickiness"] == list(stretched.layer_stickiness)


def test_from_fit_keeps_the_opening_while_every_prompt_holds_it(fit_file, tmp_path):
    out = tmp_path / "p.npz"
    res = run_module("traces", "synth", "--from-fit", fit_file, "--prompt-len", "2,6", "--out", out)
    assert res.returncode == 0, res.stderr
    t = load_trace(out)
    assert (t.num_experts, t.top_k, t.num_layers) == (16, 4, 3)  # the fitted shape by default
    assert "2 of the 2" not in t.meta.extra["from_fit"]["prefix"]
    assert t.meta.extra["from_fit"]["prefix"] == "2 fitted opening positions kept (every prompt holds them)"
    assert t.meta.extra["knobs"]["prefix_popularity"]["shape"] == [2, 3, 16]
    res = run_module("traces", "synth", "--from-fit", fit_file, "--prompt-len", "1,6", "--out", tmp_path / "q.npz")
    assert res.returncode == 0, res.stderr
    assert load_trace(tmp_path / "q.npz").meta.extra["from_fit"]["prefix"].startswith("1 of the 2")


def test_from_fit_reshaped_popularity_shows_in_the_generated_routing(tmp_path):
    """Generated from a 64-expert fit at 128 experts, the routing's popularity skew stays that of the fit."""
    knobs = fitted(e=64, k=4, layers=2, prefix=0, requests=200)
    src = generate(knobs, 1)
    shaped = reshape.reshape_experts(knobs, 128, 4).knobs
    out = generate(shaped, 1)
    assert stats.popularity_skew(out)[0] == pytest.approx(stats.popularity_skew(src)[0], abs=0.03)


def _one_line_exit_2(res, *words):
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: ")
    for w in words:
        assert w in res.stderr


def test_from_fit_on_a_trace_without_fitted_knobs_exits_2_naming_the_file(tmp_path, fit_file):
    plain = tmp_path / "plain.npz"
    save_trace(generate(SynthKnobs(num_experts=8, top_k=2, decoder_layers=2, requests=3), 0), plain)
    _one_line_exit_2(
        run_module("traces", "synth", "--from-fit", plain, "--out", tmp_path / "x.npz"), str(plain), "no fitted knobs"
    )
    made = tmp_path / "made.npz"
    assert run_module("traces", "synth", "--from-fit", fit_file, *ARGS, "--out", made).returncode == 0
    _one_line_exit_2(
        run_module("traces", "synth", "--from-fit", made, "--out", tmp_path / "y.npz"), str(made), "digest"
    )


@pytest.mark.parametrize(
    "args, words",
    [
        (["--skew", "1"], "--skew"),
        (["--tokens", "100"], "--tokens"),
        (["--no-holdout"], "--no-holdout"),
        (["--fit", "x.npz"], "--fit"),
        (["--experts", "4", "--top-k", "8"], "--top-k"),
    ],
)
def test_from_fit_bad_arguments_exit_2(fit_file, tmp_path, args, words):
    _one_line_exit_2(run_module("traces", "synth", "--from-fit", fit_file, "--out", tmp_path / "x.npz", *args), words)


def test_bundled_from_fit_traces_name_their_fit_and_keep_within_the_size():
    """The bundled traces made by --from-fit: small, and their metadata say what they were fitted to."""
    data = ROOT / "traces" / "data"
    found = 0
    for path in sorted(data.glob("synth_*.npz")):
        with zipfile.ZipFile(path) as zf:
            extra = json.loads(zf.read("meta.json"))["extra"]
        if "from_fit" not in extra:
            continue
        found += 1
        assert path.stat().st_size < 2_000_000
        assert extra["fitted_to"]["model"] == "qwen3.5-35b-a3b" and len(extra["from_fit"]["sha256"]) == 64
        assert isinstance(extra["knobs"]["layer_transition"], dict)
    if not found:
        pytest.skip("no bundled trace made by --from-fit yet")
