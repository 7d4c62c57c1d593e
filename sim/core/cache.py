"""The GPU expert-cache tiers as state, with their invariants (no time here: engines own time).

- **HPC** (high priority), per MoE layer: up to ``hpc_slots`` experts pinned before inference, never replaced.
- **MPC** (medium priority), per MoE layer: up to ``mpc_slots`` experts that a policy inserts and evicts.
- **LPC** (low priority), shared: the working buffers that experts copied from host land in. An expert is in
  the LPC from the moment a policy decides to copy it (demand miss or prefetch) until its layer finishes; then
  it is dropped unless a policy promoted it into the MPC. How many copies occupy buffers *at once* is the
  engine's business (a copy waits for a free buffer); the LPC here is the logical set.

Every mutation checks the invariants and raises ``CacheInvariantError``: a tier over capacity, an HPC expert
evicted or moved, an expert held twice in one layer, a promotion of an expert that is not in a working buffer.

**Organization** (``cache.organization``): :class:`TierCache` is the per-layer one (each cached layer's MPC has its
own ``mpc_slots``); :class:`SharedTierCache` is one MPC shared by every cached layer (MoE-Infinity's and SpecMD's
whole-model cache): ``mpc_slots`` is then the capacity of the MPC *across all cached layers* (the per-layer dicts
stay as storage, the capacity check is global), and a promotion may evict an expert of another layer
(``promote(layer, expert, victim, victim_layer)``). The HPC stays per layer in both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HPC, MPC, LPC, MISS = "hpc", "mpc", "lpc", "miss"
#: A source, not a tier: the active expert is computed on the host CPU from its weights in host memory (as
#: Fiddler and kTransformers do): it never enters a working buffer (LPC), is never copied and never promoted.
CPU = "cpu"
TIERS = (HPC, MPC, LPC)


class CacheInvariantError(AssertionError):
    """A decision broke a tier rule: always a bug in a policy, never bad input."""


@dataclass
class CacheCounters:
    """What happened to the tiers over a run: hits, misses and host experts as the decision protocol counts them from
    each plan's sources (``sim.decisions.protocol``), insertions, evictions and promotions as the tiers change."""

    hits: dict = field(default_factory=lambda: {t: 0 for t in TIERS})
    misses: int = 0
    insertions: int = 0
    evictions: int = 0
    promotions: int = 0
    cpu: int = 0  # accesses served by computing the expert on the host CPU (source ``CPU``)

    @property
    def accesses(self) -> int:
        """hits + misses + cpu (cpu is 0 for a policy that never computes on the host)."""
        return sum(self.hits.values()) + self.misses + self.cpu


