"""`traces import kt-parquet FILE... --model NAME --out OUT.npz`: per-token routing logged by kTransformers.

The routing logs of a kTransformers/SGLang deployment (as the Qwen3.5-35B-A3B logs in GitHub r3ndd/ktransformers'
``data/traces/``, with the server's ``output_<prompt>.json`` beside them): Parquet files with one row per forward
token and MoE layer, in execution order:

- ``layer_id`` (integer, 0..L-1): the MoE layer;
- ``token_position`` (integer): the token's position inside its forward pass (restarting at 0 in every pass);
- ``expert_ids`` (list of integers, top-k long): the routed experts, in the router's rank order;
- ``expert_weights`` (list of floats, as long): their gate weights;
- ``context_id`` (string, optional): the request; ``token_category`` (string, optional): its prompt's category.
  Other columns (``token_id``, ``token_text``, ``timestamp``) are not read.

A forward pass starts where ``layer_id`` decreases. Inside a pass of several tokens (a prefill) the rows are
layer-major: layer 0 of every token, then layer 1, and so on. A request is the rows of one ``context_id`` (one
request per file when the column is absent or empty); its passes 0 and 1 are single-token warm-up passes (dropped),
pass 2 is the prefill (its tokens become the request's prompt rows, in token order) and every later pass is one
decode token (one decode row each; the first completion token comes out of the prefill, so a request with C
completion tokens has C - 1 decode passes). Requests come in the order the files are given, then in the order of
their rows. Expert ids keep the router's rank order, and the gate weights are kept (as float16).

``--outputs DIR_OR_FILE`` (repeatable) names the server's output JSONs (``output_<prompt>.json``: ``context_id``,
``trace_file``, ``usage.prompt_tokens`` and ``usage.completion_tokens``, at the top level or under
``raw_response``); a request is matched by its ``context_id`` (else, for a file of one request, by ``trace_file``)
and its prompt and completion counts must equal its prefill tokens and its decode passes + 1.

Every file is untrusted: it is opened only if it is a regular file, at most MAX_PARQUET_BYTES, its footer says at
most MAX_ROWS rows and MAX_UNCOMPRESSED_BYTES of data before anything is decoded, and every column, list length,
id, weight, layer and pass is checked. Any problem is one InputError naming the file (and the request, pass or
row: rows count from 0 in the file) and the problem; nothing is written.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from traces.errors import InputError, brief
from traces.format import MAX_CONTEXT, ModelInfo, Provenance, Trace, TraceMeta, today
from traces.importers.common import (
    check_content,
    check_model_fit,
    check_model_name,
    check_out,
    default_num_experts,
    offsets_from_lengths,
    read_bounded,
    read_json_file,
    show_list,
)

TOOL = "traces import kt-parquet"
REQUIRED = ("layer_id", "token_position", "expert_ids", "expert_weights")
OPTIONAL = ("context_id", "token_category")
#: Single-token passes that open every request (identical in every request, not part of it).
WARMUP_PASSES = 2
#: The largest Parquet file read, into memory (the real ones are at most 2.6 MB, 43,200 rows).
MAX_PARQUET_BYTES = 256 << 20
#: The most rows a file may say it holds, and the most data it may say its columns hold uncompressed: both read
#: from the footer before any column is decoded.
MAX_ROWS = 1 << 24
MAX_UNCOMPRESSED_BYTES = 4 << 30
#: The most MoE layers (layer_id 0..MAX_LAYERS-1) and the longest top-k list accepted.
MAX_LAYERS = 4096
MAX_TOP_K = 1024
#: The largest output JSON read, and the most JSON files a folder given to --outputs may hold.
MAX_OUTPUT_JSON_BYTES = 16 << 20
MAX_OUTPUT_FILES = 4096
#: The longest context_id or token_category kept (request names and categories go into the trace's metadata).
MAX_NAME_CHARS = 200
INT16_MAX = int(np.iinfo(np.int16).max)
FLOAT16_MAX = float(np.finfo(np.float16).max)
ROUTING_OF = (
    "prompt rows: each request's prefill pass (its layer-major rows put in token order); decode rows: one "
    "per later forward pass (the first completion token comes out of the prefill, so a request has "
    "completion_tokens - 1 decode rows); the two single-token warm-up passes of each request dropped"
)


def add_parser(fmt) -> None:
    """Register ``kt-parquet`` under ``traces import``."""
    p = fmt.add_parser(
        "kt-parquet", help="kTransformers per-token routing logs (Parquet, one row per token and MoE layer)"
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="Parquet logs (<prompt>_session.parquet), in request order")
    p.add_argument("--out", "-o", required=True, help="trace file to write (.npz)")
    p.add_argument("--model", required=True, help="model name in the trace, e.g. qwen3.5-35b-a3b")
    p.add_argument(
        "--outputs",
        action="append",
        default=None,
        metavar="DIR_OR_FILE",
        help="the server's output JSONs (a folder of *.json, or files; repeatable): each request's "
        "prompt and completion token counts are checked against its rows",
    )
    p.add_argument(
        "--num-experts",
        type=int,
        default=None,
        help="routed experts per MoE layer (default: the model's profile in configs/models/, else a "
        "numeric suffix of --model, else the largest id + 1)",
    )
    p.add_argument("--source-model", default=None, help="checkpoint that produced the routing (default: --model)")
    p.add_argument("--dataset", default=None, help="data set name for provenance (default: the requests' categories)")
    p.set_defaults(func=_run)


# --------------------------------------------------------------------------------------------- reading a file
@dataclass(frozen=True)
class LogRows:
    """One file's rows, checked column by column: layer, position int64 [n]; ids int64 [n, k]; weights float64
    [n, k]; per-row context codes int64 [n] into ``contexts`` (None: one request for the file); categories."""

    path: Path
    layer: np.ndarray
    position: np.ndarray
    ids: np.ndarray
    weights: np.ndarray
    context_codes: np.ndarray | None
    contexts: list[str]
    category_codes: np.ndarray | None
    categories: list[str]


def read_log(path: str | os.PathLike) -> LogRows:
    """Read and check one Parquet log; any problem raises InputError naming the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    data = read_bounded(path, MAX_PARQUET_BYTES, "Parquet log")
    if len(data) < 12 or data[:4] != b"PAR1" or data[-4:] != b"PAR1":
        raise InputError(f"{path}: not a Parquet file (no PAR1 magic at its start and end)")
    # read from memory, on this thread: no file handle for pyarrow's reads to outlive
    try:
        pf = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False)
        md = pf.metadata
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError, EOFError, MemoryError, IndexError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({_why(exc)})") from None
    _check_footer(md, path)
    columns = _check_schema(schema, path)
    try:
        table = pf.read(columns=columns, use_threads=False)
        table.validate(full=True)  # list offsets in bounds, strings valid UTF-8
    except (pa.ArrowException, OSError, ValueError, EOFError, MemoryError, IndexError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({_why(exc)})") from None
    n = table.num_rows
    if n != md.num_rows:
        raise InputError(f"{path}: its footer says {md.num_rows} rows but its columns hold {n}")
    if n == 0:
        raise InputError(f"{path}: no rows")
    layer = _int_column(table, "layer_id", path, MAX_LAYERS - 1)
    position = _int_column(table, "token_position", path, MAX_CONTEXT - 1)
    ids = _list_column(table, "expert_ids", path)
    weights = _list_column(table, "expert_weights", path)
    if weights.shape != ids.shape:
        raise InputError(
            f"{path}: expert_weights lists hold {weights.shape[1]} values, expert_ids lists {ids.shape[1]} (row 0)"
        )
    _check_ids(ids, path)
    _check_weights(weights, path)
    context_codes, contexts = _string_codes(table, "context_id", path, required=True)
    category_codes, categories = _string_codes(table, "token_category", path, required=False)
    return LogRows(path, layer, position, ids, weights, context_codes, contexts, category_codes, categories)


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {brief(text, 160)[1:-1]}" if text else type(exc).__name__


def _check_footer(md, path: Path) -> None:
    """Rows and uncompressed bytes (each row group's total) as the footer states them, bounded before anything is
    decoded."""
    if md.num_rows > MAX_ROWS:
        raise InputError(f"{path}: {md.num_rows} rows, more than the {MAX_ROWS} a Parquet log may have")
    total = 0
    for g in range(md.num_row_groups):  # row-group totals only: a column chunk's metadata object can abort
        total += max(int(md.row_group(g).total_byte_size), 0)  # the process on a corrupt footer (pyarrow 26)
    if total > MAX_UNCOMPRESSED_BYTES:
        raise InputError(
            f"{path}: its columns hold {total} bytes uncompressed, more than the "
            f"{MAX_UNCOMPRESSED_BYTES} a Parquet log may have"
        )


def _check_schema(schema, path: Path) -> list[str]:
    """The columns to read: every one of REQUIRED with its type, and those of OPTIONAL present (strings or
    nulls)."""
    import pyarrow.types as pt

    names = list(schema.names)
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise InputError(
            f"{path}: no column {', '.join(repr(c) for c in missing)} (has: {show_list(names)}); a "
            f"kTransformers routing log has {', '.join(REQUIRED)}"
        )
    for name in REQUIRED + OPTIONAL:
        if names.count(name) > 1:
            raise InputError(f"{path}: column {name!r} appears {names.count(name)} times")
    for name in ("layer_id", "token_position"):
        t = schema.field(name).type
        if not pt.is_integer(t):
            raise InputError(f"{path}: column {name!r} is {t}, expected integers")
    for name, ok, what in (("expert_ids", pt.is_integer, "integers"), ("expert_weights", pt.is_floating, "floats")):
        t = schema.field(name).type
        if not (pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t)) or not ok(t.value_type):
            raise InputError(f"{path}: column {name!r} is {t}, expected lists of {what}")
    for name in OPTIONAL:
        if name in names:
            t = schema.field(name).type
            if not (pt.is_string(t) or pt.is_large_string(t) or pt.is_null(t)):
                raise InputError(f"{path}: column {name!r} is {t}, expected strings")
    return list(REQUIRED) + [c for c in OPTIONAL if c in names]


