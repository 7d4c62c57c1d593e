"""`traces import expert-arrays`: numpy routing arrays with a requests.json beside them (the gpt-oss-20b layout),
and the trace format's optional per-request metadata (``meta.request_info``)."""

from __future__ import annotations

import json
import time
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moebase.errors import InputError, TraceError
from tests.support.cli import run_module
from tests.support.paths import ROOT
from tests.support.traces import make_trace
from traces.format import TraceMeta
from traces.importers.arrays import import_expert_arrays
from traces.importers.common import rows_of_requests
from traces.io import load_trace, save_trace

SHARED_GPT_OSS = ROOT.parent / "shared" / "traces" / "gpt-oss-20b"


def make_source(
    folder,
    lengths,
    layers=3,
    k=2,
    experts=16,
    seed=0,
    datasets=None,
    repetitive=None,
    with_probs=True,
    with_offsets=True,
    requests_json=True,
    ids_dtype=np.int8,
):
    """Write routing.npz (and requests.json) in ``folder``; returns (npz path, ids, probs, entries)."""
    rng = np.random.default_rng(seed)
    t = int(sum(lengths))
    ids = np.argsort(rng.random((t, layers, experts)), axis=2)[:, :, :k].astype(ids_dtype)
    probs = rng.random((t, layers, k)).astype(np.float16)
    arrays = {"expert_ids": ids}
    if with_probs:
        arrays["expert_probs"] = probs
    if with_offsets:
        arrays["request_offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "routing.npz"
    np.savez(path, **arrays)
    entries = None
    if requests_json:
        datasets = datasets or ["alpha"] * len(lengths)
        repetitive = repetitive or [False] * len(lengths)
        entries = [
            {
                "dataset": d,
                "category": f"c{i % 2}",
                "prompt_len": 10 + i,
                "n_decode_steps": int(n),
                "has_repetition": rep,
                "finished": True,
                "decode_tokens": ["x"] * int(n),
            }
            for i, (n, d, rep) in enumerate(zip(lengths, datasets, repetitive))
        ]
        (folder / "requests.json").write_text(json.dumps(entries))
    return path, ids, probs, entries


def test_arrays_and_per_request_metadata_are_kept(tmp_path):
    lengths = [4, 7, 1, 5]
    path, ids, probs, entries = make_source(tmp_path / "src", lengths, datasets=["a", "b", "a", "c"])
    trace, report = import_expert_arrays(path, "toy-moe", 16)
    assert np.array_equal(trace.experts, ids.astype(np.int16))
    assert np.array_equal(trace.weights, probs)
    assert trace.request_lengths.tolist() == lengths
    assert trace.prefill_lengths.tolist() == [0] * 4  # decode-only stays decode-only ...
    info = trace.meta.request_info
    assert info["prompt_len"] == [10, 11, 12, 13]  # ... with the prompt lengths recorded
    assert info["dataset"] == ["a", "b", "a", "c"] and info["source_index"] == [0, 1, 2, 3]
    assert info["has_repetition"] == [False] * 4 and "decode_tokens" not in info
    assert trace.meta.extra["request_fields_left_out"] == ["decode_tokens"]
    assert trace.meta.provenance.dataset == "a+b+c" and trace.meta.provenance.kind == "imported"
    assert trace.meta.request_ids == ("a/0", "b/1", "a/2", "c/3")
    assert report.requests_kept == report.requests_in_source == 4
    out = save_trace(trace, tmp_path / "t.npz")
    back = load_trace(out)
    assert back.meta.request_info == info and np.array_equal(back.experts, trace.experts)


def test_filters_keep_the_chosen_requests_rows(tmp_path):
    lengths = [3, 5, 2, 6, 4]
    datasets = ["a", "b", "a", "b", "c"]
    repetitive = [False, True, True, False, False]
    path, ids, probs, _ = make_source(tmp_path, lengths, datasets=datasets, repetitive=repetitive)
    starts = np.concatenate([[0], np.cumsum(lengths)])

    def expected(keep):
        return np.concatenate([ids[starts[r] : starts[r + 1]] for r in keep]).astype(np.int16)

    for ds, excl, keep in (
        (["a"], False, [0, 2]),
        (["a", "b"], True, [0, 3]),
        (None, True, [0, 3, 4]),
        (["c", "a"], False, [0, 2, 4]),
    ):
        trace, report = import_expert_arrays(path, "toy", 16, datasets=ds, exclude_repetitive=excl)
        assert np.array_equal(trace.experts, expected(keep)), (ds, excl)
        assert trace.request_lengths.tolist() == [lengths[r] for r in keep]
        assert trace.meta.request_info["source_index"] == keep
        assert trace.meta.request_info["dataset"] == [datasets[r] for r in keep]
        assert report.requests_kept == len(keep) and trace.meta.extra["requests_kept"] == len(keep)
        kept_probs = np.concatenate([probs[starts[r] : starts[r + 1]] for r in keep])
        assert np.array_equal(trace.weights, kept_probs)
    out = tmp_path / "f.npz"
    res = run_module(
        "traces",
        "import",
        "expert-arrays",
        path,
        "--model",
        "toy",
        "--num-experts",
        16,
        "--datasets",
        "b",
        "--exclude-repetitive",
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr
    assert "in 1 requests (of 5)" in res.stdout
    assert load_trace(out).meta.request_info["source_index"] == [3]


def test_without_offsets_or_requests_json_one_request_and_experts_from_the_data(tmp_path):
    path, ids, _, _ = make_source(
        tmp_path, [9], experts=12, with_probs=False, with_offsets=False, requests_json=False, ids_dtype=np.int64
    )
    trace, report = import_expert_arrays(path, "mystery-moe")
    assert trace.num_requests == 1 and trace.weights is None and trace.meta.request_info is None
    assert trace.num_experts == int(ids.max()) + 1 and "data" in report.num_experts_from
    assert import_expert_arrays(path, "mystery-moe-64")[0].num_experts == 64  # the name's suffix
    gpt, *_ = make_source(
        tmp_path / "gpt", [3], layers=24, k=4, experts=32, with_probs=False, with_offsets=False, requests_json=False
    )
    assert import_expert_arrays(gpt, "gpt-oss-20b")[0].num_experts == 32  # the model profile
    with pytest.raises(InputError, match="does not match model"):
        import_expert_arrays(path, "switch-base-128")  # 3 decoder layers, top-2: not that profile's shape


def test_requests_json_given_or_ignored(tmp_path):
    path, _, _, entries = make_source(tmp_path / "a", [2, 3])
    other = tmp_path / "meta.json"
    other.write_text(json.dumps([{**e, "dataset": "z"} for e in entries]))
    assert import_expert_arrays(path, "t", 16, requests_json=other)[0].meta.request_info["dataset"] == ["z", "z"]
    assert import_expert_arrays(path, "t", 16, no_requests_json=True)[0].meta.request_info is None


def _bad_npz(tmp_path, case):
    """A source folder broken in one way; returns (path, extra CLI args, expected words in the message)."""
    lengths = [3, 4]
    path, ids, probs, entries = make_source(tmp_path, lengths)
    offsets = np.array([0, 3, 7], dtype=np.int64)
    args = ["--num-experts", "16"]
    if case == "no_expert_ids":
        np.savez(path, routing=ids)
        return path, args, "no array 'expert_ids'"
    if case == "float_ids":
        np.savez(path, expert_ids=ids.astype(np.float32), request_offsets=offsets)
        return path, args, "must be an integer array"
    if case == "flat_ids":
        np.savez(path, expert_ids=ids[:, :, 0], request_offsets=offsets)
        return path, args, "[tokens, layers, top_k]"
    if case == "probs_shape":
        np.savez(path, expert_ids=ids, expert_probs=probs[:, :2], request_offsets=offsets)
        return path, args, "expert_probs must be a float array shaped like"
    if case == "probs_nan":
        probs[1, 1, 1] = np.nan
        np.savez(path, expert_ids=ids, expert_probs=probs, request_offsets=offsets)
        return path, args, "not finite"
    if case == "offsets_end":
        np.savez(path, expert_ids=ids, request_offsets=np.array([0, 3, 6]))
        return path, args, "request_offsets must run from 0 to the 7 rows"
    if case == "duplicate":
        ids[5, 2, 1] = ids[5, 2, 0]
        np.savez(path, expert_ids=ids, request_offsets=offsets)
        return path, args, "repeats an expert within one token's top-k (row 5, layer 2)"
    if case == "id_range":
        return path, ["--num-experts", "4"], "outside 0..3"
    if case == "not_zip":
        path.write_text("hello")
        return path, args, "not a readable .npz"
    if case == "single_npy":
        single = tmp_path / "routing.npy"
        np.save(single, ids)
        return single, args, "a single array, expected an .npz"
    if case == "requests_count":
        (tmp_path / "requests.json").write_text(json.dumps(entries[:1]))
        return path, args, "has 1 entries but the routing has 2 requests"
    if case == "requests_steps":
        entries[1]["n_decode_steps"] = 5
        (tmp_path / "requests.json").write_text(json.dumps(entries))
        return path, args, "entry 1: n_decode_steps 5 but request 1 has 4 rows"
    if case == "requests_not_json":
        (tmp_path / "requests.json").write_text("[{")
        return path, args, "not valid JSON"
    if case == "unknown_dataset":
        return path, args + ["--datasets", "alpha,beta"], "unknown data set 'beta'"
    if case == "filter_without_metadata":
        (tmp_path / "requests.json").unlink()
        return path, args + ["--exclude-repetitive"], "needs per-request metadata"
    raise AssertionError(case)


BAD = [
    "no_expert_ids",
    "float_ids",
    "flat_ids",
    "probs_shape",
    "probs_nan",
    "offsets_end",
    "duplicate",
    "id_range",
    "not_zip",
    "requests_count",
    "requests_steps",
    "requests_not_json",
    "unknown_dataset",
    "filter_without_metadata",
    "single_npy",
]


@pytest.mark.parametrize("case", BAD)
def test_bad_sources_exit_2_with_one_line_naming_the_file(tmp_path, case):
    path, args, problem = _bad_npz(tmp_path, case)
    out = tmp_path / "out.npz"
    res = run_module("traces", "import", "expert-arrays", path, "--model", "toy", *args, "--out", out)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and problem in res.stderr, res.stderr
    named = "requests.json" if case.startswith("requests") or case == "unknown_dataset" else str(path)
    assert named in res.stderr
    assert not out.exists()


def test_request_info_is_checked_on_save_and_load(tmp_path):
    good = make_trace([[1], [2], [0]], lengths=[1, 2])
    assert "request_info" not in good.meta.to_dict()  # traces without it are written as before
    bad = make_trace([[1], [2], [0]], lengths=[1, 2])
    bad = type(bad)(
        bad.experts,
        bad.request_offsets,
        bad.prefill_lengths,
        TraceMeta(**{**bad.meta.__dict__, "request_info": {"dataset": ["a"]}}),
    )
    with pytest.raises(TraceError, match="request_info.dataset has 1 values for 2 requests"):
        save_trace(bad, tmp_path / "bad.npz")
    ok = type(bad)(
        bad.experts,
        bad.request_offsets,
        bad.prefill_lengths,
        TraceMeta(**{**bad.meta.__dict__, "request_info": {"dataset": ["a", "b"], "n": [1, None]}}),
    )
    path = save_trace(ok, tmp_path / "ok.npz")
    assert load_trace(path).meta.request_info == {"dataset": ["a", "b"], "n": [1, None]}
    # a file whose request_info holds a list per request, or lists of different lengths, does not load
    for info, problem in (({"x": [[1], [2]]}, "request_info.x[0]"), ({"x": [1], "y": [1, 2]}, "different lengths")):
        with zipfile.ZipFile(path) as z:
            members = {n: z.read(n) for n in z.namelist()}
        meta = json.loads(members["meta.json"])
        meta["request_info"] = info
        members["meta.json"] = json.dumps(meta).encode()
        broken = tmp_path / "broken.npz"
        with zipfile.ZipFile(broken, "w") as z:
            for n, b in members.items():
                z.writestr(n, b)
        with pytest.raises(TraceError, match=problem.replace("[", r"\[")):
            load_trace(broken)


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 6), min_size=1, max_size=8), data=st.data())
def test_rows_of_requests_concatenates_the_kept_requests(lengths, data):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    kept = sorted(data.draw(st.sets(st.integers(0, len(lengths) - 1), min_size=1)))
    expected = [row for r in kept for row in range(offsets[r], offsets[r + 1])]
    assert rows_of_requests(offsets, np.array(kept, dtype=np.int64)).tolist() == expected


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 5), min_size=1, max_size=6), data=st.data())
def test_random_sources_keep_every_kept_row(tmp_path_factory, lengths, data):
    """Any source and dataset filter: the trace's rows are the kept requests' rows, in order, token counts equal."""
    names = data.draw(st.lists(st.sampled_from("abc"), min_size=len(lengths), max_size=len(lengths)))
    chosen = sorted(data.draw(st.sets(st.sampled_from(sorted(set(names))), min_size=1)))
    folder = tmp_path_factory.mktemp("src")
    path, ids, _, _ = make_source(folder, lengths, datasets=names, seed=len(lengths))
    trace, _ = import_expert_arrays(path, "toy", 16, datasets=chosen)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    keep = [r for r, d in enumerate(names) if d in chosen]
    assert trace.num_tokens == sum(lengths[r] for r in keep)
    assert np.array_equal(trace.experts, np.concatenate([ids[starts[r] : starts[r + 1]] for r in keep]))