class TierCache:
    """HPC and MPC contents per layer, and the LPC: per layer, the set of experts in working buffers
    (``lpc_of[layer]``; ``lpc`` is the same as a set of (layer, expert))."""

    def __init__(self, num_layers: int, num_experts: int, hpc_slots: int, mpc_slots: int, cached_layers):
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.hpc_slots = hpc_slots
        self.mpc_slots = mpc_slots
        self.cached_layers = frozenset(cached_layers)
        self.hpc: list[frozenset[int]] = [frozenset() for _ in range(num_layers)]
        self.mpc: list[dict[int, None]] = [{} for _ in range(num_layers)]  # insertion-ordered sets
        self.lpc_of: list[set[int]] = [set() for _ in range(num_layers)]
        self._hpc_pinned = [False] * num_layers
        self.counters = CacheCounters()

    # ------------------------------------------------------------------------------------------------ queries
    @property
    def lpc(self) -> frozenset[tuple[int, int]]:
        """Every (layer, expert) in a working buffer (a snapshot)."""
        return frozenset((layer, e) for layer, held in enumerate(self.lpc_of) for e in held)

    def cached(self, layer: int, expert: int) -> bool:
        """Held in a slot of the layer (HPC or MPC), i.e. survives the iteration."""
        return expert in self.hpc[layer] or expert in self.mpc[layer]

    # -------------------------------------------------------------------------------------------- mutations
    def pin_hpc(self, layer: int, experts) -> None:
        """Fill a layer's HPC once, before inference; it never changes afterwards."""
        experts = frozenset(int(e) for e in experts)
        if self._hpc_pinned[layer]:
            if experts != self.hpc[layer]:
                raise CacheInvariantError(f"layer {layer}: HPC re-pinned with different experts")
            return
        if layer not in self.cached_layers and experts:
            raise CacheInvariantError(f"layer {layer} is not cached but HPC experts were pinned")
        if len(experts) > self.hpc_slots:
            raise CacheInvariantError(f"layer {layer}: {len(experts)} HPC experts exceed {self.hpc_slots} slots")
        self._check_ids(layer, experts)
        self.hpc[layer] = experts
        self._hpc_pinned[layer] = True

    def fill_mpc(self, layer: int, experts) -> None:
        """Replace a layer's MPC contents outright (a policy's state at the start of a batch)."""
        experts = [int(e) for e in experts]
        if len(set(experts)) != len(experts):
            raise CacheInvariantError(f"layer {layer}: MPC filled with a repeated expert")
        if len(experts) > self.mpc_slots or (experts and layer not in self.cached_layers):
            raise CacheInvariantError(f"layer {layer}: MPC fill of {len(experts)} exceeds {self.mpc_slots} slots")
        if self.hpc[layer] & set(experts):
            raise CacheInvariantError(f"layer {layer}: MPC fill repeats an HPC expert")
        self._check_ids(layer, experts)
        self.mpc[layer] = dict.fromkeys(experts)

    def add_lpc(self, layer: int, expert: int) -> None:
        """An expert is being copied from host into a working buffer for ``layer``."""
        lpc = self.lpc_of[layer]
        if expert in self.hpc[layer] or expert in self.mpc[layer] or expert in lpc:
            raise CacheInvariantError(f"layer {layer}: expert {expert} copied from host while cached or in flight")
        if not 0 <= expert < self.num_experts:
            raise CacheInvariantError(f"layer {layer}: expert {expert} out of range")
        lpc.add(expert)

    shared = False  #: one MPC for all cached layers (:class:`SharedTierCache`)

    def mpc_size(self) -> int:
        """Experts held in the MPC, over all layers."""
        return sum(len(m) for m in self.mpc)

    def promote(self, layer: int, expert: int, victim: int | None, victim_layer: int | None = None) -> None:
        """Move ``expert`` from its working buffer into an MPC slot, evicting ``victim`` (an MPC expert) if given.
        ``victim_layer`` (default ``layer``) must be ``layer`` in a per-layer cache."""
        if victim_layer is not None and victim_layer != layer:
            raise CacheInvariantError(f"layer {layer}: victim taken from layer {victim_layer} in a per-layer cache")
        if expert not in self.lpc_of[layer]:
            raise CacheInvariantError(f"layer {layer}: promoted expert {expert} is not in a working buffer")
        if layer not in self.cached_layers:
            raise CacheInvariantError(f"layer {layer} is not cached but expert {expert} was promoted")
        mpc, counters = self.mpc[layer], self.counters
        if victim is not None:
            if victim not in mpc:
                raise CacheInvariantError(
                    f"layer {layer}: "
                    + (
                        f"HPC expert {victim} chosen for eviction"
                        if victim in self.hpc[layer]
                        else f"evicted expert {victim} is not in the MPC"
                    )
                )
            del mpc[victim]
            counters.evictions += 1
        if len(mpc) >= self.mpc_slots:
            raise CacheInvariantError(f"layer {layer}: MPC full ({self.mpc_slots}) and no victim given")
        mpc[expert] = None
        counters.promotions += 1
        counters.insertions += 1

    def finish_layer(self, layer: int) -> None:
        """A layer is done: its working buffers are dropped."""
        if self.lpc_of[layer]:
            self.lpc_of[layer] = set()

    # -------------------------------------------------------------------------------------------- checking
    def _check_ids(self, layer: int, experts) -> None:
        if not 0 <= layer < self.num_layers:
            raise CacheInvariantError(f"layer {layer} out of range")
        for e in experts:
            if not 0 <= e < self.num_experts:
                raise CacheInvariantError(f"layer {layer}: expert {e} out of range")

    def check(self) -> None:
        """Full invariant check (tests call it after every step)."""
        for layer in range(self.num_layers):
            if len(self.hpc[layer]) > self.hpc_slots or len(self.mpc[layer]) > self.mpc_slots:
                raise CacheInvariantError(f"layer {layer}: a tier is over capacity")
            if self.hpc[layer] & set(self.mpc[layer]):
                raise CacheInvariantError(f"layer {layer}: an expert is in both HPC and MPC")
            if layer not in self.cached_layers and (self.hpc[layer] or self.mpc[layer]):
                raise CacheInvariantError(f"layer {layer} is not cached but holds experts")
        # a promoted expert is in its buffer and the MPC until the layer ends
        for layer, held in enumerate(self.lpc_of):
            if self.hpc[layer] & held:
                raise CacheInvariantError(
                    f"layer {layer}: expert {min(self.hpc[layer] & held)} in a working buffer and the HPC"
                )


