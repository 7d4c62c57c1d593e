"""Fuzzing the trace reader: a mutated trace file either loads (and passes validation) or fails with ONE bounded
line naming the file (an InputError, exit status 2 on the command line), never another exception, a hang or an
unbounded allocation.

The importers get the same property (at the end): any expert-arrays archive (random dtypes, shapes, probs,
offsets and requests.json values) or ft-log text (ASCII, signed, underscored and non-ASCII digits, long lines) either
becomes a trace that loads and holds exactly the input's rows, or is refused with one line.

Mutations start from one small valid trace: random byte edits of the whole file; entries rewritten with garbled
bytes, mutated npy headers or zip fields (flags, compression method, sizes, names); and meta.json with a field
replaced by a hostile value (wrong type, bool for int, huge or negative number, long or invalid string, deep
nesting), removed, or joined by an unknown key. Examples are derandomized (the same ones on every run);
TRACE_FUZZ_EXAMPLES=5000 explores more locally.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import itertools
import json
import math
import os
import struct
import subprocess
import sys
import threading
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from moebase.errors import InputError
from tests.support.cli import traces_main
from tests.support.paths import ROOT
from tests.support.traces import make_trace, patch_central
from traces.io import load_trace, load_trace_header, trace_bytes

MAX_LINE = 500  # the longest error line a bad trace may give (TraceError: path <= 200, problem <= 300)
FUZZ = settings(
    max_examples=int(os.environ.get("TRACE_FUZZ_EXAMPLES", 150)),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _base_trace():
    """A small valid trace that uses every part of the format: weights, request ids and info, notes."""
    t = make_trace(
        [[[0, 1], [2, 3]], [[1, 2], [3, 0]], [[2, 3], [0, 1]], [[3, 0], [1, 2]]],
        lengths=[1, 3],
        prefill=[1, 1],
        num_experts=4,
        roles=["encoder", "decoder"],
        weights=np.full((4, 2, 2), 0.5, np.float16),
        kind="imported",
    )
    meta = dataclasses.replace(
        t.meta,
        request_ids=("a", "b"),
        extra={"note": "fuzz", "knobs": {"x": [1.5, 2]}},
        request_info={"prompt_len": [3, 7], "dataset": ["gsm8k", None]},
    )
    return dataclasses.replace(t, meta=meta)


GOOD = trace_bytes(_base_trace())
with zipfile.ZipFile(io.BytesIO(GOOD)) as _z:
    MEMBERS = {name: _z.read(name) for name in _z.namelist()}
META = json.loads(MEMBERS["meta.json"])
_counter = itertools.count()


def _zip(members, method=zipfile.ZIP_DEFLATED) -> bytes:
    """A zip of (name, bytes) pairs, in order (duplicates allowed)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as z, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name"
        for name, data in members:
            z.writestr(name, data)
    return buf.getvalue()


def _write(tmp_path, data: bytes):
    """A fresh file per example (readers may cache per path)."""
    path = tmp_path / f"fuzz{next(_counter)}.npz"
    path.write_bytes(data)
    return path


def _one_line(text: str) -> str:
    """The one line of an error message (asserting there is exactly one, of bounded length)."""
    lines = text.strip().splitlines()
    assert len(lines) == 1, text[:2000]
    assert len(lines[0]) <= MAX_LINE + len("error: "), lines[0][:2000]
    return lines[0]


def check_reads_or_refuses(path) -> None:
    """The property: every reader, and the command line, either accepts the file or refuses it with one bounded
    line naming it."""
    for read in (load_trace, load_trace_header):
        try:
            result = read(path)
        except InputError as exc:
            assert _one_line(str(exc)).startswith(str(path))
        else:
            if read is load_trace:
                result.validate()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = traces_main(["validate", str(path)])
    assert code in (0, 2)
    if code == 2:
        assert _one_line(err.getvalue()).startswith(f"error: {path}")


# ------------------------------------------------------------------------------------------- whole-file bytes


