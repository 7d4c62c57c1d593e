"""`traces import expert-arrays FILE.npz --model NAME --out OUT.npz`: routing saved as plain numpy arrays.

Input, an ``.npz`` archive holding:

- ``expert_ids``: integer [tokens, layers, top_k], the experts each token was routed to in each MoE layer
  (highest router weight first; -1 where a token has no routing in a layer);
- ``expert_probs`` (optional): float, the same shape, their router weights (kept as the trace's ``weights``);
- ``request_offsets`` (optional): integer [requests + 1], request r owns rows ``offsets[r]:offsets[r+1]``;
  without it all rows are one request.

and, optionally, ``requests.json`` beside it (or ``--requests-json``; ``--no-requests-json`` ignores one): a JSON
list with one object per request, in the same order, e.g. ``{"dataset", "category", "prompt_len",
"n_decode_steps", "has_repetition", ...}`` (as in the gpt-oss-20b routing of GitHub
AmanPriyanshu/GPT-OSS-MoE-ExpertFingerprinting, converted to arrays). Its plain fields (strings, numbers, bools,
nulls) go into the trace's ``meta.request_info`` as one column per field, with ``source_index``
(the request's position in the source); fields holding lists or objects (e.g. ``decode_tokens``) are left out and
named in ``extra.request_fields_left_out``. Where an entry says ``n_decode_steps`` it must equal its row count.

Every row is taken as a decode token (one per decode step): such sources keep no prompt rows, so the trace's
prefill lengths are 0 and the prompt length the source reports stays in ``request_info.prompt_len``.
``--datasets a,b`` keeps the requests of those data sets and ``--exclude-repetitive`` drops the ones whose
``has_repetition`` is true (both need requests.json). Requests without rows are dropped (with a note): they
would cost every replay time and memory and route nothing.

Everything in the source is untrusted: the archive is read like a trace file (:func:`traces.io.read_npy_entry`:
plain zip entries, npy headers sized before anything is allocated, at most MAX_SOURCE_ARRAY_BYTES per array),
requests.json is parsed with bounds (size, nesting, fields), and the trace must be one its model can run
(:func:`traces.importers.common.check_model_fit`). Any problem is one InputError naming the file (and entry or
field); nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moebase.errors import InputError, brief
from traces.format import INT_MAX, MAX_CONTEXT, MAX_REQUESTS, ModelInfo, Provenance, Trace, TraceMeta, today
from traces.importers.common import (
    check_content,
    check_model_fit,
    check_model_name,
    check_out,
    default_num_experts,
    offsets_from_lengths,
    read_json_file,
    rows_of_requests,
    show_list,
)
from traces.io import open_regular_file, open_zip, read_npy_entry

TOOL = "traces import expert-arrays"
REQUESTS_JSON = "requests.json"
ARRAYS = ("expert_ids", "expert_probs", "request_offsets")
#: The largest array read from a source archive, uncompressed (the gpt-oss-20b routing's largest is 30 MB): a
#: zip entry or npy header claiming more is refused before anything is inflated or allocated.
MAX_SOURCE_ARRAY_BYTES = 1 << 30
#: The most entries a source archive may hold (it needs three).
MAX_SOURCE_ENTRIES = 256
#: The largest requests.json read (the gpt-oss-20b one, with every decoded token, is 1.4 MB).
MAX_REQUESTS_JSON_BYTES = 64 << 20
#: The most distinct fields the entries of a requests.json may have (each becomes a column of request_info).
MAX_REQUEST_FIELDS = 256
#: The largest magnitude a float16 weight can hold.
FLOAT16_MAX = float(np.finfo(np.float16).max)


@dataclass(frozen=True)
class RoutingArrays:
    """The arrays of one source archive, checked: ids int16 [T, L, k], probs (floats) or None, offsets int64."""

    ids: np.ndarray
    probs: np.ndarray | None
    offsets: np.ndarray
    ignored: tuple[str, ...]  # other arrays in the archive, not used


@dataclass(frozen=True)
class ImportReport:
    """What an import kept and how it chose: for the terminal and the trace's ``extra``."""

    requests_in_source: int
    requests_kept: int
    num_experts_from: str
    empty_requests_dropped: int = 0