class SharedTierCache(TierCache):
    """One MPC for all cached layers: ``mpc_slots`` experts in all, of any cached layers (see the module doc).
    The HPC is per layer (``hpc_slots`` per cached layer) as in :class:`TierCache`."""

    shared = True

    def __init__(self, num_layers: int, num_experts: int, hpc_slots: int, mpc_slots: int, cached_layers):
        super().__init__(num_layers, num_experts, hpc_slots, mpc_slots, cached_layers)
        self.used = 0  # experts in the MPC, all layers together

    def mpc_size(self) -> int:
        return self.used

    def fill_mpc(self, layer: int, experts) -> None:
        """Replace a layer's MPC contents outright; the MPC over all layers must stay within ``mpc_slots`` (to
        refill several layers, empty them first)."""
        experts = [int(e) for e in experts]
        if len(set(experts)) != len(experts):
            raise CacheInvariantError(f"layer {layer}: MPC filled with a repeated expert")
        if experts and layer not in self.cached_layers:
            raise CacheInvariantError(f"layer {layer} is not cached but its MPC was filled")
        used = self.used - len(self.mpc[layer]) + len(experts)
        if used > self.mpc_slots:
            raise CacheInvariantError(
                f"layer {layer}: MPC fill brings the shared MPC to {used} experts, over its {self.mpc_slots} slots"
            )
        if self.hpc[layer] & set(experts):
            raise CacheInvariantError(f"layer {layer}: MPC fill repeats an HPC expert")
        self._check_ids(layer, experts)
        self.mpc[layer] = dict.fromkeys(experts)
        self.used = used

    def promote(self, layer: int, expert: int, victim: int | None, victim_layer: int | None = None) -> None:
        """Move ``expert`` of ``layer`` from its working buffer into the shared MPC, evicting ``victim`` of
        ``victim_layer`` (default ``layer``) if given."""
        if expert not in self.lpc_of[layer]:
            raise CacheInvariantError(f"layer {layer}: promoted expert {expert} is not in a working buffer")
        if layer not in self.cached_layers:
            raise CacheInvariantError(f"layer {layer} is not cached but expert {expert} was promoted")
        counters = self.counters
        if victim is not None:
            vl = layer if victim_layer is None else victim_layer
            if not 0 <= vl < self.num_layers:
                raise CacheInvariantError(f"layer {layer}: victim layer {vl} out of range")
            vm = self.mpc[vl]
            if victim not in vm:
                raise CacheInvariantError(
                    f"layer {layer}: "
                    + (
                        f"HPC expert {victim} of layer {vl} chosen for eviction"
                        if victim in self.hpc[vl]
                        else f"evicted expert {victim} of layer {vl} is not in the MPC"
                    )
                )
            del vm[victim]
            self.used -= 1
            counters.evictions += 1
        if self.used >= self.mpc_slots:
            raise CacheInvariantError(f"layer {layer}: shared MPC full ({self.mpc_slots}) and no victim given")
        self.mpc[layer][expert] = None
        self.used += 1
        counters.promotions += 1
        counters.insertions += 1

    def check(self) -> None:
        total = 0
        for layer in range(self.num_layers):
            if len(self.hpc[layer]) > self.hpc_slots:
                raise CacheInvariantError(f"layer {layer}: the HPC is over capacity")
            if self.hpc[layer] & set(self.mpc[layer]):
                raise CacheInvariantError(f"layer {layer}: an expert is in both HPC and MPC")
            if layer not in self.cached_layers and (self.hpc[layer] or self.mpc[layer]):
                raise CacheInvariantError(f"layer {layer} is not cached but holds experts")
            total += len(self.mpc[layer])
        if total != self.used:
            raise CacheInvariantError(f"shared MPC holds {total} experts but counted {self.used}")
        if total > self.mpc_slots:
            raise CacheInvariantError(f"shared MPC holds {total} experts, over its {self.mpc_slots} slots")
        for layer, held in enumerate(self.lpc_of):
            if self.hpc[layer] & held:
                raise CacheInvariantError(
                    f"layer {layer}: expert {min(self.hpc[layer] & held)} in a working buffer and the HPC"
                )
