"""The trace format: round trips, determinism, atomic writes, and every kind of bad file."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moebase.errors import OutputError, TraceError
from tests.support.paths import ROOT
from tests.support.traces import make_trace
from traces.io import load_trace, save_trace, trace_bytes


@st.composite
def traces(draw):
    experts = draw(st.integers(1, 40))
    k = draw(st.integers(1, min(4, experts)))
    layers = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(0, 12), min_size=1, max_size=5))
    tokens = sum(lengths)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    e = np.argsort(rng.random((tokens, layers, experts)), axis=2)[:, :, :k].astype(np.int16)
    e[rng.random((tokens, layers)) < 0.2] = -1  # some tokens without routing in some layers
    prefill = [int(rng.integers(0, n + 1)) for n in lengths]
    roles = [draw(st.sampled_from(["encoder", "decoder"])) for _ in range(layers)]
    weights = rng.random(e.shape).astype(np.float16) if draw(st.booleans()) else None
    return make_trace(
        e, lengths, prefill, experts, roles, weights, kind=draw(st.sampled_from(["synthetic", "recorded", "imported"]))
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(traces())
def test_round_trip_keeps_every_array_and_field(tmp_path, trace):
    path = tmp_path / "t.npz"
    save_trace(trace, path)
    back = load_trace(path)
    assert np.array_equal(back.experts, trace.experts) and back.experts.dtype == np.int16
    assert np.array_equal(back.request_offsets, trace.request_offsets)
    assert np.array_equal(back.prefill_lengths, trace.prefill_lengths)
    assert (back.weights is None) == (trace.weights is None)
    if trace.weights is not None:
        assert np.array_equal(back.weights, trace.weights)
    assert back.meta == trace.meta
    assert trace_bytes(back) == path.read_bytes()  # deterministic: same trace, same bytes


def test_writing_is_atomic_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "t.npz"
    good = make_trace([[0], [1], [2]])
    save_trace(good, path)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OutputError, match=r"t\.npz: cannot be written \(disk full\); nothing was written"):
        save_trace(make_trace([[3], [4]]), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.npz"]  # no temporary file left behind


def test_invalid_trace_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "t.npz"
    bad = make_trace([[0], [1]], num_experts=2)
    bad.experts[0, 0, 0] = 5
    with pytest.raises(TraceError, match="outside"):
        save_trace(bad, path)
    assert not path.exists()


def _rewrite(path, tmp_path, *, drop=None, add=None, replace=None):
    """Copy a trace file with entries dropped, added or replaced (raw bytes or arrays)."""
    out = tmp_path / "edited.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            if name == drop:
                continue
            data = src.read(name)
            if replace and name in replace:
                data = replace[name]
            dst.writestr(name, data)
        for name, data in (add or {}).items():
            dst.writestr(name, data)
    return out


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


@pytest.fixture
def good_file(tmp_path):
    t = make_trace(
        [[[0, 1], [2, 3]], [[1, 2], [3, 0]], [[2, 3], [0, 1]]], lengths=[1, 2], prefill=[1, 0], num_experts=4
    )
    return save_trace(t, tmp_path / "good.npz")


def _meta(path):
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read("meta.json"))


BAD_CASES = {
    "experts wrong dtype": (lambda p: {"replace": {"experts.npy": _npy(np.zeros((3, 2, 2), np.int32))}}, "int16"),
    "experts wrong rank": (lambda p: {"replace": {"experts.npy": _npy(np.zeros((3, 4), np.int16))}}, "experts"),
    "layers mismatch": (lambda p: {"replace": {"experts.npy": _npy(np.zeros((3, 3, 2), np.int16))}}, "layers"),
    "top_k mismatch": (lambda p: {"replace": {"experts.npy": _npy(np.zeros((3, 2, 1), np.int16))}}, "top_k"),
    "id too large": (lambda p: {"replace": {"experts.npy": _npy(np.full((3, 2, 2), 4, np.int16))}}, "outside"),
    "id below -1": (lambda p: {"replace": {"experts.npy": _npy(np.full((3, 2, 2), -2, np.int16))}}, "outside"),
    "repeated expert": (lambda p: {"replace": {"experts.npy": _npy(np.ones((3, 2, 2), np.int16))}}, "repeats"),
    "offsets wrong end": (lambda p: {"replace": {"request_offsets.npy": _npy(np.array([0, 1, 5]))}}, "token count"),
    "offsets decreasing": (
        lambda p: {"replace": {"request_offsets.npy": _npy(np.array([0, 2, 1, 3]))}},
        "prefill_lengths|non-decreasing",
    ),
    "prefill too long": (lambda p: {"replace": {"prefill_lengths.npy": _npy(np.array([2, 0]))}}, "prefill"),
    "prefill wrong dtype": (
        lambda p: {"replace": {"prefill_lengths.npy": _npy(np.array([1, 0], np.int32))}},
        "prefill_lengths",
    ),
    "weights wrong shape": (lambda p: {"add": {"weights.npy": _npy(np.zeros((3, 2), np.float16))}}, "weights"),
    "weights not finite": (lambda p: {"add": {"weights.npy": _npy(np.full((3, 2, 2), np.inf, np.float16))}}, "finite"),
    "pickled object array": (
        lambda p: {"replace": {"experts.npy": _npy(np.array([None, 1], dtype=object))}},
        "plain numeric",
    ),
    "missing experts": (lambda p: {"drop": "experts.npy"}, "experts.npy"),
    "missing metadata": (lambda p: {"drop": "meta.json"}, "meta.json"),
    "unknown entry": (lambda p: {"add": {"extra.npy": _npy(np.zeros(1))}}, "unknown entry"),
    "metadata not json": (lambda p: {"replace": {"meta.json": b"{not json"}}, "JSON"),
    "experts big-endian": (lambda p: {"replace": {"experts.npy": _npy(np.zeros((3, 2, 2), ">i2"))}}, "int16"),
    "experts complex": (
        lambda p: {"replace": {"experts.npy": _npy(np.zeros((3, 2, 2), np.complex64))}},
        "plain numeric",
    ),
    "experts structured": (
        lambda p: {"replace": {"experts.npy": _npy(np.zeros(3, [("a", "<i2"), ("b", "<i2")]))}},
        "plain numeric",
    ),
    "experts 4-D": (lambda p: {"replace": {"experts.npy": _npy(np.zeros((3, 2, 2, 1), np.int16))}}, "dimensions"),
    "weights NaN": (lambda p: {"add": {"weights.npy": _npy(np.full((3, 2, 2), np.nan, np.float16))}}, "finite"),
    "npy header claims 2**45 tokens": (
        lambda p: {"replace": {"experts.npy": _npy_header((2**45, 2, 2)) + bytes(24)}},
        "claims",
    ),
    "npy header negative shape": (lambda p: {"replace": {"experts.npy": _npy_header((-3, 2, 2))}}, "shape"),
    "npy header garbled": (lambda p: {"replace": {"experts.npy": _garbled_header()}}, "bad npy header"),
    "npy header truncated": (
        lambda p: {"replace": {"experts.npy": _npy(np.zeros((3, 2, 2), np.int16))[:40]}},
        "bad npy header|truncated",
    ),
    "npy data truncated": (lambda p: {"replace": {"experts.npy": _npy(np.zeros((3, 2, 2), np.int16))[:-2]}}, "claims"),
    "metadata not UTF-8": (lambda p: {"replace": {"meta.json": b'{"seed": "\xff"}'}}, "UTF-8"),
    "metadata nested 100000 deep": (
        lambda p: {"replace": {"meta.json": b"[" * 100_000 + b"]" * 100_000}},
        "too deeply",
    ),
    "metadata nested 65 deep": (lambda p: {"replace": {"meta.json": b"[" * 65 + b"]" * 65}}, "too deeply"),
    "metadata integer of 5000 digits": (
        lambda p: {"replace": {"meta.json": b'{"seed": ' + b"9" * 5000 + b"}"}},
        "JSON",
    ),
}


def _npy_header(shape, descr="<i2") -> bytes:
    """Just an npy header (no data) claiming ``shape``."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _garbled_header() -> bytes:
    """An npy header numpy's parser chokes on (SyntaxError, then tokenize.TokenError in its Python 2 fallback)."""
    text = b"{'descr': '<i2', 'fortran_order': False, 'shape': (3, 2, 2]), }\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + bytes(24)