@FUZZ
@given(
    edits=st.lists(
        st.tuples(
            st.sampled_from(["flip", "set", "cut", "insert", "delete"]),
            st.floats(0, 1),
            st.binary(min_size=1, max_size=8),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_byte_edits_of_the_file(tmp_path, edits):
    data = bytearray(GOOD)
    for kind, where, payload in edits:
        i = min(int(where * len(data)), max(len(data) - 1, 0))
        if kind == "flip" and data:
            data[i] ^= payload[0] or 1
        elif kind == "set":
            data[i : i + len(payload)] = payload
        elif kind == "cut":
            del data[i:]
        elif kind == "insert":
            data[i:i] = payload
        else:
            del data[i : i + payload[0]]
    check_reads_or_refuses(_write(tmp_path, bytes(data)))


# ------------------------------------------------------------------------------------------- entries and npy headers

ARRAY_NAMES = [n for n in MEMBERS if n.endswith(".npy")]
DESCRS = [
    "<i2",
    ">i2",
    "<i8",
    "<f2",
    "<f8",
    "|b1",
    "<c8",
    "|O",
    "<U3",
    "|V4",
    "<M8[s]",
    [("a", "<i2")],
    ("<i2", (2,)),
    "garbage",
    5,
    None,
]
SHAPES = st.one_of(
    st.tuples(*[st.integers(0, 5)] * 3),
    st.tuples(st.sampled_from([2**45, 2**62, 2**63, -1])),
    st.lists(st.integers(-3, 2**40), max_size=6).map(tuple),
    st.sampled_from([[3, 2, 2], "3", None]),
    st.just((1,) * 70),
)


@st.composite
def npy_headers(draw) -> bytes:
    """An npy header (magic, version, length, text): a mutated dict, or the real one with characters garbled."""
    text = draw(
        st.one_of(
            st.builds(
                lambda d, f, s: f"{{'descr': {d!r}, 'fortran_order': {f!r}, 'shape': {s!r}, }}",
                st.sampled_from(DESCRS),
                st.sampled_from([False, True, 1, "no"]),
                SHAPES,
            ),
            st.builds(
                lambda s, i, junk: s[:i] + junk + s[i:],
                st.just("{'descr': '<i2', 'fortran_order': False, 'shape': (4, 2, 2), }"),
                st.integers(0, 60),
                st.text("(){}[],:'\"\\0123456789-LjeE.<>|#\n\t ", min_size=1, max_size=6),
            ),
            st.text(max_size=40),
        )
    )
    version = draw(st.sampled_from([1, 2, 3, 9]))
    body = text.encode("utf-8", "surrogatepass") + b"\n"
    length = draw(st.one_of(st.just(len(body)), st.integers(0, 2**16 - 1)))
    head = struct.pack("<H", length) if version == 1 else struct.pack("<I", length)
    return b"\x93NUMPY" + bytes([version, 0]) + head + body


@FUZZ
@given(name=st.sampled_from(ARRAY_NAMES), header=npy_headers(), data=st.binary(max_size=64), keep=st.booleans())
def test_mutated_npy_headers(tmp_path, name, header, data, keep):
    """An array entry with a hostile header (garbled text, odd dtypes, huge or negative shapes, Fortran order)
    followed by the real data (after the real 128-byte header) or random bytes."""
    old = MEMBERS[name]
    payload = header + (old[128:] if keep else data)
    members = [(n, payload if n == name else d) for n, d in MEMBERS.items()]
    check_reads_or_refuses(_write(tmp_path, _zip(members)))


@FUZZ
@given(
    name=st.sampled_from(list(MEMBERS)),
    method=st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]),
    flags=st.one_of(st.none(), st.sampled_from([0x1, 0x8, 0x20, 0x40, 0x800, 0xFFFF])),
    zmethod=st.one_of(st.none(), st.sampled_from([1, 9, 12, 14, 93, 99, 0xFFFF])),
    sizes=st.one_of(st.none(), st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))),
    garble=st.one_of(st.none(), st.tuples(st.integers(0, 400), st.binary(min_size=1, max_size=4))),
    names=st.sampled_from(["same", "duplicate", "extra", "tricky", "dropped"]),
)
def test_mutated_zip_entries(tmp_path, name, method, flags, zmethod, sizes, garble, names):
    """Entries with encryption/patch flags, unknown compression methods, lying sizes (zip bombs), garbled bytes,
    duplicate names, path tricks and missing entries."""
    members = list(MEMBERS.items())
    if garble:
        at, junk = garble
        members = [(n, d[:at] + junk + d[at + len(junk) :] if n == name else d) for n, d in members]
    extra = {
        "duplicate": [(name, MEMBERS[name])],
        "extra": [("../experts.npy", b"x"), ("/etc/passwd", b"")],
        "tricky": [("experts.npy\n" + "x" * 5000, b"")],
    }.get(names, [])
    if names == "dropped":
        members = [(n, d) for n, d in members if n != name]
    data = _zip(members + extra, method)
    fields = {}
    if flags is not None:
        fields["flags"] = flags
    if zmethod is not None:
        fields["method"] = zmethod
    if sizes is not None:
        fields["compress_size"], fields["file_size"] = sizes
    check_reads_or_refuses(_write(tmp_path, patch_central(data, name, **fields)))


