"""The one trace format: routing of every token in every MoE layer, request boundaries, and metadata.

A trace holds, for T tokens, L MoE layers and top-k routing:

- ``experts``: int16 [T, L, k], the expert ids a token was routed to in a layer, in the router's order
  (highest gate weight first). -1 means "no routing here": a dropped token, or a layer the token never
  passes (encoder layers for generated tokens, decoder layers for prompt tokens in an encoder-decoder model).
- ``weights``: optional float16 [T, L, k], the gate weights of those experts (0 where the id is -1).
- ``request_offsets``: int64 [R + 1], request r owns tokens ``offsets[r]:offsets[r+1]``, in time order.
- ``prefill_lengths``: int64 [R], how many leading tokens of each request are its prompt (prefill); the rest
  are generated (decode) tokens, one per decode iteration.
- ``meta``: :class:`TraceMeta`, the model routed, where the trace came from, and the seed that made it;
  optionally ``request_info``, per-request facts from the source (one list of R plain values per field, e.g. the
  data set and prompt length of each request of a decode-only import).

Invariants are checked by :meth:`Trace.validate`; :func:`traces.io.load_trace` calls it on every load.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import numpy as np

from moebase.errors import brief, one_line

FORMAT_VERSION = 1
LAYER_ROLES = ("encoder", "decoder")
PROVENANCE_KINDS = ("recorded", "imported", "synthetic")
#: The largest integer metadata may hold: every count, index and seed must fit in an int64.
INT_MAX = int(np.iinfo(np.int64).max)
#: The most requests a trace may hold. Each request costs the simulator time and memory whether or not it has
#: tokens (ten million empty requests took a minute and 2.2 GB to replay 20 tokens), so a trace is refused above.
MAX_REQUESTS = 1 << 20
#: The longest prompt a trace may claim for a request (``request_info.prompt_len``: 2,097,152 tokens, above the
#: context of every model profiled here). A decode-only import keeps its source's prompt lengths there, and the
#: simulator sizes each request's KV cache from them, so a claim of millions of tokens is refused, not simulated.
MAX_CONTEXT = 1 << 21


def _fail(msg: str):
    raise ValueError(msg)


def _check_keys(d: Any, where: str, required: set[str], optional: AbstractSet[str] = frozenset()) -> None:
    if not isinstance(d, dict):
        _fail(f"metadata {where} must be an object, got {type(d).__name__}")
    missing = sorted(required - d.keys())
    if missing:
        _fail(f"metadata {where} is missing {', '.join(missing)}")
    unknown = sorted(d.keys() - required - set(optional))
    if unknown:
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        _fail(f"metadata {where} has unknown key(s) {', '.join(one_line(k, 40) for k in unknown[:3])}{more}")


def _int(value: Any, where: str, minimum: int = 0, maximum: int = INT_MAX) -> int:
    """``value`` as an int in minimum..maximum; a bool is not an integer here (JSON true is not 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        _fail(f"metadata {where} must be an integer >= {minimum}, got {brief(value)}")
    if value > maximum:
        _fail(f"metadata {where} must be at most {maximum}, got {brief(value)}")
    return int(value)


@overload
def _str(value: Any, where: str, allow_none: Literal[False] = False) -> str: ...
@overload
def _str(value: Any, where: str, allow_none: bool) -> str | None: ...
def _str(value: Any, where: str, allow_none: bool = False) -> str | None:
    """``value``, a non-empty string (or None when ``allow_none``); ValueError naming ``where`` otherwise."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value:
        _fail(f"metadata {where} must be a non-empty string, got {brief(value)}")
    return value


@dataclass(frozen=True)
class LayerInfo:
    """One MoE layer: its position among the model's transformer blocks and which stack it is in."""

    index: int
    role: str = "decoder"

    @classmethod
    def from_dict(cls, d: Any, where: str) -> LayerInfo:
        _check_keys(d, where, {"index", "role"})
        role = d["role"]
        if role not in LAYER_ROLES:
            _fail(f"metadata {where}.role must be one of {', '.join(LAYER_ROLES)}, got {brief(role)}")
        return cls(index=_int(d["index"], f"{where}.index"), role=role)


@dataclass(frozen=True)
class ModelInfo:
    """The routed model: name, experts per MoE layer, experts per token, and its MoE layers in order."""

    name: str
    num_experts: int
    top_k: int
    layers: tuple[LayerInfo, ...]

    @classmethod
    def decoder_only(cls, name: str, num_experts: int, top_k: int, num_layers: int) -> ModelInfo:
        return cls(name, num_experts, top_k, tuple(LayerInfo(i, "decoder") for i in range(num_layers)))

    @classmethod
    def from_dict(cls, d: Any) -> ModelInfo:
        _check_keys(d, "model", {"name", "num_experts", "top_k", "layers"})
        if not isinstance(d["layers"], list) or not d["layers"]:
            _fail("metadata model.layers must be a non-empty list")
        layers = tuple(LayerInfo.from_dict(x, f"model.layers[{i}]") for i, x in enumerate(d["layers"]))
        num_experts = _int(d["num_experts"], "model.num_experts", 1, int(np.iinfo(np.int16).max))
        top_k = _int(d["top_k"], "model.top_k", 1)
        if top_k > num_experts:
            _fail(f"metadata model.top_k ({top_k}) exceeds model.num_experts ({num_experts})")
        return cls(_str(d["name"], "model.name"), num_experts, top_k, layers)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "layers": [{"index": x.index, "role": x.role} for x in self.layers],
        }


