"""`traces import kt-parquet`: kTransformers per-token routing logs (Parquet, one row per forward token and MoE
layer) become prompt rows (the prefill pass, layer-major undone) and decode rows (one per later pass), with the
warm-up passes dropped; a replay gives exactly the logged active sets, counted here independently from the raw
rows. Bad files exit 2 with one line naming the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moebase.errors import InputError
from sim.core.workload import active_sets, build_iterations, phase_layers
from sim.decisions.replay import replay
from sim.predictors import PREDICTORS, PredictorContext
from tests.support.cli import run_traces as run
from tests.support.paths import ROOT
from tests.support.policies import policy_for
from traces.importers.ktparquet import import_kt_parquet
from traces.io import load_trace

SHARED_KT = ROOT.parent / "shared" / "traces" / "qwen3.5-35b-a3b-ktransformers"
SCHEMA = pa.schema(
    [
        ("token_id", pa.int64()),
        ("context_id", pa.string()),
        ("layer_id", pa.int32()),
        ("token_position", pa.int32()),
        ("expert_ids", pa.list_(pa.int32())),
        ("expert_weights", pa.list_(pa.float32())),
        ("token_text", pa.null()),
        ("timestamp", pa.int64()),
        ("token_category", pa.string()),
    ]
)


# ------------------------------------------------------------------------------------------------ helpers
def routing(rng, tokens, layers, k, experts):
    """Random top-k ids (distinct per token and layer) and weights in descending order, [tokens, layers, k]."""
    ids = np.argsort(rng.random((tokens, layers, experts)), axis=2)[:, :, :k].astype(np.int32)
    w = -np.sort(-rng.random((tokens, layers, k)), axis=2).astype(np.float32)
    return ids, w


def request_rows(ctx, prompt, decode, layers=3, k=4, experts=16, seed=0, category="coding"):
    """The rows of one logged request: 2 single-token warm-up passes, a layer-major prefill of ``prompt`` tokens,
    ``decode`` single-token passes; and the routing by token ([2 + prompt + decode, layers, k])."""
    rng = np.random.default_rng(seed)
    n = 2 + prompt + decode
    ids, w = routing(rng, n, layers, k, experts)
    rows = []

    def add(t, layer, pos):
        rows.append(
            {
                "context_id": ctx,
                "layer_id": layer,
                "token_position": pos,
                "expert_ids": ids[t, layer].tolist(),
                "expert_weights": w[t, layer].tolist(),
                "token_category": category,
            }
        )

    for t in (0, 1):
        for layer in range(layers):
            add(t, layer, 0)
    for layer in range(layers):
        for j in range(prompt):
            add(2 + j, layer, j)
    for d in range(decode):
        for layer in range(layers):
            add(2 + prompt + d, layer, 0)
    return rows, ids, w


def write_log(path, rows, schema=SCHEMA, drop=()):
    cols = {name: [] for name in schema.names}
    for i, r in enumerate(rows):
        full = {"token_id": i, "token_text": None, "timestamp": 1000 * i, **r}
        for name in schema.names:
            cols[name].append(full.get(name))
    table = pa.table({n: pa.array(cols[n], type=schema.field(n).type) for n in schema.names if n not in drop})
    pq.write_table(table, path, row_group_size=37)
    return path


def write_output(folder, name, ctx, prompt, completion, trace_file=None):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"output_{name}.json"
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    trace_file = trace_file or f"{name}_session.parquet"
    path.write_text(
        json.dumps({"prompt_id": name, "context_id": ctx, "trace_file": trace_file, "raw_response": {"usage": usage}})
    )
    return path


def raw_active_sets(paths):
    """Independently of the importer: per request (in file order, then row order), per step (0 = the prefill pass,
    then one per decode pass), per layer, the set of experts the raw rows route to, warm-up passes skipped."""
    out = []  # (request, step, layer, frozenset)
    for path in paths:
        df = pq.read_table(path).to_pandas()
        contexts = df["context_id"].tolist() if "context_id" in df else [None] * len(df)
        sets = defaultdict(set)
        order = []
        prev_ctx, prev_layer, pass_no = object(), None, -1
        for ctx, layer, ids in zip(contexts, df["layer_id"].tolist(), df["expert_ids"].tolist()):
            if ctx != prev_ctx:
                pass_no, prev_layer = 0, None
            elif layer < prev_layer:
                pass_no += 1
            prev_ctx, prev_layer = ctx, layer
            if pass_no < 2:
                continue
            key = (f"{path}:{ctx}", pass_no - 2, int(layer))
            if key not in sets:
                order.append(key)
            sets[key].update(int(x) for x in ids)
        out.extend((k[0], k[1], k[2], frozenset(sets[k])) for k in order)
    return out


def raw_sets_in_step_order(paths):
    """raw_active_sets ordered by (request, step, layer): the order of a batch-1 replay."""
    items = raw_active_sets(paths)
    reqs = {r: i for i, r in enumerate(dict.fromkeys(r for r, _, _, _ in items))}
    return [s for _, _, _, s in sorted(items, key=lambda x: (reqs[x[0]], x[1], x[2]))]


def replay_sets(trace):
    """Active sets of every (iteration, layer) of a batch-1 static replay: the workload's, and the decisions'
    of the simulator's LRU policy driven by sim.decisions.replay."""
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    layers = phase_layers(trace)
    workload = [frozenset(a) for it in its for a, _ in active_sets(trace, it.rows, layers[it.kind])]
    policy = policy_for("lru", trace, None, 0, 4)
    decisions = replay(trace, its, policy, PREDICTORS.get("none")(None, PredictorContext(trace.num_layers, 8, 0)))
    assert [(d.iteration, d.layer) for d in decisions] == [
        (i, layer) for i in range(len(its)) for layer in range(trace.num_layers)
    ]
    return workload, [frozenset(d.active) for d in decisions]