def add_parser(fmt) -> None:
    """Register ``expert-arrays`` under ``traces import``."""
    a = fmt.add_parser(
        "expert-arrays", help="numpy expert_ids [tokens, layers, top_k] (+ probs, offsets, requests.json)"
    )
    a.add_argument("file", metavar="FILE", help=".npz with expert_ids, optional expert_probs and request_offsets")
    a.add_argument("--out", "-o", required=True, help="trace file to write (.npz)")
    a.add_argument("--model", required=True, help="model name in the trace, e.g. gpt-oss-20b")
    a.add_argument(
        "--num-experts",
        type=int,
        default=None,
        help="routed experts per MoE layer (default: the model's profile in configs/models/, else a "
        "numeric suffix of --model, else the largest id + 1)",
    )
    a.add_argument("--source-model", default=None, help="checkpoint that produced the routing (default: --model)")
    a.add_argument(
        "--requests-json",
        default=None,
        help=f"per-request metadata (default: {REQUESTS_JSON} beside FILE, when there is one)",
    )
    a.add_argument("--no-requests-json", action="store_true", help=f"ignore a {REQUESTS_JSON} beside FILE")
    a.add_argument("--datasets", default=None, help="keep only requests of these data sets (comma list)")
    a.add_argument("--exclude-repetitive", action="store_true", help="drop requests whose has_repetition is true")
    a.add_argument(
        "--dataset",
        default="unknown",
        help="data set name for provenance when requests.json does not name one (default: %(default)s)",
    )
    a.set_defaults(func=_run)


# --------------------------------------------------------------------------------------------- reading
def load_routing_arrays(path: Path) -> RoutingArrays:
    """Read and check the arrays of a source ``.npz``; bad input raises InputError naming the file (and entry)."""
    _refuse_single_npy(path)
    with open_zip(path, ".npz archive", MAX_SOURCE_ENTRIES, not_zip="not a readable .npz archive") as zf:
        members = _members(zf, path)
        if "expert_ids" not in members:
            raise InputError(f"{path}: no array 'expert_ids' (has: {show_list(members)})")
        arrays = {
            name: read_npy_entry(zf, members[name], path, MAX_SOURCE_ARRAY_BYTES) for name in ARRAYS if name in members
        }
    ids = _check_ids(arrays["expert_ids"], path)
    probs = arrays.get("expert_probs")
    probs = None if probs is None else _check_probs(probs, ids.shape, path)
    offsets = _check_offsets(arrays.get("request_offsets"), ids.shape[0], path)
    ignored = tuple(n for n in members if n not in ARRAYS)
    return RoutingArrays(ids, probs, offsets, ignored)


def _refuse_single_npy(path: Path) -> None:
    """A lone ``.npy`` array (what np.save writes) is not a source: say so rather than "not a zip"."""
    with open_regular_file(path, ".npz archive") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        raise InputError(f"{path}: a single array, expected an .npz archive with expert_ids (np.savez)")


def _members(zf, path: Path) -> dict[str, str]:
    """Array name -> entry name of an archive (``expert_ids.npy`` and ``expert_ids`` both name ``expert_ids``, as
    numpy reads them); an archive naming one array twice is refused."""
    out: dict[str, str] = {}
    for entry in zf.namelist():
        name = entry[:-4] if entry.endswith(".npy") else entry
        if name in out:
            raise InputError(f"{path}: entries {brief(out[name])} and {brief(entry)} both hold array {brief(name)}")
        out[name] = entry
    return out


def _check_ids(ids: np.ndarray, path: Path) -> np.ndarray:
    """expert_ids as int16 [T, L, k]: integer, three axes, no empty axis, ids in -1..32767, no repeat in a row."""
    if ids.ndim != 3 or not np.issubdtype(ids.dtype, np.integer):
        raise InputError(
            f"{path}: expert_ids must be an integer array [tokens, layers, top_k], "
            f"got {ids.dtype} with shape {list(ids.shape)}"
        )
    if 0 in ids.shape:
        raise InputError(f"{path}: expert_ids is empty (shape {list(ids.shape)})")
    low, high = int(ids.min()), int(ids.max())
    if low < -1 or high > np.iinfo(np.int16).max:
        bad = low if low < -1 else high
        row = int(np.argwhere((ids == bad).any(axis=(1, 2)))[0][0])
        raise InputError(
            f"{path}: expert_ids holds id {bad} (row {row}); ids are 0..{np.iinfo(np.int16).max}, or -1 for no routing"
        )
    ids = ids.astype(np.int16)
    if ids.shape[2] > 1:
        s = np.sort(ids, axis=2)
        dup = ((s[:, :, 1:] == s[:, :, :-1]) & (s[:, :, 1:] >= 0)).any(axis=2)
        if dup.any():
            row, layer = (int(x) for x in np.argwhere(dup)[0])
            raise InputError(
                f"{path}: expert_ids repeats an expert within one token's top-k (row {row}, layer {layer})"
            )
    return ids


