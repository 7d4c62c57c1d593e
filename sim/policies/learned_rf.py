"""`learned-rf`: evict the cached expert with the largest learned score of recency and frequency features, the
weights fitted offline on a training trace (never on the evaluated one).

In the spirit of FlashMoE (Kim, Lee, Han, Yoo, Kim, "FlashMoE: Reducing SSD I/O Bottlenecks via ML-Based Cache
Replacement for Mixture-of-Experts Inference on Edge Devices", arXiv 2601.17063, 2026), whose cache replacement is
"a lightweight ML-based caching strategy that adaptively combines recency and frequency signals" (its abstract; the
paper's model, features and training could not be read from here). Every rule below is therefore **guessed**:

- Features of an expert of a layer at the layer's step ``t`` (time is the layer's own step count, one per
  iteration in which it runs; uses are counted whether the expert was cached or not, since the run started):
  ``recency = log2(1 + age)`` with ``age`` the steps since its last use, and ``frequency = log2(uses / t)``, its
  share of the layer's steps so far.
- The model: a linear score ``w0 + w1 recency + w2 frequency`` that predicts ``log2`` of the steps until the
  expert's next use in the layer; the victim is the cached expert with the largest score (the one predicted to
  come back last) among those the layer does not use now; ties go to the least recent use, then the lower id.
- Training (``train``: the path of a training trace of the same model, which must not be the evaluated trace: a
  file with the same routing and request boundaries is refused, as ``transition``'s ``train``): the training trace is
  replayed as a workload of static batches of ``train_batch`` requests (default 1), prompts included where its model
  routes them; in each of the run's cached layers, at every step and for every expert used before but not in that
  step (the experts that could be evicted then), the features above and the target ``log2`` of the steps to its next
  use (when there is none in the trace, the steps to one past the trace's end) make one sample; the weights are the
  least-squares fit over every sample of every layer (one model for all layers).
- Without ``train``: fixed default weights ``w = (0, 1, -1)``, i.e. the score ``log2((1 + age) / share)``: the
  expert that is both long unused and rarely used goes first (recency and frequency weighed equally).

The learned weights are in ``weights`` (``weights_source`` says "default" or the training trace's path).

Tiers and sets as ``lru`` (``sim.policies.base.PerLayerCache``): no pinned experts by default, the layer's
``hpc_slots + mpc_slots`` as one cache (hits count as MPC hits); ``pin_hot: true`` pins the layer's hottest
``hpc_slots`` experts and the rule runs on the ``mpc_slots`` others. The cache starts empty. A layer's active
experts in one iteration are used together: their counts and last uses are updated first, then each newcomer (a
miss or a prefetched expert) enters in id order, evicting the victim above; when every slot holds an expert in use
now the newcomer is not admitted (otherwise every newcomer is admitted: no bypass). Copies land in their slot.

Shared cache (``cache.organization: shared``): the same per-layer state and step; the victim is the expert of any
cached layer, but those the running layer uses now, whose predicted next use is furthest in whole-model layer steps
(``Policy.global_distance``); ties as above, then the higher layer.
"""

from __future__ import annotations

import math

import numpy as np

from moebase.errors import ConfigError
from sim.config.params import between, training_trace
from sim.core.workload import active_sets, build_iterations, phase_layers
from sim.policies.base import POLICIES, LayerPlan, PerLayerCache

ORIGIN = "published"

#: (bias, recency, frequency) without a training trace.
DEFAULT_WEIGHTS: tuple[float, ...] = (0.0, 1.0, -1.0)


def layer_steps(trace, batch: int, layers) -> dict[int, list[tuple[int, ...]]]:
    """Per layer of ``layers``, the sorted active experts of each of its steps when ``trace`` is served in static
    batches of ``batch`` requests (prompts included where the model routes them)."""
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    phases = phase_layers(trace)
    out: dict[int, list[tuple[int, ...]]] = {layer: [] for layer in layers}
    for it in its:
        run = [layer for layer in phases[it.kind] if layer in out]
        if not run:
            continue
        for layer, (active, _) in zip(run, active_sets(trace, it.rows, run)):
            out[layer].append(active)
    return out


