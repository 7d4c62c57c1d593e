"""What every policy is: an object the engine asks, per (iteration, MoE layer), where each active expert comes
from, what to promote into the MPC, and what to prefetch for the next layer. It never sees time.

Protocol, per layer of an iteration (the simulator and the validator call exactly this, in this order):

0. ``start_iteration(iteration)`` before the iteration's first layer.
1. ``plan_prefetch(it, next_layer, predicted)`` at the gate of the current layer (``predicted`` is empty when
   the predictor is ``none``): experts of the next layer to copy ahead into working buffers (the base class:
   predicted experts that are neither cached nor already being copied).
2. ``plan_layer(it, layer, active)`` once the gate has chosen the layer's experts: a :class:`LayerPlan` saying,
   per active expert, whether it is served from the HPC, the MPC, a working buffer it was prefetched into
   (LPC), or is a miss to copy now; which experts move from their working buffer into the MPC after they
   compute (and whom they evict); and which prefetched experts went unused. The base class classifies the sources
   and hands the step to the admission driver (``sim.policies.admission``), which runs the policy's MPC from what it
   declares (``admits``: a victim key, a keeper or a rule; ``observe`` for its own bookkeeping). A hybrid policy
   may instead have an active expert computed on the host CPU (source ``CPU``): it is not copied, never enters a
   working buffer and is never promoted. Such a policy sets ``wants_counts`` and reads the layer's tokens per
   active expert from ``self.layer_counts`` (set by the protocol just before ``plan_layer``), and the cost model
   from ``ctx.costs``. No policy counts hits or misses: the protocol counts them from the plan's sources.
3. ``finish_layer(it, layer)`` when the layer's experts have computed: its working buffers are dropped.

``start_batch()`` is called before the first iteration of each static batch (and once for continuous batching).

**Cache organization** (``cache.organization``, ``PolicyContext.organization``): ``per-layer`` (default) gives each
cached layer its own slots (``TierCache``); ``shared`` gives the policy one MPC for all cached layers
(``SharedTierCache``) of ``shared_slots`` experts (default ``(hpc_slots + mpc_slots) x cached layers``: the same GPU
memory), less the HPC it pins (``hpc_capacity`` per cached layer). Only policies with ``supports_shared`` accept it
(the config refuses the others on load, naming ``cache.organization``). In a shared cache a promotion may evict an
expert of another layer: ``LayerPlan.promote`` then maps the expert to ``(victim layer, victim)`` (or None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moebase.errors import ConfigError
from sim.config.memory import expert_slots
from sim.config.params import Parametrised
from sim.config.registries import POLICIES
from sim.core.cache import CPU, HPC, LPC, MISS, MPC, SharedTierCache, TierCache
from sim.policies.admission import AdmissionDriver
from sim.policies.layer_plan import LayerPlan

if TYPE_CHECKING:
    from sim.core.workload import Iteration
    from sim.costs.costs import CostModel
    from traces.format import Trace


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may know besides its params: the model's shape, which layers are cached, tier sizes,
    the hot-expert ranking per layer (most selected first), a seed, the cache's organization, and what
    ``sim.decisions.build.build_decisions`` passes from the run (each None where a caller has none): the evaluated
    trace, the whole workload (the future, which only offline policies may read: :meth:`future`), the trace's
    path and the run's cost model (:meth:`cost_model`)."""

    num_layers: int
    num_experts: int
    layer_roles: tuple[str, ...]
    cached_layers: frozenset[int]
    hpc_slots: int
    mpc_slots: int
    hot_ranking: tuple[tuple[int, ...], ...]
    seed: int = 0
    organization: str = "per-layer"  # per-layer | shared (cache.organization)
    shared_slots: int | None = None  # shared: the cache's experts (None: (hpc + mpc) x cached layers)
    #: the evaluated trace (an online policy reads a layer's routing only once its gate has run)
    trace: Trace | None = None
    #: the whole workload in run order (with ``trace``: the future, for offline policies such as belady)
    iterations: Sequence[Iteration] | None = None
    #: the evaluated trace's file (a part trained on another trace refuses this very file)
    trace_path: str | Path | None = None
    #: the run's cost model (hybrid CPU/GPU policies weigh a copy against computing an expert on the host)
    costs: CostModel | None = None

    def future(self, who: str) -> tuple[Trace, Sequence[Iteration]]:
        """The workload's future (``trace`` and ``iterations``) for an offline policy (``who`` names it); a
        ConfigError without it."""
        if self.trace is None or self.iterations is None:
            raise ConfigError(
                f"{who}: needs the workload's future: PolicyContext.trace and PolicyContext.iterations "
                "(sim.decisions.build.build_decisions passes them)"
            )
        return self.trace, self.iterations

    def cost_model(self, who: str) -> CostModel:
        """The run's cost model for a policy that weighs host compute against copies (``who`` names it)."""
        if self.costs is None:
            raise ConfigError("policy.name", f"{who}: needs the run's cost model (PolicyContext.costs)")
        return self.costs

    def shared_total(self) -> int:
        """The experts a shared cache holds, HPC included (:func:`~sim.config.memory.expert_slots`)."""
        return expert_slots(self.hpc_slots, self.mpc_slots, len(self.cached_layers), self.shared_slots)