def refused(result, *words, out=None):
    code, _, err, caught = result
    assert code == 2, (code, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) <= 600, err[-2000:]
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not caught, caught
    if out is not None:
        assert not Path(out).is_file()
    return lines[0]


def kt_import(*files, out, extra=()):
    return run("import", "kt-parquet", *files, "--model", "tiny-kt", "--num-experts", 16, "--out", out, *extra)


# ------------------------------------------------------------------------------------------------ layout
def test_prefill_and_decode_rows_warmups_dropped_rank_order_and_weights_kept(tmp_path):
    layers, k = 3, 4
    rows_a, ids_a, w_a = request_rows("ctx_a", prompt=5, decode=4, layers=layers, k=k, seed=1)
    rows_b, ids_b, w_b = request_rows("ctx_b", prompt=1, decode=0, layers=layers, k=k, seed=2, category="edge")
    rows_c, ids_c, w_c = request_rows("ctx_c", prompt=3, decode=6, layers=layers, k=k, seed=3)
    f1 = write_log(tmp_path / "one_session.parquet", rows_a + rows_b)
    f2 = write_log(tmp_path / "two_session.parquet", rows_c)
    trace, summary = import_kt_parquet([f1, f2], "tiny-kt", 16)
    assert trace.num_requests == 3 and trace.num_layers == layers and trace.top_k == k and trace.num_experts == 16
    assert trace.meta.request_ids == ("ctx_a", "ctx_b", "ctx_c")
    assert trace.request_offsets.tolist() == [0, 9, 10, 19] and trace.prefill_lengths.tolist() == [5, 1, 3]
    for r, (ids, w) in enumerate(((ids_a, w_a), (ids_b, w_b), (ids_c, w_c))):
        sl = trace.request_slice(r)
        # token order (warm-ups 0 and 1 dropped), rank order within each row, weights as float16
        assert (trace.experts[sl] == ids[2:]).all()
        assert (trace.weights[sl] == w[2:].astype(np.float16)).all()
    info = trace.meta.request_info
    assert info["context_id"] == ["ctx_a", "ctx_b", "ctx_c"] and info["prompt_len"] == [5, 1, 3]
    assert info["completion_tokens"] == [5, 1, 7] and info["category"] == ["coding", "edge", "coding"]
    assert info["source_file"] == ["one_session.parquet"] * 2 + ["two_session.parquet"]
    assert trace.meta.extra["warmup_passes_dropped"] == 6
    assert trace.meta.provenance.tool == "traces import kt-parquet" and trace.meta.provenance.dataset == "coding+edge"
    assert summary["per_request"] == [("ctx_a", 5, 4), ("ctx_b", 1, 0), ("ctx_c", 3, 6)]


