"""`traces import vllm FILE... --model NAME --num-experts N --out OUT`: vLLM's routed-experts output, one int array
[tokens, layers, top_k] per request, as ``.npy`` files (one request each), ``.npz`` archives (one array per request, in
archive order) or ``.jsonl`` lines (a nested list, or an object with ``routed_experts`` and optional ``request_id``,
``prompt_len``, ``routed_weights``). Rows are taken as decode tokens unless ``prompt_len`` (or ``--prompt-len``) says
how many lead as prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moebase.errors import InputError, brief
from traces.format import MAX_CONTEXT, ModelInfo, Provenance, Trace, TraceMeta, today
from traces.importers.common import (
    FLOAT16_MAX,
    TOOL,
    check_content,
    check_model_fit,
    check_model_name,
    check_num_experts,
    check_out,
    is_json_int,
    offsets_of,
    read_json_lines,
)
from traces.io import open_regular_file, open_zip, read_npy_entry, read_npy_file, save_trace

MAX_SOURCE_ARRAY_BYTES = 1 << 30
#: The most entries (one request each) a vLLM .npz may hold.
MAX_NPZ_ENTRIES = 1 << 16


def add_parser(fmt) -> None:
    """The ``vllm`` format's sub-command."""
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
    if not is_json_int(prompt_len) or not 0 <= prompt_len <= MAX_CONTEXT:
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
        offsets_of([r[1].shape[0] for r in requests]),
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
        for lineno, rec in read_json_lines(path, allow_lists=True):
            where = f"{path}:{lineno}"
            if isinstance(rec, list):
                rec = {"routed_experts": rec}
            if "routed_experts" not in rec:
                raise InputError(f"{where}: record has no field 'routed_experts'")
            arr = _routing_array(rec["routed_experts"], where, num_experts)
            w = rec.get("routed_weights")
            w = None if w is None else _weights(w, where)
            plen = rec.get("prompt_len", prompt_len)
            if not is_json_int(plen):
                raise InputError(f"{where}: field 'prompt_len' must be an integer")
            rid = rec.get("request_id", f"{path.stem}/{lineno}")
            if not (isinstance(rid, str) and rid) and not is_json_int(rid):
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


def _run_vllm(args) -> int:
    check_out(args.out, args.files)
    trace = import_vllm(args.files, args.model, args.num_experts, args.source_model, args.dataset, args.prompt_len)
    save_trace(trace, args.out)
    print(
        f"wrote {args.out}: {trace.num_tokens} tokens in {trace.num_requests} requests, "
        f"{trace.num_layers} layers, top-{trace.top_k}"
    )
    return 0