class Policy(Parametrised):
    """Base class: serve hits from the HPC/MPC and prefetched buffers, copy misses, keep nothing new."""

    name = "base"
    WHERE = "policy.params"
    #: True when a copied expert lands straight in its cache slot, so a promotion costs no device copy.
    promotion_is_free = False
    #: True when a cached expert is copied device-to-device into the working arena before it computes.
    hit_d2d = False
    #: True when every expert is resident (no tier sizes needed): the GPU-memory check counts every expert.
    all_resident = False
    #: True when the policy can manage one cache shared by all cached layers (``cache.organization: shared``).
    supports_shared = False
    #: False for a policy whose MPC is always empty (it keeps no shared MPC either).
    keeps_mpc = True
    #: Where the policy comes from (``sim compare``'s origin column): ``ceiling`` (every expert resident),
    #: ``baseline`` (caches nothing), ``published`` (a published system's rule), ``ours`` (this project's) or
    #: ``bound`` (offline, reads the future). Every registered policy declares it.
    origin: str | None = None
    #: The predictor the policy's own design pairs it with (None: any), which ``sim compare --policies all
    #: --own-predictors`` gives it (plain ``--policies all`` gives every policy the same one).
    default_predictor: str | None = None
    #: False for a policy that never reads the predictor's guesses (it prefetches nothing, or what it prefetches
    #: does not depend on them): ``sim compare`` runs it with ``none`` and shows no predictor for it.
    uses_predictor = True
    #: True when ``plan_layer`` reads ``self.layer_counts`` (active expert -> tokens routed to it in the layer),
    #: which the decision protocol then sets before each ``plan_layer`` (hybrid CPU/GPU policies).
    wants_counts = False
    layer_counts: dict | None = None
    #: How the admission driver (``sim.policies.admission``) runs the policy's MPC after each layer's gate: ``"rank"``
    #: (newcomers evict by ``victim_key`` / ``shared_victim_keys``, least recent use by default), ``"keeper"`` (a
    #: replacement structure's hit/admit, ``keeper``), ``"rule"`` (``choose`` gives the promotions) or None (no
    #: admission: the MPC changes only by the policy's own fills).
    admits: str | None = None
    #: ``"rank"``: an MPC hit becomes the most recently used (the recency order a ranking of None evicts by).
    touch_hits = False
    #: True when ``observe`` runs on every layer step (uncached layers and an MPC of no slots included).
    observes_every_layer = False

    def __init__(self, params: dict | None, ctx: PolicyContext, where: str = "policy.params"):
        self.params = self.check_params(params, where)
        self.ctx = ctx
        hpc, mpc = self.hpc_capacity(ctx), self.mpc_capacity(ctx)
        if ctx.organization == "shared":
            if not self.supports_shared:
                raise ConfigError("cache.organization", f"policy {self.name!r} manages per-layer slots only")
            n = len(ctx.cached_layers)
            if self.keeps_mpc:  # a policy that keeps nothing in an MPC keeps nothing in a shared one either
                total = ctx.shared_total()
                mpc = total - hpc * n
                if mpc < 0:
                    raise ConfigError(
                        "cache.shared_slots",
                        f"{total} slots cannot hold the pinned HPC ({hpc} per layer x {n} cached layers)",
                    )
            self.cache: TierCache = SharedTierCache(ctx.num_layers, ctx.num_experts, hpc, mpc, ctx.cached_layers)
        elif ctx.organization == "per-layer":
            self.cache = TierCache(ctx.num_layers, ctx.num_experts, hpc, mpc, ctx.cached_layers)
        else:
            raise ConfigError("cache.organization", f"must be per-layer or shared, got {ctx.organization!r}")
        self.shared = self.cache.shared
        self.shared_layers = sorted(ctx.cached_layers)  # ascending: the run order of the cached layers
        self.layer_pos = {layer: i for i, layer in enumerate(self.shared_layers)}
        self.configure()
        self.driver = AdmissionDriver(self, Policy)  # runs every layer step's admission from what the policy declares

    # Tier sizes the policy uses (a policy that keeps nothing ignores the configured slots).
    def hpc_capacity(self, ctx: PolicyContext) -> int:
        return ctx.hpc_slots

    def mpc_capacity(self, ctx: PolicyContext) -> int:
        return ctx.mpc_slots

    @classmethod
    def reads_predictions(cls, params: dict) -> bool:
        """Whether the policy, with these checked params, reads the predictor's guesses (``uses_predictor``; a
        policy whose prefetching is a param says so here)."""
        return cls.uses_predictor

    def configure(self) -> None:
        """Read params, pin the HPC. Called once at construction."""

    def layers_until(self, layer: int, now: int) -> int:
        """In a shared cache, how many layer steps after the running layer ``now`` the cached layer ``layer``
        next runs: ``((pos(layer) - pos(now) - 1) mod n) + 1`` over the ``n`` cached layers in run order (the next
        layer is 1 step away, the running one itself ``n``, a whole pass). An approximation where prefill and
        decode run different layers (an encoder-decoder model with ``cache.layers: all``)."""
        pos = self.layer_pos
        return (pos[layer] - pos[now] - 1) % len(pos) + 1

    def global_distance(self, steps: float, layer: int, now: int) -> float:
        """A use predicted ``steps`` of its own layer's steps ahead (1: the layer's next step) as layer steps of
        the whole model ahead of the running layer ``now``: ``(steps - 1) n + d``, ``n`` the cached layers and ``d``
        the layer steps until ``layer`` next runs (``layers_until``: 1 for the next layer, ``n`` for the running
        one). The shared-cache rule of the policies that predict a next use per layer (least-stale,
        reuse-distance, learned-rf) evicts the largest."""
        return (steps - 1.0) * len(self.layer_pos) + self.layers_until(layer, now)

    def pin_hot_experts(self) -> None:
        """Fill every cached layer's HPC with its ``hpc_slots`` hottest experts (from the hot-expert profile)."""
        for layer in self.ctx.cached_layers:
            self.cache.pin_hpc(layer, self.ctx.hot_ranking[layer][: self.cache.hpc_slots])

    def start_batch(self) -> None:
        """A new static batch begins."""

    def start_iteration(self, iteration) -> None:
        """An iteration (a ``sim.core.workload.Iteration``: its kind, trace rows, requests) is about to run. A policy
        may read the routing of a layer's rows only once that layer's gate has run (in ``plan_layer``)."""

    # ----------------------------------------------------------------------------------------------- protocol
    def plan_prefetch(self, iteration: int, layer: int, predicted) -> list[int]:
        if not predicted:
            return []
        cache = self.cache
        hpc, mpc, lpc = cache.hpc[layer], cache.mpc[layer], cache.lpc_of[layer]
        out = sorted(frozenset(predicted).difference(hpc, mpc, lpc))  # neither cached nor in flight, by id
        if out and (out[0] < 0 or out[-1] >= cache.num_experts):  # cache.add_lpc's check (the others hold)
            for e in out:
                cache.add_lpc(layer, e)
        lpc.update(out)  # add_lpc of each, inline: none is cached or in flight, and ``out`` is sorted
        return out

    def plan_layer(self, iteration: int, layer: int, active: Sequence[int]) -> LayerPlan:
        return self.driver.plan(iteration, layer, active)  # classify, then the admission driver's step

    def finish_layer(self, iteration: int, layer: int) -> None:
        self.cache.finish_layer(layer)

    # ---------------------------------------------------------------------------------------------- helpers
    def classify(self, layer: int, active: Sequence[int]) -> LayerPlan:
        """Sources of the active experts; misses are entered into the LPC (they are copied now)."""
        cache = self.cache
        hpc, mpc, lpc = cache.hpc[layer], cache.mpc[layer], cache.lpc_of[layer]
        prefetched = len(lpc)
        sources = {}
        resident, copied = [], []
        n_lpc = 0
        for e in active:
            if e in hpc:
                sources[e] = HPC
                resident.append(e)
            elif e in mpc:
                sources[e] = MPC
                resident.append(e)
            elif e in lpc:
                sources[e] = LPC
                copied.append((e, LPC))
                n_lpc += 1
            else:
                cache.add_lpc(layer, e)
                sources[e] = MISS
                copied.append((e, MISS))
        # prefetches this layer did not use: in a buffer before, not active now
        unused = sorted(lpc.difference(sources)) if prefetched > n_lpc else []
        return LayerPlan(sources, {}, unused, resident, copied, prefetch_hits=n_lpc)

    # ------------------------------------------------------------------------------- what the driver asks
    # (sim.policies.admission.AdmissionDriver runs every layer step from these; see ``admits``)
    def observe(self, iteration: int, layer: int, active: Sequence[int], plan: LayerPlan) -> None:
        """The policy's own bookkeeping of a layer step (use counts, last uses, scores), before admission; called
        on a cached layer with MPC slots (on every layer with ``observes_every_layer``). Base: none."""

    def victim_key(self, layer: int, active: Sequence[int], newcomers: list[int]) -> Callable[[int], Any] | None:
        """``admits = "rank"``, per-layer cache: the key of a held expert, the largest evicted first (ties: the first
        in MPC order); None: the least recently used. May reorder ``newcomers`` in place (the order they enter in).
        Read once per step with newcomers."""
        return None

    def shared_victim_keys(
        self, layer: int, active: Sequence[int], newcomers: list[int]
    ) -> Callable[[int, list[int]], list] | None:
        """``admits = "rank"``, shared cache: ``keys(held_layer, held)`` gives the keys of a list of one cached
        layer's held experts, the largest ``(key, layer, expert)`` evicted first; None: the least recently used
        (layer, expert) of the whole cache. May reorder ``newcomers`` in place. Read once per step with
        newcomers."""
        return None

    def keeps_out(self, layer: int, expert: int, victim) -> bool:
        """Bypass (``admits = "rank"``): True to leave the newcomer ``expert`` out rather than evict ``victim`` (an
        expert, or a ``(layer, expert)`` pair in a shared cache). Base: never (the driver skips the call)."""
        return False

    def after_admission(self, layer: int, newcomers: list[int], plan: LayerPlan) -> None:
        """After a ranked step with newcomers (``plan.promote`` holds the admitted ones and their victims)."""

    def keeper(self, layer: int) -> Any:
        """``admits = "keeper"``: the replacement structure of ``layer`` (per-layer) or of the whole cache
        (shared), with ``hit(key)`` and ``admit(key, busy) -> (admitted, victim)``."""
        raise NotImplementedError(f"policy {self.name!r} admits by a keeper but has none")

    def choose(self, iteration: int, layer: int, active: Sequence[int], plan: LayerPlan) -> list:
        """``admits = "rule"``: the step's promotions as ``(newcomer, victim)`` pairs, applied in order (a victim
        is an expert of ``layer``, a ``(layer, expert)`` pair in a shared cache, or None)."""
        raise NotImplementedError(f"policy {self.name!r} admits by a rule but has none")


