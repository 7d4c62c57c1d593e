"""`traces import kt-parquet` on hostile Parquet files: what a file decodes to is bounded before it is decoded (the
footer and every page header walked first) and counted as it is decoded; top-k lists are no longer than the model's
experts (or MAX_TOP_K); gate weights are finite and not negative; names that go into the trace's metadata follow the
model-name rule. Every file either imports exactly what it holds or is refused with one line naming it, and
pyarrow's own allocations (its memory pool, watched through a proxy) stay within a small multiple of the bound."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import traces.importers.ktparquet as kt
from moebase.errors import InputError
from tests.support.cli import run_traces
from tests.support.fuzz import PLAIN_NAME_CHARS, fuzz_settings
from tests.support.messages import checked_message
from traces.importers.ktparquet import import_kt_parquet
from traces.io import load_trace

HYP = fuzz_settings(25)
EXPERTS = 16
#: The decoded bound and largest page the hostile-file tests run under (small, so a test file can pass them).
SMALL_BOUND = 256 << 10
SMALL_PAGE = 64 << 10


COLUMNS = ("context_id", "layer_id", "token_position", "expert_ids", "expert_weights")


# ------------------------------------------------------------------------------------------------ building logs
def logged(prompts, decodes, layers, k, seed=0):
    """Rows of one log of ``len(prompts)`` requests (2 single-token warm-up passes, a layer-major prefill,
    single-token decode passes each) as columns, and the expected trace rows (ids [T, L, k], weights)."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {
        c: [] for c in ("context_id", "layer_id", "token_position", "expert_ids", "expert_weights")
    }
    want_ids, want_w = [], []
    for r, (p, d) in enumerate(zip(prompts, decodes)):
        n = 2 + p + d
        ids = np.argsort(rng.random((n, layers, EXPERTS)), axis=2)[:, :, :k]
        w = rng.random((n, layers, k))
        passes = [(0, 1), (1, 1), (2, p)] + [(2 + p + i, 1) for i in range(d)]
        for first, tokens in passes:
            for layer in range(layers):
                for j in range(tokens):
                    cols["context_id"].append(f"req{r}")
                    cols["layer_id"].append(layer)
                    cols["token_position"].append(j if tokens > 1 else 0)
                    cols["expert_ids"].append(ids[first + j, layer].tolist())
                    cols["expert_weights"].append(w[first + j, layer].tolist())
        want_ids.append(ids[2:])
        want_w.append(w[2:])
    return cols, np.concatenate(want_ids), np.concatenate(want_w)