def _check_probs(probs: np.ndarray, shape: tuple, path: Path) -> np.ndarray:
    """expert_probs: floats of the ids' shape, every value finite."""
    if not np.issubdtype(probs.dtype, np.floating) or probs.shape != shape:
        raise InputError(
            f"{path}: expert_probs must be a float array shaped like expert_ids {list(shape)}, "
            f"got {probs.dtype} with shape {list(probs.shape)}"
        )
    if not np.isfinite(probs).all():
        row = int(np.argwhere(~np.isfinite(probs).all(axis=(1, 2)))[0][0])
        raise InputError(f"{path}: expert_probs holds a value that is not finite (row {row})")
    return probs


def _check_offsets(offsets: np.ndarray | None, tokens: int, path: Path) -> np.ndarray:
    """request_offsets as int64 [R + 1] from 0 to the row count, non-decreasing, at most MAX_REQUESTS requests;
    one request when absent."""
    if offsets is None:
        return np.array([0, tokens], dtype=np.int64)
    if offsets.ndim != 1 or offsets.shape[0] < 2 or not np.issubdtype(offsets.dtype, np.integer):
        raise InputError(
            f"{path}: request_offsets must be an integer array [requests + 1], "
            f"got {offsets.dtype} with shape {list(offsets.shape)}"
        )
    if offsets.shape[0] - 1 > MAX_REQUESTS:
        raise InputError(
            f"{path}: request_offsets holds {offsets.shape[0] - 1} requests, more than the "
            f"{MAX_REQUESTS} a trace may hold"
        )
    if int(offsets[0]) != 0 or int(offsets[-1]) != tokens:
        raise InputError(
            f"{path}: request_offsets must run from 0 to the {tokens} rows of expert_ids, "
            f"got {int(offsets[0])}..{int(offsets[-1])}"
        )
    if int(offsets.min()) < 0 or int(offsets.max()) > tokens or (np.diff(offsets.astype(np.int64)) < 0).any():
        raise InputError(f"{path}: request_offsets must be non-decreasing")
    return offsets.astype(np.int64)


def find_requests_json(path: Path, given: str | None, ignore: bool) -> Path | None:
    """The requests.json to read: the one given, else the one beside ``path`` (unless ignored), else None."""
    if given is not None:
        if ignore:
            raise InputError("--requests-json and --no-requests-json: give one or the other")
        return Path(given)  # read as a regular file, or refused saying what it is
    beside = path.parent / REQUESTS_JSON
    return beside if not ignore and _exists(beside) else None


def _exists(path: Path) -> bool:
    """Whether anything is at ``path`` (a folder or FIFO there is then refused when read, not ignored)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def load_requests_json(path: Path, lengths: np.ndarray) -> list[dict]:
    """The entries of a requests.json, one object per request, checked against the requests' row counts."""
    entries = read_json_file(path, MAX_REQUESTS_JSON_BYTES, "requests.json file")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InputError(f"{path}: expected a JSON list with one object per request")
    if len(entries) != len(lengths):
        raise InputError(f"{path}: has {len(entries)} entries but the routing has {len(lengths)} requests")
    fields = dict.fromkeys(k for e in entries for k in e)
    if len(fields) > MAX_REQUEST_FIELDS:
        raise InputError(
            f"{path}: its entries have {len(fields)} different fields, more than the "
            f"{MAX_REQUEST_FIELDS} an import keeps"
        )
    for i, e in enumerate(entries):
        _check_entry(e, i, int(lengths[i]), path)
    return entries