def _meta_edit(fn):
    def make(path):
        m = _meta(path)
        fn(m)
        return {"replace": {"meta.json": json.dumps(m).encode()}}

    return make


BAD_META = {
    "missing model": (_meta_edit(lambda m: m.pop("model")), "missing model"),
    "missing seed": (_meta_edit(lambda m: m.pop("seed")), "missing seed"),
    "unknown top-level key": (_meta_edit(lambda m: m.update(colour="red")), "unknown key"),
    "unknown model key": (_meta_edit(lambda m: m["model"].update(vocab=5)), "model has unknown"),
    "bad version": (_meta_edit(lambda m: m.update(format_version=99)), "format_version"),
    "bad role": (_meta_edit(lambda m: m["model"]["layers"][0].update(role="middle")), "role"),
    "top_k above experts": (_meta_edit(lambda m: m["model"].update(top_k=9)), "top_k"),
    "bad provenance kind": (_meta_edit(lambda m: m["provenance"].update(kind="dreamed")), "provenance.kind"),
    "recorded without date": (
        _meta_edit(lambda m: m["provenance"].update(kind="recorded", date=None)),
        "provenance.date",
    ),
    "bad date": (_meta_edit(lambda m: m["provenance"].update(kind="imported", date="yesterday")), "ISO-8601"),
    "request_ids wrong count": (_meta_edit(lambda m: m.update(request_ids=["a"])), "request_ids"),
    "format_version true": (_meta_edit(lambda m: m.update(format_version=True)), "format_version"),
    "format_version 1.0": (_meta_edit(lambda m: m.update(format_version=1.0)), "format_version"),
    "num_experts 10**30": (_meta_edit(lambda m: m["model"].update(num_experts=10**30)), "num_experts"),
    "num_experts true": (_meta_edit(lambda m: m["model"].update(num_experts=True)), "num_experts"),
    "seed 2**64": (_meta_edit(lambda m: m.update(seed=2**64)), "seed"),
    "negative layer index": (_meta_edit(lambda m: m["model"]["layers"][0].update(index=-1)), "index"),
    "request_info int beyond 64 bits": (
        _meta_edit(lambda m: m.update(request_info={"n": [1, 10**30]})),
        "request_info.n",
    ),
    "5-million-character kind": (_meta_edit(lambda m: m["provenance"].update(kind="k" * 5_000_000)), "provenance.kind"),
    "multi-line unknown key": (_meta_edit(lambda m: m.update({"a\nb" * 1000: 1})), "unknown key"),
    "lone surrogate": (_meta_edit(lambda m: m["model"].update(name="\ud800")), "not valid Unicode"),
}


