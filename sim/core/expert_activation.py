"""MoE-Infinity's Expert Activation Matrices (EAM), shared by the `moe-infinity` predictor and policy.

MoE-Infinity (Xue et al., "MoE-Infinity: activation-aware expert offloading", 2024; code ``TorchMoE/MoE-Infinity``,
``moe_infinity/memory/expert_tracer.py``) traces expert activation per request:

- a request's **EAM** is a matrix [MoE layers x experts] of how many of the request's tokens were routed to each
  expert so far (prompt and generated tokens alike);
- the **EAM collection** holds the matrices of earlier requests, at most ``capacity`` of them; here the oldest is
  replaced first (FIFO; the artifact replaces the least matched one, a detail that matters little at a capacity
  far above the distinct requests of a trace);
- **matching**: for an ongoing request, the stored matrix with the highest mean cosine similarity over the rows
  (layers) the request has seen so far, each row compared with the same stored row. Rows the request has not
  seen (all zero) take no part; a stored row of zeros counts as similarity 0.

A request's matrix is finished (moved into the collection) when the request leaves the batch: at the start of a
static batch (``new_batch``), when a decode iteration no longer holds it, or when it is prefilled again (a request
served a second time is a new request). Requests are identified by trace request (``Trace.request_index``): two
served copies of one trace request in flight at once share a matrix.

Nothing here reads routing before the engine has made it known: :meth:`ActivationTracker.observe_through` adds
the current iteration's routing of a layer only when a caller (at that layer's gate, or later) asks for it, and
the rest of an iteration's layers are added when the next iteration starts.

Plain Python and numpy: no SimPy, no torch (the validator shares it).
"""

from __future__ import annotations

import numpy as np

from sim.core.workload import phase_layers
from traces.format import Trace


def _unit_rows(m: np.ndarray) -> np.ndarray:
    """Each row (last axis) scaled to unit L2 norm; zero rows stay zero."""
    norm = np.sqrt((m * m).sum(axis=-1, keepdims=True))
    return np.divide(m, norm, out=np.zeros_like(m, dtype=np.float64), where=norm > 0)


def _distribution(rows: np.ndarray) -> np.ndarray:
    """Rows (last axis) scaled to sum 1; zero rows stay zero."""
    s = rows.sum(axis=-1, keepdims=True)
    return np.divide(rows, s, out=np.zeros_like(rows, dtype=np.float64), where=s > 0)


class EAMCollection:
    """At most ``capacity`` finished EAMs (FIFO), with their row-normalised forms kept for matching."""

    def __init__(self, num_layers: int, num_experts: int, capacity: int = 256):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.counts = np.zeros((capacity, num_layers, num_experts))
        self.unit = np.zeros((capacity, num_layers, num_experts))  # rows scaled to unit length
        self.size = 0
        self._next = 0
        self.added = 0  # matrices ever added

    def add(self, matrix: np.ndarray) -> None:
        """Store one request's EAM (all-zero matrices are skipped), replacing the oldest when full."""
        if not matrix.any():
            return
        i = self._next
        self.counts[i] = matrix
        self.unit[i] = _unit_rows(matrix)
        self._next = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        self.added += 1

    def similarity(self, unit: np.ndarray) -> np.ndarray:
        """[R, size]: for EAMs given as unit rows [R, layers, experts], the sum over their rows of the cosine
        with each stored EAM's same row (a zero row adds nothing, so this is the mean over the rows seen, times
        their count: the same ranking)."""
        r, n = unit.shape[0], self.unit[0].size
        return unit.reshape(r, n) @ self.unit[: self.size].reshape(self.size, n).T

    def similarity_of_row(self, unit_row: np.ndarray, layer: int) -> np.ndarray:
        """[R, size]: the part of :meth:`similarity` that one layer's unit rows [R, experts] contribute."""
        return unit_row @ self.unit[: self.size, layer, :].T

    @staticmethod
    def best(sim: np.ndarray) -> np.ndarray:
        """Per row of a similarity matrix [R, size], the most similar slot (ties: the lowest), or -1 where
        nothing is similar (empty collection, nothing seen, no similarity above 0)."""
        r = sim.shape[0]
        if sim.shape[1] == 0 or r == 0:
            return np.full(r, -1, dtype=np.int64)
        best = sim.argmax(axis=1)
        best[sim[np.arange(r), best] <= 1e-9] = -1
        return best


