"""What a run config needs from a trace without reading its routing: metadata and request lengths, read from the
file's header (cached per file version), and whether the trace is of the config's model. Training traces (a part's
``train`` param) are checked here too: of the run's model, with routed tokens, not the evaluated trace."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moebase.errors import CONFIG_PROBLEM_CHARS, ConfigError, TraceError, brief, one_line
from moebase.model import ModelSpec
from traces.format import TraceMeta
from traces.io import load_trace, load_trace_header


@dataclass(frozen=True)
class TraceSummary:
    """What a config needs from a trace without reading its routing: metadata and request lengths."""

    path: Path
    meta: TraceMeta
    prefill_lengths: np.ndarray  # int64 [R]
    decode_lengths: np.ndarray  # int64 [R]

    @property
    def num_requests(self) -> int:
        return int(self.prefill_lengths.shape[0])

    def layer_counts(self) -> tuple[int, int]:
        roles = [x.role for x in self.meta.model.layers]
        return roles.count("encoder"), roles.count("decoder")

    @functools.cached_property
    def prompt_lengths(self) -> np.ndarray:
        """int64 [R]: per request, the prompt its KV cache holds: its prefill rows, or, for a request whose prompt's
        routing was not recorded (a decode-only import), ``request_info.prompt_len`` where the trace has it (what
        the workload's decode steps attend over, :func:`sim.core.workload.prompt_context`)."""
        return prompt_with_info(self.prefill_lengths, self.meta.request_info)

    def request_tokens(self, max_decode_tokens: int | None) -> np.ndarray:
        """int64 [R]: per request, the KV-cache tokens it holds at its end: its prompt plus its (capped)
        generated tokens."""
        decode = self.decode_lengths
        if max_decode_tokens is not None:
            decode = np.minimum(decode, max_decode_tokens)
        return self.prompt_lengths + decode

    def max_request_tokens(self, max_decode_tokens: int | None) -> int:
        """The most KV-cache tokens one request holds: its prompt plus its (capped) generated tokens."""
        return int(self.request_tokens(max_decode_tokens).max()) if self.num_requests else 0

    def longest_request(self, max_decode_tokens: int | None) -> tuple[int, int]:
        """(prompt, generated tokens) of the request that holds the most KV-cache tokens (0, 0 without one)."""
        if not self.num_requests:
            return 0, 0
        total = self.request_tokens(max_decode_tokens)
        r = int(np.argmax(total))
        prompt = int(self.prompt_lengths[r])
        return prompt, int(total[r]) - prompt


#: A ``request_info.prompt_len`` above this counts as this much (far beyond any GPU's KV cache), so that sums of
#: token counts stay exact in int64.
MAX_PROMPT_INFO = 1 << 48


def prompt_with_info(prefill: np.ndarray, request_info: dict | None) -> np.ndarray:
    """int64 [R]: ``prefill`` where it is above 0, else the request's ``request_info.prompt_len`` when that is a
    positive integer (anything else counts 0)."""
    ctx = np.asarray(prefill, dtype=np.int64).copy()
    known = (request_info or {}).get("prompt_len")
    if known is None or len(known) != ctx.shape[0]:
        return ctx
    col = np.asarray(known, dtype=object)
    ok = np.fromiter(
        (isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and x > 0 for x in col),
        dtype=bool,
        count=col.shape[0],
    )
    lens = np.zeros(ctx.shape[0], dtype=np.int64)
    if ok.any():
        lens[ok] = np.array([min(int(x), MAX_PROMPT_INFO) for x in col[ok]], dtype=np.int64)
    return np.where(ctx > 0, ctx, lens)


def file_version(path: str | Path) -> tuple[str, int, int]:
    """(path, modification time in ns, size) of a trace file: the key its cached summaries are kept under, so a
    rewritten file is read again. TraceError when it is missing."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        raise TraceError(path, "no such file") from None
    return str(path), st.st_mtime_ns, st.st_size


def read_trace_summary(path: str | Path) -> TraceSummary:
    """Metadata and request lengths of a trace file, read without its expert arrays (cached per file version).
    Raises TraceError naming the file, like :func:`traces.io.load_trace`."""
    return _trace_summary(*file_version(path))


@functools.lru_cache(maxsize=32)
def _trace_summary(path_str: str, mtime_ns: int, size: int) -> TraceSummary:
    path = Path(path_str)
    meta, experts_shape, offsets, prefill = load_trace_header(path)
    if (
        offsets.dtype != np.int64
        or offsets.ndim != 1
        or offsets.shape[0] < 2
        or offsets[0] != 0
        or np.any(np.diff(offsets) < 0)
    ):
        raise TraceError(path, "request_offsets must be non-decreasing int64 [requests + 1] starting at 0")
    if len(experts_shape) != 3 or experts_shape[0] != offsets[-1] or experts_shape[1] != len(meta.model.layers):
        raise TraceError(
            path,
            f"experts shape {list(experts_shape)} does not match request_offsets "
            f"(ending at {offsets[-1]}) and the {len(meta.model.layers)} layers of its metadata",
        )
    lengths = np.diff(offsets)
    if prefill.dtype != np.int64 or prefill.shape != lengths.shape or np.any(prefill < 0) or np.any(prefill > lengths):
        raise TraceError(path, "prefill_lengths must be int64, one per request, between 0 and its token count")
    return TraceSummary(path, meta, prefill, lengths - prefill)


#: The longest model name a message about a trace's model shows whole (import names are at most 128 characters).
SHOWN_NAME_CHARS = 130
#: The most of a trace file's path a mismatch message shows beside two long names (its end: the file's own name).
SHOWN_PATH_CHARS = 120


def _quoted(name: str) -> str:
    """A model name for a message: quoted, whole up to SHOWN_NAME_CHARS characters, on one line."""
    if len(name) <= SHOWN_NAME_CHARS:
        return one_line(repr(name), 4 * SHOWN_NAME_CHARS)
    return one_line(repr(name[:SHOWN_NAME_CHARS]), 4 * SHOWN_NAME_CHARS) + f"... ({len(name)} characters)"


def model_shape(summary: TraceSummary) -> str:
    """The trace's model in words: name (whole up to SHOWN_NAME_CHARS), experts, top-k, MoE layers."""
    m = summary.meta.model
    enc, dec = summary.layer_counts()
    return f"{_quoted(m.name)} ({shape_text(m.num_experts, m.top_k, enc, dec)})"


def spec_shape(model: ModelSpec) -> str:
    """The run's model in the words of :func:`model_shape`."""
    shape = shape_text(model.num_experts, model.top_k, model.encoder_moe_layers, model.decoder_moe_layers)
    return f"{_quoted(model.name)} ({shape})"


def shape_text(experts: int, top_k: int, enc: int, dec: int) -> str:
    return f"{experts} experts, top-{top_k}, {enc} encoder + {dec} decoder MoE layers"


def _norm_name(name: str) -> str:
    return name.strip().lower().rsplit("/", 1)[-1]


def names_match(trace_name: str, profile_name: str) -> bool:
    """The simulator's name rule: the same name, or it with an organisation prefix and a variant suffix
    ("mistralai/Mixtral-8x7B-Instruct-v0.1" is a "mixtral-8x7b")."""
    tn, mn = _norm_name(trace_name), _norm_name(profile_name)
    return tn == mn or tn.startswith(mn + "-")


def model_mismatch(summary: TraceSummary, model: ModelSpec, subject: str = "trace model") -> str | None:
    """None when the trace is of ``model`` (:func:`trace_matches_model`); else what differs, each difference in
    full, e.g. "trace model 'x' has 8 experts per layer; profile 'y' has 16 experts per layer" (shapes first, then
    the name; ``subject`` names the trace's side)."""
    m = summary.meta.model
    enc, dec = summary.layer_counts()
    theirs, ours = _differences(
        (m.num_experts, m.top_k, enc, dec),
        (model.num_experts, model.top_k, model.encoder_moe_layers, model.decoder_moe_layers),
    )
    same_name = names_match(m.name, model.name)
    if theirs:
        also = "" if same_name else "; and the names differ"
        return f"{subject} {_quoted(m.name)} has {theirs}; profile {_quoted(model.name)} has {ours}{also}"
    if not same_name:  # each name once: two names at their longest and the rule stay within a message's bound
        return (
            f"{subject} name {_quoted(m.name)} is not profile {_quoted(model.name)} (a trace of it is named as "
            "it is, or so with an ORG/ prefix or a -VARIANT suffix)"
        )
    return None


def mismatch_message(problem: str, summary: TraceSummary, model: ModelSpec, limit: int = CONFIG_PROBLEM_CHARS) -> str:
    """A run's message for a trace not of its model, within ``limit`` characters and never cut: ``problem`` (what
    differs, whole: :func:`model_mismatch`), then both shapes with the names and the file; when long names leave no
    room for that, the file alone, its path shortened to the room left (the names are in ``problem`` already)."""
    m = summary.meta.model
    enc, dec = summary.layer_counts()
    theirs = shape_text(m.num_experts, m.top_k, enc, dec)
    ours = shape_text(model.num_experts, model.top_k, model.encoder_moe_layers, model.decoder_moe_layers)
    path = str(summary.path)
    full = (
        f"{problem}: trace model {_quoted(m.name)} ({theirs}) does not match model {_quoted(model.name)} ({ours}) in "
    )
    if len(full) + len(path) <= limit:
        return full + path
    compact = f"{problem} (trace file "
    room = max(min(limit - len(compact) - 1, SHOWN_PATH_CHARS), 40)
    shown = one_line(path, len(path) + 1)
    return f"{compact}{shown if len(shown) <= room else '...' + shown[-(room - 3) :]})"  # the file's own name kept


def _differences(trace: tuple[int, int, int, int], profile: tuple[int, int, int, int]) -> tuple[str, str]:
    """The differing parts of two (experts, top-k, encoder MoE layers, decoder MoE layers) shapes, in words: one
    text for each side ("" for both when they agree)."""
    differs = [a != b for a, b in zip(trace, profile)]

    def words(shape: tuple[int, int, int, int]) -> str:
        experts, top_k, enc, dec = shape
        parts = [f"{experts} experts per layer"] if differs[0] else []
        parts += [f"top-{top_k}"] if differs[1] else []
        layers = [f"{n} {role}" for n, role, d in ((enc, "encoder", differs[2]), (dec, "decoder", differs[3])) if d]
        parts += [" and ".join(layers) + " MoE layers"] if layers else []
        return ", ".join(parts)

    return words(trace), words(profile)


def trace_matches_model(summary: TraceSummary, model: ModelSpec) -> bool:
    """Same experts, top-k and encoder/decoder MoE layer counts, and the same model name (:func:`names_match`);
    :func:`model_mismatch` says what differs."""
    return model_mismatch(summary, model) is None


# --------------------------------------------------------------------------------------------- training traces
def check_training_trace(value, where: str, model: ModelSpec, evaluated_path: Path | None = None) -> Path:
    """The path of a training trace a ``train`` param names, checked when the config loads; ConfigError naming
    ``where`` when it cannot be read, is of another model than the run's, has no routed tokens (nothing to learn:
    a part would silently fall back to its defaults) or is the evaluated trace (the same file, or the same routing
    and request boundaries)."""
    from moebase.files import resolve_path

    path = resolve_path(value, where, "trace file").resolve()
    try:
        summary = read_trace_summary(path)
    except TraceError as exc:
        raise ConfigError(where, str(exc)) from None
    if not trace_matches_model(summary, model):  # both shapes and both names whole: every difference shows
        raise ConfigError(
            where,
            f"training trace {brief(str(value))} is of model {model_shape(summary)}, the run's is {spec_shape(model)}",
        )
    if evaluated_path is not None and _same_trace_file(path, Path(evaluated_path)):
        raise ConfigError(
            where,
            f"training trace {brief(str(value))} is the evaluated trace: it must differ (a part "
            f"learned from the routing it predicts would see the future)",
        )
    tokens, routed = routed_tokens(path)
    if routed == 0:
        raise ConfigError(
            where,
            f"training trace {brief(str(value))} has no routed tokens ({tokens} tokens, "
            f"{'every expert id -1' if tokens else 'none'}): nothing to learn from",
        )
    return path


def _same_trace_file(path: Path, evaluated: Path) -> bool:
    """The same file, or a file with the evaluated trace's request boundaries and routing (a copy of it)."""
    try:
        if os.path.samefile(path, evaluated):
            return True
        a, b = read_trace_summary(path), read_trace_summary(evaluated)
    except (OSError, TraceError):
        return False
    same_lengths = np.array_equal(a.prefill_lengths, b.prefill_lengths) and np.array_equal(
        a.decode_lengths, b.decode_lengths
    )
    if not same_lengths:
        return False
    try:
        ta, tb = load_trace(path), load_trace(evaluated)
    except TraceError:
        return False
    return ta.experts.shape == tb.experts.shape and np.array_equal(ta.experts, tb.experts)


def routed_tokens(path: str | Path) -> tuple[int, int]:
    """(tokens, tokens routed to at least one expert in some layer) of a trace file (cached per file version);
    TraceError when it cannot be read."""
    return _routed_tokens(*file_version(path))


@functools.lru_cache(maxsize=8)
def _routed_tokens(path_str: str, mtime_ns: int, size: int) -> tuple[int, int]:
    experts = load_trace(path_str).experts
    if experts.size == 0:
        return int(experts.shape[0]), 0
    return int(experts.shape[0]), int((experts >= 0).reshape(experts.shape[0], -1).any(axis=1).sum())


__all__ = [
    "TraceSummary",
    "check_training_trace",
    "model_mismatch",
    "model_shape",
    "names_match",
    "prompt_with_info",
    "read_trace_summary",
    "routed_tokens",
    "shape_text",
    "spec_shape",
    "trace_matches_model",
]
