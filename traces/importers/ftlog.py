"""`traces import ft-log FILE --model switch-base-128 --batch B --out OUT.npz`: FasterTransformer expert logs.

The Pre-gated MoE / Diff-MoE authors' FasterTransformer build logs one line per MoE layer call::

    permuted_experts_ 3 3 17 42 42 42 ...

the expert id chosen by every token of that call, sorted ascending. For an encoder-decoder Switch model a *run*
is ``--encoder-layers`` lines (encoder MoE layers in order; each holds B x P ids: the batch's P prompt tokens
per request), then ``--decode-steps`` decode steps of ``--decoder-layers`` lines each (one id per request of the
batch). The defaults (6, 6, 256: 1,542 lines a run) are those of the ``expert_log/`` files of GitHub
ceciliawinter/Pregated_MoE, whose files hold several consecutive runs (the first a warm-up). The number of runs is the
line count over the
run length; a file holding only one run's encoder lines (e.g. ``experts_e128_Pre-gated_b512.txt``) gives an
encoder-only trace (prompt rows only, no decode rows). Any other line count is an error. ``--runs`` picks runs
by 0-based index (``all`` by default; ``1-`` skips the warm-up run 0).

Each run becomes one static batch of B requests (``--batch``; every line's token count must agree with it: an
encoder line holds a multiple of B ids, all encoder lines of a run the same number, a decoder line exactly B).
Request j of a run gets P = (encoder ids) / B prompt rows, routed in the encoder layers (-1 in the decoder
layers), then one decode row per step, routed in the decoder layers (-1 in the encoder layers). The sorted ids
of a line are dealt in order: encoder ids ``j*P .. j*P+P-1`` to request j's prompt rows, decoder id j to
request j's row of that step.

What is exact, and what is not: replayed as static batches of B requests (``workload.batch_size = B``,
``batching: static``), every iteration's active set per layer and the number of tokens per expert equal the
log's line, so per-iteration caching, copies and compute are exact. Which request (or prompt token) chose which
expert is not in the log (for B = 1 a decode row is exact; the order of prompt tokens never is: prompt rows come
in sorted order), so anything that follows one token across layers or steps (``traces stats``' overlap with the
previous token and transition accuracy, a predictor learned from rows) and any replay at another batch size or
with continuous batching see a made-up assignment. The trace says the same in ``extra.exact`` and
``extra.not_exact``.

A log is untrusted input: it is read as bytes, line by line (at most MAX_LINE_BYTES a line, MAX_LOG_LINES
lines, MAX_LOG_BYTES in all), and an id is ASCII digits with an optional minus sign (``+5``, ``1_0``,
Arabic-Indic or full-width digits, which Python's int() would take, are refused naming the file and line).
"""

from __future__ import annotations

import dataclasses
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moebase.errors import InputError, brief
from traces.format import MAX_CONTEXT, MAX_REQUESTS, LayerInfo, ModelInfo, Provenance, Trace, TraceMeta, today
from traces.importers.common import (
    bounded_lines,
    check_content,
    check_model_fit,
    check_model_name,
    check_out,
    default_num_experts,
    offsets_from_lengths,
    parse_index_list,
)
from traces.io import MAX_ARRAY_BYTES, open_regular_file