def parquet_bytes(cols, id_type, w_type, list_of, **write) -> bytes:
    lists = {"list": pa.list_, "large": pa.large_list}[list_of]
    table = pa.table(
        {
            "context_id": pa.array(cols["context_id"], pa.string()),
            "layer_id": pa.array(cols["layer_id"], pa.int32()),
            "token_position": pa.array(cols["token_position"], pa.int64()),
            "expert_ids": pa.array(cols["expert_ids"], lists(id_type)),
            "expert_weights": pa.array(cols["expert_weights"], lists(w_type)),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, **write)
    return buf.getvalue()


@contextlib.contextmanager
def watched_pool():
    """pyarrow's default memory pool replaced by a proxy that keeps its own peak (``max_memory()``)."""
    old = pa.default_memory_pool()
    proxy = pa.proxy_memory_pool(old)
    pa.set_memory_pool(proxy)
    try:
        yield proxy
    finally:
        pa.set_memory_pool(old)


def one_line_naming(exc: InputError, path) -> str:
    msg = checked_message(exc, 600)
    assert str(path) in msg, msg
    return msg


storage = st.fixed_dictionaries(
    {
        "row_group_size": st.integers(1, 60),
        "use_dictionary": st.booleans(),
        "compression": st.sampled_from(["none", "zstd", "snappy"]),
        "data_page_size": st.sampled_from([64, 1024, 1 << 20]),
    }
)

MUTATIONS = st.one_of(
    st.none(),
    st.tuples(st.just("length"), st.integers(0, 10_000), st.integers(0, 300)),
    st.tuples(
        st.just("weight"),
        st.integers(0, 10_000),
        st.sampled_from([-1e-6, -0.5, float("nan"), float("inf"), -float("inf"), 1e6]),
    ),
    st.tuples(st.just("id"), st.integers(0, 10_000), st.sampled_from([-1, EXPERTS, 40_000, "repeat"])),
    st.tuples(st.just("null"), st.integers(0, 10_000), st.sampled_from(["expert_ids", "expert_weights"])),
)


def mutate(cols, mutation) -> bool:
    """Apply ``mutation`` to one row; True when the file must then be refused."""
    if mutation is None:
        return False
    kind, row, value = mutation
    row %= len(cols["layer_id"])
    k = len(cols["expert_ids"][row])
    if kind == "length":
        if value == k:
            return False
        cols["expert_ids"][row] = list(range(value))
        cols["expert_weights"][row] = [0.5] * value
    elif kind == "weight":
        cols["expert_weights"][row][0] = value
    elif kind == "id":
        ids = cols["expert_ids"][row]
        if value == "repeat":
            if k < 2:
                return False
            ids[1] = ids[0]
        else:
            ids[0] = value
    else:
        cols[value][row] = None
    return True


# ------------------------------------------------------------------------------------------------ the properties
@HYP
@given(
    shape=st.tuples(st.integers(1, 2), st.integers(2, 3), st.integers(1, 4)),  # one layer: passes cannot be told
    lengths=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(0, 3), st.integers(0, 3)),
    types=st.tuples(
        st.sampled_from([pa.int16(), pa.int32(), pa.int64()]),
        st.sampled_from([pa.float32(), pa.float64()]),
        st.sampled_from(["list", "large"]),
    ),
    write=storage,
    mutation=MUTATIONS,
    seed=st.integers(0, 1000),
)
def test_a_log_imports_exactly_what_it_holds_or_is_refused_with_one_line(
    tmp_path, shape, lengths, types, write, mutation, seed
):
    requests, layers, k = shape
    prompts, decodes = lengths[:requests], lengths[2 : 2 + requests]
    cols, want_ids, want_w = logged(prompts, decodes, layers, k, seed)
    must_refuse = mutate(cols, mutation)
    path = tmp_path / "log.parquet"
    path.write_bytes(parquet_bytes(cols, *types, **write))
    try:
        trace, _ = import_kt_parquet([path], "tiny-kt", EXPERTS)
    except InputError as exc:
        msg = one_line_naming(exc, path)
        assert must_refuse, msg
        if mutation[0] == "weight" and mutation[2] < 0:
            assert "negative" in msg or "not finite" in msg, msg
        return
    assert not must_refuse, mutation
    assert trace.experts.tolist() == want_ids.tolist()
    native = np.float32 if types[1] == pa.float32() else np.float64
    assert np.array_equal(trace.weights, want_w.astype(native).astype(np.float16))
    assert trace.prefill_lengths.tolist() == list(prompts)