def _first_null(arr) -> int:
    return int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])


def _int_column(table, name: str, path: Path, top: int) -> np.ndarray:
    arr = table.column(name).combine_chunks()
    if arr.null_count:
        raise InputError(f"{path}: column {name!r} is null at row {_first_null(arr)}")
    v = arr.to_numpy(zero_copy_only=False)
    bad = np.flatnonzero((v < 0) | (v > top))
    if bad.size:
        row = int(bad[0])
        raise InputError(f"{path}: {name} {int(v[row])} at row {row}, outside 0..{top}")
    return v.astype(np.int64)


def _list_column(table, name: str, path: Path) -> np.ndarray:
    """A list column whose lists all have one length k (1..MAX_TOP_K), without nulls, as [rows, k]."""
    import pyarrow.compute as pc

    arr = table.column(name).combine_chunks()
    n = len(arr)
    if arr.null_count:
        raise InputError(f"{path}: column {name!r} is null at row {_first_null(arr)}")
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    k = int(lengths[0])
    bad = np.flatnonzero(lengths != k)
    if bad.size:
        row = int(bad[0])
        raise InputError(
            f"{path}: {name} at row {row} holds {int(lengths[row])} values, row 0 holds {k} (every "
            f"row lists the top-k experts of one token in one layer)"
        )
    if not 1 <= k <= MAX_TOP_K:
        raise InputError(f"{path}: {name} lists hold {k} values; a top-k of 1..{MAX_TOP_K} is expected")
    values = pc.list_flatten(arr)
    if len(values) != n * k:
        raise InputError(f"{path}: column {name!r} holds {len(values)} values for {n} rows of {k}")
    if values.null_count:
        raise InputError(f"{path}: {name} at row {_first_null(values) // k} holds a null")
    return values.to_numpy(zero_copy_only=False).reshape(n, k)