TOOL = "traces import ft-log"
PREFIX = "permuted_experts_"
_PREFIX_BYTES = PREFIX.encode()
#: The longest line read (the largest real line, batch 512 x 256 prompt tokens, is about 0.5 MB).
MAX_LINE_BYTES = 16 << 20
#: The most lines and bytes a log may have (the real ones: 7,710 lines, 2.5 MB).
MAX_LOG_LINES = 1 << 20
MAX_LOG_BYTES = 256 << 20
#: The most MoE layers of one stack (--encoder-layers, --decoder-layers) an import accepts.
MAX_LAYERS = 4096
#: What an id is: ASCII decimal digits (at most 9), after an optional minus sign (refused later as out of
#: range, naming the id).
_ID = re.compile(rb"[0-9]{1,9}|-(?!0+$)[0-9]{1,9}")
_ID_BYTES = b"0123456789-"
_BAD_MINUS_OR_LONG = re.compile(rb"[0-9-]-|-(?![0-9])|-0+(?![0-9])|[0-9]{10}")
_BLANKS = b" \t\r\n\f\v"
_WORD = re.compile(rb"[^ \t]+")
EXACT = (
    "per (iteration, MoE layer) at the log's batch size with static batching: the active set of experts and "
    "the number of tokens routed to each"
)
NOT_EXACT = (
    "which request (or which prompt token) chose which expert: each line's sorted ids are dealt to the "
    "batch's requests in order, so per-token paths across layers and steps are made up (exact for B = 1 "
    "decode rows) and a request's prompt rows come in a seeded random order; per-token figures "
    "(overlap with the previous "
    "token, layer transitions, predictors learned from rows) and replays at another batch size or with "
    "continuous batching are therefore not the log's"
)


@dataclass(frozen=True)
class LogLine:
    """One MoE layer call: its line number in the file and the expert id of each of its tokens (sorted)."""

    lineno: int
    ids: np.ndarray  # int32


@dataclass(frozen=True)
class LogRun:
    """One run of the log: its 0-based index in the file, its encoder lines, and its decode steps' lines."""

    index: int
    encoder: list[LogLine]  # one per encoder MoE layer
    decoder: list[list[LogLine]]  # [step][decoder MoE layer]; empty for an encoder-only run


@dataclass(frozen=True)
class LogShape:
    """How the model's calls are laid out in a run."""

    encoder_layers: int = 6
    decoder_layers: int = 6
    decode_steps: int = 256

    @property
    def run_lines(self) -> int:
        return self.encoder_layers + self.decode_steps * self.decoder_layers


def add_parser(fmt) -> None:
    """Register ``ft-log`` under ``traces import``."""
    f = fmt.add_parser("ft-log", help="FasterTransformer permuted_experts_ logs (Pre-gated MoE expert_log)")
    f.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="log file(s), one 'permuted_experts_ ids...' line per MoE layer call; several files (of the "
        "same batch size and shape) are imported one after another into one trace",
    )
    f.add_argument("--out", "-o", required=True, help="trace file to write (.npz)")
    f.add_argument("--model", required=True, help="model name in the trace, e.g. switch-base-128")
    f.add_argument("--batch", type=int, required=True, help="requests per run (the batch size the log ran at)")
    f.add_argument(
        "--num-experts",
        type=int,
        default=None,
        help="experts per MoE layer (default: the model's profile in configs/models/, else the numeric "
        "suffix of --model: switch-base-128 -> 128)",
    )
    f.add_argument(
        "--runs",
        default="all",
        help="runs to keep, 0-based: 'all' (default), or e.g. '1-' (skip the warm-up run 0), '1-3', '0,2'",
    )
    f.add_argument(
        "--encoder-layers",
        type=int,
        default=LogShape.encoder_layers,
        help="encoder MoE layer lines per run (default: %(default)s)",
    )
    f.add_argument(
        "--decoder-layers",
        type=int,
        default=LogShape.decoder_layers,
        help="decoder MoE layer lines per decode step (default: %(default)s)",
    )
    f.add_argument(
        "--decode-steps", type=int, default=LogShape.decode_steps, help="decode steps per run (default: %(default)s)"
    )
    f.add_argument(
        "--source-model", default=None, help="checkpoint that produced the log (provenance.model; default: --model)"
    )
    f.add_argument(
        "--dataset", default="unknown", help="where the prompts came from (provenance.dataset; default: %(default)s)"
    )
    f.set_defaults(func=_run)


