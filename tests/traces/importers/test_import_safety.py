"""The trace importers (traces/importers/cli.py and the formats it registers) and writers as untrusted-input surfaces:
every bad input ends in exit status 2 with ONE bounded line naming the file (and entry, field or line), nothing written,
no RuntimeWarning, no hang.

One class per class of problem: hostile expert-arrays archives and requests.json files, traces that contradict
their model's profile, inputs with nothing to simulate (or absurdly many requests), ft-log numbers that are not
ASCII digits and over-long lines, and what a message may echo (long lists, special files). Most cases run the
command line in-process (``traces.cli.main``); a few run ``python -m traces`` to check the real process.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.cli import run_traces as run
from tests.support.fuzz import fuzz_settings
from tests.support.paths import ROOT
from tests.support.traces import patch_central
from traces.format import MAX_CONTEXT, MAX_REQUESTS
from traces.importers.common import bundled_profiles
from traces.io import load_trace

MAX_LINE = 600  # the longest error line an import may print ("error: " + a bounded message)
HYP = fuzz_settings(40)


# ------------------------------------------------------------------------------------------------ helpers
def refused(result, *words: str, out: Path | None = None) -> str:
    """Assert exit status 2 with one bounded ``error:`` line holding every one of ``words``, no warning, and
    nothing written at ``out`` (nor a temporary file beside it); returns the line."""
    code, _, err, caught = result
    assert code == 2, (code, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    line = lines[0]
    assert line.startswith("error: ") and len(line) <= MAX_LINE, line[:2000]
    for w in words:
        assert w in line, (w, line)
    assert not caught, caught
    if out is not None:
        assert not out.is_file(), out  # missing, or still the folder or FIFO it was
        folder = out.parent if out.parent.is_dir() else None
        if folder is not None:
            assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")], list(folder.iterdir())
    return line


def _is_special(path: Path) -> bool:
    import stat

    return not stat.S_ISREG(os.stat(path).st_mode)


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=True)
    return buf.getvalue()


def npy_header(shape, descr="|i1") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def zip_of(members, method=zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as z:
        for name, data in members:
            z.writestr(name, data)
    return buf.getvalue()


def routing(lengths, layers=2, k=2, experts=8, seed=0):
    """ids int8 (int16 above 128 experts) [T, L, k] (distinct per row), probs float16, offsets int64."""
    rng = np.random.default_rng(seed)
    t = int(sum(lengths))
    ids = np.argsort(rng.random((t, layers, experts)), axis=2)[:, :, :k].astype(np.int8 if experts <= 128 else np.int16)
    probs = rng.random((t, layers, k)).astype(np.float16)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return ids, probs, offsets


def source(folder: Path, lengths=(3, 2), entries=None, **kw) -> Path:
    """routing.npz (and requests.json when ``entries`` is given) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ids, probs, offsets = routing(lengths, **kw)
    path = folder / "routing.npz"
    np.savez(path, expert_ids=ids, expert_probs=probs, request_offsets=offsets)
    if entries is not None:
        (folder / "requests.json").write_text(json.dumps(entries) if not isinstance(entries, str) else entries)
    return path


def arrays_cmd(path, out, *extra, model="toy-8"):
    return ("import", "expert-arrays", path, "--model", model, "--out", out, *extra)


