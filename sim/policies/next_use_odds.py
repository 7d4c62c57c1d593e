"""`next-use-odds` (ours): keep the experts most likely to be used at the layer's next step, by a logistic model of
recency and multi-scale frequency learned offline on training requests, with bypass.

Why (docs/our_policy.md has the measurements): on the real routing the experts a layer uses next are best told
apart by *how often they were used lately at several time scales* together with how long ago they were last used;
a single recency (LRU) or a single long-run frequency (LFU) misses one of them, and a predicted reuse *interval*
(reuse-distance) is noisy for experts used in bursts. The Belady bound also shows that newcomers used once are
often not worth a slot: admitting every miss (as every published per-layer policy here does) flushes experts that
come back sooner. So this policy scores every candidate by one model and lets a newcomer in only when it beats the
weakest expert it would replace.

**Features** of expert ``e`` of a cached layer at the layer's step ``t`` (time is the layer's own step count, one
per iteration in which it runs; every use counts, cached or not; all of them known after the layer's gate at
``t``, none from the future): ``age`` = steps since its last use (0 when used now), ``ema_d`` = the exponentially
decayed use count with decay ``d`` normalised to [0, 1] (``(1 - d) sum_j d^(t - j) used_j``) for ``d`` in 0.5, 0.9,
0.98, and ``share`` = uses / t. The model's inputs (``FEATURES``): 1, log2(1 + min(age, 1024)), [age = 0],
[age = 1], sqrt(ema_0.5), sqrt(ema_0.9), sqrt(ema_0.98), sqrt(share).

**Model**: ``score = w . x``, the log-odds that the expert is used at the layer's next step.

**Training** (``train``: the path of a training trace of the same model; never the evaluated trace: a file with the
same routing and request boundaries, or the evaluated file itself, is refused, as ``learned-rf`` and ``transition``
do): the training trace is replayed as static batches of ``train_batch`` requests (prompts included where its model
routes them); in each of the run's cached layers, at every step and for every expert used at least once so far, the
features above and the label "used at the next step" make one sample (above ``MAX_SAMPLES`` possible samples,
every n-th of each layer's, in order); ``w`` is the logistic-regression fit by Newton's method (an L2 term of 1e-6
per sample, for numerical stability only), one model for all layers.
The training trace also gives the warm start (below). Without ``train`` the weights are ``DEFAULT_WEIGHTS``, fitted
this way on the *training half* of the bundled gpt-oss-20b trace (its even-numbered requests, batch 1; see
docs/our_policy.md), and the cache starts cold. Nothing is learned while the evaluated workload runs: the state kept
then (last uses, decayed counts) is the cache's own bookkeeping, as in every policy here.

**Rule**, per cached layer after its gate: the features are updated with the step's active experts; then the
newcomers (misses, and prefetched experts the layer uses) are taken by score, highest first (ties: lower id). A
newcomer enters a free slot; when the cache is full it replaces the held expert with the lowest score among those
the layer does not use now (ties: the least recent use, then the higher id) if, and only if, its own score is higher
(strictly); otherwise it is not admitted (bypass) and is dropped with its working buffer. An expert the layer uses
now is never evicted.

**Warm start** (``warm``, default true, needs ``train``): before the first batch each cached layer's cache is
filled, once, with the layer's ``hpc_slots + mpc_slots`` most-selected experts *of the training trace* (never the
run's own trace; ``cache.hot_profile`` is not read). The fill is free, as ``diffmoe``'s start-of-batch fill and
``belady``'s warm start are; it is done once, not per batch.

Tiers: no pinned experts: the layer's ``hpc_slots + mpc_slots`` slots form one cache (its hits count as MPC hits),
as ``lru`` etc. by default; copies land in their slot (``promotion_is_free``). Prefetching follows the run's
predictor (the base rule: the predicted experts that are neither cached nor in flight are copied into working
buffers); under ``--policies all --own-predictors`` it runs with the causal ``cross-layer`` predictor
(``default_predictor``), which predicts nothing without its own ``train``.
"""

from __future__ import annotations

import numpy as np

from moebase.errors import ConfigError
from sim.config.params import between, training_trace
from sim.policies.base import POLICIES, LayerPlan, Policy, PolicyContext
from sim.policies.learned_rf import layer_steps as training_steps  # the training trace's steps, per layer

ORIGIN = "ours"