class PerLayerCache(Policy):
    """A per-layer cache whose copies land straight in their slots (no device-to-device promotion).

    Capacity: without ``pin_hot`` (default, as Mixtral-offloading: no pinned experts) there is no HPC and the
    policy manages all ``hpc_slots + mpc_slots`` slots of a layer as one cache (the tier counters show its hits
    as MPC hits), so that policies compared at equal slots per layer get equal room whatever the HPC/MPC split.
    With ``pin_hot: true`` the HPC pins each layer's ``hpc_slots`` hottest experts (``cache.hot_profile``) and
    the policy manages the ``mpc_slots`` others. With ``cache.organization: shared`` the same room (by default) is one
    cache for all cached layers (``Policy.shared_victim_keys``, run by ``sim.policies.admission``), for the
    subclasses that set ``supports_shared``."""

    PARAMS = {"pin_hot": False}
    promotion_is_free = True
    admits = "rank"  # least recent use unless a subclass declares its victim keys (or another mode)

    def hpc_capacity(self, ctx: PolicyContext) -> int:
        return ctx.hpc_slots if self.params["pin_hot"] else 0

    def mpc_capacity(self, ctx: PolicyContext) -> int:
        return ctx.mpc_slots if self.params["pin_hot"] else ctx.hpc_slots + ctx.mpc_slots

    def configure(self) -> None:
        if self.params["pin_hot"]:
            self.pin_hot_experts()