def _check_ids(ids: np.ndarray, path: Path) -> None:
    bad = np.flatnonzero(((ids < 0) | (ids > INT16_MAX)).any(axis=1))
    if bad.size:
        row = int(bad[0])
        raise InputError(
            f"{path}: expert_ids at row {row} holds {brief(ids[row].tolist())}, ids must lie in 0..{INT16_MAX}"
        )
    if ids.shape[1] > 1:
        s = np.sort(ids, axis=1)
        dup = np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1))
        if dup.size:
            row = int(dup[0])
            raise InputError(f"{path}: expert_ids at row {row} repeats an expert ({brief(ids[row].tolist())})")


def _check_weights(w: np.ndarray, path: Path) -> None:
    with np.errstate(all="ignore"):
        bad = np.flatnonzero((~np.isfinite(w) | (np.abs(w) > FLOAT16_MAX)).any(axis=1))
    if bad.size:
        row = int(bad[0])
        raise InputError(
            f"{path}: expert_weights at row {row} holds a value that is not finite or beyond the range "
            f"of the trace's float16 weights (+-{FLOAT16_MAX:.0f})"
        )


def _string_codes(table, name: str, path: Path, required: bool) -> tuple[np.ndarray | None, list[str]]:
    """Per-row codes into the distinct values of a string column; (None, []) when the column is absent or all
    null. A column with some nulls is refused when ``required`` (every row needs its request), else ignored."""
    if name not in table.column_names:
        return None, []
    arr = table.column(name).combine_chunks()
    if arr.null_count == len(arr):
        return None, []
    if arr.null_count:
        if not required:
            return None, []
        raise InputError(
            f"{path}: {name} is null at row {_first_null(arr)} but set elsewhere (every row needs its request)"
        )
    enc = arr.dictionary_encode()
    values = enc.dictionary.to_pylist()
    for v in values:
        if not v or not v.isprintable() or len(v) > MAX_NAME_CHARS:
            raise InputError(f"{path}: {name} {brief(v)} is not a printable name of 1..{MAX_NAME_CHARS} characters")
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64), values


