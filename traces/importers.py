"""`python -m traces import FORMAT FILE... --out OUT`: bring routing recorded elsewhere into the trace format.

Formats:

- ``mixtral-jsonl``: one JSON object per (request, layer, token), as in GitHub Mario928/speculative-moe's ``routing_data_collected/``:
  ``{"dataset", "problem_id", "layer", "experts": [...], "gating_probs": [...], "token_idx"}``. Records may be
  missing for some layers; tokens are aligned across layers by ``token_idx`` and a token missing in any layer
  is dropped (the count per request goes to the trace's ``extra.dropped_tokens`` and to the terminal).
- ``vllm``: vLLM's routed-experts output, one int array [tokens, layers, top_k] per request, as ``.npy`` files
  (one request each), ``.npz`` archives (one array per request, in archive order) or ``.jsonl`` lines (a nested
  list, or an object with ``routed_experts`` and optional ``request_id``, ``prompt_len``, ``routed_weights``).
  Rows are taken as decode tokens unless ``prompt_len`` (or ``--prompt-len``) says how many lead as prompt.
- ``expert-arrays`` (:mod:`traces.import_arrays`): one ``.npz`` with ``expert_ids`` [tokens, layers, top_k], optional
  ``expert_probs`` (kept as weights) and ``request_offsets``, and a ``requests.json`` beside it whose plain
  per-request fields (data set, prompt length, ...) go to ``meta.request_info``; ``--datasets`` and
  ``--exclude-repetitive`` filter requests. Rows are decode tokens (as in gpt-oss-20b routing recorded with forward hooks).
- ``ft-log`` (:mod:`traces.import_ftlog`): the ``permuted_experts_`` logs of the Pre-gated MoE FasterTransformer
  build (GitHub ceciliawinter/Pregated_MoE, ``expert_log/``): one line per MoE layer call with the sorted expert ids of
  its tokens; each run becomes one static batch of ``--batch`` requests, with encoder and decoder MoE layers.
  Each iteration's active set and tokens per expert are exact; which request chose which expert is not.
"""

from __future__ import annotations

import json
import zipfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from traces import import_arrays, import_ftlog
from traces.errors import InputError
from traces.format import ModelInfo, Provenance, Trace, TraceMeta, today
from traces.io import save_trace

TOOL = "traces import"


def register(sub) -> None:
    p = sub.add_parser("import", help="convert routing recorded by other tools into a trace file")
    fmt = p.add_subparsers(dest="format", required=True, metavar="FORMAT")

    m = fmt.add_parser("mixtral-jsonl", help="per-(request, layer, token) JSON lines with token_idx")
    m.add_argument("files", nargs="+", metavar="FILE")
    m.add_argument("--out", "-o", required=True, help="trace file to write (.npz)")
    m.add_argument("--model", default="mixtral-8x7b", help="model name in the trace (default: %(default)s)")
    m.add_argument("--source-model", default="neuralmagic/Mixtral-8x7B-Instruct-v0.1-FP8",
                   help="the checkpoint that produced the routing (provenance.model)")
    m.add_argument("--num-experts", type=int, default=8, help="experts per layer (default: %(default)s)")
    m.set_defaults(func=_run_mixtral)

    v = fmt.add_parser("vllm", help="vLLM routed-experts arrays [tokens, layers, top_k] per request")
    v.add_argument("files", nargs="+", metavar="FILE", help=".npy, .npz or .jsonl")
    v.add_argument("--out", "-o", required=True, help="trace file to write (.npz)")
    v.add_argument("--model", required=True, help="model name in the trace, e.g. qwen1.5-moe-a2.7b")
    v.add_argument("--num-experts", type=int, required=True, help="routed experts per MoE layer")
    v.add_argument("--source-model", default=None, help="checkpoint served by vLLM (default: --model)")
    v.add_argument("--dataset", default="unknown", help="data set the prompts came from")
    v.add_argument("--prompt-len", type=int, default=0,
                   help="leading rows of each request that are prompt tokens, where a record does not say")
    v.set_defaults(func=_run_vllm)

    import_arrays.add_parser(fmt)
    import_ftlog.add_parser(fmt)


