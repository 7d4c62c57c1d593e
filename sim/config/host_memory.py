"""What a run keeps in the host's memory, checked against the host's installed capacity as the GPU's memory is checked
against ``gpu_memory_gb`` (:mod:`sim.config.memory`).

A machine composed from parts may state its host memory (``hardware.host.memory.capacity_gb``; a profile without it,
or with ``capacity_gb: null``, is not checked). The host then holds:

- **the routed experts in host memory**, at their storage format (the system's ``expert_format``): every expert of
  every MoE layer, since any of them may be copied or computed from there; for a policy that places whole layers on
  the host (``host_layers_param``, ``cpu_layers`` of ``ktransformers``: llama.cpp's ``--n-cpu-moe N``), only those
  N layers' experts; none for a policy that keeps every expert on the GPU (``all_resident``, e.g. ``gpu-only``);
  times the copies the system keeps (``numa: replicated``: one per socket, :func:`sim.config.host_choice.host_copies`);
- **what the host keeps for itself**: ``hardware.host.memory.reserved_gb`` (the operating system, drivers, pinned
  staging buffers and the serving process; default in ``configs/parts/memory.yaml``).

When together they exceed the capacity, the config is refused with one line naming
``hardware.host.memory.capacity_gb``, what each part needs and the capacity: a
:class:`sim.config.memory.DoesNotFit` (``memory`` "host"), so that a comparison or a sweep shows it as a row, as it
does a config that does not fit the GPU.
"""

from __future__ import annotations

from typing import Any

from moebase.model import ModelSpec
from sim.config.hardware import HardwareSpec
from sim.config.memory import DoesNotFit
from sim.config.placement import on_host, parse_ranges
from sim.config.units import GB

FIELD = "hardware.host.memory.capacity_gb"


def host_expert_layers(model: ModelSpec, policy_class: Any, params: dict, all_resident: bool) -> int:
    """How many MoE layers' experts the host holds: none when the policy keeps every expert on the GPU, the layers
    a layer-placing policy puts on the host, else all."""
    if all_resident:
        return 0
    gpu_param = getattr(policy_class, "gpu_layers_param", None)
    ranges = params.get(gpu_param) if gpu_param is not None else None
    gpu = set(parse_ranges(ranges, f"policy.params.{gpu_param}")) if isinstance(ranges, str) else None
    param = getattr(policy_class, "host_layers_param", None)
    n = params.get(param) if param is not None else None
    if gpu is None and not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
        return model.moe_layers  # no layer placement: every layer's experts are on the host
    return sum(on_host(layer, n, gpu) for layer in range(model.moe_layers))


def host_memory_check(
    model: ModelSpec, hw: HardwareSpec, policy_class: Any, params: dict, all_resident: bool, copies: int = 1
) -> dict[str, int] | None:
    """Bytes the host holds (``experts``, ``reserved``) when the hardware states its host memory, else None;
    DoesNotFit naming ``hardware.host.memory.capacity_gb`` when they exceed it. ``model`` carries the experts'
    storage width (the system's format applied); ``copies``: each expert held that many times (one per socket under
    ``numa: replicated``)."""
    memory = None if hw.host is None else hw.host.memory
    if memory is None or memory.capacity_gb is None:
        return None
    layers = host_expert_layers(model, policy_class, params, all_resident)
    need = {
        "experts": copies * model.num_experts * layers * model.expert_bytes,
        "reserved": int(round((memory.reserved_gb or 0.0) * GB)),
    }
    capacity = memory.capacity_gb * GB
    if sum(need.values()) <= capacity:
        return need
    copy_text = f"{copies} copies (numa: replicated) of " if copies > 1 else ""
    raise DoesNotFit(
        FIELD,
        f"{memory.capacity_gb:g} GB of host memory cannot hold the run: the experts in host memory need "
        f"{need['experts'] / GB:,.1f} GB ({copy_text}{model.num_experts} experts x {layers} MoE layers of "
        f"{model.name}, "
        f"{model.expert_bytes / GB:.3g} GB each at {model.expert_bits_per_weight:g} bits per weight) beside "
        f"{need['reserved'] / GB:g} GB the host keeps (hardware.host.memory.reserved_gb): "
        f"{sum(need.values()) / GB:,.1f} GB in all",
        sum(need.values()),
        int(capacity),
        need,
        memory="host",
    )


__all__ = ["FIELD", "host_expert_layers", "host_memory_check"]