# --------------------------------------------------------------------------------------------- requests
@dataclass
class Request:
    """One request of a log: its routing (prompt in token order, then decode) and where it came from."""

    name: str
    context_id: str | None
    path: Path
    first_row: int
    category: str | None
    ids: np.ndarray  # int64 [P + D, L, k]
    weights: np.ndarray  # float64 [P + D, L, k]
    prompt: int
    decode: int
    output_file: str | None = None


def file_requests(log: LogRows) -> list[Request]:
    """The requests of one file, in row order: runs of one context_id (the whole file without one)."""
    n = log.layer.shape[0]
    if log.context_codes is None:
        runs: list[tuple[int, int, str | None]] = [(0, n, None)]
    else:
        c = log.context_codes
        starts = np.concatenate([[0], np.flatnonzero(c[1:] != c[:-1]) + 1])
        stops = np.concatenate([starts[1:], [n]])
        runs = []
        seen: dict[str, int] = {}
        for a, b in zip(starts.tolist(), stops.tolist()):
            name = log.contexts[int(c[a])]
            if name in seen:
                raise InputError(
                    f"{log.path}: context_id {brief(name)} at row {a} again, after other requests (it "
                    f"first starts at row {seen[name]}); a request's rows must be contiguous"
                )
            seen[name] = a
            runs.append((a, b, name))
    out = []
    for a, b, ctx in runs:
        category = None
        if log.category_codes is not None:
            cats = np.unique(log.category_codes[a:b])
            category = log.categories[int(cats[0])] if cats.size == 1 else None
        out.append(_request(log, a, b, ctx, category))
    return out


def _request(log: LogRows, a: int, b: int, ctx: str | None, category: str | None) -> Request:
    path = log.path
    name = ctx if ctx is not None else path.stem
    where = f"{path}: request {name}"
    layer, pos = log.layer[a:b], log.position[a:b]
    num_layers = int(layer.max()) + 1
    cuts = np.flatnonzero(layer[1:] < layer[:-1]) + 1
    bounds = np.concatenate([[0], cuts, [b - a]]).astype(np.int64)
    passes = bounds.size - 1
    if passes < WARMUP_PASSES + 1:
        raise InputError(
            f"{where}: {passes} forward pass{'es' if passes != 1 else ''} (a pass starts where layer_id "
            f"decreases); expected {WARMUP_PASSES} warm-up passes, a prefill pass, then decode passes"
        )
    for p in range(WARMUP_PASSES + 1):
        t = _check_pass(layer, pos, int(bounds[p]), int(bounds[p + 1]), num_layers, a, f"{where}: pass {p}")
        if p < WARMUP_PASSES and t != 1:
            raise InputError(
                f"{where}: pass {p} (rows {a + bounds[p]}..{a + bounds[p + 1] - 1}) holds {t} tokens; "
                f"the first {WARMUP_PASSES} passes of a request are single-token warm-up passes"
            )
    prompt = (int(bounds[WARMUP_PASSES + 1]) - int(bounds[WARMUP_PASSES])) // num_layers
    first_decode = int(bounds[WARMUP_PASSES + 1])
    decode = passes - WARMUP_PASSES - 1
    lengths = np.diff(bounds[WARMUP_PASSES + 1 :])
    tail = layer[first_decode:]
    ok = (
        (lengths == num_layers).all()
        and (tail.reshape(-1, num_layers) == np.arange(num_layers)).all()
        and not pos[first_decode:].any()
        if decode
        else True
    )
    if not ok:  # find the pass at fault and say what is wrong with it
        for p in range(WARMUP_PASSES + 1, passes):
            t = _check_pass(layer, pos, int(bounds[p]), int(bounds[p + 1]), num_layers, a, f"{where}: pass {p}")
            if t != 1:
                raise InputError(
                    f"{where}: pass {p} (rows {a + bounds[p]}..{a + bounds[p + 1] - 1}) holds {t} "
                    f"tokens; after the prefill (pass {WARMUP_PASSES}) every pass is one decode token"
                )
        raise AssertionError("a decode pass failed its check but no pass was found at fault")
    k = log.ids.shape[1]
    lo, hi = a + int(bounds[WARMUP_PASSES]), a + first_decode
    ids = np.concatenate(
        [log.ids[lo:hi].reshape(num_layers, prompt, k).transpose(1, 0, 2), log.ids[hi:b].reshape(decode, num_layers, k)]
    )
    weights = np.concatenate(
        [
            log.weights[lo:hi].reshape(num_layers, prompt, k).transpose(1, 0, 2),
            log.weights[hi:b].reshape(decode, num_layers, k),
        ]
    )
    return Request(name, ctx, path, a, category, ids, weights, prompt, decode)