DECAYS = (0.5, 0.9, 0.98)
AGE_CAP = 1024
FEATURES = (
    "bias",
    "log2(1+age)",
    "age==0",
    "age==1",
    "sqrt(ema_0.5)",
    "sqrt(ema_0.9)",
    "sqrt(ema_0.98)",
    "sqrt(share)",
)
#: ``fit_weights`` on the even-numbered requests of traces/data/gpt_oss_20b.npz at batch 1, all 24 layers, rounded
#: to 3 decimals (docs/our_policy.md makes that training half).
DEFAULT_WEIGHTS: tuple[float, ...] = (-3.263, -0.227, 0.346, -0.141, -0.174, 1.661, 2.671, 0.714)
#: The most training samples the fit uses (every n-th, in order, above this).
MAX_SAMPLES = 1_500_000
RIDGE = 1e-6
NEWTON_STEPS = 15


def feature_rows(age, ema, share) -> np.ndarray:
    """The model's inputs [n, 8] from ages [n] (steps since the last use), normalised decayed counts [3, n] and
    shares [n]."""
    age = np.minimum(np.asarray(age, dtype=np.float64), AGE_CAP)
    ema = np.asarray(ema, dtype=np.float64)
    return np.column_stack(
        [
            np.ones(age.shape),
            np.log2(1.0 + age),
            (age == 0) * 1.0,
            (age == 1) * 1.0,
            np.sqrt(np.maximum(ema[0], 0.0)),
            np.sqrt(np.maximum(ema[1], 0.0)),
            np.sqrt(np.maximum(ema[2], 0.0)),
            np.sqrt(np.maximum(share, 0.0)),
        ]
    )


def layer_samples(steps: list[tuple[int, ...]], num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs [n, 8] and labels [n] (used at the next step) of one layer's steps: every step but the last, every
    expert used at least once so far."""
    n = len(steps)
    if n < 2:
        return np.zeros((0, len(FEATURES))), np.zeros(0)
    used = np.zeros((n, num_experts), dtype=bool)
    for i, active in enumerate(steps):
        used[i, list(active)] = True
    t = np.arange(1, n + 1, dtype=np.int64)[:, None]  # the step, 1-based
    last = np.maximum.accumulate(np.where(used, t, 0), axis=0)  # last use <= t (0: none)
    ema = np.zeros((len(DECAYS), n, num_experts))
    for j, d in enumerate(DECAYS):
        cur = np.zeros(num_experts)
        for i in range(n):
            cur = cur * d + used[i]
            ema[j, i] = cur * (1.0 - d)
    share = np.cumsum(used, axis=0) / t
    seen = last[:-1] > 0
    age = (t - last)[:-1][seen]
    x = feature_rows(age, ema[:, :-1][:, seen], share[:-1][seen])
    y = used[1:][seen].astype(np.float64)
    return x, y


def fit_logistic(x: np.ndarray, y: np.ndarray) -> tuple[float, ...]:
    """L2-regularised logistic regression by Newton's method (deterministic)."""
    w = np.zeros(x.shape[1])
    if x.shape[0] == 0 or y.min() == y.max():
        return DEFAULT_WEIGHTS
    eye = RIDGE * np.eye(x.shape[1])
    eye[0, 0] = 0.0
    for _ in range(NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -40, 40)))
        grad = x.T @ (y - p) - eye @ w * x.shape[0]
        hess = (x * (p * (1.0 - p))[:, None]).T @ x + eye * x.shape[0] + 1e-9 * np.eye(x.shape[1])
        step = np.linalg.solve(hess, grad)
        w += step
        if np.abs(step).max() < 1e-8:
            break
    return tuple(float(v) for v in w)