def _check_entry(e: dict, i: int, rows: int, path: Path) -> None:
    """The fields an import relies on, where present: dataset, has_repetition, prompt_len (an integer within
    MAX_CONTEXT: the simulator sizes the request's KV cache from it), n_decode_steps; and every field name and
    plain string value valid Unicode (the trace's metadata must be writable as UTF-8)."""
    for key, v in e.items():
        if not _unicode(key) or (isinstance(v, str) and not _unicode(v)):
            raise InputError(f"{path}: entry {i}: field {brief(key)} holds text that is not valid Unicode")
    if "dataset" in e and (not isinstance(e["dataset"], str) or not e["dataset"]):
        raise InputError(f"{path}: entry {i}: field 'dataset' must be a non-empty string, got {brief(e['dataset'])}")
    if "has_repetition" in e and not isinstance(e["has_repetition"], bool):
        raise InputError(f"{path}: entry {i}: field 'has_repetition' must be true or false")
    for key, top in (("prompt_len", MAX_CONTEXT), ("n_decode_steps", None)):
        v = e.get(key)
        if key in e and (isinstance(v, bool) or not isinstance(v, int) or v < 0 or (top is not None and v > top)):
            bound = f"0..{top}" if top is not None else ">= 0"
            raise InputError(f"{path}: entry {i}: field '{key}' must be an integer {bound} (tokens), got {brief(v)}")
    if "n_decode_steps" in e and e["n_decode_steps"] != rows:
        raise InputError(
            f"{path}: entry {i}: n_decode_steps {e['n_decode_steps']} but request {i} has {rows} "
            f"rows in the routing (does this requests.json belong to these arrays?)"
        )


def _unicode(text) -> bool:
    """Whether ``text`` (when a string) can be written as UTF-8 (JSON's \\ud800 escapes make lone surrogates)."""
    if not isinstance(text, str):
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --------------------------------------------------------------------------------------------- choosing
def select_requests(
    entries: list[dict] | None, n: int, datasets: list[str] | None, exclude_repetitive: bool, where: str
) -> np.ndarray:
    """int64 indices of the requests to keep, in source order, after the ``--datasets`` and
    ``--exclude-repetitive`` filters. ``where`` names the requests.json (the routing file when there is none) in
    messages."""
    keep = np.ones(n, dtype=bool)
    if (datasets is not None or exclude_repetitive) and entries is None:
        flag = "--datasets" if datasets is not None else "--exclude-repetitive"
        raise InputError(
            f"{flag}: needs per-request metadata: put {REQUESTS_JSON} beside {where} or give --requests-json"
        )
    if datasets is not None:
        assert entries is not None  # checked above
        have = [e.get("dataset") for e in entries]
        known = list(dict.fromkeys(d for d in have if d is not None))
        unknown = [d for d in datasets if d not in known]
        if unknown:
            raise InputError(f"--datasets: unknown data set {brief(unknown[0])} in {where} (known: {show_list(known)})")
        chosen = set(datasets)
        keep &= np.array([d in chosen for d in have], dtype=bool)
    if exclude_repetitive:
        assert entries is not None  # checked above
        if any("has_repetition" not in e for e in entries):
            i = next(i for i, e in enumerate(entries) if "has_repetition" not in e)
            raise InputError(f"--exclude-repetitive: {where}: entry {i} has no field 'has_repetition'")
        keep &= ~np.array([e["has_repetition"] for e in entries], dtype=bool)
    kept = np.flatnonzero(keep).astype(np.int64)
    if kept.size == 0:
        raise InputError(f"{where}: no requests left after {_filters(datasets, exclude_repetitive)}")
    return kept


def _filters(datasets: list[str] | None, exclude_repetitive: bool) -> str:
    """The filters given, for a message: ``--datasets a, b --exclude-repetitive``."""
    parts = ([f"--datasets {show_list(datasets)}"] if datasets is not None else []) + (
        ["--exclude-repetitive"] if exclude_repetitive else []
    )
    return " ".join(parts) or "reading it"


def drop_empty(
    kept: np.ndarray, lengths: np.ndarray, where: str, datasets: list[str] | None, exclude_repetitive: bool
) -> np.ndarray:
    """The kept requests that have rows (an empty request routes nothing but costs every replay); InputError
    when none has: a trace without tokens has nothing to simulate."""
    full = kept[lengths[kept] > 0]
    if full.size == 0:
        if datasets is not None or exclude_repetitive:
            raise InputError(
                f"{where}: no tokens left after {_filters(datasets, exclude_repetitive)} (the "
                f"{kept.size} requests kept have no rows)"
            )
        raise InputError(f"{where}: no tokens: every one of its {kept.size} requests has no rows")
    return full