def _check_pass(layer: np.ndarray, pos: np.ndarray, lo: int, hi: int, num_layers: int, base: int, where: str) -> int:
    """Rows lo..hi of a request as one forward pass: a whole number t of tokens, each passing layers
    0..num_layers-1 once, layer-major, with token_position 0..t-1 in each layer; returns t."""
    rows = f"rows {base + lo}..{base + hi - 1}"
    n = hi - lo
    if n % num_layers:
        raise InputError(
            f"{where} ({rows}): {n} rows, not a whole number of tokens x {num_layers} MoE layers (a pass "
            f"starts where layer_id decreases; every token of it passes every layer once)"
        )
    t = n // num_layers
    want = np.repeat(np.arange(num_layers), t)
    bad = np.flatnonzero(layer[lo:hi] != want)
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"{where} ({rows}): layer_id {int(layer[lo + i])} at row {base + lo + i}, expected "
            f"{int(want[i])} (the {t} token{'s' if t != 1 else ''} of a pass pass layers "
            f"0..{num_layers - 1} once each, layer-major)"
        )
    want = np.tile(np.arange(t), num_layers)
    bad = np.flatnonzero(pos[lo:hi] != want)
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"{where} ({rows}): token_position {int(pos[lo + i])} at row {base + lo + i}, expected "
            f"{int(want[i])} (positions restart at 0 in every forward pass, and a multi-token pass is "
            f"layer-major: layer 0 of all its tokens in order, then layer 1, ...)"
        )
    return t


# --------------------------------------------------------------------------------------------- output JSONs
@dataclass(frozen=True)
class Output:
    path: Path
    context_id: str | None
    trace_file: str | None
    prompt_tokens: int
    completion_tokens: int


def load_outputs(specs: list[str | os.PathLike]) -> list[Output]:
    """The output JSONs named by ``--outputs``: each a file, or a folder whose ``*.json`` files are read."""
    files: list[Path] = []
    for spec in specs:
        p = Path(spec)
        try:
            is_dir = p.is_dir()
        except (OSError, ValueError):
            is_dir = False
        if is_dir:
            try:
                found = sorted(x for x in p.iterdir() if x.name.endswith(".json"))
            except OSError as exc:
                raise InputError(f"--outputs {brief(str(p))}: cannot be listed ({exc.strerror or exc})") from None
            if not found:
                raise InputError(f"--outputs {brief(str(p))}: a folder without .json files")
            files.extend(found)
        else:
            files.append(p)
        if len(files) > MAX_OUTPUT_FILES:
            raise InputError(f"--outputs: more than {MAX_OUTPUT_FILES} output JSON files")
    return [_output(f) for f in files]


