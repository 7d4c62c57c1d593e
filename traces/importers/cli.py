"""`python -m traces import FORMAT FILE... --out OUT`: bring routing recorded elsewhere into the trace format.

Formats:

- ``mixtral-jsonl``: one JSON object per (request, layer, token), as in GitHub Mario928/speculative-moe's
``routing_data_collected/``:
  ``{"dataset", "problem_id", "layer", "experts": [...], "gating_probs": [...], "token_idx"}``. Records may be
  missing for some layers; tokens are aligned across layers by ``token_idx`` and a token missing in any layer
  is dropped (the count per request goes to the trace's ``extra.dropped_tokens`` and to the terminal).
- ``vllm``: vLLM's routed-experts output, one int array [tokens, layers, top_k] per request, as ``.npy`` files
  (one request each), ``.npz`` archives (one array per request, in archive order) or ``.jsonl`` lines (a nested
  list, or an object with ``routed_experts`` and optional ``request_id``, ``prompt_len``, ``routed_weights``).
  Rows are taken as decode tokens unless ``prompt_len`` (or ``--prompt-len``) says how many lead as prompt.
- ``expert-arrays`` (:mod:`traces.importers.arrays`): one ``.npz`` with ``expert_ids`` [tokens, layers, top_k], optional
  ``expert_probs`` (kept as weights) and ``request_offsets``, and a ``requests.json`` beside it whose plain
  per-request fields (data set, prompt length, ...) go to ``meta.request_info``; ``--datasets`` and
  ``--exclude-repetitive`` filter requests. Rows are decode tokens (as in gpt-oss-20b routing recorded with forward
  hooks).
- ``ft-log`` (:mod:`traces.importers.ftlog`): the ``permuted_experts_`` logs of the Pre-gated MoE FasterTransformer
  build (GitHub ceciliawinter/Pregated_MoE, ``expert_log/``): one line per MoE layer call with the sorted expert ids of
  its tokens; each run becomes one static batch of ``--batch`` requests, with encoder and decoder MoE layers.
  Each iteration's active set and tokens per expert are exact; which request chose which expert is not.
- ``kt-parquet`` (:mod:`traces.importers.ktparquet`): kTransformers per-token routing logs, Parquet with one row per
  forward token and MoE layer (``layer_id``, ``token_position``, ``expert_ids``, ``expert_weights``, ``context_id``);
  each request's two warm-up passes are dropped, its prefill pass becomes its prompt rows (in token order) and every
  later pass one decode row; ``--outputs`` checks the counts against the server's output JSONs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from traces.errors import InputError, brief
from traces.format import MAX_CONTEXT, ModelInfo, Provenance, Trace, TraceMeta, today
from traces.importers import arrays as import_arrays
from traces.importers import ftlog as import_ftlog
from traces.importers import ktparquet as import_ktparquet
from traces.importers.common import (
    bounded_lines,
    check_content,
    check_model_fit,
    check_model_name,
    check_out,
    show_list,
)
from traces.io import open_regular_file, open_zip, read_npy_entry, read_npy_file, save_trace
from traces.run_setup import add_hf_config_flag

TOOL = "traces import"
#: The longest JSON line read (a Mixtral record is about 150 bytes; a vLLM line holds one request's routing).
MAX_JSON_LINE_BYTES = 64 << 20
#: The largest JSON-lines file read, and the largest array (a .npy, or an entry of a .npz) read.
MAX_JSONL_BYTES = 1 << 30
MAX_SOURCE_ARRAY_BYTES = 1 << 30
#: The most entries (one request each) a vLLM .npz may hold.
MAX_NPZ_ENTRIES = 1 << 16
#: The highest MoE layer index a Mixtral record may give (layers run 0..the highest seen).
MAX_LAYER_INDEX = 4095
FLOAT16_MAX = float(np.finfo(np.float16).max)
INT16_MAX = int(np.iinfo(np.int16).max)


def register(sub) -> None:
    p = sub.add_parser("import", help="convert routing recorded by other tools into a trace file")
    fmt = p.add_subparsers(dest="format", required=True, metavar="FORMAT")

    m = fmt.add_parser("mixtral-jsonl", help="per-(request, layer, token) JSON lines with token_idx")
    m.add_argument("files", nargs="+", metavar="FILE", help="JSON-lines routing logs, imported together into one trace")
    m.add_argument("--out", "-o", required=True, help="trace file to write (.npz)")
    m.add_argument("--model", default="mixtral-8x7b", help="model name in the trace (default: %(default)s)")
    m.add_argument(
        "--source-model",
        default="neuralmagic/Mixtral-8x7B-Instruct-v0.1-FP8",
        help="the checkpoint that produced the routing (provenance.model)",
    )
    m.add_argument("--num-experts", type=int, default=8, help="experts per layer (default: %(default)s)")
    m.set_defaults(func=_run_mixtral)

    v = fmt.add_parser("vllm", help="vLLM routed-experts arrays [tokens, layers, top_k] per request")
    v.add_argument("files", nargs="+", metavar="FILE", help=".npy, .npz or .jsonl")
    v.add_argument("--out", "-o", required=True, help="trace file to write (.npz)")
    v.add_argument("--model", required=True, help="model name in the trace, e.g. qwen1.5-moe-a2.7b")
    v.add_argument("--num-experts", type=int, required=True, help="routed experts per MoE layer")
    v.add_argument("--source-model", default=None, help="checkpoint served by vLLM (default: --model)")
    v.add_argument("--dataset", default="unknown", help="data set the prompts came from")
    v.add_argument(
        "--prompt-len",
        type=int,
        default=0,
        help="leading rows of each request that are prompt tokens, where a record does not say",
    )
    v.set_defaults(func=_run_vllm)

    import_arrays.add_parser(fmt)
    import_ftlog.add_parser(fmt)
    import_ktparquet.add_parser(fmt)
    for parser in fmt.choices.values():  # every format: --hf-config, a profile and run config beside the trace
        add_hf_config_flag(parser)


# --------------------------------------------------------------------------------------------- mixtral-jsonl


def import_mixtral_jsonl(
    files: list[str | Path],
    model: str = "mixtral-8x7b",
    source_model: str = "neuralmagic/Mixtral-8x7B-Instruct-v0.1-FP8",
    num_experts: int = 8,
) -> tuple[Trace, dict[str, int]]:
    """Read per-(request, layer, token) JSON lines; return the trace and the dropped-token count per request."""
    check_model_name(model)
    check_num_experts(num_experts)
    rows: dict[tuple[str, object], dict[int, dict[int, tuple[list, list]]]] = defaultdict(lambda: defaultdict(dict))
    order: list[tuple[str, object]] = []
    top_k = None
    datasets: list[str] = []
    duplicates = 0
    for path in files:
        path = Path(path)
        for lineno, rec in _json_lines(path):
            where = f"{path}:{lineno}"
            for field in ("problem_id", "layer", "experts", "token_idx"):
                if field not in rec:
                    raise InputError(f"{where}: record has no field '{field}'")
            experts, probs = rec["experts"], rec.get("gating_probs")
            if not isinstance(experts, list) or not experts or not all(_is_int(x) for x in experts):
                raise InputError(f"{where}: field 'experts' must be a non-empty list of integers")
            top_k = top_k or len(experts)
            if len(experts) != top_k:
                raise InputError(f"{where}: field 'experts' has {len(experts)} ids, earlier records have {top_k}")
            if any(not 0 <= x < num_experts for x in experts):
                raise InputError(f"{where}: expert id outside 0..{num_experts - 1} (see --num-experts)")
            if len(set(experts)) != len(experts):
                raise InputError(f"{where}: field 'experts' repeats an expert ({brief(experts)})")
            if probs is not None and (
                not isinstance(probs, list) or len(probs) != top_k or not all(_is_weight(x) for x in probs)
            ):
                raise InputError(
                    f"{where}: field 'gating_probs' must be a list of {top_k} finite numbers within +-{FLOAT16_MAX:.0f}"
                )
            layer, tok = rec["layer"], rec["token_idx"]
            if (
                not _is_int(layer)
                or not 0 <= layer <= MAX_LAYER_INDEX
                or not _is_int(tok)
                or not 0 <= tok < MAX_CONTEXT
            ):
                raise InputError(
                    f"{where}: fields 'layer' and 'token_idx' must be integers >= 0 (layer at most "
                    f"{MAX_LAYER_INDEX}, token_idx below {MAX_CONTEXT})"
                )
            pid = rec["problem_id"]
            if not (isinstance(pid, str) or _is_int(pid)):
                raise InputError(f"{where}: field 'problem_id' must be a string or an integer, got {brief(pid)}")
            dataset = rec.get("dataset", path.stem)
            if not isinstance(dataset, str) or not dataset:
                raise InputError(f"{where}: field 'dataset' must be a non-empty string, got {brief(dataset)}")
            key = (dataset, pid)
            if key not in rows:
                order.append(key)
                if dataset not in datasets:
                    datasets.append(dataset)
            if tok in rows[key][layer]:
                duplicates += 1
                continue
            rows[key][layer][tok] = (experts, probs if probs is not None else [0.0] * top_k)
    if not order or top_k is None:
        raise InputError(f"{files[0]}: no routing records found")
    num_layers = 1 + max(max(layers) for layers in rows.values())

    experts_parts, weight_parts, lengths, dropped = [], [], [], {}
    for key in order:
        layers = rows[key]
        all_tokens = set().union(*(set(layers.get(layer, {})) for layer in range(num_layers)))
        kept = sorted(set.intersection(*(set(layers.get(layer, {})) for layer in range(num_layers))))
        req_id = f"{key[0]}/{key[1]}"
        dropped[req_id] = len(all_tokens) - len(kept)
        e = np.empty((len(kept), num_layers, top_k), dtype=np.int16)
        w = np.empty((len(kept), num_layers, top_k), dtype=np.float16)
        for layer in range(num_layers):
            per_tok = layers[layer]
            e[:, layer, :] = [per_tok[t][0] for t in kept]
            w[:, layer, :] = [per_tok[t][1] for t in kept]
        experts_parts.append(e)
        weight_parts.append(w)
        lengths.append(len(kept))
    meta = TraceMeta(
        model=ModelInfo.decoder_only(model, num_experts, top_k, num_layers),
        provenance=Provenance("imported", f"{TOOL} mixtral-jsonl", source_model or model, "+".join(datasets), today()),
        seed=None,
        request_ids=tuple(f"{k[0]}/{k[1]}" for k in order),
        extra={
            "source_files": [Path(f).name for f in files],
            "alignment": "layers aligned by token_idx; tokens missing in any layer dropped",
            "dropped_tokens": dropped,
            "duplicate_records_ignored": duplicates,
            "routing_of": "decode tokens only (no prefill recorded)",
        },
    )
    trace = Trace(
        np.concatenate(experts_parts),
        _offsets(lengths),
        np.zeros(len(lengths), np.int64),
        meta,
        np.concatenate(weight_parts),
    )
    check_model_fit(trace, str(files[0]))
    check_content(trace, str(files[0]))
    return trace, dropped


def _is_int(x) -> bool:
    """A JSON integer (true and false are not)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _is_weight(x) -> bool:
    """A JSON number a float16 weight can hold."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x)) and abs(x) <= FLOAT16_MAX


def check_num_experts(n) -> int:
    """``--num-experts``: 1..32767 (expert ids are int16)."""
    if not _is_int(n) or not 1 <= n <= INT16_MAX:
        raise InputError(f"--num-experts: must be between 1 and {INT16_MAX}, got {brief(n)}")
    return n


def _run_mixtral(args) -> int:
    check_out(args.out, args.files)
    trace, dropped = import_mixtral_jsonl(args.files, args.model, args.source_model, args.num_experts)
    save_trace(trace, args.out)
    total = sum(dropped.values())
    detail = show_list(f"{k}: {v}" for k, v in dropped.items())
    print(
        f"wrote {args.out}: {trace.num_tokens} tokens in {trace.num_requests} requests, "
        f"{trace.num_layers} layers, top-{trace.top_k}; dropped {total} tokens missing in some layer ({detail})"
    )
    return 0


# ----------------------------------------------------------------------------------------------------- vllm


def import_vllm(
    files: list[str | Path],
    model: str,
    num_experts: int,
    source_model: str | None = None,
    dataset: str = "unknown",
    prompt_len: int = 0,
) -> Trace:
    """Read vLLM routed-experts arrays (one [tokens, layers, top_k] array per request) into a trace."""
    check_model_name(model)
    check_num_experts(num_experts)
    if not _is_int(prompt_len) or not 0 <= prompt_len <= MAX_CONTEXT:
        raise InputError(f"--prompt-len: must be 0..{MAX_CONTEXT}, got {brief(prompt_len)}")
    if not isinstance(dataset, str) or not dataset.strip():
        raise InputError(f"--dataset: give a data set name, got {brief(dataset)}")
    requests: list[tuple[str, np.ndarray, np.ndarray | None, int]] = []
    for path in files:
        requests.extend(_vllm_requests(Path(path), prompt_len, num_experts))
    if not requests:
        raise InputError(f"{files[0]}: no requests found")
    shape = requests[0][1].shape[1:]
    for rid, arr, weights, plen in requests:
        if arr.shape[1:] != shape:
            raise InputError(
                f"{rid}: routed_experts has shape [*, {arr.shape[1]}, {arr.shape[2]}], "
                f"earlier requests have [*, {shape[0]}, {shape[1]}]"
            )
        if weights is not None and weights.shape != arr.shape:
            raise InputError(f"{rid}: routed_weights shape {list(weights.shape)} differs from routed_experts")
        if not 0 <= plen <= arr.shape[0]:
            raise InputError(f"{rid}: prompt_len {plen} outside 0..{arr.shape[0]}")
    if 0 in shape or shape[1] > num_experts:
        raise InputError(
            f"{requests[0][0]}: routed_experts has {shape[0]} layers and top-{shape[1]}; a trace needs at "
            f"least one layer and a top-k of 1..num_experts ({num_experts})"
        )
    has_weights = all(r[2] is not None for r in requests)
    meta = TraceMeta(
        model=ModelInfo.decoder_only(model, num_experts, int(shape[1]), int(shape[0])),
        provenance=Provenance("imported", f"{TOOL} vllm", source_model or model, dataset, today()),
        seed=None,
        request_ids=tuple(r[0] for r in requests),
        extra={"source_files": [Path(f).name for f in files]},
    )
    trace = Trace(
        np.concatenate([r[1] for r in requests]),
        _offsets([r[1].shape[0] for r in requests]),
        np.array([r[3] for r in requests], dtype=np.int64),
        meta,
        np.concatenate([r[2] for r in requests]) if has_weights else None,
    )
    check_model_fit(trace, str(files[0]), "--num-experts")
    check_content(trace, str(files[0]))
    return trace


def _vllm_requests(path: Path, prompt_len: int, num_experts: int):
    """(request id, int16 ids, float16 weights or None, prompt length) of each request in a file."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        yield (
            path.stem,
            _routing_array(read_npy_file(path, MAX_SOURCE_ARRAY_BYTES), str(path), num_experts),
            None,
            prompt_len,
        )
    elif suffix == ".npz":
        with open_zip(path, ".npz archive", MAX_NPZ_ENTRIES, not_zip="not a readable .npz archive") as zf:
            for name in zf.namelist():
                arr = read_npy_entry(zf, name, path, MAX_SOURCE_ARRAY_BYTES)
                stem = name[:-4] if name.endswith(".npy") else name
                yield f"{path.stem}/{stem}", _routing_array(arr, f"{path}:{brief(name)}", num_experts), None, prompt_len
    elif suffix in (".jsonl", ".json"):
        for lineno, rec in _json_lines(path, allow_lists=True):
            where = f"{path}:{lineno}"
            if isinstance(rec, list):
                rec = {"routed_experts": rec}
            if "routed_experts" not in rec:
                raise InputError(f"{where}: record has no field 'routed_experts'")
            arr = _routing_array(rec["routed_experts"], where, num_experts)
            w = rec.get("routed_weights")
            w = None if w is None else _weights(w, where)
            plen = rec.get("prompt_len", prompt_len)
            if not _is_int(plen):
                raise InputError(f"{where}: field 'prompt_len' must be an integer")
            rid = rec.get("request_id", f"{path.stem}/{lineno}")
            if not (isinstance(rid, str) and rid) and not _is_int(rid):
                raise InputError(
                    f"{where}: field 'request_id' must be a non-empty string or an integer, got {brief(rid)}"
                )
            yield str(rid), arr, w, plen
    else:
        open_regular_file(path, "routing file").close()  # a missing file, folder or FIFO: say so first
        raise InputError(f"{path}: unknown file type {brief(suffix)} (expected .npy, .npz or .jsonl)")