@pytest.mark.parametrize("case", sorted({**BAD_CASES, **BAD_META}))
def test_each_bad_file_is_rejected_with_its_problem_named(good_file, tmp_path, case):
    edit, expected = {**BAD_CASES, **BAD_META}[case]
    bad = _rewrite(good_file, tmp_path, **edit(good_file))
    with pytest.raises(TraceError) as info:
        load_trace(bad)
    msg = str(info.value)
    assert msg.startswith(str(bad)) and len(msg.splitlines()) == 1 and len(msg) <= 500, msg[:1000]
    assert any(word in msg for word in expected.split("|")), msg


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 0.999), flips=st.lists(st.tuples(st.floats(0, 0.999), st.integers(1, 255)), max_size=4))
def test_truncated_or_corrupted_files_never_load_silently_wrong(good_file, tmp_path, cut, flips):
    """Any truncation fails with TraceError; byte flips either fail with TraceError or (where the flip lands
    in zip padding or leaves every value valid) load a trace that still passes validation."""
    data = bytearray(good_file.read_bytes())
    for pos, x in flips:
        data[int(pos * len(data))] ^= x
    if cut < 0.98 or not flips:
        data = data[: int(cut * len(data))]
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(data))
    try:
        trace = load_trace(bad)
    except TraceError as exc:
        assert str(exc).startswith(str(bad)) and "\n" not in str(exc)
    else:
        trace.validate()


def test_trace_error_is_one_bounded_line():
    """Whatever a problem echoes (line breaks, escape codes, megabytes), the error is one line of <= 502 chars."""
    from moebase.errors import brief

    exc = TraceError("/data/t.npz", "bad value " + brief("x" * 5_000_000) + " and\nmore\r\n\x1b[31m" * 10_000)
    text = str(exc)
    assert text.startswith("/data/t.npz: bad value 'xxx") and len(text.splitlines()) == 1 and len(text) <= 502
    assert "\x1b" not in text and exc.path == "/data/t.npz"
    assert len(brief([[[[[[1]]]]]] * 10**5)) <= 80 and brief(True) == "True"


def test_not_a_trace_and_missing_file(tmp_path):
    text = tmp_path / "notes.npz"
    text.write_text("hello")
    with pytest.raises(TraceError, match="not a trace file"):
        load_trace(text)
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "absent.npz")
    with pytest.raises(TraceError, match="folder"):
        load_trace(tmp_path)


def test_validate_command_exit_codes(good_file, tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "traces", "validate", *map(str, args)], cwd=ROOT, capture_output=True, text=True
        )

    ok = run(good_file)
    assert ok.returncode == 0 and "ok" in ok.stdout
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"PK\x03\x04 truncated")
    bad = run(good_file, junk)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and str(junk) in bad.stderr