# ------------------------------------------------------------------------------------------- meta.json


def _paths(value, prefix=()):
    """Every (path to a value) in parsed JSON."""
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, v in items:
        yield from _paths(v, prefix + (key,))


# values json.dumps cannot write, or that must stay raw text: spliced into the dumped text
RAW = {
    "<deep>": "[" * 100_000 + "]" * 100_000,
    "<deep-object>": '{"a":' * 70 + "1" + "}" * 70,
    "<bigint>": "9" * 5000,
    "<nan>": "NaN",
    "<inf>": "-Infinity",
}
HOSTILE = st.one_of(
    st.booleans(),
    st.none(),
    st.integers(),
    st.sampled_from([-1, 0, 2**15, 2**31, 2**63, -(2**63) - 1, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.builds(lambda n, c: c * n, st.integers(1000, 5_000_000), st.sampled_from(["x", "\n", "é", "\ud800", "\x1b"])),
    st.sampled_from(sorted(RAW)),
    st.lists(st.integers(-2, 5), max_size=4),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=3),
    st.integers(1, 200).map(lambda d: json.loads("[" * d + "]" * d)),
)


@st.composite
def meta_texts(draw) -> bytes:
    """meta.json: the valid one with 1 to 3 edits (a value replaced by a hostile one, a key or item removed, an
    unknown key added), or a hostile value in place of the whole object."""
    if draw(st.integers(0, 4)) == 0:
        meta = draw(HOSTILE)
    else:
        meta = copy.deepcopy(META)
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(list(_paths(meta))))
            if not path:
                continue
            parent, key = functools.reduce(lambda v, k: v[k], path[:-1], meta), path[-1]
            op = draw(st.sampled_from(["replace", "delete", "add"]))
            if op == "replace":
                parent[key] = draw(HOSTILE)
            elif op == "delete":
                del parent[key]
            elif isinstance(parent, dict):
                parent[draw(st.sampled_from(["unknown", "", "a\nb" * 500]))] = draw(HOSTILE)
    text = json.dumps(meta)
    for key, raw in RAW.items():
        text = text.replace(json.dumps(key), raw)
    return text.encode()


@FUZZ
@given(meta=meta_texts())
def test_mutated_metadata(tmp_path, meta):
    """meta.json with fields of the wrong type, bools for ints, huge or negative numbers, long, multi-line or
    invalid strings, deep nesting, missing or unknown keys (or not an object at all)."""
    members = [(n, meta if n == "meta.json" else d) for n, d in MEMBERS.items()]
    check_reads_or_refuses(_write(tmp_path, _zip(members)))


def test_the_unmutated_trace_loads(tmp_path):
    path = _write(tmp_path, GOOD)
    check_reads_or_refuses(path)
    assert load_trace(path).meta.request_info["prompt_len"] == [3, 7]


# ------------------------------------------------------------------------------------------- hostile archives


def _with_entry(name, data) -> bytes:
    """The valid trace file with entry ``name`` replaced by ``data``."""
    return _zip([(n, data if n == name else d) for n, d in MEMBERS.items()])


