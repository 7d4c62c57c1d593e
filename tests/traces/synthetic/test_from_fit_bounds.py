"""`traces synth --from-fit` (traces/synthetic/reshape.py, fit.py) with an untrusted fitted trace and any shape asked of
it: every size (experts, top-k, layers, requests, the fitted tables a shape would build) is checked before anything is
stretched, reshaped or drawn; every fitted knob of the wrong type or value is refused with one line naming the file and
the knob; the names copied from the fitted trace follow the model-name rule. The stretching and reshaping are watched,
to fail the test when asked for a shape beyond the bounds."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import traces.synthetic.fit as fitting
import traces.synthetic.generator as gen
import traces.synthetic.reshape as reshape
from tests.support.cli import run_traces
from tests.support.fuzz import PLAIN_NAME_CHARS, fuzz_settings, names_near_the_rule
from traces.importers.ktparquet import MAX_LAYERS
from traces.io import load_trace, save_trace
from traces.synthetic.generator import SynthKnobs, generate

HYP = fuzz_settings(40)
#: The table bound the size tests run under (small, so that a shape within it is quick to build).
SMALL_CELLS = 1 << 16


def fitted_knobs(e=8, k=2, layers=3) -> SynthKnobs:
    rng = np.random.default_rng(0)
    r = lambda a: tuple(float(x) for x in np.round(a, 6))  # noqa: E731
    return SynthKnobs(
        model="tiny-fit",
        num_experts=e,
        top_k=k,
        decoder_layers=layers,
        requests=3,
        prompt_len=(2, 3),
        decode_len=(2, 4),
        correlation=0.0,
        layer_popularity=tuple(r(w) for w in np.maximum(rng.dirichlet(np.ones(e), size=layers), 1e-6)),
        layer_stickiness=r(rng.uniform(0.1, 0.5, layers)),
        request_concentration=r(rng.uniform(1, 50, layers)),
        prefix_popularity=(tuple(r(w) for w in rng.dirichlet(np.ones(e), size=layers)),),
        layer_transition=tuple(tuple(r(row) for row in rng.uniform(0.2, 3, (e, e))) for _ in range(layers - 1)),
        transition_power=1.5,
    )


@pytest.fixture(scope="module")
def fit_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fit") / "fit.npz"
    save_trace(generate(fitted_knobs(), 0, extra={"fitted_to": {"file": "real.npz"}}, dataset="test"), path)
    return path.read_bytes()


def with_meta(data: bytes, change) -> bytes:
    """The trace file ``data`` with ``change(meta)`` applied to its meta.json."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            body = src.read(info)
            if info.filename == "meta.json":
                meta = json.loads(body)
                change(meta)
                body = json.dumps(meta).encode()
            dst.writestr(info, body)
    return out.getvalue()


def synth(tmp_path: Path, fit: Path, *args) -> tuple[int, str, Path]:
    out = tmp_path / "out.npz"
    out.unlink(missing_ok=True)  # the examples share tmp_path
    code, _, err, _ = run_traces(
        "synth", "--from-fit", fit, "--requests", 2, "--prompt-len", "1,2", "--decode-len", "1,2", *args, "--out", out
    )
    if code:
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) <= 600, err
        assert not out.exists()
        return code, lines[0], out
    return code, "", out


# ------------------------------------------------------------------------------------------------ sizes
@pytest.fixture
def watched(monkeypatch):
    """The table bound made small, and stretching and reshaping made to fail the test when asked beyond it."""
    monkeypatch.setattr(gen, "MAX_TABLE_CELLS", SMALL_CELLS)
    real_stretch, real_reshape = fitting.stretch_layers, reshape.reshape_experts

    def cells(layers, experts):  # lifts between consecutive layers, popularity and one opening position per layer
        return (layers - 1) * experts * experts + 2 * layers * experts

    def stretch(knobs, enc, dec):
        assert 1 <= enc + dec <= MAX_LAYERS and cells(enc + dec, knobs.num_experts) <= SMALL_CELLS
        return real_stretch(knobs, enc, dec)

    def reshape_to(knobs, experts, top_k):
        layers = knobs.encoder_layers + knobs.decoder_layers
        assert 1 <= experts <= 32767 and cells(layers, experts) <= SMALL_CELLS
        return real_reshape(knobs, experts, top_k)

    monkeypatch.setattr(fitting, "stretch_layers", stretch)
    monkeypatch.setattr(reshape, "reshape_experts", reshape_to)


