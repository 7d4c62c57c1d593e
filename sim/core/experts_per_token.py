"""Fewer routed experts per token than the model's top-k (``system.experts_per_token: N``): llama.cpp's
``--override-kv ARCH.expert_used_count=int:N``, SGLang/vLLM's ``num_experts_per_tok`` override, kTransformers'
``--n_activated_experts`` / ``experts_per_token`` option of a published row.

The rule: a token keeps the N highest-ranked of its routed experts in each layer, where the rank is the gate weight
when the trace stores weights (:attr:`traces.format.Trace.weights`; highest first, ties in the stored order) and
otherwise the stored order, which the trace format defines as the router's (``experts`` [T, L, k] "in the router's
order, highest gate weight first", traces/format.py). "No routing here" (-1) ranks after every routed expert, so a
token with r routed experts in a layer keeps min(N, r) of them and never gains one. N at or above the trace's top-k
changes nothing (the trace is returned as is). The reduced trace has top-k min(N, k) and is what every part of the
run reads (the policy's hot ranking, the predictors, the engine), as if the router had picked N.

Not modelled: the router renormalising the kept weights (the simulator prices experts by count, not by weight).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from traces.format import Trace


def keep_top_experts(trace: Trace, n: int | None) -> Trace:
    """``trace`` with each token's N highest-ranked routed experts per layer (see the module docstring); ``trace``
    itself when ``n`` is None or at least its top-k."""
    if n is None or n >= trace.top_k:
        return trace
    if n < 1:
        raise ValueError(f"experts per token must be >= 1, got {n}")
    experts = trace.experts
    k = trace.top_k
    if trace.weights is not None:
        score = trace.weights.astype(np.float32)
    else:
        score = np.broadcast_to(-np.arange(k, dtype=np.float32), experts.shape)  # the stored order
    score = np.where(experts < 0, -np.inf, score)
    order = np.argsort(-score, axis=-1, kind="stable")[..., :n]  # highest first; ties keep the stored order
    kept = np.take_along_axis(experts, order, axis=-1)
    weights = None if trace.weights is None else np.take_along_axis(trace.weights, order, axis=-1)
    model = dataclasses.replace(trace.meta.model, top_k=n)
    meta = dataclasses.replace(trace.meta, model=model)
    return Trace(
        np.ascontiguousarray(kept, dtype=experts.dtype),
        trace.request_offsets,
        trace.prefill_lengths,
        meta,
        None if weights is None else np.ascontiguousarray(weights),
    )


__all__ = ["keep_top_experts"]