HOSTILE_ARCHIVES = {
    "encrypted entry": (lambda: patch_central(GOOD, "experts.npy", flags=0x1), "encrypted"),
    "unknown compression method": (lambda: patch_central(GOOD, "meta.json", method=99), "compression method 99"),
    "bzip2 entry": (lambda: _zip(MEMBERS.items(), zipfile.ZIP_BZIP2), "compression method 12"),
    "size claim beyond deflate": (
        lambda: patch_central(GOOD, "experts.npy", file_size=2**32 - 1),
        "more than its compression can give",
    ),
    "duplicate entry": (
        lambda: _zip([*MEMBERS.items(), ("experts.npy", MEMBERS["experts.npy"])]),
        "appears more than once",
    ),
    "path trick entry": (lambda: _zip([*MEMBERS.items(), ("../../etc/passwd", b"")]), "unknown entry"),
    "multi-line 60k-character entry name": (lambda: _zip([*MEMBERS.items(), ("x\n" * 30_000, b"")]), "unknown entry"),
    "local and central names differ": (lambda: GOOD.replace(b"meta.json", b"meta.jsoN", 1), "corrupt entry"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_ARCHIVES))
def test_hostile_archives_are_refused_with_one_line(tmp_path, case):
    make, expected = HOSTILE_ARCHIVES[case]
    path = _write(tmp_path, make())
    with pytest.raises(InputError, match=expected) as info:
        load_trace(path)
    assert _one_line(str(info.value)).startswith(str(path))
    check_reads_or_refuses(path)


def test_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path, monkeypatch):
    """An entry of 64 MiB of zeros (64 KiB deflated) over the size limit is refused from its zip header alone."""
    import traces.io

    monkeypatch.setattr(traces.io, "MAX_ARRAY_BYTES", 1 << 20)
    n = 16 << 20
    bomb = _npy_header_for((n, 2, 1)) + bytes(n * 4)
    path = _write(tmp_path, _with_entry("experts.npy", bomb))
    assert path.stat().st_size < 1 << 20
    with pytest.raises(InputError, match="over the limit"):
        load_trace(path)


def _npy_header_for(shape) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<i2", "fortran_order": False, "shape": shape})
    return buf.getvalue()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "/dev/null"])