def fit_weights(trace, layers, batch: int = 1) -> tuple[float, ...]:
    """The model's weights fitted on ``trace`` (the training trace) in ``layers``."""
    per_layer = training_steps(trace, batch, sorted(layers))
    bound = sum(len(steps) for steps in per_layer.values()) * trace.num_experts  # samples at most
    stride = max(1, -(-bound // MAX_SAMPLES))
    xs, ys = [], []
    for steps in per_layer.values():
        x, y = layer_samples(steps, trace.num_experts)
        xs.append(x[::stride])
        ys.append(y[::stride])
    x = np.concatenate(xs) if xs else np.zeros((0, len(FEATURES)))
    y = np.concatenate(ys) if ys else np.zeros(0)
    return fit_logistic(x, y)


@POLICIES.register("next-use-odds")
class NextUseOdds(Policy):
    origin = ORIGIN
    default_predictor = "cross-layer"
    promotion_is_free = True
    admits = "rank"
    PARAMS = {"train": None, "train_batch": 1, "warm": True}
    PARAM_RULES = {"train": training_trace(), "train_batch": between(1, 4096, kind=int)}

    # one cache of hpc_slots + mpc_slots per cached layer, nothing pinned
    def hpc_capacity(self, ctx: PolicyContext) -> int:
        return 0

    def mpc_capacity(self, ctx: PolicyContext) -> int:
        return ctx.hpc_slots + ctx.mpc_slots

    def configure(self) -> None:
        ctx = self.ctx
        if getattr(ctx, "organization", "per-layer") not in (None, "per-layer"):
            raise ConfigError("cache.organization", "next-use-odds manages per-layer slots only")
        n, e = ctx.num_layers, ctx.num_experts
        self.step = [0] * n
        self.last = np.zeros((n, e), dtype=np.int64)  # last use (1-based step), 0: never
        self.ema = np.zeros((n, len(DECAYS), e))  # normalised decayed use counts
        self.uses = np.zeros((n, e), dtype=np.int64)
        self._decay = np.array(DECAYS)[:, None]
        self._keep = 1.0 - np.array(DECAYS)[:, None]
        self.warm_fill: dict[int, list[int]] = {}
        train = self.params["train"]
        if train is None:
            self.weights, self.weights_source = DEFAULT_WEIGHTS, "default"
        else:
            from sim.predictors.transition import load_training_trace

            where = "policy.params.train"
            trace = load_training_trace(train, where, ctx.trace, ctx.trace_path)
            if (trace.num_layers, trace.num_experts) != (n, e):
                raise ConfigError(
                    where,
                    f"training trace {train} has {trace.num_layers} layers x "
                    f"{trace.num_experts} experts, the run {n} x {e}",
                )
            layers = ctx.cached_layers or range(n)
            self.weights = fit_weights(trace, layers, self.params["train_batch"])
            self.weights_source = str(train)
            if self.params["warm"] and self.cache.mpc_slots:
                for layer in ctx.cached_layers:
                    ids = trace.experts[:, layer, :].ravel()
                    counts = np.bincount(ids[ids >= 0].astype(np.int64), minlength=e)
                    order = sorted(range(e), key=lambda x: (-counts[x], x))
                    self.warm_fill[layer] = [x for x in order[: self.cache.mpc_slots] if counts[x] > 0]
        self._w = np.array(self.weights, dtype=np.float64)
        self._started = False
        self._score: dict[int, float] = {}  # the step's scores of its newcomers and free held experts

    def start_batch(self) -> None:
        if self._started:
            return
        self._started = True
        for layer, experts in self.warm_fill.items():
            self.cache.fill_mpc(layer, experts)

    # ------------------------------------------------------------------------------------------------ model
    def scores(self, layer: int, experts) -> np.ndarray:
        """The model's log-odds that each of ``experts`` is used at ``layer``'s next step (after this step)."""
        idx = np.asarray(list(experts), dtype=np.int64)
        now = self.step[layer]
        last = self.last[layer, idx]
        age = np.where(last > 0, now - last, now)  # a warm-filled expert never used: as if used at step 0
        share = self.uses[layer, idx] / max(now, 1)
        return feature_rows(age, self.ema[layer][:, idx], share) @ self._w

    def observe(self, iteration, layer: int, active, plan: LayerPlan) -> None:
        """Record the layer's step (its active experts)."""
        self.step[layer] += 1
        idx = list(active)
        ema = self.ema[layer]
        ema *= self._decay
        if idx:
            ema[:, idx] += self._keep
            self.last[layer, idx] = self.step[layer]
            self.uses[layer, idx] += 1

    # -------------------------------------------------------------------------------------------- admission
    def victim_key(self, layer: int, active, newcomers: list[int]):
        """Newcomers enter by score, highest first (ties: lower id); the victim is the held expert with the lowest
        score (ties: the least recent use, then the higher id)."""
        busy = set(active)
        # the model scores the newcomers and the held experts not in use now in one product (its rounding is the
        # same for the same rows only)
        held = [v for v in self.cache.mpc[layer] if v not in busy]
        pool = newcomers + held
        score = self._score = dict(zip(pool, self.scores(layer, pool).tolist()))
        last = self.last[layer]
        newcomers.sort(key=lambda x: (-score[x], x))
        return lambda v: (-score[v], -last[v], v)

    def keeps_out(self, layer: int, expert: int, victim) -> bool:
        """Bypass: a newcomer enters a full cache only with a strictly higher score than its victim's."""
        return not self._score[expert] > self._score[victim]