# --------------------------------------------------------------------------------------------- mixtral-jsonl

def import_mixtral_jsonl(files: list[str | Path], model: str = "mixtral-8x7b",
                         source_model: str = "neuralmagic/Mixtral-8x7B-Instruct-v0.1-FP8",
                         num_experts: int = 8) -> tuple[Trace, dict[str, int]]:
    """Read per-(request, layer, token) JSON lines; return the trace and the dropped-token count per request."""
    rows: dict[tuple[str, object], dict[int, dict[int, tuple[list, list]]]] = defaultdict(lambda: defaultdict(dict))
    order: list[tuple[str, object]] = []
    top_k = None
    datasets: list[str] = []
    duplicates = 0
    for path in files:
        path = Path(path)
        for lineno, rec in _json_lines(path):
            where = f"{path}:{lineno}"
            for key in ("problem_id", "layer", "experts", "token_idx"):
                if key not in rec:
                    raise InputError(f"{where}: record has no field '{key}'")
            experts, probs = rec["experts"], rec.get("gating_probs")
            if not isinstance(experts, list) or not experts or not all(isinstance(x, int) for x in experts):
                raise InputError(f"{where}: field 'experts' must be a non-empty list of integers")
            top_k = top_k or len(experts)
            if len(experts) != top_k:
                raise InputError(f"{where}: field 'experts' has {len(experts)} ids, earlier records have {top_k}")
            if probs is not None and (not isinstance(probs, list) or len(probs) != top_k):
                raise InputError(f"{where}: field 'gating_probs' must be a list of {top_k} numbers")
            if any(not 0 <= x < num_experts for x in experts):
                raise InputError(f"{where}: expert id outside 0..{num_experts - 1} (see --num-experts)")
            layer, tok = rec["layer"], rec["token_idx"]
            if not isinstance(layer, int) or layer < 0 or not isinstance(tok, int) or tok < 0:
                raise InputError(f"{where}: fields 'layer' and 'token_idx' must be integers >= 0")
            dataset = str(rec.get("dataset", path.stem))
            key = (dataset, rec["problem_id"])
            if key not in rows:
                order.append(key)
                if dataset not in datasets:
                    datasets.append(dataset)
            if tok in rows[key][layer]:
                duplicates += 1
                continue
            rows[key][layer][tok] = (experts, probs if probs is not None else [0.0] * top_k)
    if not order:
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
        provenance=Provenance("imported", f"{TOOL} mixtral-jsonl", source_model, "+".join(datasets), today()),
        seed=None,
        request_ids=tuple(f"{k[0]}/{k[1]}" for k in order),
        extra={"source_files": [Path(f).name for f in files],
               "alignment": "layers aligned by token_idx; tokens missing in any layer dropped",
               "dropped_tokens": dropped, "duplicate_records_ignored": duplicates,
               "routing_of": "decode tokens only (no prefill recorded)"},
    )
    trace = Trace(np.concatenate(experts_parts), _offsets(lengths), np.zeros(len(lengths), np.int64), meta,
                  np.concatenate(weight_parts))
    return trace, dropped


def _run_mixtral(args) -> int:
    trace, dropped = import_mixtral_jsonl(args.files, args.model, args.source_model, args.num_experts)
    save_trace(trace, args.out)
    total = sum(dropped.values())
    detail = ", ".join(f"{k}: {v}" for k, v in dropped.items())
    print(f"wrote {args.out}: {trace.num_tokens} tokens in {trace.num_requests} requests, "
          f"{trace.num_layers} layers, top-{trace.top_k}; dropped {total} tokens missing in some layer ({detail})")
    return 0


# ----------------------------------------------------------------------------------------------------- vllm