def test_special_files_are_refused_without_reading(tmp_path, kind):
    """A FIFO would block the reader forever and /dev/zero never ends: only regular files are opened."""
    path = tmp_path / "fifo"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path = Path(kind)
        if not path.exists():
            pytest.skip(f"no {kind} here")
    result = {}
    reader = threading.Thread(target=lambda: result.update(error=_error_of(path)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), f"reading {path} hangs"
    assert "not a regular file" in result["error"]


def _error_of(path) -> str:
    try:
        load_trace(path)
    except InputError as exc:
        return str(exc)
    return "loaded"


def test_valid_variants_still_load(tmp_path):
    """What np.save and zip tools may write and the format allows: stored entries, Fortran order."""
    trace = load_trace(_write(tmp_path, GOOD))
    stored = load_trace(_write(tmp_path, _zip(MEMBERS.items(), zipfile.ZIP_STORED)))
    assert np.array_equal(stored.experts, trace.experts) and stored.meta == trace.meta
    buf = io.BytesIO()
    np.save(buf, np.asfortranarray(trace.experts))
    fortran = load_trace(_write(tmp_path, _with_entry("experts.npy", buf.getvalue())))
    assert np.array_equal(fortran.experts, trace.experts)


# ------------------------------------------------------------------------------------------- the real command lines


def _bad_files(tmp_path):
    """Files the reader used to crash on (meta.json 100,000 levels deep) or answer with a 5 MB "line"."""
    deep = json.dumps({**META, "extra": "<deep>"}).replace('"<deep>"', RAW["<deep>"])
    long_name = json.dumps({**META, "model": {**META["model"], "num_experts": "m" * 5_000_000}})
    return {
        name: _write(tmp_path, _zip([(n, text.encode() if n == "meta.json" else d) for n, d in MEMBERS.items()]))
        for name, text in (("deep", deep), ("long", long_name))
    }


def _cli(*argv):
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_python_m_traces_exits_2_with_one_line(tmp_path):
    files = _bad_files(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    cases = [
        ("stats", tmp_path / "fifo", "not a regular file"),
        ("validate", "/dev/zero", "not a regular file"),
        ("stats", files["long"], "num_experts"),
        ("validate", files["deep"], "too deeply"),
    ]
    for command, path, problem in cases:
        done = _cli("-m", "traces", command, str(path))
        assert done.returncode == 2, done.stderr[-2000:]
        line = _one_line(done.stderr)
        assert line.startswith(f"error: {path}: ") and problem in line, line


def test_python_m_sim_run_exits_2_with_one_line(tmp_path):
    files = _bad_files(tmp_path)
    done = _cli(
        "-m",
        "sim",
        "run",
        "configs/switch_xxl.yaml",
        "--set",
        f"workload.trace={files['long']}",
        "--out",
        str(tmp_path / "out"),
    )
    assert done.returncode == 2, done.stderr[-2000:]
    line = _one_line(done.stderr)
    assert line.startswith("error: workload.trace: ") and "num_experts" in line
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------- the importers
# The same property for the importers: any input either becomes a trace that loads and holds exactly the input's
# rows, or is refused with one bounded line naming the file; never another exception, a warning or a hang.

IMPORT_FUZZ = settings(
    max_examples=int(os.environ.get("IMPORT_FUZZ_EXAMPLES", 80)),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


def _import(*argv) -> tuple[int, str, str]:
    """``python -m traces ARGV`` in-process: (exit status, stdout, stderr); a warning fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning (float16 overflow) would print before the error line
        code = traces_main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _refused_with_one_line(code: int, err: str, path, out: Path) -> None:
    assert code == 2, err[-2000:]
    line = _one_line(err)
    assert line.startswith("error: "), line
    assert str(path) in line or "--" in line, line
    assert not out.exists()


ID_DTYPES = [
    "|i1",
    "<i2",
    "<i4",
    ">i4",
    "<i8",
    "|u1",
    "<u2",
    "<u8",
    "|b1",
    "<f2",
    "<f4",
    "<c8",
    "<m8[s]",
    "<M8[D]",
    "<U2",
    "|S2",
]
PROB_DTYPES = ["<f2", "<f4", "<f8", ">f8", "<i4", "<c8", "<U1"]
PROB_VALUES = st.one_of(
    st.floats(0, 1, width=32),
    st.floats(0, 1, width=32),
    st.sampled_from([0.0, 1.0, float("nan"), float("inf"), 1e5, -7e4, 65504.0, 65520.0, 1e-8, 3e38]),
)
ENTRY_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 10),
    st.sampled_from([2**63, 2**70, -(2**63) - 1, 10**7, 2**21 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.sampled_from(["", "\ud800", "a" * 300]),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
ENTRY_KEYS = st.sampled_from(
    ["dataset", "prompt_len", "n_decode_steps", "has_repetition", "request_id", "note", "", "source_index", "\udfff"]
)


def _cast(values: np.ndarray, dtype: str) -> np.ndarray:
    """Small integers as an array of ``dtype`` (wrapping, truncating or formatting as numpy does)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dtype[1] in "US":
            return values.astype(str).astype(dtype)
        if dtype[1] in "mM":
            return values.astype(np.int64).astype(dtype)
        return values.astype(dtype)


@st.composite
def expert_array_sources(draw):
    """(archive members, requests.json bytes or None, the ids, probs and lengths written (when plain))."""
    plain = draw(st.integers(0, 3)) > 0  # mostly a well-formed source, so that imports also succeed
    tokens, layers, k = draw(st.integers(0, 6)), draw(st.integers(0, 3)), draw(st.integers(0, 3))
    if plain:
        shape = (max(tokens, 1), max(layers, 1), max(k, 1))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        values = np.argsort(rng.random((*shape[:2], 16)), axis=2)[:, :, : shape[2]]
        values[rng.random(shape) < 0.1] = -1
        dtype = draw(st.sampled_from(["|i1", "<i2", "<i8", ">i4", "|u1", "<u8"]))
    else:
        shape = draw(st.one_of(st.just((tokens, layers, k)), st.lists(st.integers(0, 3), max_size=4).map(tuple)))
        values = np.array(
            draw(st.lists(st.integers(-3, 40), min_size=math.prod(shape), max_size=math.prod(shape))), dtype=np.int64
        ).reshape(shape)
        dtype = draw(st.sampled_from(ID_DTYPES))
    ids = _cast(values, dtype)
    members = {"expert_ids.npy": ids}
    probs = None
    if draw(st.booleans()):
        pshape = shape if draw(st.integers(0, 4)) else draw(st.lists(st.integers(0, 3), max_size=3).map(tuple))
        pvals = np.array(
            draw(st.lists(PROB_VALUES, min_size=math.prod(pshape), max_size=math.prod(pshape))), dtype=np.float64
        ).reshape(pshape)
        pdtype = draw(st.sampled_from(PROB_DTYPES))
        probs = _cast(pvals, pdtype) if pdtype[1] in "fc" else _cast(np.nan_to_num(pvals).astype(np.int64), pdtype)
        members["expert_probs.npy"] = probs
    lengths = [shape[0]] if shape else [0]
    if draw(st.booleans()):
        cuts = sorted(draw(st.lists(st.integers(0, lengths[0]), max_size=4)))
        lengths = list(np.diff([0, *cuts, lengths[0]]))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        if draw(st.integers(0, 5)) == 0:  # garbage offsets
            offsets = _cast(
                np.array(draw(st.lists(st.integers(-3, 10), max_size=4)), dtype=np.int64),
                draw(st.sampled_from(["<i8", "<u2", "<f8"])),
            )
        members["request_offsets.npy"] = offsets
    if draw(st.integers(0, 6)) == 0:
        members["extra.npy"] = np.zeros(2)
    rj = None
    if draw(st.booleans()):
        n = draw(st.sampled_from([len(lengths), len(lengths), max(len(lengths) - 1, 0), len(lengths) + 1]))
        entries = [
            draw(st.dictionaries(ENTRY_KEYS, ENTRY_VALUES, max_size=4))
            if draw(st.integers(0, 3)) == 0
            else {"dataset": "d", "prompt_len": draw(st.integers(0, 100))}
            for _ in range(n)
        ]
        for e, rows in zip(entries, lengths):
            if draw(st.booleans()):
                e["n_decode_steps"] = int(rows)
        text = json.dumps(entries)
        if draw(st.integers(0, 8)) == 0:
            text = draw(st.sampled_from(["[" * 5000 + "]" * 5000, "NaN", '[{"a": 1, "a": 2}]', "{", "[1]"]))
        rj = text.encode("utf-8", "surrogatepass")
    return members, rj, ids, probs, lengths


@IMPORT_FUZZ
@given(
    src=expert_array_sources(),
    model=st.sampled_from(["toy", "toy-16", "gpt-oss-20b", "switch-base-8"]),
    num_experts=st.sampled_from([None, 0, 1, 16, 40, 2**15]),
    plain_args=st.booleans(),
)
def test_expert_arrays_import_writes_the_input_or_refuses_with_one_line(tmp_path, src, model, num_experts, plain_args):
    members, rj, ids, probs, lengths = src
    if plain_args:  # half the examples with a model of the user's own and the experts from the data
        model, num_experts = "toy", None
    folder = tmp_path / f"src{next(_counter)}"
    folder.mkdir()
    path = folder / "routing.npz"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, arr in members.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, arr, allow_pickle=False)
            z.writestr(name, member.getvalue())
    path.write_bytes(buf.getvalue())
    if rj is not None:
        (folder / "requests.json").write_bytes(rj)
    out = folder / "out.npz"
    extra = () if num_experts is None else ("--num-experts", num_experts)
    code, _, err = _import("import", "expert-arrays", path, "--model", model, "--out", out, *extra)
    event(f"exit {code}")
    if code != 0:
        _refused_with_one_line(code, err, folder, out)
        return
    trace = load_trace(out)  # what an import writes, the reader takes
    assert np.array_equal(trace.experts, ids.astype(np.int16))  # every row, in order
    assert trace.request_lengths.tolist() == [n for n in lengths if n > 0]  # empty requests dropped
    if probs is not None:
        wide = probs.astype(np.float64)
        wide[ids < 0] = 0
        assert np.array_equal(trace.weights, wide.astype(np.float16))


ALIEN_WORDS = st.one_of(
    st.sampled_from(
        [
            "+5",
            "1_0",
            "-1",
            "--2",
            "5-",
            "-",
            "0x5",
            "1e3",
            "5.0",
            "1,2",
            "12345678901",
            "\u0663",
            "\uff13",
            "\u00b9",
            "\u2164",
            "\u0e53",
            "5\u200b",
            "x",
        ]
    ),
    st.text(st.characters(whitelist_categories=["Nd", "No", "Nl"]), min_size=1, max_size=3),
    st.from_regex(r"[+\-]?[0-9_]{1,12}", fullmatch=True),
)
BLANKS = st.sampled_from([" ", "  ", "\t", " \t "])


@st.composite
def ft_log_texts(draw):
    """(log text, batch, decode steps): a valid one-encoder, one-decoder-layer log (runs of batch x prompt ids
    then one id per request per step), with some words replaced by alien ones, blank lines or whitespace added,
    a line repeated to great length, or a line dropped."""
    runs, batch, prompt, steps = (
        draw(st.integers(1, 2)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        draw(st.integers(0, 2)),
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lines = []
    for _ in range(runs):
        lines.append([str(x) for x in rng.integers(0, 8, batch * prompt)])
        lines.extend([str(x) for x in rng.integers(0, 8, batch)] for _ in range(steps))
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["word", "word", "long", "drop", "blank"]))
        if op == "word" and lines[i]:
            lines[i][draw(st.integers(0, len(lines[i]) - 1))] = draw(ALIEN_WORDS)
        elif op == "long":
            lines[i] = (lines[i] * 800)[:3000]  # past the 2000-byte line limit, and no further
        elif op == "drop" and len(lines) > 1:
            del lines[i]
        elif op == "blank":
            lines.insert(i, [])
    text = "".join(
        ("permuted_experts_" + "".join(sep + w for w in words) + end if words else end.strip("\r")) + "\n"
        for words, sep, end in ((w, draw(BLANKS), draw(st.sampled_from(["", " ", "\r"]))) for w in lines)
    )
    return text, batch, steps


def _reference_ids(text: str) -> list[int] | None:
    """The ids of a log read the strict way (ASCII digits only), or None when some word is not one."""
    ids = []
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        for w in words[1:]:
            if not (w.isascii() and w.isdigit()):
                return None
            ids.append(int(w))
    return ids


@IMPORT_FUZZ
@given(log=ft_log_texts())
def test_ft_log_import_takes_ascii_ids_only_or_refuses_with_one_line(tmp_path, monkeypatch, log):
    import traces.importers.ftlog

    monkeypatch.setattr(traces.importers.ftlog, "MAX_LINE_BYTES", 2000)
    text, batch, steps = log
    path = tmp_path / f"log{next(_counter)}.txt"
    path.write_bytes(text.encode("utf-8"))
    out = tmp_path / f"out{next(_counter)}.npz"
    code, _, err = _import(
        "import",
        "ft-log",
        path,
        "--model",
        "toy-8",
        "--batch",
        batch,
        "--encoder-layers",
        1,
        "--decoder-layers",
        1,
        "--decode-steps",
        steps,
        "--out",
        out,
    )
    expected = _reference_ids(text)
    event(f"exit {code}")
    too_long = any(len(line.encode()) > 2000 for line in text.split("\n"))
    if code != 0:
        _refused_with_one_line(code, err, path, out)
        return
    assert expected is not None and not too_long  # a sign, an underscore or a non-ASCII digit is never read
    trace = load_trace(out)
    routed = trace.experts[trace.experts >= 0]
    assert sorted(routed.tolist()) == sorted(expected)  # exactly the log's ids, each once