def test_trace_helpers_tell_prefill_from_decode():
    t = make_trace([[0], [1], [2], [3], [4]], lengths=[3, 2], prefill=[2, 0])
    assert t.request_index().tolist() == [0, 0, 0, 1, 1]
    assert t.position_in_request().tolist() == [0, 1, 2, 0, 1]
    assert t.decode_mask().tolist() == [False, False, True, True, True]


# ------------------------------------------------------------------------------------------ one_line
def test_one_line_joins_every_kind_of_line_break_and_whitespace_run_into_one_space():
    from moebase.errors import one_line

    text = "  a\r\nb\n\nc\rd\te\x0bf\x0cg\x1ch\x85i\u2028j\u2029k\xa0l   m \t "
    assert one_line(text, 100) == "a b c d e f g h i j k l m"


def test_one_line_escapes_control_characters_instead_of_passing_them_to_a_terminal():
    from moebase.errors import one_line

    assert one_line("red \x1b[31mX\x00 \x7f \ud800", 100) == "red \\x1b[31mX\\x00 \\x7f \\ud800"
    assert one_line("caf\xe9 \u6f22", 100) == "caf\xe9 \u6f22"  # printable non-ASCII is kept as it is


def test_one_line_cuts_to_the_limit_with_an_ellipsis():
    from moebase.errors import one_line

    assert one_line("x" * 10, 10) == "x" * 10
    assert one_line("x" * 11, 10) == "x" * 7 + "..."
    assert one_line("\x1b" * 10, 10) == "\\x1b\\x1..."  # escapes count toward the limit
    assert [one_line("abcdef", n) for n in (0, 1, 2, 3, 4)] == ["", ".", "..", "...", "a..."]
    assert one_line("x", -5) == ""
    # the input beyond 4 x limit is never read, and the result says something was dropped
    assert one_line("a" + " " * 1000 + "b", 10) == "a..."
    assert one_line(12345, 3) == "..." and one_line(None) == "None"


@settings(max_examples=300, deadline=None)
@given(st.text(), st.integers(min_value=0, max_value=300))
def test_one_line_is_one_bounded_printable_line(text, limit):
    from moebase.errors import one_line

    line = one_line(text, limit)
    assert len(line) <= limit and line.isprintable() and len(line.splitlines()) <= 1
    assert "  " not in line and line == line.strip()
    words = " ".join(text.split())
    if len(text) <= limit and words.isprintable():
        assert line == words  # a short printable text only loses its extra whitespace
    assert one_line(line, limit) == line  # applying it twice changes nothing


def test_config_errors_are_input_errors_of_one_line():
    import moebase.errors
    from moebase.errors import ConfigError

    assert issubclass(ConfigError, moebase.errors.InputError)
    exc = ConfigError("workload.\tbatch_size\n", "must be\r\nan integer \x1b[1m" + "!" * 1000)
    assert exc.field == "workload. batch_size"
    assert (
        exc.problem.startswith("must be an integer \\x1b[1m!")
        and len(exc.problem) == moebase.errors.CONFIG_PROBLEM_CHARS
    )
    assert str(moebase.errors.InputError("a\tb\n\nc")) == "a b c"


@settings(max_examples=60, deadline=None)
@given(
    k=st.sampled_from([1, 2, 3, 8, 9, 12]),
    seed=st.integers(0, 10**6),
    repeats=st.integers(0, 3),
)
def test_validate_names_the_first_token_and_layer_that_repeats_an_expert(k, seed, repeats):
    """Both ways of finding a repeat (column pairs up to top-8, sorting above) name the first (token, layer) in row
    order whose top-k holds an id twice; -1 (no expert) may repeat."""
    from traces.format import _repeated_ids

    rng = np.random.default_rng(seed)
    e = np.argsort(rng.random((6, 3, 16)), axis=2)[:, :, :k].astype(np.int16)
    e[rng.random(e.shape) < 0.2] = -1
    for _ in range(repeats if k > 1 else 0):
        t, layer = rng.integers(6), rng.integers(3)
        i, j = rng.choice(k, size=2, replace=False)
        e[t, layer, j] = e[t, layer, i]
    expected = next(
        (
            (t, layer)
            for t in range(6)
            for layer in range(3)
            if len([x for x in e[t, layer] if x >= 0]) != len({x for x in e[t, layer] if x >= 0})
        ),
        None,
    )
    assert _repeated_ids(e) == expected