def samples(steps: list[tuple[int, ...]], num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Features [n, 3] (1, recency, frequency) and targets [n] of one layer's steps (see the module doc)."""
    n_steps = len(steps)
    if n_steps == 0:
        return np.zeros((0, 3)), np.zeros(0)
    used = np.zeros((n_steps, num_experts), dtype=bool)
    for i, active in enumerate(steps):
        used[i, list(active)] = True
    t = np.arange(1, n_steps + 1, dtype=np.int64)[:, None]  # the step, 1-based
    uses = np.cumsum(used, axis=0)  # uses up to and including t
    last = np.maximum.accumulate(np.where(used, t, 0), axis=0)  # last use <= t (0: none)
    after = np.where(used, t, n_steps + 1)
    first_from = np.minimum.accumulate(after[::-1], axis=0)[::-1]  # first use >= t
    nxt = np.vstack([first_from[1:], np.full((1, num_experts), n_steps + 1)])  # first use > t
    candidate = (uses > 0) & ~used
    age = (t - last)[candidate]
    share = (uses / t)[candidate]
    target = np.log2((nxt - t)[candidate].astype(np.float64))
    x = np.column_stack([np.ones(age.size), np.log2(1.0 + age), np.log2(share)])
    return x, target


def fit_weights(trace, layers, batch: int = 1) -> tuple[float, ...]:
    """Least-squares weights (bias, recency, frequency) over every layer of ``layers`` of ``trace``."""
    xtx = np.zeros((3, 3))
    xty = np.zeros(3)
    for steps in layer_steps(trace, batch, sorted(layers)).values():
        x, y = samples(steps, trace.num_experts)
        xtx += x.T @ x
        xty += x.T @ y
    if not xtx[0, 0]:
        return DEFAULT_WEIGHTS
    w = np.linalg.lstsq(xtx, xty, rcond=None)[0]
    return tuple(float(v) for v in w)


@POLICIES.register("learned-rf")
class LearnedRF(PerLayerCache):
    origin = ORIGIN
    supports_shared = True
    admits = "rank"
    PARAMS = {**PerLayerCache.PARAMS, "train": None, "train_batch": 1}
    PARAM_RULES = {**PerLayerCache.PARAM_RULES, "train": training_trace(), "train_batch": between(1, 4096, kind=int)}

    def configure(self) -> None:
        super().configure()
        n, e = self.ctx.num_layers, self.ctx.num_experts
        self.step = [0] * n
        self.uses = [[0] * e for _ in range(n)]
        self.last = [[-1] * e for _ in range(n)]
        train = self.params["train"]
        if train is None:
            self.weights, self.weights_source = DEFAULT_WEIGHTS, "default"
            return
        from sim.predictors.transition import load_training_trace

        where = "policy.params.train"
        trace = load_training_trace(train, where, self.ctx.trace, self.ctx.trace_path)
        if (trace.num_layers, trace.num_experts) != (n, e):
            raise ConfigError(
                where,
                f"training trace {train} has {trace.num_layers} layers x {trace.num_experts} "
                f"experts, the run {n} x {e}",
            )
        layers = self.ctx.cached_layers or range(n)
        self.weights = fit_weights(trace, layers, self.params["train_batch"])
        self.weights_source = str(train)

    def score(self, layer: int, expert: int) -> float:
        """The predicted log2 steps until ``expert``'s next use in ``layer`` (it has been used before)."""
        now = self.step[layer]
        w0, w1, w2 = self.weights
        age = now - self.last[layer][expert]
        return w0 + w1 * math.log2(1 + age) + w2 * math.log2(self.uses[layer][expert] / now)

    def observe(self, iteration, layer: int, active, plan: LayerPlan) -> None:
        """Advance ``layer``'s step count and count and stamp this step's uses of its active experts."""
        self.step[layer] += 1
        now = self.step[layer]
        uses, last = self.uses[layer], self.last[layer]
        for e in active:
            uses[e] += 1
            last[e] = now

    def victim_key(self, layer: int, active, newcomers: list[int]):
        """The largest score; ties: the least recent use, then the lower id."""
        last, score = self.last[layer], self.score
        return lambda v: (score(layer, v), -last[v], -v)

    def shared_victim_keys(self, layer: int, active, newcomers: list[int]):
        """Shared cache: the score is ``log2`` of the predicted own-layer steps to the next use, ``2 ** score`` of
        them converted to whole-model layer steps (``Policy.global_distance``)."""
        score = self.score

        def keys(lay, held):
            t, distance = self.last[lay], self.global_distance
            return [(distance(2.0 ** score(lay, v), lay, layer), -t[v], -v) for v in held]

        return keys