@HYP
@given(
    experts=st.one_of(st.integers(1, 64), st.integers(1, 64), st.sampled_from([-2, 0, 32767, 32768, 1 << 40])),
    top_k=st.one_of(st.integers(1, 4), st.integers(1, 4), st.sampled_from([-1, 0, 1 << 40])),
    layers=st.one_of(st.integers(1, 12), st.integers(1, 12), st.sampled_from([-1, 0, 4096, 4097, 1 << 40])),
    requests=st.sampled_from([1, 2, 3, (1 << 20) + 1, 1 << 40]),
)
def test_any_asked_shape_is_checked_before_anything_is_built(
    tmp_path, fit_bytes, watched, experts, top_k, layers, requests
):
    fit = tmp_path / "fit.npz"
    fit.write_bytes(fit_bytes)
    args = ("--experts", experts, "--top-k", top_k, "--layers", layers, "--requests", requests)
    code, line, out = synth(tmp_path, fit, *args)
    event("refused" if code else "generated")
    if code:
        return
    t = load_trace(out)
    assert (t.num_experts, t.top_k, t.num_layers, t.num_requests) == (experts, top_k, layers, requests)
    assert 1 <= top_k <= experts and (layers - 1) * experts * experts <= SMALL_CELLS


def test_the_defects_huge_shapes_are_one_line_at_once(tmp_path, fit_bytes):
    """29 TiB asked by --experts/--layers, a hang for 2^40 layers: now refused before anything is built."""
    fit = tmp_path / "fit.npz"
    fit.write_bytes(fit_bytes)
    for args, word in (
        (("--experts", 32767, "--layers", 4096), "tables"),
        (("--layers", 1 << 40), "--decoder-layers"),
        (("--experts", 1 << 40), "--experts"),
        (("--requests", 1 << 40), "--requests"),
    ):
        _, line, _ = synth(tmp_path, fit, *args)
        assert word in line, line


# ------------------------------------------------------------------------------------------------ fitted knobs
KNOB_VALUES = st.one_of(
    st.integers(-3, 10),
    st.sampled_from([1.5, 2.5, 0.0, -1.0, 1e300, "5", "", True, False, None, [], [1], [1, 2], [1.5, 2], {"a": 1}]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(-2, 5), max_size=3),
)
#: What each core knob must be: ints, pairs of ints, finite numbers, a name.
KIND = {
    "num_experts": "int",
    "top_k": "int",
    "decoder_layers": "int",
    "encoder_layers": "int",
    "requests": "int",
    "prompt_len": "pair",
    "decode_len": "pair",
    "skew": "number",
    "stickiness": "number",
    "correlation": "number",
    "transition_power": "number",
    "model": "name",
}


def right_type(kind: str, v) -> bool:
    if kind == "int":
        return type(v) is int
    if kind == "pair":
        return isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)
    if kind == "number":
        return type(v) in (int, float)
    return isinstance(v, str)


@HYP
@given(knob=st.sampled_from(sorted(KIND)), value=KNOB_VALUES)
def test_a_fitted_knob_of_any_type_or_value_is_used_or_named_in_one_line(tmp_path, fit_bytes, knob, value):
    """top_k 1.5, requests 2.5, a NaN length, model 5, a string where a number belongs: one line naming the file
    and the knob, never a traceback."""

    def change(meta):
        meta["extra"]["knobs"][knob] = value

    fit = tmp_path / "fit.npz"
    fit.write_bytes(with_meta(fit_bytes, change))
    code, line, out = synth(tmp_path, fit)
    event("refused" if code else "generated")
    if code:
        assert str(fit) in line, line
        if not right_type(KIND[knob], value):
            assert f"knobs.{knob}" in line, line
        return
    assert right_type(KIND[knob], value), (knob, value)
    load_trace(out).validate()


def test_non_finite_lengths_and_tables_are_named(tmp_path, fit_bytes):
    for knob, value in (("decode_len", [float("nan"), 3]), ("layer_stickiness", ["x", 0.1, 0.2])):

        def change(meta, knob=knob, value=value):
            meta["extra"]["knobs"][knob] = value

        fit = tmp_path / "fit.npz"
        fit.write_bytes(with_meta(fit_bytes, change))
        code, line, _ = synth(tmp_path, fit)
        if code == 2 and "meta" in line and knob not in line:
            continue  # the trace reader refused the file itself (NaN in its metadata)
        assert code == 2 and f"knobs.{knob}" in line and str(fit) in line, line


@HYP
@given(
    name=names_near_the_rule(["../../", "/", "\n", "\x1b", " ", "..", "\u2028"]),
    given_model=st.booleans(),
)
def test_the_fitted_model_name_follows_the_model_name_rule(tmp_path, fit_bytes, name, given_model):
    """A fitted trace's knobs.model is copied into the output unless --model is given: it must be a model name
    either way (one '/' after an organisation is one)."""

    def change(meta):
        meta["extra"]["knobs"]["model"] = name

    fit = tmp_path / "fit.npz"
    fit.write_bytes(with_meta(fit_bytes, change))
    code, line, out = synth(tmp_path, fit, *(("--model", "other-model") if given_model else ()))
    parts = name.split("/")
    plain = (
        len(parts) <= 2
        and all(p and p[0].isalnum() and p.isascii() and all(c in PLAIN_NAME_CHARS for c in p) for p in parts)
        and ".." not in name
    )
    if not plain:
        assert code == 2 and "knobs.model" in line and str(fit) in line, line
        return
    assert code == 0, line
    assert load_trace(out).meta.model.name == ("other-model" if given_model else name)