# ------------------------------------------------------------------------------------------------ expert-arrays
HOSTILE_MEMBERS = {
    # name: (members of the archive, words the error line must hold)
    "npy header claiming 9.6 GB": (
        lambda: [("expert_ids.npy", npy_header((100_000_000, 24, 4)) + bytes(64))],
        "claims",
    ),
    "negative shape": (lambda: [("expert_ids.npy", npy_header((-3, 2, 2)))], "shape"),
    "garbled npy header": (
        lambda: [("expert_ids.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': (((\n" + bytes(8))],
        "bad npy header",
    ),
    "npy version 3": (
        lambda: [("expert_ids.npy", b"\x93NUMPY\x03\x00" + npy_bytes(np.zeros((1, 1, 1), np.int8))[8:])],
        "npy",
    ),
    "timedelta ids": (lambda: [("expert_ids.npy", npy_bytes(np.zeros((2, 2, 2), "m8[s]")))], "dtype"),
    "datetime ids": (lambda: [("expert_ids.npy", npy_bytes(np.zeros((2, 2, 2), "M8[s]")))], "dtype"),
    "object ids": (lambda: [("expert_ids.npy", npy_bytes(np.array([[[None]]], dtype=object)))], "dtype"),
    "complex ids": (lambda: [("expert_ids.npy", npy_bytes(np.zeros((2, 2, 2), np.complex64)))], "dtype"),
    "string ids": (lambda: [("expert_ids.npy", npy_bytes(np.zeros((2, 2, 2), "U3")))], "dtype"),
    "bytes ids": (lambda: [("expert_ids.npy", npy_bytes(np.zeros((2, 2, 2), "S3")))], "dtype"),
    "void ids": (lambda: [("expert_ids.npy", npy_bytes(np.zeros((2, 2, 2), "V4")))], "dtype"),
    "structured ids": (lambda: [("expert_ids.npy", npy_bytes(np.zeros(3, [("a", "<i2")])))], "dtype"),
    "bool ids": (lambda: [("expert_ids.npy", npy_bytes(np.zeros((2, 2, 2), bool)))], "integer array"),
    "4-D ids": (lambda: [("expert_ids.npy", npy_bytes(np.zeros((2, 2, 2, 1), np.int8)))], "dimensions"),
    "complex probs": (
        lambda: [
            ("expert_ids.npy", npy_bytes(np.zeros((2, 2, 1), np.int8))),
            ("expert_probs.npy", npy_bytes(np.zeros((2, 2, 1), np.complex128))),
        ],
        "expert_probs",
    ),
    "probs of strings": (
        lambda: [
            ("expert_ids.npy", npy_bytes(np.zeros((2, 2, 1), np.int8))),
            ("expert_probs.npy", npy_bytes(np.zeros((2, 2, 1), "U2"))),
        ],
        "expert_probs",
    ),
    "offsets of floats": (
        lambda: [
            ("expert_ids.npy", npy_bytes(np.zeros((2, 2, 1), np.int8))),
            ("request_offsets.npy", npy_bytes(np.array([0.0, 2.0]))),
        ],
        "request_offsets",
    ),
    "uint64 offsets beyond int64": (
        lambda: [
            ("expert_ids.npy", npy_bytes(np.zeros((2, 2, 1), np.int8))),
            ("request_offsets.npy", npy_bytes(np.array([0, 2**64 - 1, 2], np.uint64))),
        ],
        "request_offsets",
    ),
    "one array twice": (
        lambda: [
            ("expert_ids.npy", npy_bytes(np.zeros((2, 2, 1), np.int8))),
            ("expert_ids", npy_bytes(np.zeros((2, 2, 1), np.int8))),
        ],
        "both hold",
    ),
    "no expert_ids": (lambda: [(f"a{i}.npy", b"") for i in range(40)], "(40 in all)"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_MEMBERS))
def test_hostile_npz_members_exit_2_naming_the_file(tmp_path, case):
    make, words = HOSTILE_MEMBERS[case]
    path = tmp_path / "routing.npz"
    path.write_bytes(zip_of(make()))
    out = tmp_path / "out.npz"
    refused(run(*arrays_cmd(path, out)), str(path), words, out=out)


def _good_npz() -> bytes:
    ids, probs, offsets = routing([3, 2])
    return zip_of(
        [
            ("expert_ids.npy", npy_bytes(ids)),
            ("expert_probs.npy", npy_bytes(probs)),
            ("request_offsets.npy", npy_bytes(offsets)),
        ]
    )