@dataclass(frozen=True)
class Provenance:
    """Where a trace came from: how it was made, by which tool, from which model and data set, and when.

    ``date`` is an ISO-8601 date or date-time; it may be None only for synthetic traces, whose content is a
    function of their knobs and seed (leaving the date out keeps same-seed files byte-identical).
    """

    kind: str
    tool: str
    model: str
    dataset: str
    date: str | None

    @classmethod
    def from_dict(cls, d: Any) -> Provenance:
        _check_keys(d, "provenance", {"kind", "tool", "model", "dataset", "date"})
        kind = d["kind"]
        if kind not in PROVENANCE_KINDS:
            _fail(f"metadata provenance.kind must be one of {', '.join(PROVENANCE_KINDS)}, got {brief(kind)}")
        date = _str(d["date"], "provenance.date", allow_none=(kind == "synthetic"))
        if date is not None:
            try:
                _dt.datetime.fromisoformat(date.replace("Z", "+00:00"))
            except ValueError:
                _fail(f"metadata provenance.date must be an ISO-8601 date, got {brief(date)}")
        return cls(
            kind,
            _str(d["tool"], "provenance.tool"),
            _str(d["model"], "provenance.model"),
            _str(d["dataset"], "provenance.dataset"),
            date,
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def today() -> str:
    """Today's UTC date-time, the default ``provenance.date`` of recorded and imported traces."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class TraceMeta:
    """Metadata of a trace. ``request_ids`` name the requests (optional); ``extra`` is free-form notes
    from the tool that made the trace (e.g. how many tokens an import dropped, the knobs of a synthetic trace).
    ``request_info`` (optional) holds per-request facts as columns: field name -> one plain value (string,
    number, bool or null) per request, in request order, e.g. ``{"dataset": [...], "prompt_len": [...]}``."""

    model: ModelInfo
    provenance: Provenance
    seed: int | None = None
    request_ids: tuple[str, ...] | None = None
    extra: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    request_info: dict[str, list] | None = None

    @classmethod
    def from_dict(cls, d: Any) -> TraceMeta:
        _check_keys(d, "", {"format_version", "model", "provenance", "seed"}, {"request_ids", "extra", "request_info"})
        version = d["format_version"]
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version != FORMAT_VERSION:
            _fail(f"metadata format_version {brief(version)} is not supported (this version reads {FORMAT_VERSION})")
        seed = None if d["seed"] is None else _int(d["seed"], "seed")
        ids = d.get("request_ids")
        if ids is not None:
            if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
                _fail("metadata request_ids must be a list of strings")
            ids = tuple(ids)
        extra = d.get("extra", {})
        if not isinstance(extra, dict):
            _fail("metadata extra must be an object")
        info = d.get("request_info")
        if info is not None:
            info = _request_info(info)
        return cls(
            ModelInfo.from_dict(d["model"]), Provenance.from_dict(d["provenance"]), seed, ids, extra, request_info=info
        )

    def to_dict(self) -> dict:
        d = {
            "format_version": self.format_version,
            "model": self.model.to_dict(),
            "provenance": self.provenance.to_dict(),
            "seed": self.seed,
        }
        if self.request_ids is not None:
            d["request_ids"] = list(self.request_ids)
        if self.extra:
            d["extra"] = self.extra
        if self.request_info is not None:
            d["request_info"] = {
                k: [x.item() if isinstance(x, np.generic) else x for x in v] for k, v in self.request_info.items()
            }
        return d


def _check_prompt_lengths(column: list | tuple) -> None:
    """``request_info.prompt_len``: per request null (unknown) or an integer 0..MAX_CONTEXT (tokens)."""
    for i, v in enumerate(column):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= MAX_CONTEXT:
            _fail(
                f"metadata request_info.prompt_len[{i}] must be null or an integer 0..{MAX_CONTEXT} (tokens), "
                f"got {brief(v)}"
            )


def _request_info(info: Any) -> dict[str, list]:
    """Check ``request_info``: an object of columns, each a list of plain values, all of one length."""
    if not isinstance(info, dict):
        _fail("metadata request_info must be an object of per-request lists")
    lengths = set()
    for name, column in info.items():
        if name == "prompt_len" and isinstance(column, (list, tuple)):
            _check_prompt_lengths(column)
        if not isinstance(name, str) or not name:
            _fail(f"metadata request_info has a field name that is not a non-empty string: {brief(name)}")
        if not isinstance(column, (list, tuple)):
            _fail(f"metadata request_info.{one_line(name, 40)} must be a list (one value per request)")
        for i, v in enumerate(column):
            plain = (
                v is None
                or isinstance(v, (str, bool))
                or (isinstance(v, (int, np.integer)) and -INT_MAX - 1 <= v <= INT_MAX)
                or (isinstance(v, (float, np.floating)) and np.isfinite(v))
            )
            if not plain:
                _fail(
                    f"metadata request_info.{one_line(name, 40)}[{i}] must be a string, finite number (integers "
                    f"within 64 bits), bool or null, got {brief(v)}"
                )
        lengths.add(len(column))
    if len(lengths) > 1:
        _fail(f"metadata request_info lists have different lengths ({', '.join(map(str, sorted(lengths)))})")
    return {k: list(v) for k, v in info.items()}


@dataclass(frozen=True, eq=False)
class Trace:
    """Routing of T tokens (all requests, concatenated in time order) through L MoE layers, top-k each."""

    experts: np.ndarray
    request_offsets: np.ndarray
    prefill_lengths: np.ndarray
    meta: TraceMeta
    weights: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.experts.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.experts.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.experts.shape[2])

    @property
    def num_experts(self) -> int:
        return self.meta.model.num_experts

    @property
    def num_requests(self) -> int:
        return int(self.request_offsets.shape[0] - 1)

    @property
    def request_lengths(self) -> np.ndarray:
        return np.diff(self.request_offsets)

    def request_slice(self, r: int) -> slice:
        return slice(int(self.request_offsets[r]), int(self.request_offsets[r + 1]))

    def request_index(self) -> np.ndarray:
        """int64 [T]: the request each token belongs to."""
        return np.repeat(np.arange(self.num_requests), self.request_lengths)

    def position_in_request(self) -> np.ndarray:
        """int64 [T]: each token's position within its request (0 = first prompt token)."""
        return np.arange(self.num_tokens) - np.repeat(self.request_offsets[:-1], self.request_lengths)

    def decode_mask(self) -> np.ndarray:
        """bool [T]: True for generated (decode) tokens, False for prompt (prefill) tokens."""
        return self.position_in_request() >= np.repeat(self.prefill_lengths, self.request_lengths)

    def validate(self) -> None:
        """Raise ValueError naming the first broken rule of the format."""
        e, off, pre, meta = self.experts, self.request_offsets, self.prefill_lengths, self.meta
        if not isinstance(meta, TraceMeta):
            _fail("meta must be a TraceMeta")
        if not isinstance(e, np.ndarray) or e.dtype != np.int16 or e.ndim != 3:
            _fail(f"experts must be int16 [tokens, layers, top_k], got {_describe(e)}")
        if e.shape[1] != len(meta.model.layers):
            _fail(f"experts has {e.shape[1]} layers but metadata model.layers lists {len(meta.model.layers)}")
        if e.shape[2] != meta.model.top_k:
            _fail(f"experts has top_k {e.shape[2]} but metadata model.top_k is {meta.model.top_k}")
        if e.size:
            lo, hi = int(e.min()), int(e.max())
            if lo < -1 or hi >= meta.model.num_experts:
                bad = lo if lo < -1 else hi
                _fail(
                    f"experts holds id {bad}, outside -1..{meta.model.num_experts - 1} "
                    f"(model.num_experts = {meta.model.num_experts})"
                )
            dup = _repeated_ids(e)
            if dup is not None:
                t, layer = dup
                _fail(f"experts repeats an expert id within one token's top-k (token {t}, layer {layer})")
        if not isinstance(off, np.ndarray) or off.dtype != np.int64 or off.ndim != 1 or off.shape[0] < 2:
            _fail(f"request_offsets must be int64 [requests + 1] with at least one request, got {_describe(off)}")
        if off.shape[0] - 1 > MAX_REQUESTS:
            _fail(f"{off.shape[0] - 1} requests, more than the limit of {MAX_REQUESTS}")
        if off[0] != 0 or off[-1] != e.shape[0]:
            _fail(f"request_offsets must run from 0 to the token count {e.shape[0]}, got {off[0]}..{off[-1]}")
        if np.any(np.diff(off) < 0):
            _fail("request_offsets must be non-decreasing")
        if not isinstance(pre, np.ndarray) or pre.dtype != np.int64 or pre.shape != (off.shape[0] - 1,):
            _fail(f"prefill_lengths must be int64 [{off.shape[0] - 1}], got {_describe(pre)}")
        if np.any(pre < 0) or np.any(pre > np.diff(off)):
            _fail("prefill_lengths must lie between 0 and each request's token count")
        if meta.request_ids is not None and len(meta.request_ids) != off.shape[0] - 1:
            _fail(f"metadata request_ids has {len(meta.request_ids)} names for {off.shape[0] - 1} requests")
        if meta.request_info is not None:
            _request_info(meta.request_info)
            for name, column in meta.request_info.items():
                if len(column) != off.shape[0] - 1:
                    _fail(
                        f"metadata request_info.{one_line(name, 40)} has {len(column)} values for "
                        f"{off.shape[0] - 1} requests"
                    )
        w = self.weights
        if w is not None:
            if not isinstance(w, np.ndarray) or w.dtype != np.float16 or w.shape != e.shape:
                _fail(f"weights must be float16 {list(e.shape)} like experts, got {_describe(w)}")
            if not np.all(np.isfinite(w)):
                _fail("weights holds a value that is not finite")


#: Up to this top-k, :func:`_repeated_ids` compares each pair of columns (k(k-1)/2 passes, faster than sorting).
PAIRWISE_TOP_K = 8


def _repeated_ids(e: np.ndarray) -> tuple[int, int] | None:
    """The first (token, layer) whose top-k repeats an expert id (-1, no expert, may repeat), or None."""
    k = e.shape[2]
    if k < 2:
        return None
    if k <= PAIRWISE_TOP_K:
        cols = [e[:, :, i] for i in range(k)]
        dup = np.zeros(e.shape[:2], dtype=bool)
        for i in range(k - 1):
            real = cols[i] >= 0
            for j in range(i + 1, k):
                dup |= (cols[i] == cols[j]) & real
    else:
        s = np.sort(e, axis=2)
        dup = ((s[:, :, 1:] == s[:, :, :-1]) & (s[:, :, 1:] >= 0)).any(axis=2)
    if not dup.any():
        return None
    t, layer = np.argwhere(dup)[0]
    return int(t), int(layer)


def _describe(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype} {list(a.shape)}"
    return type(a).__name__