# ------------------------------------------------------------------------------------------- the real data
@pytest.fixture(scope="module")
def gpt_oss():
    path = SHARED_GPT_OSS / "routing.npz"
    if not path.is_file() or not (SHARED_GPT_OSS / "requests.json").is_file():
        pytest.skip(f"real gpt-oss-20b routing not found ({path}): ../shared is absent in this checkout")
    return path


def test_real_gpt_oss_import_is_fast_and_keeps_every_row(gpt_oss):
    entries = json.loads((gpt_oss.parent / "requests.json").read_text())
    with np.load(gpt_oss) as z:
        ids, offsets = z["expert_ids"], z["request_offsets"]
    t0 = time.perf_counter()
    trace, report = import_expert_arrays(gpt_oss, "gpt-oss-20b")
    assert time.perf_counter() - t0 < 30
    assert np.array_equal(trace.experts, ids) and np.array_equal(trace.request_offsets, offsets)
    assert trace.num_experts >= int(ids.max()) + 1 and trace.top_k == ids.shape[2]
    assert trace.meta.request_info["prompt_len"] == [e["prompt_len"] for e in entries]
    assert (trace.prefill_lengths == 0).all() and trace.weights is not None


def test_real_gpt_oss_filters(gpt_oss):
    entries = json.loads((gpt_oss.parent / "requests.json").read_text())
    some = sorted({e["dataset"] for e in entries})[:2]
    trace, _ = import_expert_arrays(gpt_oss, "gpt-oss-20b", datasets=some, exclude_repetitive=True)
    keep = [i for i, e in enumerate(entries) if e["dataset"] in some and not e["has_repetition"]]
    assert trace.meta.request_info["source_index"] == keep
    assert trace.num_tokens == sum(entries[i]["n_decode_steps"] for i in keep)
    with pytest.raises(InputError, match="unknown data set"):
        import_expert_arrays(gpt_oss, "gpt-oss-20b", datasets=["no-such-set"])


def test_decode_steps_of_a_decode_only_import_attend_over_the_recorded_prompt():
    import dataclasses

    from sim.core.workload import build_iterations
    from tests.support.traces import random_trace

    t = random_trace(np.random.default_rng(0), tokens=40, layers=2, experts=8, k=2, requests=2)
    t = dataclasses.replace(t, prefill_lengths=np.zeros(2, dtype=np.int64))
    its, _ = build_iterations(t, 2, "static", 3, prefill=False)
    bare = [it.context for it in its]
    meta = dataclasses.replace(t.meta, request_info={"prompt_len": [100, 50]})
    its, _ = build_iterations(dataclasses.replace(t, meta=meta), 2, "static", 3, prefill=False)
    assert [it.context for it in its] == [c + 75 for c in bare] == [76.0, 77.0, 78.0]