@HYP
@given(
    rows=st.integers(1, 3000),
    k=st.integers(1, 4000),
    huge_row=st.one_of(st.none(), st.integers(1, 2_000_000)),
    write=storage,
    experts=st.one_of(st.none(), st.integers(1, 200)),
)
def test_what_a_hostile_file_decodes_to_stays_within_the_bound(
    tmp_path, monkeypatch, rows, k, huge_row, write, experts
):
    """Lists of any length (repeated, dictionary-encoded, zstd: a few KB that decode to GBs), one row with a huge
    list, many row groups: pyarrow's peak allocation stays a small multiple of the decoded bound."""
    monkeypatch.setattr(kt, "MAX_DECODED_BYTES", SMALL_BOUND)
    monkeypatch.setattr(kt, "MAX_PAGE_BYTES", SMALL_PAGE)
    lengths = np.full(rows, k, dtype=np.int64)
    if huge_row is not None:
        lengths[rows // 2] = huge_row
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    values = np.arange(int(lengths.sum()), dtype=np.int64) % 7
    table = pa.table(
        {
            "layer_id": pa.array(np.zeros(rows, np.int32)),
            "token_position": pa.array(np.zeros(rows, np.int32)),
            "expert_ids": pa.LargeListArray.from_arrays(offsets, pa.array(values.astype(np.int32))),
            "expert_weights": pa.LargeListArray.from_arrays(offsets, pa.array(np.full(values.size, 0.5, np.float32))),
        }
    )
    path = tmp_path / "hostile.parquet"
    pq.write_table(table, path, **{**write, "compression": "zstd"})
    del table, values
    with watched_pool() as pool:
        try:
            import_kt_parquet([path], "tiny-kt", experts)
        except InputError as exc:
            one_line_naming(exc, path)
        peak = pool.max_memory()
    assert peak <= 4 * (SMALL_BOUND + 6 * SMALL_PAGE), peak


@HYP
@given(rows=st.integers(2, 400), k=st.integers(1, 8), extra=st.integers(1, 3_000_000))
def test_pages_that_hold_more_than_the_footer_says_are_refused_before_decoding(tmp_path, rows, k, extra):
    """A footer whose value counts are patched down to rows x k while one row holds ``extra`` more values: the
    page walk finds the difference before pyarrow decodes the row."""
    lengths = np.full(rows, k, dtype=np.int64)
    lengths[rows // 2] += extra
    total = int(lengths.sum())
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    table = pa.table(
        {
            "layer_id": pa.array(np.zeros(rows, np.int32)),
            "token_position": pa.array(np.zeros(rows, np.int32)),
            "expert_ids": pa.LargeListArray.from_arrays(offsets, pa.array(np.zeros(total, np.int32))),
            "expert_weights": pa.LargeListArray.from_arrays(offsets, pa.array(np.zeros(total, np.float32))),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    data = _patched_counts(buf.getvalue(), total, rows * k)
    assume(data is not None)
    path = tmp_path / "lies.parquet"
    path.write_bytes(data)
    with watched_pool() as pool, pytest.raises(InputError) as caught:
        import_kt_parquet([path], "tiny-kt", 16)
    one_line_naming(caught.value, path)
    assert pool.max_memory() <= 1 << 20, pool.max_memory()


def _zigzag_varint(v: int, width: int | None = None) -> bytes:
    v = (v << 1) ^ (v >> 63)
    out = bytearray()
    while True:
        out.append(v & 0x7F)
        v >>= 7
        if not v:
            break
        out[-1] |= 0x80
    while width is not None and len(out) < width:  # a longer (non-canonical) varint of the same value
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)


def _patched_counts(data: bytes, true: int, claimed: int) -> bytes | None:
    """The file with every varint of ``true`` in its footer rewritten as ``claimed`` (same length); None when the
    footer holds none."""
    size = int.from_bytes(data[-8:-4], "little")
    start, end = len(data) - 8 - size, len(data) - 8
    old = _zigzag_varint(true)
    new = _zigzag_varint(claimed, len(old))
    if len(new) != len(old) or old not in data[start:end]:
        return None
    return data[:start] + data[start:end].replace(old, new) + data[end:]


@HYP
@given(k=st.integers(1, 100), experts=st.one_of(st.none(), st.integers(1, 120)), suffix=st.booleans())
def test_top_k_is_at_most_the_model_s_experts_and_max_top_k(tmp_path, k, experts, suffix):
    """Lists longer than the experts known before reading (--num-experts, else the name's suffix), or than
    MAX_TOP_K, are refused from the footer, naming the bound; others import."""
    model = "tiny-kt-100" if suffix else "tiny-kt"
    known = experts if experts is not None else (100 if suffix else None)
    e = max(k, known or k)
    cols: dict[str, list] = {c: [] for c in COLUMNS}
    for row in range(8):  # warm-up, warm-up, a one-token prefill, one decode pass; two layers
        cols["context_id"].append("r")
        cols["layer_id"].append(row % 2)
        cols["token_position"].append(0)
        cols["expert_ids"].append([(row + j) % e for j in range(k)])
        cols["expert_weights"].append([1.0 / k] * k)
    path = tmp_path / "k.parquet"
    path.write_bytes(parquet_bytes(cols, pa.int32(), pa.float32(), "list"))
    bound = min(kt.MAX_TOP_K, known) if known is not None else kt.MAX_TOP_K
    try:
        trace, _ = import_kt_parquet([path], model, experts)
    except InputError as exc:
        msg = one_line_naming(exc, path)
        assert k > bound, msg
        assert f"top-{bound}" in msg, msg
        return
    assert k <= bound and trace.top_k == k


def test_the_decoded_bound_holds_for_all_files_of_an_import_together(tmp_path, monkeypatch):
    cols, _, _ = logged([3], [2], 2, 4)
    one = len(parquet_bytes(cols, pa.int32(), pa.float32(), "list"))
    files = []
    for i in range(3):
        cols, _, _ = logged([3], [2], 2, 4, seed=i)
        cols["context_id"] = [f"file{i}"] * len(cols["context_id"])
        files.append(tmp_path / f"f{i}.parquet")
        files[-1].write_bytes(parquet_bytes(cols, pa.int32(), pa.float32(), "list"))
    limits = kt.read_limits("tiny-kt", EXPERTS)
    kt.read_log(files[0], limits)
    per_file = kt.MAX_DECODED_BYTES - limits.left
    assert 0 < per_file < 100 * one
    monkeypatch.setattr(kt, "MAX_DECODED_BYTES", 2 * per_file + per_file // 2)
    assert import_kt_parquet(files[:2], "tiny-kt", EXPERTS)[0].num_requests == 2
    with pytest.raises(InputError) as caught:
        import_kt_parquet(files, "tiny-kt", EXPERTS)
    msg = one_line_naming(caught.value, files[2])
    assert "of it taken by the files before" in msg, msg


# ------------------------------------------------------------------------------------------------ names
#: Names with something the rule refuses: a control or non-ASCII space, a space, a backslash, "..", a leading "/".
HOSTILE = st.builds(
    lambda a, bad, b: a + bad + b,
    st.text(PLAIN_NAME_CHARS, max_size=10),
    st.sampled_from(["\n", "\x00", "\x1b[2J", " ", "\\", "..", "\u2028", "\t", "\u3000", "/../"]),
    st.text(max_size=10),
)


@HYP
@given(
    flag=st.sampled_from(["--dataset", "--source-model"]),
    name=st.one_of(
        HOSTILE, st.text(PLAIN_NAME_CHARS, min_size=1, max_size=130), st.sampled_from(["../../x", "a/b/c", "x\ny"])
    ),
)
def test_names_that_go_into_the_metadata_follow_the_model_name_rule(tmp_path, flag, name):
    """A --dataset or --source-model with a control character, a space, '..', a path of more than one '/', or
    over 128 characters is refused with one line naming the flag; a plain name is kept as given."""
    cols, _, _ = logged([2], [1], 2, 2)
    path = tmp_path / "n.parquet"
    path.write_bytes(parquet_bytes(cols, pa.int32(), pa.float32(), "list"))
    out = tmp_path / "n.npz"
    out.unlink(missing_ok=True)  # the examples share tmp_path
    code, _, err, _ = run_traces(
        "import", "kt-parquet", path, "--model", "tiny-kt", "--num-experts", EXPERTS, flag, name, "--out", out
    )
    plain = (
        name[0].isalnum()
        and all(c in PLAIN_NAME_CHARS for c in name)
        and ".." not in name
        and len(name) <= 128
        and name.isascii()
    )
    if not plain:
        assert code == 2 and len(err.strip().splitlines()) == 1 and flag in err, err
        assert not out.exists()
        return
    assert code == 0, err
    prov = load_trace(out).meta.provenance
    assert (prov.dataset if flag == "--dataset" else prov.model) == name


@pytest.mark.parametrize("value", ["a\nb", "x\x1b[31m", "\t"])
def test_every_importer_refuses_a_source_model_or_dataset_with_control_characters(tmp_path, value):
    """The check every import makes before writing (``check_content``) holds the provenance's names too: here
    vllm, which takes both flags."""
    arr = np.array([[[0, 1]], [[2, 3]]], dtype=np.int64)
    src = tmp_path / "req0.npy"
    np.save(src, arr)
    for flag in ("--source-model", "--dataset"):
        out = tmp_path / "v.npz"
        code, _, err, _ = run_traces(
            "import", "vllm", src, "--model", "tiny-v", "--num-experts", 8, flag, value, "--out", out
        )
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert (flag in err) or ("data set" in err), err
        assert not out.exists()