def _routing_array(a, where: str, num_experts: int) -> np.ndarray:
    """One request's routing as int16 [tokens, layers, top_k], ids in -1..num_experts-1, no expert twice in a
    token's top-k."""
    try:
        arr = np.asarray(a)
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise InputError(f"{where}: routed_experts is not a rectangular [tokens, layers, top_k] array") from None
    if arr.ndim != 3 or not (np.issubdtype(arr.dtype, np.integer) or (arr.size == 0 and arr.dtype.kind in "fiu")):
        raise InputError(
            f"{where}: routed_experts must be an integer array [tokens, layers, top_k], "
            f"got {arr.dtype} with shape {list(arr.shape)}"
        )
    if arr.size and (int(arr.min()) < -1 or int(arr.max()) >= num_experts):
        raise InputError(f"{where}: expert id outside -1..{num_experts - 1} (see --num-experts)")
    arr = arr.astype(np.int16)
    if arr.shape[2] > 1 and arr.size:
        s = np.sort(arr, axis=2)
        dup = ((s[:, :, 1:] == s[:, :, :-1]) & (s[:, :, 1:] >= 0)).any(axis=2)
        if dup.any():
            row, layer = (int(x) for x in np.argwhere(dup)[0])
            raise InputError(
                f"{where}: routed_experts repeats an expert within one token's top-k (row {row}, layer {layer})"
            )
    return arr