class KeepNothing(Policy):
    """A policy that caches nothing across iterations (no HPC, no MPC, whatever the configured slots say): every
    expert comes from host memory, on demand or prefetched, into the working buffers. The organization of a cache
    it does not keep does not matter, so it accepts ``shared`` too."""

    supports_shared = True
    keeps_mpc = False

    def hpc_capacity(self, ctx: PolicyContext) -> int:
        return 0

    def mpc_capacity(self, ctx: PolicyContext) -> int:
        return 0


class PinnedOnly(Policy):
    """A policy that keeps no MPC: every GPU slot, the MPC's included, holds a pinned expert (the host runs or
    copies the rest); published, and without a predictor by default."""

    origin = "published"
    default_predictor = "none"
    uses_predictor = False  # the GPU holds the pinned experts, the host computes or copies the rest: no prefetch
    keeps_mpc = False

    def hpc_capacity(self, ctx: PolicyContext) -> int:
        return ctx.hpc_slots + ctx.mpc_slots

    def mpc_capacity(self, ctx: PolicyContext) -> int:
        return 0


def hot_ranking_from_counts(counts: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """Per layer, expert ids sorted by selection count (descending; ties by id). counts: [layers, experts]."""
    order = np.lexsort((np.arange(counts.shape[1])[None, :].repeat(counts.shape[0], 0), -counts), axis=1)
    return tuple(tuple(int(x) for x in row) for row in order)


def selection_counts(experts: np.ndarray, num_experts: int) -> np.ndarray:
    """[layers, experts] selection counts of a trace's expert array [tokens, layers, k]."""
    n_layers = experts.shape[1]
    out = np.zeros((n_layers, num_experts), dtype=np.int64)
    for layer in range(n_layers):
        ids = experts[:, layer, :].ravel()
        out[layer] = np.bincount(ids[ids >= 0], minlength=num_experts)
    return out


__all__ = [
    "POLICIES",
    "KeepNothing",
    "PerLayerCache",
    "PinnedOnly",
    "CPU",
    "HPC",
    "LPC",
    "MISS",
    "MPC",
    "LayerPlan",
    "Policy",
    "PolicyContext",
    "hot_ranking_from_counts",
    "selection_counts",
]
