"""What a run keeps in the GPU's memory, and the error a run gets when that does not fit.

A run needs, on the GPU at once: the dense weights, the KV cache of its largest batch, the runtime's reserved
memory, and the experts its policy keeps there (its tiers: HPC and MPC slots and the working buffers; every expert
of every MoE layer for a policy that keeps them all resident, such as ``gpu-only``). When the parts add up to more
than ``hardware.gpu_memory_gb``, the config is refused with :class:`DoesNotFit`: one line that lists what each part
needs and the GPU's memory (``sim run`` exits 2 with it), and that ``sim compare`` and ``sim sweep`` show as
``does not fit (X GB > Y GB)`` instead of a throughput (:meth:`DoesNotFit.short`). No command reports a figure for a
configuration that cannot run.
"""

from __future__ import annotations

import math
from typing import Any

from moebase.errors import ConfigError
from sim.config.units import GB

#: Significant figures of the sizes a memory message shows (0.0213 GB, 4.91 GB, 773 GB).
SIGNIFICANT = 3


def gb(n_bytes: float, significant: int = SIGNIFICANT) -> str:
    """``n_bytes`` in GB (10^9 bytes) to ``significant`` figures, never in exponent form: ``773``, ``4.91``,
    ``0.0213``; ``0`` for nothing."""
    value = n_bytes / GB
    if value == 0:
        return "0"
    digits = max(0, min(12, significant - 1 - math.floor(math.log10(abs(value)))))
    return f"{value:,.{digits}f}"


def gb_pair(larger: float, smaller: float) -> tuple[str, str]:
    """Two sizes in GB (:func:`gb`) with as many figures as it takes for the larger to read larger (``24.01`` and
    ``24``, not ``24.0`` and ``24.0``)."""
    for significant in range(SIGNIFICANT, 13):
        a, b = gb(larger, significant), gb(smaller, significant)
        if a != b or larger <= smaller:
            return a, b
    return a, b


def expert_slots(hpc_slots: int, mpc_slots: int, n_layers: int, shared_slots: int | None = None) -> int:
    """Cached-expert slots on the GPU over ``n_layers`` cached layers (working buffers aside): a shared cache's
    ``shared_slots`` when given, else ``(hpc_slots + mpc_slots) x n_layers`` (per-layer slots, or a shared cache of
    the same GPU memory). The one place this total is computed: the config's memory check
    (``CacheConfig.total_slots``) and the policies' shared cache (``PolicyContext.shared_total``) read it here."""
    if shared_slots is not None:
        return shared_slots
    return (hpc_slots + mpc_slots) * n_layers


class DoesNotFit(ConfigError):
    """A config whose parts do not fit in the GPU's memory: a ConfigError (one line naming the field, exit status
    2) that also holds the numbers, so that a comparison or a sweep can show it as a row instead of failing.

    ``need_bytes`` and ``gpu_bytes``: what the run needs in all and the memory it must fit (the GPU's, or the
    host's when ``memory`` is ``"host"``: :mod:`sim.config.host_memory`); ``parts``: bytes per part (``dense``,
    ``kv_cache``, ``reserved``, and ``tiers`` or ``experts``); ``config``: the config as loaded but for this check
    (a :class:`sim.config.run_config.RunConfig`, set by ``config_from_dict``; None before), whose ``resolved``
    identifies the configuration."""

    def __init__(
        self, field: str, problem: str, need_bytes: int, gpu_bytes: int, parts: dict[str, int], memory: str = "GPU"
    ):
        super().__init__(field, problem)
        self.need_bytes = int(need_bytes)
        self.gpu_bytes = int(gpu_bytes)
        self.parts = dict(parts)
        self.memory = memory
        self.config: Any = None

    def short(self) -> str:
        """``does not fit (71.3 GB > 24 GB)`` (``... GB of host memory)`` for the host's): the words a table shows
        in place of a throughput."""
        need, gpu = gb_pair(self.need_bytes, self.gpu_bytes)
        return f"does not fit ({need} GB > {gpu} GB{'' if self.memory == 'GPU' else ' of host memory'})"


__all__ = ["DoesNotFit", "SIGNIFICANT", "expert_slots", "gb", "gb_pair"]