class ActivationTracker:
    """The EAMs of the requests in flight and the collection of finished ones, fed from a trace iteration by
    iteration; also every expert's selection count per layer so far (its global frequency).

    Protocol: :meth:`start_iteration` before an iteration, then :meth:`observe_through` (layer) once that
    layer's gate has run; :meth:`scores` and :meth:`own_rows` then describe the iteration's requests."""

    def __init__(self, trace: Trace, capacity: int = 256):
        self.trace = trace
        self.num_layers, self.num_experts = trace.num_layers, trace.num_experts
        self.collection = EAMCollection(self.num_layers, self.num_experts, capacity)
        self.request_of_row = trace.request_index()
        self.phase_layers = phase_layers(trace)
        self.live: dict[int, np.ndarray] = {}  # request -> EAM so far
        self.global_counts = np.zeros((self.num_layers, self.num_experts))
        # the current iteration
        self.iteration = None
        self.requests = np.zeros(0, dtype=np.int64)  # distinct requests, sorted
        self.matrices = np.zeros((0, self.num_layers, self.num_experts))  # their EAMs (stacked copy of live)
        self._inverse = np.zeros(0, dtype=np.int64)  # row -> position in requests
        self._layers: list[int] = []
        self._observed = 0  # how many of _layers were added
        self._unit = np.zeros((0, self.num_layers, self.num_experts))  # matrices with unit rows
        self._sim = np.zeros((0, 0))  # similarity of the requests to the collection
        self._match: np.ndarray | None = None  # cached best match of the current state

    # ------------------------------------------------------------------------------------------- iterations
    def start_iteration(self, it) -> None:
        """Close the previous iteration (add its remaining layers), retire requests that left, stack the
        iteration's requests."""
        if self.iteration is not None:
            self.observe_through(None)
            for pos, req in enumerate(self.requests.tolist()):
                self.live[req] = self.matrices[pos]
        reqs, inverse = np.unique(self.request_of_row[it.rows], return_inverse=True)
        now = set(reqs.tolist())
        if it.new_batch:
            leaving = list(self.live)
        elif it.kind == "decode":
            leaving = [r for r in self.live if r not in now]
        else:  # requests joining by a prefill: one already live is a new copy of it
            leaving = [r for r in self.live if r in now]
        for r in sorted(leaving):
            self.collection.add(self.live.pop(r))
        self.iteration = it
        self.requests = reqs
        self._inverse = inverse.reshape(-1)
        zero = np.zeros((self.num_layers, self.num_experts))
        self.matrices = (
            np.stack([self.live.get(r, zero).copy() for r in reqs.tolist()])
            if reqs.size
            else np.zeros((0, self.num_layers, self.num_experts))
        )
        self._layers = self.phase_layers[it.kind]
        self._observed = 0
        self._unit = _unit_rows(self.matrices)
        self._sim = self.collection.similarity(self._unit)  # the collection changes only here
        self._match = None

    def observe_through(self, layer: int | None) -> None:
        """Add the current iteration's routing of its layers up to ``layer`` (None: all of them)."""
        if self.iteration is None:
            return
        stop = len(self._layers) if layer is None else self._layers.index(layer) + 1
        rows, e = self.iteration.rows, self.num_experts
        while self._observed < stop:
            lyr = self._layers[self._observed]
            ids = self.trace.experts[rows, lyr, :].astype(np.int64)  # [T, k]
            valid = ids >= 0
            codes = (self._inverse[:, None] * e + ids)[valid]
            counts = np.bincount(codes, minlength=self.requests.size * e).reshape(self.requests.size, e)
            self.matrices[:, lyr, :] += counts
            self.global_counts[lyr] += counts.sum(axis=0)
            new_unit = _unit_rows(self.matrices[:, lyr, :])
            if self.collection.size:  # only this row's cosines change
                self._sim += self.collection.similarity_of_row(new_unit - self._unit[:, lyr, :], lyr)
            self._unit[:, lyr, :] = new_unit
            self._observed += 1
            self._match = None

    def observe_before(self, layer: int) -> None:
        """Add the routing of the current iteration's layers that run before ``layer``."""
        pos = self._layers.index(layer)
        if pos > 0:
            self.observe_through(self._layers[pos - 1])

    # ----------------------------------------------------------------------------------------------- queries
    def matches(self) -> np.ndarray:
        """Per current request, the slot of its most similar stored EAM, or -1."""
        if self._match is None:
            self._match = self.collection.best(self._sim)
        return self._match

    def own_rows(self, layer: int) -> np.ndarray:
        """[R, experts]: each current request's own EAM row of ``layer``, as a distribution (zero if unseen)."""
        return _distribution(self.matrices[:, layer, :])

    def matched_rows(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """([R, experts] the matched stored EAM's row of ``layer`` as a distribution, bool [R] matched)."""
        best = self.matches()
        ok = best >= 0
        out = np.zeros((best.size, self.num_experts))
        if ok.any():
            out[ok] = _distribution(self.collection.counts[best[ok], layer, :])
        return out, ok

    def scores(self, layer: int) -> np.ndarray:
        """[experts]: predicted activation of ``layer``'s experts for the current requests: per request, the
        matched stored EAM's row of ``layer`` as a distribution, summed over requests. A request without a match
        uses its own row (its earlier tokens), else the layer's global frequency so far; all zero if none."""
        matched, ok = self.matched_rows(layer)
        if not ok.all():
            own = self.own_rows(layer)
            has_own = own.any(axis=1)  # numpy's stubs: may be a scalar; here an array, indexed below
            fallback = _distribution(self.global_counts[layer])
            for i in np.flatnonzero(~ok):
                matched[i] = own[i] if has_own[i] else fallback  # type: ignore[index]  # numpy stub gap (above)
        return matched.sum(axis=0)

    def frequency(self, layer: int) -> np.ndarray:
        """[experts]: each expert's share of ``layer``'s selections so far, Laplace-smoothed (never 0)."""
        c = self.global_counts[layer]
        return (c + 1.0) / (c.sum() + c.size)
