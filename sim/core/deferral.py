"""Expert deferral (a system's ``deferral: D``, kTransformers SOSP'25 / SGLang ``--kt-max-deferred-experts-per-token``):
which of a layer's host experts wait until the next layer. The rule, kt-kernel's ``select_deferred_experts``: each
token's top ``k - D`` routed experts by routing score are protected (the trace stores a token's experts highest
first), and a host expert is deferred when no token of the layer protects it. The engine times the deferred ones
after the others (``sim/timing/engine.py``, ``HostStream.run_deferring``)."""

from __future__ import annotations

import numpy as np

from traces.format import Trace


def deferred_experts(trace: Trace, rows: np.ndarray, layer: int, host: tuple[int, ...], deferral: int) -> set[int]:
    """The experts of ``host`` (a layer's experts computed on the host) that every token of ``rows`` ranks among its
    ``deferral`` lowest."""
    protected = max(trace.top_k - deferral, 0)
    kept = set(trace.experts[rows, layer][:, :protected].ravel().tolist())
    return {e for e in host if e not in kept}


__all__ = ["deferred_experts"]