def _output(path: Path) -> Output:
    d = read_json_file(path, MAX_OUTPUT_JSON_BYTES, "output JSON file")
    if not isinstance(d, dict):
        raise InputError(f"{path}: expected a JSON object (a server output with usage.prompt_tokens)")
    usage = d.get("usage")
    if usage is None and isinstance(d.get("raw_response"), dict):
        usage = d["raw_response"].get("usage")
    if not isinstance(usage, dict):
        raise InputError(
            f"{path}: no 'usage' object (at the top level or under 'raw_response') with the prompt and "
            f"completion token counts"
        )
    counts = []
    for key in ("prompt_tokens", "completion_tokens"):
        v = usage.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_CONTEXT:
            raise InputError(f"{path}: usage.{key} must be an integer 0..{MAX_CONTEXT}, got {brief(v)}")
        counts.append(v)
    names = []
    for key in ("context_id", "trace_file"):
        v = d.get(key)
        if v is not None and not (isinstance(v, str) and v):
            raise InputError(f"{path}: field '{key}' must be a non-empty string, got {brief(v)}")
        names.append(v)
    return Output(path, names[0], names[1], counts[0], counts[1])


def match_outputs(requests: list[Request], outputs: list[Output], files_requests: dict[Path, int]) -> None:
    """Give each request its output JSON (by context_id, else by trace_file for a file of one request) and check
    its counts; InputError naming the request's file when one has none or disagrees."""
    by_ctx: dict[str, Output] = {}
    by_file: dict[str, Output] = {}
    for o in outputs:
        for key, table in ((o.context_id, by_ctx), (o.trace_file, by_file)):
            if key is None:
                continue
            if key in table and table[key].path != o.path:
                raise InputError(f"{o.path}: names {brief(key)} like {table[key].path}; which one belongs to it?")
            table[key] = o
    for r in requests:
        found = by_ctx.get(r.context_id) if r.context_id is not None else None
        if found is None and files_requests[r.path] == 1:
            found = by_file.get(r.path.name)
        if found is None:
            raise InputError(
                f"{r.path}: request {r.name}: no output JSON in --outputs has context_id {brief(r.name)}"
                f"{'' if files_requests[r.path] != 1 else f' or trace_file {brief(r.path.name)}'} "
                f"({len(outputs)} read)"
            )
        o = found
        if o.prompt_tokens != r.prompt:
            raise InputError(
                f"{r.path}: request {r.name}: its prefill pass holds {r.prompt} tokens but {o.path} says "
                f"prompt_tokens {o.prompt_tokens}"
            )
        if o.completion_tokens - 1 != r.decode:
            raise InputError(
                f"{r.path}: request {r.name}: {r.decode} decode passes but {o.path} says "
                f"completion_tokens {o.completion_tokens} (expected {o.completion_tokens - 1} decode "
                f"passes: the first completion token comes out of the prefill)"
            )
        r.output_file = o.path.name


