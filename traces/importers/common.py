"""Small pieces the importers share: the checks every import makes before it reads (``--out``, ``--model``) and
before it writes (the trace is of its model, and has tokens), the default expert count of a model, bounded
reading of JSON files, request offsets, rows of requests, and short lists for messages."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from moebase.errors import InputError, TraceError, brief, one_line
from moebase.outputs import check_not_input
from traces.format import MAX_CONTEXT, MAX_REQUESTS, LayerInfo, ModelInfo, Provenance, Trace, TraceMeta
from traces.io import check_output_file, metadata_problem, open_regular_file

#: The tool named in an imported trace's provenance.
TOOL = "traces import"
#: The longest JSON line read (a Mixtral record is about 150 bytes; a vLLM line holds one request's routing).
MAX_JSON_LINE_BYTES = 64 << 20
#: The largest JSON-lines file read.
MAX_JSONL_BYTES = 1 << 30
FLOAT16_MAX = float(np.finfo(np.float16).max)
INT16_MAX = int(np.iinfo(np.int16).max)

#: The longest model name an import accepts (Hugging Face repository ids are at most 96 characters).
MAX_MODEL_NAME_CHARS = 128
#: A model name: letters, digits and ``. _ + -``, with at most one ``/`` (an organisation prefix, as in
#: ``mistralai/Mixtral-8x7B-Instruct-v0.1``). ASCII only: the name is matched against the model profiles, and a
#: name that looks like another one (full-width letters, spaces) would not find its profile.
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*(?:/[A-Za-z0-9][A-Za-z0-9._+-]*)?", re.ASCII)
_SUFFIX = re.compile(r"-(\d+)$", re.ASCII)
#: How many items of a long list (data sets, model names) a message shows before "... (N in all)".
SHOWN = 5


# --------------------------------------------------------------------------------------------- messages
def show_list(items: Iterable[Any], shown: int = SHOWN, width: int = 40) -> str:
    """``items`` for a message, at most ``shown`` of them, each cut to ``width`` characters:
    ``"a, b, c, d, e ... (33 in all)"``; "none" for an empty list."""
    items = list(items)
    head = ", ".join(brief(x, width) if not isinstance(x, str) else _cut(x, width) for x in items[:shown])
    if len(items) > shown:
        return f"{head} ... ({len(items)} in all)"
    return head or "none"


def _cut(text: str, width: int) -> str:
    text = brief(text, width + 2)[1:-1] if not text.isprintable() else text
    return text if len(text) <= width else text[: width - 3] + "..."


# --------------------------------------------------------------------------------------------- messages
def with_short_paths(exc: InputError, paths: Iterable[Any]) -> InputError:
    """``exc`` with every long path of ``paths`` (the files, folders and outputs a command was given) shown as a
    TraceError shows a path, cut to MAX_PATH_CHARS, so that a message naming a file deep in long folders stays
    within its bound instead of being cut at its end (where it says what is wrong)."""
    from moebase.errors import MAX_PATH_CHARS

    text = str(exc.args[0]) if exc.args else ""
    forms = {form for p in paths if p is not None for form in (str(p), str(Path(p)))}
    changed = text
    for form in sorted(forms, key=len, reverse=True):  # a folder after the files inside it
        if len(form) > MAX_PATH_CHARS and form in changed:
            changed = changed.replace(form, one_line(form, MAX_PATH_CHARS))
    return exc if changed == text else InputError(changed)


# --------------------------------------------------------------------------------------------- arguments
def check_out(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """``--out`` as a place for a trace file, checked before any input is read: not empty, not a folder, FIFO,
    device or socket (:func:`traces.io.check_output_file`), and not one of the ``inputs`` (which the trace
    would replace: :func:`moebase.outputs.check_not_input`). Raises InputError naming ``--out``."""
    try:
        out = check_output_file(path, "trace file")
    except TraceError as exc:
        raise InputError(f"--out {brief(str(path))}: {exc.problem}") from None
    check_not_input(out, inputs, "--out")
    return out


def check_model_name(name: Any, flag: str = "--model") -> str:
    """A model name for a trace: ASCII letters, digits and ``. _ + -`` (one ``/`` for an organisation prefix), at
    most MAX_MODEL_NAME_CHARS characters. An empty, spaced, over-long or path-like name is refused: the trace
    reader and the simulator match traces to models by this name."""
    return check_name(name, flag)


def check_name(name: Any, flag: str, what: str = "model name", example: str = "gpt-oss-20b") -> str:
    """``name`` (what ``flag`` gives: a model, checkpoint or data set name that goes into a trace's metadata or a
    profile) held to the model-name rule of :func:`check_model_name`; InputError naming ``flag`` otherwise."""
    if not isinstance(name, str) or not name:
        raise InputError(f"{flag}: give a {what} (e.g. {example}), got {brief(name)}")
    if len(name) > MAX_MODEL_NAME_CHARS:
        raise InputError(f"{flag}: a {what} of {len(name)} characters; the limit is {MAX_MODEL_NAME_CHARS}")
    if not _MODEL_NAME.fullmatch(name) or ".." in name:
        raise InputError(
            f"{flag}: {brief(name)} is not a {what} (ASCII letters, digits, '.', '_', '+', '-', "
            f"and one '/' after an organisation, e.g. mistralai/Mixtral-8x7B-Instruct-v0.1)"
        )
    return name


def check_dataset_name(name: Any, flag: str = "--dataset") -> str:
    """A data set name given on the command line (``provenance.dataset``): the model-name rule."""
    return check_name(name, flag, "data set name", "humaneval")


def plain_model_name(text: str, fallback: str = "model") -> str:
    """A model name (:func:`check_model_name`) made from a checkpoint's folder or ``name_or_path``: its last path
    part, or ``ORG/NAME`` for a Hugging Face cache folder (``models--ORG--NAME/snapshots/HASH``); characters a name
    may not hold become ``-``, and it is cut to MAX_MODEL_NAME_CHARS. ``fallback`` when nothing is left."""
    parts = [p for p in re.split(r"[\\/]+", str(text)) if p not in ("", ".", "..")]
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        org_name = parts[-3][len("models--") :].split("--", 1)
        return "/".join(plain_model_name(x, fallback) for x in org_name)
    last = parts[-1] if parts else ""
    name = re.sub(r"[^A-Za-z0-9._+-]+", "-", last, flags=re.ASCII)
    name = re.sub(r"\.{2,}", ".", name).lstrip("._+-")[:MAX_MODEL_NAME_CHARS].rstrip("._+-")
    return name or fallback


# --------------------------------------------------------------------------------------------- model profiles
@functools.lru_cache(maxsize=1)
def bundled_profiles() -> tuple[tuple[str, Any], ...]:
    """(file stem, ModelSpec) of every model profile in ``configs/models/`` that loads (a broken profile is the
    simulator's to report, not an import's)."""
    from moebase.errors import ConfigError
    from moebase.model import load_model
    from moebase.profiles import available

    out = []
    for stem in available("models"):
        try:
            out.append((stem, load_model(stem)))
        except ConfigError:
            continue
    return tuple(out)


def meta_summary(meta: TraceMeta):
    """A trace summary of ``meta`` without request lengths: what :func:`traces.summary.trace_matches_model`
    reads."""
    from traces.summary import TraceSummary

    empty = np.zeros(0, dtype=np.int64)
    return TraceSummary(Path(""), meta, empty, empty)


def meta_like(name: str, spec) -> TraceMeta:
    """Metadata of a trace called ``name`` with exactly the shape of the model ``spec``."""
    layers = tuple(
        [LayerInfo(i, "encoder") for i in range(spec.encoder_moe_layers)]
        + [LayerInfo(i, "decoder") for i in range(spec.decoder_moe_layers)]
    )
    return TraceMeta(
        ModelInfo(name, spec.num_experts, spec.top_k, layers),
        Provenance("imported", "traces import", name, "none", None),
    )


def profiles_for(name: str) -> list[tuple[str, Any]]:
    """The bundled model profiles a trace called ``name`` would be simulated with: those whose name the
    simulator's own rule (:func:`traces.summary.trace_matches_model`) takes as this trace's model (the same
    name, or it with an organisation prefix or a variant suffix), the most specific only (the longest name: a
    "deepseek-v2-lite" trace is DeepSeek-V2-Lite's, not a variant of DeepSeek-V2)."""
    from traces.summary import trace_matches_model

    matches = [
        (stem, spec)
        for stem, spec in bundled_profiles()
        if trace_matches_model(meta_summary(meta_like(name, spec)), spec)
    ]
    longest = max((len(spec.name) for _, spec in matches), default=0)
    return [(stem, spec) for stem, spec in matches if len(spec.name) == longest]


def check_model_fit(
    trace: Trace, where: str, num_experts_from: str | None = None, hint: str = "is --model the model that produced it?"
) -> None:
    """Refuse a trace that ``sim run`` would refuse with the model profile its name matches (a different expert
    count, top-k, or number of encoder or decoder MoE layers): :func:`traces.summary.model_mismatch`, the
    check a run config makes, applied when the trace is written rather than at every run, its message leading with what
    differs. A name that matches no profile is a model of the user's own (e.g. a small test model) and is not
    checked."""
    from traces.summary import model_mismatch

    m = trace.meta.model
    summary = meta_summary(trace.meta)
    for where_from, spec in profiles_held_to(m.name):
        problem = model_mismatch(summary, spec)
        if problem:
            source = (
                "; the trace's experts per layer come from --num-experts" if num_experts_from == "--num-experts" else ""
            )
            raise InputError(
                f"{where}: the routing does not match model {brief(m.name)}: {problem} (the profile: "
                f"{where_from}{source}); every run of that model would refuse the trace ({hint})"
            )


def profiles_held_to(name: str) -> list[tuple[str, Any]]:
    """(where the profile comes from, ModelSpec) of every profile a trace of model ``name`` is held to when written:
    the bundled one its name matches, and those :func:`also_checked_against` adds."""
    bundled = [(f"configs/models/{stem}.yaml", spec) for stem, spec in profiles_for(name)]
    return bundled + list(_EXTRA_PROFILES.get())


#: Profiles a trace being written must also fit, besides the bundled one its name matches: (where the profile comes
#: from, ModelSpec), set for the length of one command by :func:`also_checked_against`.
_EXTRA_PROFILES: contextvars.ContextVar[tuple] = contextvars.ContextVar("extra_profiles", default=())


@contextlib.contextmanager
def also_checked_against(where_from: str, spec):
    """While inside, :func:`check_model_fit` also holds every trace to ``spec`` (a ModelSpec derived from a
    checkpoint's config, say), so a trace that does not fit is refused before it is written."""
    token = _EXTRA_PROFILES.set(_EXTRA_PROFILES.get() + ((where_from, spec),))
    try:
        yield
    finally:
        _EXTRA_PROFILES.reset(token)


def check_content(trace: Trace, where: str) -> None:
    """Refuse to write a trace with nothing to simulate (no tokens) or more requests than a trace may hold."""
    if trace.num_tokens == 0:
        raise InputError(f"{where}: no tokens to write (every request kept is empty)")
    if trace.num_requests > MAX_REQUESTS:
        raise InputError(f"{where}: {trace.num_requests} requests, more than the {MAX_REQUESTS} a trace may hold")
    context = request_contexts(trace)
    if context.size and int(context.max()) > MAX_CONTEXT:
        r = int(np.argmax(context))
        raise InputError(
            f"{where}: request {r} ({brief(_request_name(trace, r), 60)}) spans {int(context[r])} "
            f"tokens of context (prompt and generated), more than the {MAX_CONTEXT} a trace may claim"
        )
    check_provenance_names(trace.meta.provenance, where)
    problem = metadata_problem(trace.meta)
    if problem:
        raise InputError(f"{where}: the trace's {problem}")


def check_provenance_names(provenance: Provenance, where: str) -> None:
    """The names a trace's provenance holds: its checkpoint (``--source-model``, else ``--model``) by the model-name
    rule, and its data set (``--dataset``, else the source's own data set fields) one printable line."""
    check_model_name(provenance.model, "--source-model")
    dataset = provenance.dataset
    if not dataset.strip() or not dataset.isprintable():
        raise InputError(
            f"{where}: data set name {brief(dataset)} (provenance.dataset, from --dataset or the source's data "
            f"set fields) is not one printable line"
        )


def request_contexts(trace: Trace) -> np.ndarray:
    """int64 [R]: the tokens each request attends over by its last step, as the simulator counts them: its prompt
    (its prefill rows, or ``request_info.prompt_len`` for a decode-only request) plus its generated rows."""
    prompt = trace.prefill_lengths.astype(np.int64)
    known = (trace.meta.request_info or {}).get("prompt_len")
    if known is not None:
        stated = np.array(
            [int(x) if isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x > 0 else 0 for x in known],
            dtype=np.int64,
        )
        prompt = np.where(prompt > 0, prompt, stated)
    return prompt + (trace.request_lengths - trace.prefill_lengths)


def _request_name(trace: Trace, r: int) -> str:
    ids = trace.meta.request_ids
    return ids[r] if ids is not None else f"request {r}"


def default_num_experts(model: str, largest_id: int | None = None) -> tuple[int, str]:
    """Experts per MoE layer of ``model`` when ``--num-experts`` is not given, and where the number came from:
    the model profile the name matches (``configs/models/``, by the simulator's rule), else the name's numeric
    suffix (``switch-base-128`` -> 128), else the data (largest id + 1) when ``largest_id`` is given. Raises
    InputError when none applies."""
    matches = profiles_for(model)
    if matches:
        stem, spec = matches[0]
        return spec.num_experts, f"model profile configs/models/{stem}.yaml"
    m = _SUFFIX.search(model)
    if m and 0 < int(m.group(1)) <= np.iinfo(np.int16).max:
        return int(m.group(1)), f"the model name {model!r}"
    if largest_id is not None and largest_id >= 0:
        return int(largest_id) + 1, "the data (largest expert id + 1)"
    raise InputError(
        f"--num-experts: not given, and model {brief(model)} has no profile in configs/models/ "
        f"and no numeric suffix to take it from"
    )


# --------------------------------------------------------------------------------------------- files
def bounded_lines(f, path: str | os.PathLike, max_bytes: int, max_line_bytes: int, what: str):
    """``(line number, raw bytes)`` of each line of the binary file ``f``: the file at most ``max_bytes`` and
    each line at most ``max_line_bytes`` (read with that bound, so one endless line never fills memory); an
    InputError naming the file (and line) otherwise."""
    size = os.fstat(f.fileno()).st_size
    if size > max_bytes:
        raise InputError(f"{path}: {size} bytes, more than the {max_bytes} a {what} may have")
    lineno = 0
    while True:
        raw = f.readline(max_line_bytes + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            raise InputError(f"{path}:{lineno}: a line longer than {max_line_bytes} bytes")
        yield lineno, raw


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; InputError naming the file otherwise
    (a folder, FIFO or device says what it is and is never read)."""
    with open_regular_file(path, what) as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise InputError(f"{path}: larger than {limit >> 20} MB, the limit for a {what}")
    return data


def read_json_file(path: str | os.PathLike, limit: int, what: str = "JSON file") -> Any:
    """The JSON value in the regular file ``path`` (at most ``limit`` bytes of UTF-8), parsed with the
    simulator's bounded parser (no nesting deeper than Python's stack, no key twice, no integer of thousands of
    digits). Anything else raises InputError naming the file: a folder, FIFO or device says what it is and is
    never read."""
    from moebase.files import parse_text

    path = Path(path)
    data = read_bounded(path, limit, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        return parse_text(text, json_format=True)
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON ({one_line(str(exc), 120)})") from None


def offsets_from_lengths(lengths) -> np.ndarray:
    """int64 [R + 1] request offsets from R request lengths."""
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))]).astype(np.int64)


def rows_of_requests(offsets: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """int64: the rows of requests ``kept`` (indices into ``offsets``), request after request, in order."""
    starts = offsets[kept]
    lengths = offsets[kept + 1] - starts
    total = int(lengths.sum())
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


def parse_index_list(spec: str, count: int, what: str, flag: str, where: str) -> list[int]:
    """Indices from ``"all"`` or a comma list of 0-based indices and inclusive ranges (``1-4``, ``2-`` to the
    end), checked against the ``count`` items (``what``, e.g. "run") that ``where`` (a file) holds; returns them
    sorted without repeats. Bad specs raise InputError naming the flag and the file."""
    spec = spec.strip()
    if spec == "all":
        return list(range(count))
    held = f"{where} holds {count} {what}{'' if count == 1 else 's'}: 0..{count - 1}"
    chosen: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d*))?", part)
        if not m:
            raise InputError(f"{flag}: expected 'all' or indices and ranges like 0,2 or 1-4 or 1-, got {part!r}")
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else (count - 1 if m.group(2) == "" else int(m.group(2)))
        if hi < lo or hi >= count:
            missing = lo if lo >= count else hi
            raise InputError(
                f"{flag}: {what} {missing} does not exist ({held})"
                if missing >= count
                else f"{flag}: range {part!r} is empty"
            )
        chosen.update(range(lo, hi + 1))
    return sorted(chosen)


# ------------------------------------------------------------------------------------- JSON lines and numbers


def is_json_int(x) -> bool:
    """A JSON integer (true and false are not)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_float16(x) -> bool:
    """A JSON number a float16 weight can hold."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x)) and abs(x) <= FLOAT16_MAX


def check_num_experts(n) -> int:
    """``--num-experts``: 1..32767 (expert ids are int16)."""
    if not is_json_int(n) or not 1 <= n <= INT16_MAX:
        raise InputError(f"--num-experts: must be between 1 and {INT16_MAX}, got {brief(n)}")
    return n


def read_json_lines(path: Path, allow_lists: bool = False):
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


def offsets_of(lengths: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