def request_columns(entries: list[dict], kept: np.ndarray) -> tuple[dict[str, list], list[str]]:
    """``request_info`` columns of the kept requests (``source_index`` first, then every field whose values are
    plain as the trace format defines it: strings, finite numbers, integers within 64 bits, bools, nulls; missing
    values are null), and the names of fields left out because some value is not (a list, an object, NaN, an
    integer beyond 64 bits), or because the name is empty."""
    fields = list(dict.fromkeys(k for e in entries for k in e))
    left_out = [f for f in fields if not f or any(not _plain(e.get(f)) for e in entries)]
    columns = {"source_index": kept.tolist()}
    for f in fields:
        if f not in left_out and f != "source_index":
            columns[f] = [entries[i].get(f) for i in kept.tolist()]
    return columns, left_out


def _plain(v) -> bool:
    """A value the trace format keeps in request_info."""
    if v is None or isinstance(v, (str, bool)):
        return True
    if isinstance(v, int):
        return -INT_MAX - 1 <= v <= INT_MAX
    return isinstance(v, float) and bool(np.isfinite(v))


def _request_ids(entries: list[dict] | None, kept: np.ndarray, stem: str) -> tuple[str, ...]:
    """Request names: an entry's ``request_id`` when it has one, else ``DATASET/INDEX`` or ``FILE/INDEX``."""
    ids = []
    for i in kept.tolist():
        e = entries[i] if entries is not None else {}
        rid = e.get("request_id")
        ids.append(rid if isinstance(rid, str) and rid else f"{e.get('dataset') or stem}/{i}")
    return tuple(ids)


# --------------------------------------------------------------------------------------------- building
def import_expert_arrays(
    path: str | Path,
    model: str,
    num_experts: int | None = None,
    requests_json: str | Path | None = None,
    no_requests_json: bool = False,
    datasets: list[str] | None = None,
    exclude_repetitive: bool = False,
    source_model: str | None = None,
    dataset: str = "unknown",
) -> tuple[Trace, ImportReport]:
    """Read a source ``.npz`` (and its requests.json) into a decode-only trace; returns the trace and a report.
    The trace is checked against the model profile its name matches (top-k, layers, experts) and must hold
    tokens; requests without rows are dropped (``report.empty_requests_dropped``)."""
    path = Path(path)
    check_model_name(model)
    if num_experts is not None:
        _check_num_experts(num_experts)
    if not isinstance(dataset, str) or not dataset.strip():
        raise InputError(f"--dataset: give a data set name, got {brief(dataset)}")
    arrays = load_routing_arrays(path)
    lengths = np.diff(arrays.offsets)
    rj = find_requests_json(path, None if requests_json is None else str(requests_json), no_requests_json)
    entries = load_requests_json(rj, lengths) if rj is not None else None
    where = str(rj) if rj else str(path)
    chosen = select_requests(entries, len(lengths), datasets, exclude_repetitive, where)
    kept = drop_empty(chosen, lengths, where, datasets, exclude_repetitive)
    num_experts, source = resolve_num_experts(arrays.ids, model, num_experts, path)
    ids, weights = kept_rows(arrays, kept, path)

    columns, left_out = request_columns(entries, kept) if entries is not None else (None, [])
    used = list(dict.fromkeys(columns["dataset"])) if columns and "dataset" in columns else []
    extra = {
        "source_files": [path.name] + ([rj.name] if rj is not None else []),
        "routing_of": "decode tokens only (the source keeps no prompt rows); prompt lengths, where the source "
        "gives them, are in request_info.prompt_len",
        "requests_in_source": int(len(lengths)),
        "requests_kept": int(kept.size),
        "filters": {"datasets": datasets, "exclude_repetitive": bool(exclude_repetitive)},
        "num_experts_from": source,
    }
    dropped = int(chosen.size - kept.size)
    if dropped:
        extra["empty_requests_dropped"] = dropped
    if left_out:
        extra["request_fields_left_out"] = left_out
    if arrays.ignored:
        extra["arrays_ignored"] = list(arrays.ignored[:20])
    meta = TraceMeta(
        model=ModelInfo.decoder_only(model, num_experts, int(ids.shape[2]), int(ids.shape[1])),
        provenance=Provenance(
            "imported", TOOL, source_model or model, "+".join(str(d) for d in used if d) or dataset, today()
        ),
        seed=None,
        request_ids=_request_ids(entries, kept, path.stem),
        extra=extra,
        request_info=columns,
    )
    trace = Trace(ids, offsets_from_lengths(lengths[kept]), np.zeros(kept.size, np.int64), meta, weights)
    check_model_fit(trace, str(path), source)
    check_content(trace, where)
    return trace, ImportReport(int(len(lengths)), int(kept.size), source, dropped)