# --------------------------------------------------------------------------------------------- building
def import_kt_parquet(
    files: list[str | os.PathLike],
    model: str,
    num_experts: int | None = None,
    outputs: list[str | os.PathLike] | None = None,
    source_model: str | None = None,
    dataset: str | None = None,
) -> tuple[Trace, dict]:
    """Read kTransformers Parquet logs into a trace (prompt rows from each prefill pass, a decode row per later
    pass); returns the trace and a summary (for the terminal)."""
    check_model_name(model)
    if num_experts is not None and (
        isinstance(num_experts, bool)
        or not isinstance(num_experts, (int, np.integer))
        or not 1 <= num_experts <= INT16_MAX
    ):
        raise InputError(f"--num-experts: must be between 1 and {INT16_MAX}, got {brief(num_experts)}")
    if dataset is not None and (not isinstance(dataset, str) or not dataset.strip()):
        raise InputError(f"--dataset: give a data set name, got {brief(dataset)}")
    if not files:
        raise InputError("give at least one Parquet file")
    out_list = load_outputs(outputs) if outputs else None
    requests: list[Request] = []
    per_file: dict[Path, int] = {}
    shape: tuple[int, int, Path] | None = None  # (layers, top-k, file)
    seen: dict[str, Path] = {}
    largest = -1
    for f in files:
        log = read_log(f)
        reqs = file_requests(log)
        for r in reqs:
            here = (r.ids.shape[1], r.ids.shape[2])
            if shape is None:
                shape = (*here, log.path)
            elif here != shape[:2]:
                raise InputError(
                    f"{log.path}: request {r.name} has {here[0]} MoE layers and top-{here[1]}, "
                    f"{shape[2]} has {shape[0]} and top-{shape[1]}"
                )
            if r.name in seen:
                raise InputError(
                    f"{log.path}: request {brief(r.name)} again (also in {seen[r.name]}); every request "
                    f"is imported once"
                )
            seen[r.name] = log.path
        if log.path in per_file:
            raise InputError(f"{log.path}: given twice")
        per_file[log.path] = len(reqs)
        largest = max(largest, int(log.ids.max()))
        requests.extend(reqs)
    if out_list is not None:
        match_outputs(requests, out_list, per_file)
    if shape is None:
        raise InputError(f"{files[0]}: no requests found")
    num_layers, top_k = shape[0], shape[1]

    if num_experts is not None:
        experts, source = int(num_experts), "--num-experts"
    else:
        experts, source = default_num_experts(model, largest)
    for r in requests if largest >= experts else ():  # name the first request and token with an id beyond
        beyond = np.flatnonzero((r.ids >= experts).any(axis=(1, 2)))
        if beyond.size:
            t = int(beyond[0])
            token = f"prompt token {t}" if t < r.prompt else f"decode step {t - r.prompt}"
            raise InputError(
                f"{r.path}: request {r.name}: {token} routes to expert {int(r.ids[t].max())}, outside "
                f"0..{experts - 1} (num_experts {experts} from {source}; see --num-experts)"
            )
    if top_k > experts:
        raise InputError(f"{files[0]}: top-{top_k} exceeds num_experts {experts} (from {source}; see --num-experts)")

    lengths = [r.prompt + r.decode for r in requests]
    categories = [r.category for r in requests]
    known = [c for c in dict.fromkeys(categories) if c]
    info: dict[str, list[Any]] = {
        "context_id": [r.context_id for r in requests],
        "source_file": [r.path.name for r in requests],
        "category": categories,
        "prompt_len": [r.prompt for r in requests],
        "completion_tokens": [r.decode + 1 for r in requests],
        "output_file": [r.output_file for r in requests],
    }
    meta = TraceMeta(
        model=ModelInfo.decoder_only(model, experts, top_k, num_layers),
        provenance=Provenance(
            "imported", TOOL, source_model or model, dataset or "+".join(known) or "unknown", today()
        ),
        seed=None,
        request_ids=tuple(r.name for r in requests),
        extra={
            "source_files": [Path(f).name for f in files],
            "routing_of": ROUTING_OF,
            "warmup_passes_dropped": WARMUP_PASSES * len(requests),
            "num_experts_from": source,
            "counts_checked_against": "output JSONs (usage.prompt_tokens, usage.completion_tokens)"
            if out_list is not None
            else "nothing (no --outputs given)",
        },
        request_info=info,
    )
    weights = np.concatenate([r.weights for r in requests]).astype(np.float16)
    trace = Trace(
        np.concatenate([r.ids for r in requests]).astype(np.int16),
        offsets_from_lengths(lengths),
        np.array([r.prompt for r in requests], dtype=np.int64),
        meta,
        weights,
    )
    check_model_fit(trace, str(files[0]), source)
    check_content(trace, str(files[0]))
    summary = {
        "requests": len(requests),
        "prompt_tokens": sum(r.prompt for r in requests),
        "decode_tokens": sum(r.decode for r in requests),
        "num_experts_from": source,
        "outputs_checked": out_list is not None,
        "per_request": [(r.name, r.prompt, r.decode) for r in requests],
    }
    return trace, summary


def _run(args) -> int:
    from traces.io import save_trace

    t0 = time.perf_counter()
    check_out(args.out, list(args.files) + [o for o in (args.outputs or []) if not Path(o).is_dir()])
    check_model_name(args.model)
    trace, s = import_kt_parquet(
        args.files, args.model, args.num_experts, args.outputs, args.source_model, args.dataset
    )
    save_trace(trace, args.out)
    checked = "checked against the output JSONs" if s["outputs_checked"] else "not checked (no --outputs)"
    print(
        f"wrote {args.out}: {trace.num_tokens} tokens ({s['prompt_tokens']} prompt, {s['decode_tokens']} decode) "
        f"in {trace.num_requests} requests, {trace.num_layers} layers, top-{trace.top_k} of {trace.num_experts} "
        f"experts (from {s['num_experts_from']}); {WARMUP_PASSES * trace.num_requests} warm-up passes dropped; "
        f"counts {checked}; {time.perf_counter() - t0:.1f} s"
    )
    if not s["outputs_checked"]:
        print(
            "note: give --outputs to check each request's prompt and completion counts against the server's",
            file=sys.stderr,
        )
    return 0
