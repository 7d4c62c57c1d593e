"""Benchmark traces from a recorded one (``sim bench``, docs/phases.md): requests of a given prompt length and of a
given number of generated tokens, their routing replayed from the trace's rows.

The rule for the prompt's experts: a prompt token's experts are those of the trace's prompt (prefill) rows, taken in
order over the requests and repeated from the first when more are needed; a trace without prompt rows (a decode-only
import) replays its decode rows as prompt rows, in the same way. Generated tokens replay the decode rows (the prompt
rows when the trace has none). Each benchmark request takes the next rows of its kind, so ``batch`` requests route
differently when the trace has enough rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from traces.format import Trace


def _rows(trace: Trace, prompt: bool) -> np.ndarray:
    """The trace's rows of one kind (prompt or decode) in order; the other kind's when it has none."""
    mask = ~trace.decode_mask() if prompt else trace.decode_mask()
    rows = np.flatnonzero(mask)
    if rows.size == 0:
        rows = np.flatnonzero(~mask)
    if rows.size == 0:
        raise ValueError("the trace has no rows")
    return rows


def bench_trace(trace: Trace, prompt_tokens: int, generated_tokens: int, requests: int) -> Trace:
    """``requests`` requests of ``prompt_tokens`` prompt rows then ``generated_tokens`` decode rows each, routed as
    the module's rule says."""
    if prompt_tokens < 0 or generated_tokens < 0 or requests < 1 or prompt_tokens + generated_tokens < 1:
        raise ValueError("a benchmark request needs at least one token")
    parts, pre, dec = [], _rows(trace, True), _rows(trace, False)
    for r in range(requests):
        if prompt_tokens:
            parts.append(pre[(r * prompt_tokens + np.arange(prompt_tokens)) % pre.size])
        if generated_tokens:
            parts.append(dec[(r * generated_tokens + np.arange(generated_tokens)) % dec.size])
    rows = np.concatenate(parts)
    per = prompt_tokens + generated_tokens
    out = Trace(
        experts=np.ascontiguousarray(trace.experts[rows]),
        request_offsets=np.arange(requests + 1, dtype=np.int64) * per,
        prefill_lengths=np.full(requests, prompt_tokens, dtype=np.int64),
        meta=dataclasses.replace(trace.meta, request_ids=None, request_info=None),
        weights=None if trace.weights is None else np.ascontiguousarray(trace.weights[rows]),
    )
    out.validate()
    return out


__all__ = ["bench_trace"]
