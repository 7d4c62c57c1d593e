"""What a run config needs from a trace without reading its routing: metadata and request lengths, read from the
file's header (cached per file version), and whether the trace is of the config's model."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.model_spec import ModelSpec
from traces.errors import TraceError
from traces.format import TraceMeta
from traces.io import load_trace_header


@dataclass(frozen=True)
class TraceSummary:
    """What a config needs from a trace without reading its routing: metadata and request lengths."""

    path: Path
    meta: TraceMeta
    prefill_lengths: np.ndarray  # int64 [R]
    decode_lengths: np.ndarray   # int64 [R]

    @property
    def num_requests(self) -> int:
        return int(self.prefill_lengths.shape[0])

    def layer_counts(self) -> tuple[int, int]:
        roles = [x.role for x in self.meta.model.layers]
        return roles.count("encoder"), roles.count("decoder")

    def max_request_tokens(self, max_decode_tokens: int | None) -> int:
        """The most KV-cache tokens one request holds: its prompt plus its (capped) generated tokens."""
        decode = self.decode_lengths
        if max_decode_tokens is not None:
            decode = np.minimum(decode, max_decode_tokens)
        return int((self.prefill_lengths + decode).max()) if self.num_requests else 0


def read_trace_summary(path: str | Path) -> TraceSummary:
    """Metadata and request lengths of a trace file, read without its expert arrays (cached per file version).
    Raises TraceError naming the file, like :func:`traces.io.load_trace`."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        raise TraceError(path, "no such file") from None
    return _trace_summary(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=32)
def _trace_summary(path_str: str, mtime_ns: int, size: int) -> TraceSummary:
    path = Path(path_str)
    meta, experts_shape, offsets, prefill = load_trace_header(path)
    if offsets.dtype != np.int64 or offsets.ndim != 1 or offsets.shape[0] < 2 or offsets[0] != 0 \
            or np.any(np.diff(offsets) < 0):
        raise TraceError(path, "request_offsets must be non-decreasing int64 [requests + 1] starting at 0")
    if len(experts_shape) != 3 or experts_shape[0] != offsets[-1] or experts_shape[1] != len(meta.model.layers):
        raise TraceError(path, f"experts shape {list(experts_shape)} does not match request_offsets "
                               f"(ending at {offsets[-1]}) and the {len(meta.model.layers)} layers of its metadata")
    lengths = np.diff(offsets)
    if prefill.dtype != np.int64 or prefill.shape != lengths.shape or np.any(prefill < 0) \
            or np.any(prefill > lengths):
        raise TraceError(path, "prefill_lengths must be int64, one per request, between 0 and its token count")
    return TraceSummary(path, meta, prefill, lengths - prefill)


def _norm_name(name: str) -> str:
    return name.strip().lower().rsplit("/", 1)[-1]


def trace_matches_model(summary: TraceSummary, model: ModelSpec) -> bool:
    """Same experts, top-k and encoder/decoder MoE layer counts, and the same model name; a trace name may carry
    an organisation prefix and a variant suffix ("mistralai/Mixtral-8x7B-Instruct-v0.1" is a "mixtral-8x7b")."""
    m = summary.meta.model
    enc, dec = summary.layer_counts()
    tn, mn = _norm_name(m.name), _norm_name(model.name)
    return ((tn == mn or tn.startswith(mn + "-"))
            and (m.num_experts, m.top_k, enc, dec)
            == (model.num_experts, model.top_k, model.encoder_moe_layers, model.decoder_moe_layers))


__all__ = ["TraceSummary", "read_trace_summary", "trace_matches_model"]