def _check_num_experts(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= np.iinfo(np.int16).max:
        raise InputError(f"--num-experts: must be between 1 and {np.iinfo(np.int16).max}, got {brief(n)}")


def resolve_num_experts(ids: np.ndarray, model: str, given: int | None, path: Path) -> tuple[int, str]:
    """Experts per layer (``given``, else the model's default, else the data's) and where the number came from;
    InputError when an id or the top-k does not fit it."""
    largest = int(ids.max())
    num_experts, source = (given, "--num-experts") if given is not None else default_num_experts(model, largest)
    _check_num_experts(num_experts)
    if largest >= num_experts:
        row = int(np.argwhere((ids >= num_experts).any(axis=(1, 2)))[0][0])
        raise InputError(
            f"{path}: expert_ids holds id {largest} (first id >= {num_experts} at row {row}), outside "
            f"0..{num_experts - 1} (num_experts {num_experts} from {source}; see --num-experts)"
        )
    if ids.shape[2] > num_experts:
        raise InputError(f"{path}: top_k {ids.shape[2]} exceeds num_experts {num_experts} (see --num-experts)")
    return num_experts, source


def kept_rows(arrays: RoutingArrays, kept: np.ndarray, path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """The kept requests' expert ids (int16) and weights (float16, 0 where an id is -1; None without probs). A
    weight beyond float16's range is refused, found before the cast (which would make it infinite, with a
    RuntimeWarning on stderr)."""
    rows = None if kept.size == arrays.offsets.shape[0] - 1 else rows_of_requests(arrays.offsets, kept)
    ids = arrays.ids if rows is None else arrays.ids[rows]
    if arrays.probs is None:
        return ids, None
    probs = arrays.probs if rows is None else arrays.probs[rows]
    wide = probs.astype(np.float64 if probs.dtype.itemsize > 4 else np.float32)  # a copy: zeroed below
    wide[ids < 0] = 0
    with np.errstate(all="ignore"):
        big = np.abs(wide) > FLOAT16_MAX
        if big.any():
            r = int(np.argwhere(big.any(axis=(1, 2)))[0][0])
            value = float(wide[r][big[r]][0])
            row = r if rows is None else int(rows[r])
            raise InputError(
                f"{path}: expert_probs holds {value:.6g} (row {row}), beyond the range of the trace's "
                f"float16 weights (+-{FLOAT16_MAX:.0f})"
            )
        weights = wide.astype(np.float16)
    return ids, weights


def _split_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not items:
        raise InputError("--datasets: give at least one data set name")
    return items


def _run(args) -> int:
    import sys
    import time

    from traces.io import save_trace

    t0 = time.perf_counter()
    check_out(args.out, [args.file] + ([args.requests_json] if args.requests_json else []))
    check_model_name(args.model)
    trace, rep = import_expert_arrays(
        args.file,
        args.model,
        args.num_experts,
        args.requests_json,
        args.no_requests_json,
        _split_list(args.datasets),
        args.exclude_repetitive,
        args.source_model,
        args.dataset,
    )
    if rep.empty_requests_dropped:
        print(f"note: dropped {rep.empty_requests_dropped} requests without rows (they route nothing)", file=sys.stderr)
    save_trace(trace, args.out)
    print(
        f"wrote {args.out}: {trace.num_tokens} decode tokens in {trace.num_requests} requests "
        f"(of {rep.requests_in_source}), {trace.num_layers} layers, top-{trace.top_k} of {trace.num_experts} "
        f"experts (from {rep.num_experts_from}), weights {'kept' if trace.weights is not None else 'absent'}, "
        f"{time.perf_counter() - t0:.1f} s"
    )
    return 0