def _weights(w, where: str) -> np.ndarray:
    """routed_weights as float16, every value finite and within float16's range (checked before the cast)."""
    try:
        with np.errstate(all="ignore"):
            arr = np.asarray(w, dtype=np.float64)
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise InputError(f"{where}: routed_weights must be a rectangular array of numbers") from None
    if not np.isfinite(arr).all() or (arr.size and float(np.abs(arr).max()) > FLOAT16_MAX):
        raise InputError(
            f"{where}: routed_weights holds a value that is not finite or beyond float16's range (+-{FLOAT16_MAX:.0f})"
        )
    return arr.astype(np.float16)


# ---------------------------------------------------------------------------------------------------- shared


def _json_lines(path: Path, allow_lists: bool = False):
    """Yield (line number, parsed object) for each non-blank line; bad lines raise InputError naming the file and
    line. Only a regular file is read (a FIFO or device is refused unread), at most MAX_JSONL_BYTES, a line at most
    MAX_JSON_LINE_BYTES."""
    with open_regular_file(path, "JSON-lines file") as f:
        for lineno, raw in bounded_lines(f, path, MAX_JSONL_BYTES, MAX_JSON_LINE_BYTES, "JSON-lines file"):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}:{lineno}: not UTF-8 text (byte {exc.start})") from None
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            except RecursionError:
                raise InputError(f"{path}:{lineno}: not valid JSON (nests too deeply)") from None
            except ValueError as exc:  # an integer of more than 4300 digits
                raise InputError(f"{path}:{lineno}: not valid JSON ({brief(str(exc), 100)})") from None
            if not isinstance(rec, dict) and not (allow_lists and isinstance(rec, list)):
                raise InputError(f"{path}:{lineno}: expected a JSON object per line")
            yield lineno, rec


def _offsets(lengths: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _run_vllm(args) -> int:
    check_out(args.out, args.files)
    trace = import_vllm(args.files, args.model, args.num_experts, args.source_model, args.dataset, args.prompt_len)
    save_trace(trace, args.out)
    print(
        f"wrote {args.out}: {trace.num_tokens} tokens in {trace.num_requests} requests, "
        f"{trace.num_layers} layers, top-{trace.top_k}"
    )
    return 0