HOSTILE_ZIPS = {
    "encrypted member": (lambda: patch_central(_good_npz(), "expert_ids.npy", flags=0x1), "encrypted"),
    "compression method 99": (lambda: patch_central(_good_npz(), "expert_ids.npy", method=99), "compression method 99"),
    "bzip2 member": (
        lambda: zip_of([("expert_ids.npy", npy_bytes(np.zeros((2, 2, 1), np.int8)))], zipfile.ZIP_BZIP2),
        "compression method 12",
    ),
    "size claim beyond deflate": (
        lambda: patch_central(_good_npz(), "expert_ids.npy", file_size=2**32 - 1),
        "expert_ids.npy",
    ),
    "size claim below the data (CRC)": (
        lambda: patch_central(_good_npz(), "expert_ids.npy", file_size=100),
        "expert_ids.npy",
    ),
    "truncated zip": (lambda: _good_npz()[: len(_good_npz()) // 2], "not a readable .npz archive"),
    "truncated end": (lambda: _good_npz()[:-10], "routing.npz"),
    "not a zip": (lambda: b"hello", "not a readable .npz archive"),
    "a single .npy": (lambda: npy_bytes(np.zeros((2, 2, 1), np.int8)), "a single array"),
    "empty file": (lambda: b"", "not a readable .npz archive"),
    "300 members": (lambda: zip_of([(f"m{i}", b"") for i in range(300)]), "entries"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_ZIPS))
def test_hostile_zip_archives_exit_2_naming_the_file(tmp_path, case):
    make, words = HOSTILE_ZIPS[case]
    path = tmp_path / "routing.npz"
    path.write_bytes(make())
    out = tmp_path / "out.npz"
    refused(run(*arrays_cmd(path, out)), str(path), words, out=out)


def test_a_zip_bomb_is_refused_from_its_header_before_it_is_inflated(tmp_path, monkeypatch):
    import traces.importers.arrays

    monkeypatch.setattr(traces.importers.arrays, "MAX_SOURCE_ARRAY_BYTES", 1 << 20)
    n = 64 << 20  # 64 MiB of zeros: 64 KiB deflated
    path = tmp_path / "routing.npz"
    path.write_bytes(zip_of([("expert_ids.npy", npy_header((n // 8, 2, 4)) + bytes(n))]))
    assert path.stat().st_size < 1 << 20
    out = tmp_path / "out.npz"
    refused(run(*arrays_cmd(path, out)), str(path), "over the limit", out=out)


REQUESTS_JSON = {
    # name: (requests.json text for 2 requests, words)
    "nested 100k deep": ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
    "an entry nested 100k deep": ('[{"a": ' + "[" * 100_000 + "]" * 100_000 + "}, {}]", "nests too deeply"),
    "prompt_len 10 million": (json.dumps([{"prompt_len": 10_000_000}, {}]), "prompt_len"),
    "prompt_len above MAX_CONTEXT": (json.dumps([{"prompt_len": MAX_CONTEXT + 1}, {}]), str(MAX_CONTEXT)),
    "prompt_len negative": (json.dumps([{"prompt_len": -1}, {}]), "prompt_len"),
    "prompt_len float": (json.dumps([{"prompt_len": 5.5}, {}]), "prompt_len"),
    "prompt_len bool": (json.dumps([{"prompt_len": True}, {}]), "prompt_len"),
    "prompt_len string": (json.dumps([{"prompt_len": "5"}, {}]), "prompt_len"),
    "prompt_len 2**70": (json.dumps([{"prompt_len": 2**70}, {}]), "prompt_len"),
    "integer of 5000 digits": ('[{"x": ' + "9" * 5000 + "}, {}]", "not valid JSON"),
    "duplicate key": ('[{"a": 1, "a": 2}, {}]', "duplicate key"),
    "lone surrogate value": ('[{"note": "\\ud800"}, {}]', "not valid Unicode"),
    "lone surrogate key": ('[{"\\udfff": 1}, {}]', "not valid Unicode"),
    "not UTF-8": (b'[{"a": "\xff"}, {}]', "UTF-8"),
    "300 fields": (json.dumps([{f"f{i}": i for i in range(300)}, {}]), "different fields"),
    "not a list": ('{"a": 1}', "JSON list"),
    "wrong count": ("[{}]", "has 1 entries"),
    "dataset empty": (json.dumps([{"dataset": ""}, {}]), "dataset"),
    "n_decode_steps wrong": (json.dumps([{"n_decode_steps": 9}, {}]), "n_decode_steps"),
}


@pytest.mark.parametrize("case", sorted(REQUESTS_JSON))
def test_bad_requests_json_is_named_not_the_output(tmp_path, case):
    text, words = REQUESTS_JSON[case]
    path = source(tmp_path / "src")
    rj = tmp_path / "src" / "requests.json"
    rj.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    out = tmp_path / "out.npz"
    line = refused(run(*arrays_cmd(path, out)), str(rj), words, out=out)
    assert str(out) not in line


def test_fields_the_trace_cannot_hold_are_left_out_and_the_trace_loads(tmp_path):
    """request_info takes plain values only: a field with a list, NaN, an integer beyond 64 bits or an empty name
    is left out (and named), never written into a trace the reader refuses."""
    entries = [
        {"": 1, "big": 2**70, "nan": float("nan"), "list": [1], "ok": "a", "prompt_len": 7},
        {"": 2, "big": 1, "nan": 1.0, "list": [], "ok": "b", "prompt_len": 0},
    ]
    path = source(tmp_path / "src", entries=json.dumps(entries))
    out = tmp_path / "out.npz"
    code, _, err, caught = run(*arrays_cmd(path, out))
    assert code == 0 and not caught, err
    t = load_trace(out)
    assert set(t.meta.request_info) == {"source_index", "ok", "prompt_len"}
    assert sorted(t.meta.extra["request_fields_left_out"]) == ["", "big", "list", "nan"]


def test_float16_overflow_in_probs_is_refused_without_a_runtime_warning(tmp_path):
    ids, probs, offsets = routing([3, 2])
    for big in (1e5, -7e4, 3.4e38):
        wide = probs.astype(np.float32)
        wide[1, 0, 1] = big
        path = tmp_path / "routing.npz"
        np.savez(path, expert_ids=ids, expert_probs=wide, request_offsets=offsets)
        out = tmp_path / "out.npz"
        refused(run(*arrays_cmd(path, out)), str(path), "float16", "row 1", out=out)
    # the real process prints no RuntimeWarning either
    done = subprocess.run(
        [sys.executable, "-W", "default", "-m", "traces", *map(str, arrays_cmd(path, out))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Warning" not in done.stderr, done.stderr


def test_a_huge_weight_where_no_expert_was_chosen_is_ignored(tmp_path):
    ids, probs, offsets = routing([3, 2])
    ids[0, 0, 1] = -1
    wide = probs.astype(np.float64)
    wide[0, 0, 1] = 1e300
    path = tmp_path / "routing.npz"
    np.savez(path, expert_ids=ids, expert_probs=wide, request_offsets=offsets)
    code, _, err, caught = run(*arrays_cmd(path, tmp_path / "out.npz"))
    assert code == 0 and not caught, err
    assert load_trace(tmp_path / "out.npz").weights[0, 0, 1] == 0


BAD_MODELS = [
    "",
    " ",
    "x" * 300,
    "a b",
    "../gpt-oss-20b",
    "x/y/z",
    "ｇｐｔ-oss-20b",
    "gpt\n",
    "/abs",
    "-dash",
    "a\x00b",
]


@pytest.mark.parametrize("model", BAD_MODELS, ids=repr)
def test_bad_model_names_are_refused_before_reading(tmp_path, model):
    out = tmp_path / "out.npz"
    for argv in (
        arrays_cmd(tmp_path / "missing.npz", out, model=model),
        ("import", "ft-log", tmp_path / "missing.txt", "--model", model, "--batch", 1, "--out", out),
        ("import", "vllm", tmp_path / "missing.npy", "--model", model, "--num-experts", 8, "--out", out),
        ("import", "mixtral-jsonl", tmp_path / "missing.jsonl", "--model", model, "--out", out),
        ("synth", "--model", model, "--requests", 1, "--out", out),
    ):
        refused(run(*argv), "--model", out=out)


def test_good_model_names_are_accepted(tmp_path):
    path = source(tmp_path / "src")
    for model in ("toy-8", "org/Toy-Model_v1.5+x", "a"):
        code, _, err, _ = run(*arrays_cmd(path, tmp_path / "out.npz", "--num-experts", 8, model=model))
        assert code == 0, err
        assert load_trace(tmp_path / "out.npz").meta.model.name == model


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
@pytest.mark.parametrize("kind", ["folder", "empty", "fifo", "input itself", "under a file", "link to fifo"])
def test_bad_out_is_refused_before_any_input_is_read(tmp_path, kind):
    path = source(tmp_path / "src")
    before = path.read_bytes()
    out = {
        "folder": tmp_path,
        "empty": "",
        "fifo": tmp_path / "fifo",
        "input itself": path,
        "under a file": path / "x.npz",
        "link to fifo": tmp_path / "link",
    }[kind]
    if kind in ("fifo", "link to fifo"):
        os.mkfifo(tmp_path / "fifo")
    if kind == "link to fifo":
        os.symlink(tmp_path / "fifo", out)
    commands = [
        arrays_cmd(path, out),
        ("import", "vllm", path, "--model", "toy", "--num-experts", 8, "--out", out),
        ("import", "ft-log", path, "--model", "toy-8", "--batch", 1, "--out", out),
    ]
    if kind != "input itself":  # synth has no input (without --fit): replacing a file is what it is asked
        commands.append(("synth", "--requests", 1, "--out", out))
    for argv in commands:
        refused(run(*argv), "--out")
    assert path.read_bytes() == before
    if kind in ("fifo", "link to fifo"):
        assert _is_special(tmp_path / "fifo")


# ------------------------------------------------------------------------------------------------ model profiles
DECODER_ONLY = [(stem, spec) for stem, spec in bundled_profiles() if spec.encoder_moe_layers == 0]


def _profile_source(folder, spec, layers=None, k=None, experts=None):
    layers = spec.decoder_moe_layers if layers is None else layers
    k = spec.top_k if k is None else k
    experts = spec.num_experts if experts is None else experts
    return source(folder, lengths=[2, 1], layers=layers, k=k, experts=max(experts, k))


@pytest.mark.parametrize("stem", [s for s, _ in DECODER_ONLY])
def test_expert_arrays_refuse_a_shape_their_model_profile_would_refuse(tmp_path, stem):
    """Wrong top-k, layer count or expert count for a profiled model: refused at import, naming the profile;
    the right shape: written, and the simulator's own check accepts it."""
    from moebase.model import load_model
    from traces.summary import read_trace_summary, trace_matches_model

    spec = load_model(stem)
    out = tmp_path / "out.npz"
    for i, (layers, k, extra) in enumerate(
        (
            (None, spec.top_k - 1 or 2, ()),
            (spec.decoder_moe_layers - 1, None, ()),
            (None, None, ("--num-experts", spec.num_experts + 1)),
        )
    ):
        path = _profile_source(tmp_path / f"bad{i}", spec, layers, k)
        refused(run(*arrays_cmd(path, out, *extra, model=stem)), str(path), f"configs/models/{stem}.yaml", out=out)
    path = _profile_source(tmp_path / "good", spec)
    code, _, err, _ = run(*arrays_cmd(path, out, model=stem))
    assert code == 0, err
    assert trace_matches_model(read_trace_summary(out), spec)


@HYP
@given(data=st.data())
def test_import_and_run_agree_on_every_shape(tmp_path_factory, data):
    """The class: for any profiled model name (with an organisation prefix or a variant suffix) and any routing
    shape, the import writes the trace exactly when the simulator's check would take it for that model."""
    from traces.summary import read_trace_summary, trace_matches_model

    stem, spec = data.draw(st.sampled_from(DECODER_ONLY))
    name = data.draw(st.sampled_from([stem, f"org/{stem}", f"{stem}-instruct", stem.upper()]))
    layers = data.draw(st.sampled_from(sorted({1, spec.decoder_moe_layers - 1, spec.decoder_moe_layers})))
    k = data.draw(st.sampled_from(sorted({1, spec.top_k, spec.top_k + 1})))
    experts = data.draw(st.sampled_from([None, spec.num_experts, spec.num_experts * 2]))
    folder = tmp_path_factory.mktemp("shape")
    path = source(folder, lengths=[2], layers=max(layers, 1), k=k, experts=max(spec.num_experts, k))
    out = folder / "out.npz"
    extra = () if experts is None else ("--num-experts", experts)
    code, _, err, _ = run(*arrays_cmd(path, out, *extra, model=name))
    fits = (layers, k, experts or spec.num_experts) == (spec.decoder_moe_layers, spec.top_k, spec.num_experts)
    if fits:
        assert code == 0, err
        assert trace_matches_model(read_trace_summary(out), spec)
    else:
        refused((code, "", err, []), "does not match model", out=out)


def _ftlog(path: Path, enc: int, dec: int, steps: int, batch=1, prompt=2, experts=8) -> Path:
    lines = []
    for _ in range(enc):
        lines.append("permuted_experts_ " + " ".join(str(i % experts) for i in range(batch * prompt)))
    for _ in range(steps * dec):
        lines.append("permuted_experts_ " + " ".join(str(i % experts) for i in range(batch)))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_ft_log_and_synth_refuse_a_shape_their_model_profile_would_refuse(tmp_path):
    out = tmp_path / "out.npz"
    bad = _ftlog(tmp_path / "bad.txt", 3, 3, 1)
    refused(
        run(
            "import",
            "ft-log",
            bad,
            "--model",
            "switch-base-128",
            "--batch",
            1,
            "--encoder-layers",
            3,
            "--decoder-layers",
            3,
            "--decode-steps",
            1,
            "--out",
            out,
        ),
        "switch-base-128.yaml",
        out=out,
    )
    refused(
        run(
            "import",
            "ft-log",
            _ftlog(tmp_path / "ok.txt", 6, 6, 1),
            "--model",
            "switch-base-128",
            "--batch",
            1,
            "--decode-steps",
            1,
            "--num-experts",
            64,
            "--out",
            out,
        ),
        "--num-experts",
        out=out,
    )
    code, _, err, _ = run(
        "import",
        "ft-log",
        tmp_path / "ok.txt",
        "--model",
        "switch-base-128",
        "--batch",
        1,
        "--decode-steps",
        1,
        "--out",
        out,
    )
    assert code == 0, err
    refused(run("synth", "--model", "mixtral-8x7b", "--layers", 31, "--requests", 1, "--out", out), "mixtral-8x7b.yaml")
    code, _, err, _ = run("synth", "--model", "mixtral-8x7b", "--requests", 1, "--out", out)
    assert code == 0, err  # the defaults (8 experts, top-2, 32 layers) are Mixtral's


def test_vllm_and_mixtral_jsonl_refuse_a_shape_their_model_profile_would_refuse(tmp_path):
    out = tmp_path / "out.npz"
    ids, _, _ = routing([3], layers=2, k=2, experts=8)
    np.save(tmp_path / "r.npy", ids)
    refused(
        run("import", "vllm", tmp_path / "r.npy", "--model", "mixtral-8x7b", "--num-experts", 8, "--out", out),
        "mixtral-8x7b.yaml",
        out=out,
    )
    recs = [{"problem_id": 0, "layer": layer, "token_idx": 0, "experts": [1, 2]} for layer in range(3)]
    (tmp_path / "m.jsonl").write_text("\n".join(map(json.dumps, recs)) + "\n")
    refused(run("import", "mixtral-jsonl", tmp_path / "m.jsonl", "--out", out), "32 decoder", out=out)


# ------------------------------------------------------------------------------------------------ empty content
def test_datasets_that_keep_only_empty_requests_are_refused(tmp_path):
    entries = [{"dataset": "full"}, {"dataset": "empty"}, {"dataset": "empty"}]
    path = source(tmp_path / "src", lengths=(4, 0, 0), entries=entries)
    out = tmp_path / "out.npz"
    refused(
        run(*arrays_cmd(path, out, "--datasets", "empty")),
        "no tokens left after --datasets empty",
        "requests.json",
        out=out,
    )


def test_a_source_whose_requests_are_all_empty_is_refused(tmp_path):
    ids, _, _ = routing([2])
    path = tmp_path / "routing.npz"
    np.savez(path, expert_ids=ids, request_offsets=np.array([0, 0, 2, 2], np.int64))
    np.savez(tmp_path / "none.npz", expert_ids=ids, request_offsets=np.array([0, 0, 2, 2], np.int64))
    code, _, err, _ = run(*arrays_cmd(path, tmp_path / "out.npz"))
    assert code == 0 and "dropped 2 requests without rows" in err  # a note, and the rows are kept
    t = load_trace(tmp_path / "out.npz")
    assert t.request_lengths.tolist() == [2] and np.array_equal(t.experts, ids.astype(np.int16))
    assert t.meta.extra["empty_requests_dropped"] == 2


def test_millions_of_empty_requests_are_refused_quickly(tmp_path):
    ids, _, _ = routing([20])
    offsets = np.zeros(MAX_REQUESTS + 2, np.int64)
    offsets[-1] = 20
    path = tmp_path / "routing.npz"
    np.savez_compressed(path, expert_ids=ids, request_offsets=offsets)
    assert path.stat().st_size < 1 << 20
    out = tmp_path / "out.npz"
    refused(run(*arrays_cmd(path, out), timeout=30), str(path), f"more than the {MAX_REQUESTS}", out=out)


def test_the_trace_reader_refuses_absurd_request_counts_and_prompt_lengths(tmp_path):
    from moebase.errors import TraceError

    code, _, err, _ = run(*arrays_cmd(source(tmp_path / "src", entries=[{"prompt_len": 5}, {}]), tmp_path / "ok.npz"))
    assert code == 0, err
    with zipfile.ZipFile(tmp_path / "ok.npz") as z:
        members = {n: z.read(n) for n in z.namelist()}
    meta = json.loads(members["meta.json"])
    cases = {
        "many requests": {"request_offsets.npy": npy_header((MAX_REQUESTS + 2,), "<i8") + bytes(64)},
        "prompt_len": {
            "meta.json": json.dumps(
                {**meta, "request_info": {**meta["request_info"], "prompt_len": [10_000_000, None]}}
            ).encode()
        },
    }
    for name, change in cases.items():
        bad = tmp_path / f"{name}.npz"
        bad.write_bytes(zip_of({**members, **change}.items()))
        with pytest.raises(TraceError) as info:
            load_trace(bad)
        assert "request" in str(info.value) or "prompt_len" in str(info.value), str(info.value)
        refused(run("validate", bad), str(bad))


# ------------------------------------------------------------------------------------------------ ft-log
BAD_WORDS = [
    "+5",
    "1_0",
    "\u0663",
    "\uff13",
    "5.0",
    "0x5",
    "1e3",
    "--5",
    "5-",
    "-",
    "12345678901",
    "\u00b9",
    "\u2164",
    "\u0e53",
    "5\u200b",
    "\x0b5",
    "٣٣",
    "1,2",
]


@pytest.mark.parametrize("word", BAD_WORDS, ids=ascii)
def test_ft_log_ids_are_ascii_digits_only(tmp_path, word):
    path = tmp_path / "log.txt"
    path.write_text("permuted_experts_ 1 2\n\npermuted_experts_ 3 " + word + " 4\n", encoding="utf-8")
    out = tmp_path / "out.npz"
    line = refused(
        run(
            "import",
            "ft-log",
            path,
            "--model",
            "toy-8",
            "--batch",
            1,
            "--encoder-layers",
            1,
            "--decoder-layers",
            1,
            "--decode-steps",
            0,
            "--out",
            out,
        ),
        f"{path}:3:",
        out=out,
    )
    assert "not an expert id" in line or "outside" in line, line


def test_ft_log_lines_longer_than_the_limit_are_refused_with_bounded_memory(tmp_path, monkeypatch):
    import traces.importers.ftlog

    monkeypatch.setattr(traces.importers.ftlog, "MAX_LINE_BYTES", 4096)
    path = tmp_path / "log.txt"
    path.write_text("permuted_experts_ 1\npermuted_experts_ " + "1 " * 5000 + "\n")
    out = tmp_path / "out.npz"
    refused(
        run(
            "import",
            "ft-log",
            path,
            "--model",
            "toy-8",
            "--batch",
            1,
            "--encoder-layers",
            1,
            "--decoder-layers",
            1,
            "--decode-steps",
            0,
            "--out",
            out,
        ),
        f"{path}:2:",
        "longer than 4096",
        out=out,
    )


def test_ft_log_of_too_many_layers_is_refused_before_it_is_built(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text("permuted_experts_ " + "1 " * 1_000_000 + "\n")
    out = tmp_path / "out.npz"
    refused(
        run(
            "import",
            "ft-log",
            path,
            "--model",
            "toy-8",
            "--batch",
            1,
            "--encoder-layers",
            1,
            "--decoder-layers",
            4096,
            "--decode-steps",
            0,
            "--out",
            out,
        ),
        "more than a trace file may hold",
        out=out,
    )
    for flag, value in (("--decoder-layers", 10**6), ("--batch", 10**9), ("--decode-steps", 10**9)):
        refused(run("import", "ft-log", path, "--model", "toy-8", "--batch", 1, flag, value, "--out", out), flag)


def test_ft_log_memory_is_a_small_multiple_of_the_longest_line(tmp_path):
    """A 12 MB line of 6 million ids: parsed without a list of words (a word list and int() per word used ~14x
    the line), then refused for its context. The peak memory above a one-id log's stays under 8x the line."""
    if not Path("/proc/self/status").is_file():
        pytest.skip("needs /proc/self/status (Linux) to read the peak memory")
    code = (
        "import re, sys; from tests.support.cli import traces_main as main; rc = main(sys.argv[1:]); "
        "print(re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1)); sys.exit(rc)"
    )
    line = b"permuted_experts_ " + b"1 " * 6_000_000 + b"\n"
    peaks = {}
    for name, text in (("small", b"permuted_experts_ 1\n"), ("big", line)):
        path = tmp_path / f"{name}.txt"
        path.write_bytes(text)
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                "import",
                "ft-log",
                str(path),
                "--model",
                "toy-8",
                "--batch",
                "1",
                "--encoder-layers",
                "1",
                "--decoder-layers",
                "1",
                "--decode-steps",
                "0",
                "--out",
                str(tmp_path / "o.npz"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == (2 if name == "big" else 0), done.stderr
        peaks[name] = int(done.stdout.strip().splitlines()[-1]) * 1024
    assert "context" in done.stderr, done.stderr
    assert peaks["big"] - peaks["small"] < 8 * len(line), (peaks, len(line))


# ------------------------------------------------------------------------------------------------ messages
def test_long_lists_in_messages_are_cut(tmp_path):
    names = [f"dataset-number-{i:03d}-with-a-long-name" for i in range(40)]
    path = source(tmp_path / "src", lengths=[1] * 40, entries=[{"dataset": d} for d in names])
    line = refused(run(*arrays_cmd(path, tmp_path / "o.npz", "--datasets", "nope")), "(40 in all)", "'nope'")
    assert len(line) < 400, len(line)
    line = refused(run(*arrays_cmd(path, tmp_path / "o.npz", "--datasets", ",".join(["z" * 5000] * 3))), "--datasets")
    assert len(line) < 400, len(line)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
@pytest.mark.parametrize(
    "kind, words",
    [("folder", "is a folder"), ("fifo", "FIFO"), ("/dev/zero", "character device"), ("missing", "no such file")],
)
def test_special_inputs_say_what_they_are_and_never_hang(tmp_path, kind, words):
    target = {
        "folder": tmp_path / "dir",
        "fifo": tmp_path / "fifo",
        "/dev/zero": Path("/dev/zero"),
        "missing": tmp_path / "nothing",
    }[kind]
    if kind == "folder":
        target.mkdir()
    if kind == "fifo":
        os.mkfifo(target)
    if not os.path.lexists(target) and kind != "missing":
        pytest.skip(f"no {target} here")
    out = tmp_path / "out.npz"
    good = source(tmp_path / "src")
    for argv in (
        arrays_cmd(target, out),
        arrays_cmd(good, out, "--requests-json", target),
        ("import", "ft-log", target, "--model", "toy-8", "--batch", 1, "--out", out),
        ("import", "vllm", target, "--model", "toy", "--num-experts", 8, "--out", out),
        ("import", "mixtral-jsonl", target, "--out", out),
    ):
        refused(run(*argv, timeout=20), str(target), words, out=out)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_python_m_traces_import_exits_2_with_one_line(tmp_path):
    """The real process: a FIFO input, a top-3 gpt-oss-20b, a 300-character --model."""
    os.mkfifo(tmp_path / "fifo")
    top3 = source(tmp_path / "src", lengths=[2], layers=24, k=3, experts=32)
    out = tmp_path / "out.npz"
    for argv, word in (((tmp_path / "fifo",), "FIFO"), ((top3,), "top-4"), ((top3, "--model", "x" * 300), "--model")):
        model = () if "--model" in argv else ("--model", "gpt-oss-20b")
        done = subprocess.run(
            [sys.executable, "-m", "traces", "import", "expert-arrays", *map(str, argv), *model, "--out", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and word in done.stderr, done.stderr
        assert not out.exists()