def test_prompt_rows_undo_the_layer_major_order_read_plainly(tmp_path):
    """Prompt row j, layer l is the prefill pass's row at layer block l, position j, read from the raw file."""
    rows, _, _ = request_rows("ctx", prompt=7, decode=2, layers=4, k=3, seed=5)
    path = write_log(tmp_path / "x_session.parquet", rows)
    trace, _ = import_kt_parquet([path], "tiny-kt", 16)
    df = pq.read_table(path).to_pandas()
    prefill = df.iloc[2 * 4 : 2 * 4 + 7 * 4]
    for _, row in prefill.iterrows():
        j, layer = int(row["token_position"]), int(row["layer_id"])
        assert trace.experts[j, layer].tolist() == list(row["expert_ids"])
        assert np.allclose(trace.weights[j, layer], np.asarray(row["expert_weights"], np.float16))
    decode = df.iloc[2 * 4 + 7 * 4 :]
    for i, (_, row) in enumerate(decode.iterrows()):
        assert trace.experts[7 + i // 4, int(row["layer_id"])].tolist() == list(row["expert_ids"])


def test_replay_gives_the_logged_active_sets_counted_independently(tmp_path):
    files = []
    for f in range(3):
        rows = []
        for r in range(2 if f == 1 else 1):
            rq, _, _ = request_rows(f"ctx_{f}_{r}", prompt=2 + 3 * f + r, decode=5 + f, layers=4, k=4, seed=10 * f + r)
            rows += rq
        files.append(write_log(tmp_path / f"f{f}_session.parquet", rows))
    out = tmp_path / "t.npz"
    code, stdout, err, _ = kt_import(*files, out=out)
    assert code == 0, err
    trace = load_trace(out)
    expected = raw_sets_in_step_order(files)
    workload, decided = replay_sets(trace)
    assert len(expected) == (
        sum(1 + (trace.request_lengths[r] - trace.prefill_lengths[r]) for r in range(trace.num_requests))
        * trace.num_layers
    )
    assert workload == expected and decided == expected


def test_outputs_check_counts_and_are_matched_by_context_or_file(tmp_path):
    rows, _, _ = request_rows("ctx_a", prompt=4, decode=3)
    f1 = write_log(tmp_path / "a_session.parquet", rows)
    rows, _, _ = request_rows(None, prompt=2, decode=1)
    f2 = write_log(tmp_path / "b_session.parquet", rows, drop=("context_id",))
    outs = tmp_path / "outputs"
    write_output(outs, "a", "ctx_a", 4, 4)
    write_output(outs, "b", "ctx_other", 2, 2, trace_file="b_session.parquet")
    out = tmp_path / "t.npz"
    code, stdout, err, _ = kt_import(f1, f2, out=out, extra=("--outputs", outs))
    assert code == 0, err
    assert "checked against the output JSONs" in stdout
    trace = load_trace(out)
    assert trace.meta.request_ids == ("ctx_a", "b_session")
    assert trace.meta.request_info["output_file"] == ["output_a.json", "output_b.json"]
    assert trace.meta.request_info["context_id"] == ["ctx_a", None]
    # a prompt count that disagrees, a completion count that disagrees, a request without output JSON
    write_output(outs, "a", "ctx_a", 5, 4)
    refused(
        kt_import(f1, out=out, extra=("--outputs", outs)), str(f1), "prefill pass holds 4 tokens", "prompt_tokens 5"
    )
    write_output(outs, "a", "ctx_a", 4, 9)
    refused(
        kt_import(f1, out=out, extra=("--outputs", outs / "output_a.json")),
        str(f1),
        "3 decode passes",
        "completion_tokens 9",
    )
    refused(kt_import(f1, out=out, extra=("--outputs", outs / "output_b.json")), str(f1), "no output JSON")


# ------------------------------------------------------------------------------------------------ bad files
def _good(tmp_path, **kw):
    rows, _, _ = request_rows("ctx", prompt=3, decode=3, **kw)
    return rows


def test_bad_files_exit_2_naming_the_file(tmp_path):
    out = tmp_path / "t.npz"
    rows = _good(tmp_path)
    # a missing column
    p = write_log(tmp_path / "nocol.parquet", rows, drop=("expert_weights",))
    refused(kt_import(p, out=out), str(p), "expert_weights", out=out)
    # a list of the wrong length
    bad = [dict(r) for r in rows]
    bad[17]["expert_ids"] = bad[17]["expert_ids"][:3]
    p = write_log(tmp_path / "len.parquet", bad)
    refused(kt_import(p, out=out), str(p), "row 17", "holds 3 values", out=out)
    # layer ids out of order inside a decode pass (prompt 3 x 3 layers: decode rows start at 6 + 9 = 15)
    bad = [dict(r) for r in rows]
    bad[16]["layer_id"], bad[17]["layer_id"] = 2, 1
    p = write_log(tmp_path / "order.parquet", bad)
    refused(kt_import(p, out=out), str(p), "pass 3", "not a whole number of tokens", out=out)
    # a prefill pass written token-major, not layer-major
    bad = [dict(r) for r in rows]
    pre = sorted(bad[6:15], key=lambda r: (r["token_position"], r["layer_id"]))
    bad[6:15] = pre
    p = write_log(tmp_path / "tokmajor.parquet", bad)
    refused(kt_import(p, out=out), str(p), "pass 3", "token_position 1", "layer-major", out=out)
    # a prefill pass with a layer missing for one token
    bad = [dict(r) for r in rows]
    del bad[8]
    p = write_log(tmp_path / "short.parquet", bad)
    refused(kt_import(p, out=out), str(p), "pass 2", out=out)
    # a warm-up pass of two tokens
    bad = [dict(r) for r in rows]
    bad[0:6] = [
        dict(bad[0], token_position=0),
        dict(bad[0], token_position=1),
        dict(bad[1], token_position=0),
        dict(bad[1], token_position=1),
        dict(bad[2], token_position=0),
        dict(bad[2], token_position=1),
    ]
    p = write_log(tmp_path / "warm.parquet", bad)
    refused(kt_import(p, out=out), str(p), "pass 0", "warm-up", out=out)
    # ids out of range, repeated, weights not finite, nulls
    cases = (
        ("expert_ids", [0, 1, 2, 99], ("decode step 1", "expert 99", "outside 0..15")),
        ("expert_ids", [0, 1, 1, 2], ("row 20", "repeats")),
        ("expert_weights", [0.1, float("nan"), 0.2, 0.3], ("row 20", "not finite")),
        ("expert_weights", [0.1, 1e6, 0.2, 0.3], ("row 20", "float16")),
        ("expert_ids", [0, 1, -3, 2], ("row 20", "0..32767")),
        ("expert_ids", None, ("row 20", "null")),
    )
    for i, (field, value, words) in enumerate(cases):
        bad = [dict(r) for r in rows]
        bad[20][field] = value
        p = write_log(tmp_path / f"val{i}.parquet", bad)
        refused(kt_import(p, out=out), str(p), *words, out=out)
    # too few passes; a second multi-token pass after the prefill
    p = write_log(tmp_path / "few.parquet", rows[:6])
    refused(kt_import(p, out=out), str(p), "2 forward passes", out=out)
    p = write_log(tmp_path / "twoprefill.parquet", rows + rows[6:15])
    refused(kt_import(p, out=out), str(p), "pass 6", "holds 3 tokens", "decode", out=out)


def test_not_parquet_fifo_folder_missing_and_wrong_types(tmp_path):
    out = tmp_path / "t.npz"
    p = tmp_path / "text.parquet"
    p.write_text("layer_id,token_position\n0,0\n" * 10)
    refused(kt_import(p, out=out), str(p), "not a Parquet file", out=out)
    p = tmp_path / "trunc.parquet"
    good = write_log(tmp_path / "g.parquet", _good(tmp_path))
    data = good.read_bytes()
    p.write_bytes(data[:20] + data[-30:])
    refused(kt_import(p, out=out), str(p), "Parquet", out=out)
    refused(kt_import(tmp_path / "nope.parquet", out=out), "nope.parquet", "no such file", out=out)
    refused(kt_import(tmp_path, out=out), str(tmp_path), "folder", out=out)
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo.parquet"
        os.mkfifo(fifo)
        refused(kt_import(fifo, out=out), str(fifo), "FIFO", out=out)
    schema = pa.schema([(f.name, pa.string() if f.name == "layer_id" else f.type) for f in SCHEMA])
    rows = [dict(r, layer_id=str(r["layer_id"])) for r in _good(tmp_path)]
    p = write_log(tmp_path / "types.parquet", rows, schema=schema)
    refused(kt_import(p, out=out), str(p), "layer_id", "expected integers", out=out)
    # --out checked before anything is read; the input is never replaced
    refused(kt_import(good, out=good), "--out", "input file")
    refused(kt_import(tmp_path / "nope.parquet", out=tmp_path), "--out")


def test_requests_must_agree_and_be_contiguous(tmp_path):
    out = tmp_path / "t.npz"
    a, _, _ = request_rows("ctx_a", prompt=2, decode=2, layers=3)
    b, _, _ = request_rows("ctx_b", prompt=2, decode=2, layers=4)
    p = write_log(tmp_path / "mixed.parquet", a + b)
    refused(kt_import(p, out=out), str(p), "ctx_b", "4 MoE layers", out=out)
    a2, _, _ = request_rows("ctx_a", prompt=2, decode=2, layers=3, seed=9)
    c, _, _ = request_rows("ctx_c", prompt=2, decode=2, layers=3)
    p = write_log(tmp_path / "again.parquet", a + c + a2)
    refused(kt_import(p, out=out), str(p), "ctx_a", "contiguous", out=out)
    p1 = write_log(tmp_path / "one.parquet", a)
    p2 = write_log(tmp_path / "two.parquet", a2)
    refused(kt_import(p1, p2, out=out), str(p2), "ctx_a", out=out)


def test_model_names_and_expert_counts(tmp_path):
    rows, _, _ = request_rows("ctx", prompt=2, decode=2, layers=3, k=4, experts=16)
    p = write_log(tmp_path / "m.parquet", rows)
    out = tmp_path / "t.npz"
    # an unknown model name is accepted; experts from the data when no profile or suffix gives them
    code, stdout, err, _ = run("import", "kt-parquet", p, "--model", "tiny-kt-moe", "--out", out)
    assert code == 0, err
    trace = load_trace(out)
    assert trace.meta.model.name == "tiny-kt-moe" and trace.num_experts == int(trace.experts.max()) + 1
    # the profiled model's name: 3 layers of top-4 are not its shape (40 layers, top-8)
    refused(run("import", "kt-parquet", p, "--model", "qwen3.5-35b-a3b", "--out", out), "does not match model")
    refused(
        run("import", "kt-parquet", p, "--model", "tiny-kt", "--num-experts", 8, "--out", out),
        str(p),
        "routes to expert 15",
        "outside 0..7",
    )
    # a model with a profile must fit it (mixtral-8x7b: 32 layers, top-2)
    refused(
        run("import", "kt-parquet", p, "--model", "mixtral-8x7b", "--num-experts", 16, "--out", out),
        "does not match model",
    )
    refused(run("import", "kt-parquet", p, "--model", "bad name", "--out", out), "--model")


def test_command_line_process(tmp_path):
    rows, _, _ = request_rows("ctx", prompt=2, decode=2)
    p = write_log(tmp_path / "m.parquet", rows)
    out = tmp_path / "t.npz"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "traces",
            "import",
            "kt-parquet",
            str(p),
            "--model",
            "tiny-kt",
            "--num-experts",
            "16",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "4 tokens (2 prompt, 2 decode) in 1 requests" in done.stdout
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + b"\0" * 40 + b"PAR1")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "traces",
            "import",
            "kt-parquet",
            str(bad),
            "--model",
            "tiny-kt",
            "--out",
            str(tmp_path / "u.npz"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and str(bad) in done.stderr


def test_corrupt_bytes_import_or_refuse_never_crash(tmp_path):
    """Random byte changes in a good log: the import succeeds or raises InputError, nothing else (pyarrow 26
    aborted the process on some corrupt footers when a column chunk's metadata was read, and an invalid UTF-8
    context_id raised UnicodeDecodeError, before the reader avoided both)."""
    rows, _, _ = request_rows("ctx", prompt=4, decode=5)
    good = write_log(tmp_path / "g.parquet", rows).read_bytes()
    rng = np.random.default_rng(7)
    outcomes = defaultdict(int)
    for i in range(300):
        b = bytearray(good)
        for at in rng.integers(0, len(b), size=int(rng.integers(1, 9))):
            b[int(at)] = int(rng.integers(0, 256))
        p = tmp_path / f"c{i % 3}.parquet"
        p.write_bytes(bytes(b))
        try:
            import_kt_parquet([p], "tiny-kt", 16)
            outcomes["ok"] += 1
        except InputError as exc:
            assert str(p) in str(exc) and "\n" not in str(exc)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100


def test_api_raises_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        import_kt_parquet([tmp_path / "none.parquet"], "tiny-kt", 16)


# ------------------------------------------------------------------------------------------------ the real logs
@pytest.fixture(scope="module")
def real_kt(tmp_path_factory):
    files = sorted((SHARED_KT / "parquet").glob("*.parquet")) if (SHARED_KT / "parquet").is_dir() else []
    if len(files) != 12 or not (SHARED_KT / "outputs").is_dir():
        pytest.skip(f"the kTransformers Qwen3.5-35B-A3B logs are not at {SHARED_KT} (12 Parquet files and outputs/)")
    out = tmp_path_factory.mktemp("kt") / "qwen35.npz"
    code, stdout, err, _ = run(
        "import",
        "kt-parquet",
        *files,
        "--model",
        "qwen3.5-35b-a3b",
        "--outputs",
        SHARED_KT / "outputs",
        "--out",
        out,
        timeout=300,
    )
    assert code == 0, err
    print(stdout.strip())
    return files, load_trace(out)


def test_real_logs_import_with_the_output_counts(real_kt):
    files, trace = real_kt
    assert trace.num_requests == 12 and trace.num_layers == 40 and trace.top_k == 8 and trace.num_experts == 256
    for r, f in enumerate(files):
        name = f.name.removesuffix("_session.parquet")
        usage = json.loads((SHARED_KT / "outputs" / f"output_{name}.json").read_text())["raw_response"]["usage"]
        assert trace.meta.request_ids[r] == f"ctx_{name}"
        assert int(trace.prefill_lengths[r]) == usage["prompt_tokens"]
        assert int(trace.request_lengths[r] - trace.prefill_lengths[r]) == usage["completion_tokens"] - 1
        # every row of the file is a warm-up, prompt or decode token-step of some layer
        assert pq.ParquetFile(f).metadata.num_rows == (2 + int(trace.request_lengths[r])) * 40


def test_real_logs_replay_to_the_logged_active_sets(real_kt):
    from traces.analysis import stats
    from traces.format import Trace

    files, trace = real_kt
    expected = raw_sets_in_step_order(files)
    workload, decided = replay_sets(trace)
    assert workload == expected and decided == expected
    decode = trace.decode_mask()
    lengths = [int(trace.request_lengths[r] - trace.prefill_lengths[r]) for r in range(trace.num_requests)]
    dec = Trace(
        trace.experts[decode],
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        np.zeros(trace.num_requests, np.int64),
        trace.meta,
    )
    lru, _ = stats.step_lru_hit_rates(dec, [32])
    overlap, _ = stats.overlap_prev(dec)
    print(
        f"real kt-parquet: {trace.num_tokens} tokens ({int((~decode).sum())} prompt, {int(decode.sum())} decode) "
        f"in {trace.num_requests} requests; decode-only LRU 32/256 slots per layer: {lru[32]:.3f}; consecutive "
        f"decode tokens' top-8 overlap: {overlap:.3f}"
    )