def import_vllm(files: list[str | Path], model: str, num_experts: int, source_model: str | None = None,
                dataset: str = "unknown", prompt_len: int = 0) -> Trace:
    """Read vLLM routed-experts arrays (one [tokens, layers, top_k] array per request) into a trace."""
    requests: list[tuple[str, np.ndarray, np.ndarray | None, int]] = []
    for path in files:
        requests.extend(_vllm_requests(Path(path), prompt_len))
    if not requests:
        raise InputError(f"{files[0]}: no requests found")
    shape = requests[0][1].shape[1:]
    for rid, arr, weights, plen in requests:
        if arr.shape[1:] != shape:
            raise InputError(f"{rid}: routed_experts has shape [*, {arr.shape[1]}, {arr.shape[2]}], "
                             f"earlier requests have [*, {shape[0]}, {shape[1]}]")
        if arr.size and (arr.min() < -1 or arr.max() >= num_experts):
            raise InputError(f"{rid}: expert id outside -1..{num_experts - 1} (see --num-experts)")
        if weights is not None and weights.shape != arr.shape:
            raise InputError(f"{rid}: routed_weights shape {list(weights.shape)} differs from routed_experts")
        if not 0 <= plen <= arr.shape[0]:
            raise InputError(f"{rid}: prompt_len {plen} outside 0..{arr.shape[0]}")
    has_weights = all(r[2] is not None for r in requests)
    meta = TraceMeta(
        model=ModelInfo.decoder_only(model, num_experts, int(shape[1]), int(shape[0])),
        provenance=Provenance("imported", f"{TOOL} vllm", source_model or model, dataset, today()),
        seed=None,
        request_ids=tuple(r[0] for r in requests),
        extra={"source_files": [Path(f).name for f in files]},
    )
    return Trace(
        np.concatenate([r[1] for r in requests]).astype(np.int16),
        _offsets([r[1].shape[0] for r in requests]),
        np.array([r[3] for r in requests], dtype=np.int64),
        meta,
        np.concatenate([r[2] for r in requests]).astype(np.float16) if has_weights else None,
    )


def _vllm_requests(path: Path, prompt_len: int):
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        yield path.stem, _routing_array(_load_npy(path), str(path)), None, prompt_len
    elif suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                for name in z.files:
                    yield f"{path.stem}/{name}", _routing_array(z[name], f"{path}:{name}"), None, prompt_len
        except (zipfile.BadZipFile, ValueError, OSError) as exc:
            raise InputError(f"{path}: not a readable .npz archive ({exc})") from None
    elif suffix in (".jsonl", ".json"):
        for lineno, rec in _json_lines(path, allow_lists=True):
            where = f"{path}:{lineno}"
            if isinstance(rec, list):
                rec = {"routed_experts": rec}
            if "routed_experts" not in rec:
                raise InputError(f"{where}: record has no field 'routed_experts'")
            arr = _routing_array(rec["routed_experts"], where)
            w = rec.get("routed_weights")
            w = None if w is None else np.asarray(w, dtype=np.float32)
            plen = rec.get("prompt_len", prompt_len)
            if not isinstance(plen, int):
                raise InputError(f"{where}: field 'prompt_len' must be an integer")
            yield str(rec.get("request_id", f"{path.stem}/{lineno}")), arr, w, plen
    else:
        raise InputError(f"{path}: unknown file type '{suffix}' (expected .npy, .npz or .jsonl)")


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{path}: not a readable .npy array ({exc})") from None


def _routing_array(a, where: str) -> np.ndarray:
    try:
        arr = np.asarray(a)
    except ValueError:
        raise InputError(f"{where}: routed_experts is not a rectangular [tokens, layers, top_k] array") from None
    if arr.ndim != 3 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise InputError(f"{where}: routed_experts must be an integer array [tokens, layers, top_k], "
                         f"got {arr.dtype} with shape {list(arr.shape)}")
    return arr.astype(np.int64)


# ---------------------------------------------------------------------------------------------------- shared

def _json_lines(path: Path, allow_lists: bool = False):
    """Yield (line number, parsed object) for each non-blank line; bad lines raise InputError."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(rec, dict) and not (allow_lists and isinstance(rec, list)):
                raise InputError(f"{path}:{lineno}: expected a JSON object per line")
            yield lineno, rec


def _offsets(lengths: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _run_vllm(args) -> int:
    trace = import_vllm(args.files, args.model, args.num_experts, args.source_model, args.dataset, args.prompt_len)
    save_trace(trace, args.out)
    print(f"wrote {args.out}: {trace.num_tokens} tokens in {trace.num_requests} requests, "
          f"{trace.num_layers} layers, top-{trace.top_k}")
    return 0