# --------------------------------------------------------------------------------------------- reading
def read_log(path: Path) -> list[LogLine]:
    """Every non-blank line of a log, parsed; a line that is not ``permuted_experts_`` and ids raises InputError
    naming the file and line. The file must be a regular file (a FIFO or a device is refused without being
    read) and is read line by line within MAX_LINE_BYTES, so memory stays a small multiple of the ids read."""
    lines = []
    with open_regular_file(path, "log file") as f:
        for lineno, raw in bounded_lines(f, path, MAX_LOG_BYTES, MAX_LINE_BYTES, "log"):
            ids = parse_line(raw, path, lineno)
            if ids is not None:
                lines.append(LogLine(lineno, ids))
                if len(lines) > MAX_LOG_LINES:
                    raise InputError(f"{path}: more than {MAX_LOG_LINES} lines, the most a log may have")
    if not lines:
        raise InputError(f"{path}: no '{PREFIX}' lines")
    return lines


def parse_line(raw: bytes, path: Path, lineno: int) -> np.ndarray | None:
    """The ids of one line (int32), or None for a blank line: ``permuted_experts_`` then ids separated by spaces
    or tabs. The line is checked as bytes (only ASCII digits, minus signs and blanks after the prefix) and then
    parsed by numpy without a list of words: a bad line raises InputError naming its first bad word."""
    text = raw.strip(_BLANKS)
    if not text:
        return None
    head = text[: len(_PREFIX_BYTES) + 1]
    if not (head == _PREFIX_BYTES or (head[:-1] == _PREFIX_BYTES and head[-1:] in (b" ", b"\t"))):
        first = _WORD.match(text[:200])
        word = first.group(0) if first else text[:40]
        raise InputError(f"{path}:{lineno}: expected a line starting with '{PREFIX}', got {_show(word)}")
    body = text[len(_PREFIX_BYTES) :]
    if not body.strip(_BLANKS):
        raise InputError(f"{path}:{lineno}: no expert ids after '{PREFIX}'")
    if body.translate(None, _ID_BYTES + b" \t") or _BAD_MINUS_OR_LONG.search(body):
        raise InputError(f"{path}:{lineno}: {_show(_first_bad_word(body))} is not an expert id (ASCII digits 0-9)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return np.fromstring(body, dtype=np.int32, sep=" ")
    except (ValueError, DeprecationWarning):  # not expected after the checks above; refused all the same
        raise InputError(f"{path}:{lineno}: the ids after '{PREFIX}' cannot be read as integers") from None


def _first_bad_word(body: bytes) -> bytes:
    """The first word of ``body`` that is not an id (found lazily: a line may hold millions of words)."""
    for m in _WORD.finditer(body):
        if not _ID.fullmatch(m.group(0)):
            return m.group(0)
    return body[:40]


def _show(word: bytes) -> str:
    """A word of the log for a message: its text (bytes that are not UTF-8 shown as U+FFFD), short."""
    return brief(word[:160].decode("utf-8", "replace"), 60)


def split_runs(lines: list[LogLine], shape: LogShape, path: Path) -> list[LogRun]:
    """Cut a log into runs: whole runs of ``shape.run_lines`` lines, or one run's encoder lines alone."""
    n, per_run = len(lines), shape.run_lines
    enc, dec = shape.encoder_layers, shape.decoder_layers
    if n % per_run == 0:
        starts, steps = range(0, n, per_run), shape.decode_steps
    elif n == enc:
        starts, steps = range(1), 0
    else:
        raise InputError(
            f"{path}: {n} lines are neither whole runs of {per_run} lines ({enc} encoder + "
            f"{shape.decode_steps} decode steps x {dec} decoder) nor one run's {enc} encoder lines "
            f"(see --encoder-layers, --decoder-layers, --decode-steps)"
        )
    runs = []
    for r, s in enumerate(starts):
        decode = lines[s + enc : s + enc + steps * dec]
        runs.append(LogRun(r, lines[s : s + enc], [decode[i * dec : (i + 1) * dec] for i in range(steps)]))
    return runs


def prompt_length(run: LogRun, batch: int, path: Path) -> int:
    """Prompt tokens per request of a run: an encoder line's ids / batch. Raises InputError at the first line
    whose token count does not fit the batch (encoder lines: one multiple of B; decoder lines: exactly B)."""
    first = run.encoder[0]
    count = first.ids.size
    if count % batch:
        raise InputError(
            f"{path}:{first.lineno}: {count} ids, not a multiple of --batch {batch} (an encoder line "
            f"holds batch x prompt tokens)"
        )
    for line in run.encoder[1:]:
        if line.ids.size != count:
            raise InputError(
                f"{path}:{line.lineno}: {line.ids.size} ids, but this run's first encoder line "
                f"(line {first.lineno}) has {count}: every encoder layer sees the same prompt tokens"
            )
    for step in run.decoder:
        for line in step:
            if line.ids.size != batch:
                raise InputError(
                    f"{path}:{line.lineno}: {line.ids.size} ids, expected {batch} (a decoder line "
                    f"holds one token per request of --batch {batch})"
                )
    prompt = count // batch
    if prompt + len(run.decoder) > MAX_CONTEXT:
        raise InputError(
            f"{path}:{first.lineno}: {prompt} prompt tokens per request (of --batch {batch}) and "
            f"{len(run.decoder)} decode steps: more than the {MAX_CONTEXT} tokens of context a trace "
            f"may claim"
        )
    return prompt


def check_ids(runs: list[LogRun], num_experts: int, source: str, path: Path) -> None:
    """Every id of the runs lies in 0..num_experts-1; else InputError naming the first bad line."""
    for run in runs:
        for line in run.encoder + [x for step in run.decoder for x in step]:
            lo, hi = int(line.ids.min()), int(line.ids.max())
            if lo < 0 or hi >= num_experts:
                raise InputError(
                    f"{path}:{line.lineno}: expert id {lo if lo < 0 else hi} outside "
                    f"0..{num_experts - 1} (num_experts {num_experts} from {source}; see --num-experts)"
                )


# --------------------------------------------------------------------------------------------- building
def run_rows(run: LogRun, batch: int, prompt: int, shape: LogShape) -> np.ndarray:
    """int16 [batch x (prompt + steps), enc + dec layers, 1]: the run's requests one after another, each its
    prompt rows (encoder layers) then its decode rows (decoder layers), the lines' sorted ids dealt in order.
    Within a request, the order of its prompt rows in each encoder layer is shuffled (seeded by the run and the
    layer): the log keeps no token order, and sorted rows would look like tokens that keep choosing the same
    expert (a prompt is prefilled in one iteration, so the order changes no replay, only per-token figures and a
    fit to them)."""
    enc, dec, steps = shape.encoder_layers, shape.decoder_layers, len(run.decoder)
    per_request = prompt + steps
    e = np.full((batch * per_request, enc + dec, 1), -1, dtype=np.int16)
    starts = np.arange(batch) * per_request
    prompt_rows = starts[:, None] + np.arange(prompt)[None, :]  # [B, P]
    for layer, line in enumerate(run.encoder):
        rng = np.random.default_rng([run.index, layer])
        e[prompt_rows, layer, 0] = rng.permuted(line.ids.reshape(batch, prompt), axis=1)
    if steps:
        decode_rows = starts[:, None] + prompt + np.arange(steps)[None, :]  # [B, steps]
        ids = np.array([[line.ids for line in step] for step in run.decoder])  # [steps, dec, B]
        e[decode_rows, enc:, 0] = ids.transpose(2, 0, 1)  # [B, steps, dec]
    return e


def import_ft_log(
    path: str | Path,
    model: str,
    batch: int,
    num_experts: int | None = None,
    runs: str = "all",
    shape: LogShape = LogShape(),
    source_model: str | None = None,
    dataset: str = "unknown",
) -> tuple[Trace, dict]:
    """Read a FasterTransformer ``permuted_experts_`` log into a trace of static batches (one per kept run);
    returns the trace and a summary (runs in the file, runs kept, prompt lengths, where num_experts came from).
    The trace is checked against the model profile its name matches (experts, top-1, encoder and decoder
    layers)."""
    path = Path(path)
    check_model_name(model)
    _check_shape_args(batch, shape)
    if not isinstance(dataset, str) or not dataset.strip():
        raise InputError(f"--dataset: give a data set name, got {brief(dataset)}")
    if num_experts is None:
        num_experts, source = default_num_experts(model)
    else:
        source = "--num-experts"
    if not 1 <= num_experts <= np.iinfo(np.int16).max:
        raise InputError(f"--num-experts: must be between 1 and {np.iinfo(np.int16).max}, got {num_experts}")
    all_runs = split_runs(read_log(path), shape, path)
    kept = [all_runs[i] for i in parse_index_list(runs, len(all_runs), "run", "--runs", str(path))]
    prompts = [prompt_length(run, batch, path) for run in kept]
    check_ids(kept, num_experts, source, path)
    _check_trace_size(kept, prompts, batch, shape, path)

    parts = [run_rows(run, batch, p, shape) for run, p in zip(kept, prompts)]
    steps = [len(run.decoder) for run in kept]
    lengths = [p + s for p, s in zip(prompts, steps) for _ in range(batch)]
    layers = tuple(
        [LayerInfo(i, "encoder") for i in range(shape.encoder_layers)]
        + [LayerInfo(i, "decoder") for i in range(shape.decoder_layers)]
    )
    summary = {
        "runs_in_file": len(all_runs),
        "runs_kept": [run.index for run in kept],
        "prompt_len": prompts,
        "decode_steps": steps,
        "num_experts_from": source,
    }
    meta = TraceMeta(
        model=ModelInfo(model, num_experts, 1, layers),
        provenance=Provenance("imported", TOOL, source_model or model, dataset, today()),
        seed=None,
        request_ids=tuple(f"{path.stem}/run{run.index}/{j}" for run in kept for j in range(batch)),
        extra={
            "source_files": [path.name],
            "batch": batch,
            **summary,
            "layout": "one static batch of `batch` requests per run; request j gets encoder ids j*P..j*P+P-1 "
            "of each encoder line as its P prompt rows and decoder id j of each step's lines as its "
            "decode row (lines' ids are sorted)",
            "exact": EXACT,
            "not_exact": NOT_EXACT,
        },
        request_info={
            "run": [run.index for run in kept for _ in range(batch)],
            "slot": [j for _ in kept for j in range(batch)],
        },
    )
    trace = Trace(
        np.concatenate(parts),
        offsets_from_lengths(lengths),
        np.array([p for p in prompts for _ in range(batch)], dtype=np.int64),
        meta,
    )
    check_model_fit(trace, str(path), source)
    check_content(trace, str(path))
    return trace, summary


def _check_trace_size(runs: list[LogRun], prompts: list[int], batch: int, shape: LogShape, path: Path) -> None:
    """Refuse a trace larger than a trace file may hold before allocating it: a run's rows span every MoE layer,
    so a long prompt with many layers of the other stack can be far larger than the log."""
    layers = shape.encoder_layers + shape.decoder_layers
    cells = sum(batch * (p + len(run.decoder)) for run, p in zip(runs, prompts)) * layers
    if cells * 2 > MAX_ARRAY_BYTES:
        raise InputError(
            f"{path}: the trace would hold {cells} expert ids ({cells * 2} bytes), more than a trace "
            f"file may hold ({MAX_ARRAY_BYTES}); import fewer runs (--runs) or check --batch and the "
            f"layer counts"
        )


def import_ft_logs(
    paths: list[str | Path],
    model: str,
    batch: int,
    num_experts: int | None = None,
    runs: str = "all",
    shape: LogShape = LogShape(),
    source_model: str | None = None,
    dataset: str = "unknown",
) -> tuple[Trace, dict]:
    """Several logs, each read by :func:`import_ft_log` (``runs`` applies to each), one after another in one trace;
    ``request_info.file`` says which file each request came from."""
    parts = [import_ft_log(p, model, batch, num_experts, runs, shape, source_model, dataset) for p in paths]
    if len(parts) == 1:
        return parts[0]
    traces = [t for t, _ in parts]
    first = traces[0]
    lengths = np.concatenate([t.request_lengths for t in traces])
    fields = [_request_fields(t) for t in traces]
    info = {k: [v for t_info, _ in fields for v in t_info[k]] for k in fields[0][0]}
    info["file"] = [Path(p).name for p, t in zip(paths, traces) for _ in range(t.num_requests)]
    summary = {
        "files": {Path(p).name: s for p, (_, s) in zip(paths, parts)},
        "num_experts_from": parts[0][1]["num_experts_from"],
        "runs_kept": [i for _, s in parts for i in s["runs_kept"]],
        "runs_in_file": sum(s["runs_in_file"] for _, s in parts),
        "decode_steps": [d for _, s in parts for d in s["decode_steps"]],
    }
    extra = {
        k: v
        for k, v in first.meta.extra.items()
        if k not in ("runs_in_file", "runs_kept", "prompt_len", "decode_steps", "source_files")
    }
    extra.update(source_files=[Path(p).name for p in paths], files=summary["files"])
    meta = dataclasses.replace(
        first.meta, request_ids=tuple(i for _, ids in fields for i in ids), extra=extra, request_info=info
    )
    trace = Trace(
        np.concatenate([t.experts for t in traces]),
        offsets_from_lengths(lengths.tolist()),
        np.concatenate([t.prefill_lengths for t in traces]),
        meta,
    )
    check_content(trace, str(paths[0]))
    return trace, summary


def _request_fields(trace: Trace) -> tuple[dict[str, list], tuple[str, ...]]:
    """A log's request_info and request_ids (import_ft_log sets both)."""
    info, ids = trace.meta.request_info, trace.meta.request_ids
    assert info is not None and ids is not None
    return info, ids


def _check_shape_args(batch: int, shape: LogShape) -> None:
    """The numbers that lay a log out, each within what a trace can hold."""
    for flag, n, low, high in (
        ("--batch", batch, 1, MAX_REQUESTS),
        ("--encoder-layers", shape.encoder_layers, 1, MAX_LAYERS),
        ("--decoder-layers", shape.decoder_layers, 1, MAX_LAYERS),
        ("--decode-steps", shape.decode_steps, 0, MAX_CONTEXT),
    ):
        if n < low:
            raise InputError(f"{flag}: must be >= {low}, got {n}")
        if n > high:
            raise InputError(f"{flag}: must be at most {high}, got {n}")


def _run(args) -> int:
    from traces.io import save_trace

    t0 = time.perf_counter()
    check_out(args.out, args.files)
    check_model_name(args.model)
    shape = LogShape(args.encoder_layers, args.decoder_layers, args.decode_steps)
    trace, s = import_ft_logs(
        args.files, args.model, args.batch, args.num_experts, args.runs, shape, args.source_model, args.dataset
    )
    save_trace(trace, args.out)
    decode = int(trace.decode_mask().sum())
    kind = "encoder only, " if not any(s["decode_steps"]) else ""
    where = (
        f"runs {_ranges(s['runs_kept'])} of {s['runs_in_file']}"
        if len(args.files) == 1
        else f"{len(args.files)} files, runs '{args.runs}' of each"
    )
    print(
        f"wrote {args.out}: {trace.num_tokens} tokens ({trace.num_tokens - decode} prompt + {decode} decode) in "
        f"{trace.num_requests} requests = {len(s['runs_kept'])} runs x batch {args.batch} ({kind}"
        f"{where}), {shape.encoder_layers} encoder + "
        f"{shape.decoder_layers} decoder layers, top-1 of {trace.num_experts} experts "
        f"(from {s['num_experts_from']}), {time.perf_counter() - t0:.1f} s"
    )
    return 0


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 4]`` -> ``"0-2,4"``."""
    out, i = [], 0
    while i < len(indices):
        j = i
        while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
            j += 1
        out.append(str(indices[i]) if i == j else f"{indices[i]}-{indices[j]}")
        i = j + 1
    return ",".join(out)
