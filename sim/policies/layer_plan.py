"""A policy's decisions for one MoE layer in one iteration: where each active expert comes from, what is promoted
into the MPC, and the prefetched experts that went unused."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.core.cache import CPU, HPC, MPC


@dataclass(slots=True)
class LayerPlan:
    """A policy's decisions for one MoE layer in one iteration."""

    sources: dict[int, str]  # active expert -> HPC | MPC | LPC | MISS | CPU
    promote: dict = field(default_factory=dict)  # expert -> evicted MPC expert (or None); in a shared cache
    #                                                     expert -> (victim's layer, victim) or None
    unused_prefetch: list[int] = field(default_factory=list)  # prefetched for this layer, not active
    # ``sources`` split as engines act on it (``classify`` fills them; None: the protocol splits ``sources``):
    resident: list[int] | None = field(default=None, compare=False, repr=False)  # HPC/MPC, in active order
    copied: list[tuple[int, str]] | None = field(default=None, compare=False, repr=False)  # (expert, LPC | MISS)
    # the experts computed on the host CPU (source CPU), in active order (None: none, or the protocol splits
    # ``sources``); they are in neither ``resident`` nor ``copied``
    cpu: list[int] | None = field(default=None, compare=False, repr=False)
    # the copied experts that come from a prefetch (source LPC), counted as ``classify`` meets them (None: the
    # protocol counts ``copied``)
    prefetch_hits: int | None = field(default=None, compare=False, repr=False)

    def split(self, active: Sequence[int]) -> tuple[list[int], list[tuple[int, str]], list[int]]:
        """(resident, copied, cpu): ``sources`` split as engines act on it, each in ``active`` order (the lists that
        ``classify`` fills, or split here for a plan without them)."""
        if self.resident is not None:
            assert self.copied is not None, "a plan's classify gives resident and copied together"
            return self.resident, self.copied, self.cpu or []
        sources = self.sources
        resident, copied, cpu = [], [], []
        for e in active:
            src = sources[e]
            if src == HPC or src == MPC:
                resident.append(e)
            elif src == CPU:
                cpu.append(e)
            else:
                copied.append((e, src))
        return resident, copied, cpu
