"""`moe-infinity`: MoE-Infinity's activation-aware prediction from Expert Activation Matrices
(``sim/core/expert_activation.py``).

At layer ``l``'s gate, every request of the iteration has an EAM of its tokens' routing so far (earlier iterations,
and this iteration's layers up to ``l``); each is matched with the most similar EAM of an earlier request (mean
row cosine over the rows seen), and that stored EAM's row ``l+1``, as a distribution over experts, is the
request's predicted activation of layer ``l+1``; the batch's score sums them over requests. A request with no
match (empty collection) uses its own row ``l+1`` from its earlier tokens, else layer ``l+1``'s global frequency.

The rule (MoE-Infinity prefetches the experts with a predicted activation above zero, highest first, from a
priority queue the next layer's prediction re-orders; here one layer is prefetched at a time into finite working
buffers, so the queue is cut): the guess is the experts whose score is at least ``threshold`` x the highest score,
highest first, at most ``budget`` of them (default ``2 x top_k x`` the iteration's requests, capped at the
layer's experts). ``threshold: 0`` with a large budget is the artifact's "every expert seen in the matched
matrix".

``train`` (optional): a training trace (same model shape, not the evaluated trace) whose requests' EAMs fill the
collection before the run, as MoE-Infinity's offline-built EAM collection; without it, the collection starts
empty and learns from the requests served. ``capacity``: EAMs kept (FIFO).

Reads the current iteration's routing only for layers whose gate has run; never ``truth``.
"""

from __future__ import annotations

import numpy as np

from moebase.errors import ConfigError
from sim.config.params import MAX_EXPERTS, between, training_trace
from sim.core.expert_activation import ActivationTracker
from sim.predictors.base import PREDICTORS, Predictor
from sim.predictors.transition import load_training_trace


def request_matrices(trace) -> np.ndarray:
    """[requests, layers, experts]: every request's whole EAM (token counts) in a trace."""
    e = trace.num_experts
    req = trace.request_index()
    ids = trace.experts.astype(np.int64)  # [T, L, k]
    n_layers = ids.shape[1]
    codes = (req[:, None, None] * n_layers + np.arange(n_layers)[None, :, None]) * e + ids
    counts = np.bincount(codes[ids >= 0], minlength=trace.num_requests * n_layers * e)
    return counts.reshape(trace.num_requests, n_layers, e).astype(np.float64)


def check_capacity(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(where, f"must be an integer >= 1, got {value!r}")
    return value


@PREDICTORS.register("moe-infinity")
class MoEInfinityPredictor(Predictor):
    PARAMS = {"threshold": 0.1, "budget": None, "capacity": 256, "train": None}
    # capacity: EAMs kept, each a [layers, experts] float array (twice): bounded so that it cannot exhaust memory
    PARAM_RULES = {
        "threshold": between(0.0, 1.0),
        "budget": between(1, MAX_EXPERTS, kind=int),
        "capacity": between(1, 1 << 14),
        "train": training_trace(),
    }

    def configure(self) -> None:
        p = self.params
        if not 0.0 <= p["threshold"] <= 1.0:
            raise ConfigError("predictor.params.threshold", f"must lie in [0, 1], got {p['threshold']}")
        budget = p["budget"]
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ConfigError(
                "predictor.params.budget", f"must be an integer >= 1 or null (2 x top_k x requests), got {budget!r}"
            )
        capacity = check_capacity(p["capacity"], "predictor.params.capacity")
        self.trace = self.ctx.workload_trace(f"predictor {self.name!r}")
        self.tracker = ActivationTracker(self.trace, capacity)
        if p["train"] is not None:
            train = load_training_trace(p["train"], "predictor.params.train", self.trace, self.ctx.trace_path)
            for m in request_matrices(train)[-capacity:]:
                self.tracker.collection.add(m)

    def start_iteration(self, iteration) -> None:
        self.tracker.start_iteration(iteration)

    def budget(self) -> int:
        b = self.params["budget"]
        if b is None:
            b = 2 * self.trace.top_k * max(1, int(self.tracker.requests.size))
        return min(b, self.ctx.num_experts)

    def predict(self, iteration, layer, truth, current):
        tracker = self.tracker
        tracker.observe_before(layer)  # the routing known at this gate
        score = tracker.scores(layer)
        top = score.max(initial=0.0)
        if top <= 0:
            return frozenset()
        order = np.argsort(-score, kind="stable")[: self.budget()]
        cut = max(self.params["threshold"] * top, 1e-12)
        return frozenset(int(e) for e in order if score[e] >= cut)
