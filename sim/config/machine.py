"""Machines composed from parts: a hardware mapping that names a GPU, a host and a link resolves to the figures of a
:class:`~sim.config.hardware.HardwareSpec`, the same the engine reads from a profile.

The composition keys of a hardware mapping (a run config's ``hardware:``, or a file of ``configs/hardware/``)::

    gpu: rtx4090-24gb           # a part of configs/parts/gpus/
    gpu_count: 1                # GPUs the run uses (only 1 is modelled: more are refused)
    host:
      cpu: epyc-9654            # a part of configs/parts/cpus/
      sockets: 2                # default 1; at most the CPU's max_sockets
      memory:                   # per socket, each key optional
        channels: 12            # default: the CPU's memory_channels (at most that)
        type: ddr5              # default: the CPU's (DDR5 when it takes both)
        speed_mts: 4800         # default: the CPU's rated speed for the type
        capacity_gb: 768        # the whole host's installed memory; default null: not stated, not checked
        reserved_gb: 8          # kept by the system and the serving process; default configs/parts/memory.yaml's
    link: {pcie_gen: 4, lanes: 16}   # default: the lower of the GPU's and the CPU's generation, the GPU's lanes

A machine may also be named in one string, ``GPU+[Nx-]CPU[+MEMORY][+CAPACITYgb][+genG[xL]]``, e.g.
``rtx4090-24gb+2x-epyc-9654+12xddr5-4800+768gb+gen4x16`` (:func:`parse_parts_name`); ``MEMORY`` is per socket,
``[CHANNELSx]TYPE[-SPEED]`` as the published rows write it.

The figures each part gives (:func:`derived_figures`; every input sourced or labelled an assumption in its file):

- GPU: ``gpu_memory_gb`` and ``hbm_bw_gb_s`` as stated; ``flops_tflops`` = ``tensor_tflops`` x
  ``tensor_efficiency``; ``flops_fp32_tflops`` = ``fp32_tflops`` x ``fp32_efficiency``; ``launch_overhead_us`` and
  ``reserved_gb`` as the part assumes them.
- link: ``pcie_bw_gb_s`` = the generation's ``usable_x16_gb_s`` x lanes / 16 (``configs/parts/links.yaml``: the
  pinned-copy rate of 16 lanes, i.e. the raw rate x an efficiency); ``pcie_latency_us`` from the same file.
- host: ``cpu_mem_bw_gb_s`` = sockets x channels x speed (MT/s) x the type's ``channel_bytes`` (8) x the CPU's
  ``memory_efficiency`` (an assumption in each CPU's file); ``cpu_bf16_tflops``, ``cpu_int8_tops`` and
  ``cpu_int4_tops`` = sockets x cores x ``vector_clock_ghz`` x the instruction set's ops per cycle x its
  ``usable_fraction`` (``configs/parts/host_kernels.yaml``); ``cpu_cores`` = sockets x cores;
  ``cpu_expert_overhead_us`` from ``host_kernels.yaml``.

**What a second socket does today**: its memory channels and cores add to the first's in full, bandwidth and host
rates alike, as if the experts were split across both sockets' memories and each socket computed its own share
(kTransformers' NUMA-aware split): the rule every two-socket profile of ``configs/hardware/`` has followed. Published
two-socket results gain 1.29-1.40x over one socket, not 2x (issue 32): how a system places experts across sockets,
and the bandwidth it gets, is not modelled yet.

Any figure the mapping sets itself overrides the derived one: the bundled profiles name their parts and keep the
figures they measured, fitted or rounded. A mapping with a ``base`` that changes a part (another GPU, CPU, socket
count, memory or link) drops the base's figures that part determined (:func:`merge_hardware`), so no figure of the
old part survives under the new one's name; a base calibrated on a machine (``tables``) may not change its parts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from moebase.checks import check_keys, check_mapping, integer, join, number, one_of, show, text
from moebase.errors import ConfigError
from moebase.fields import keys_of, read_settings, setting, to_plain
from moebase.profiles import available
from sim.config.parts import Part, closest_text, cpu_part, gpu_part, load_table, part_names

COMPOSITION_KEYS = ("gpu", "gpu_count", "host", "link")
MEMORY_TYPES = ("ddr4", "ddr5")
#: How many GPUs the engine models (one GPU, one copy engine, one host link).
MODELLED_GPUS = 1
#: Significant digits a derived figure keeps (no 132.16000000000003 in a resolved config).
DIGITS = 9

#: The figures each input of a composition determines (file keys): what a base's part change drops.
GPU_KEYS = ("gpu_memory_gb", "hbm_bw_gb_s", "flops_tflops", "flops_fp32_tflops", "launch_overhead_us", "reserved_gb")
GPU_DEPENDENT_KEYS = GPU_KEYS + ("d2d_bw_gb_s",)
LINK_KEYS = ("pcie_bw_gb_s", "pcie_latency_us")
LINK_DEPENDENT_KEYS = LINK_KEYS + ("d2h_bw_gb_s", "activation_latency_us")
HOST_BW_KEYS = ("cpu_mem_bw_gb_s",)
HOST_RATE_KEYS = ("cpu_bf16_tflops", "cpu_int8_tops", "cpu_int4_tops", "cpu_cores")
HOST_CALL_KEYS = ("cpu_expert_overhead_us",)
HOST_KEYS = HOST_BW_KEYS + HOST_RATE_KEYS + HOST_CALL_KEYS
#: Figures a calibration measures on one machine: a base holding them may not change its parts.
CALIBRATION_KEYS = ("tables",)


@dataclass(frozen=True)
class HostMemory:
    """The host's memory: per socket, its channels, type and speed; for the whole host, the installed capacity and
    what the system keeps for itself (resolved: every key but ``capacity_gb`` filled from the CPU's part)."""

    channels: int | None = setting(None, integer(1, 32, allow_none=True), constructor_default=True)
    type: str | None = setting(
        None, lambda v, w: None if v is None else one_of(*MEMORY_TYPES)(v, w), constructor_default=True
    )
    speed_mts: float | None = setting(
        None, lambda v, w: None if v is None else number(100, 20000)(v, w), constructor_default=True
    )
    capacity_gb: float | None = setting(
        None, lambda v, w: None if v is None else number(0, 1e6)(v, w), constructor_default=True
    )
    reserved_gb: float | None = setting(
        None, lambda v, w: None if v is None else number(0, 1e6, strict=False)(v, w), constructor_default=True
    )

    def to_dict(self) -> dict:
        return to_plain(self)


def _memory(value: Any, where: str) -> HostMemory:
    d = {} if value is None else check_mapping(value, where)
    check_keys(d, where, (), keys_of(HostMemory), see="sim/config/machine.py")
    return HostMemory(**read_settings(HostMemory, d, where))


@dataclass(frozen=True)
class HostParts:
    """The host: its CPU (a part's name), how many sockets, and their memory."""

    cpu: str = setting(check=text())
    sockets: int = setting(1, integer(1, 8), constructor_default=True)
    memory: HostMemory = setting(None, _memory, nested=HostMemory, constructor_default=True)

    def to_dict(self) -> dict:
        return to_plain(self)


@dataclass(frozen=True)
class LinkParts:
    """The GPU's host link: PCIe generation and lanes."""

    pcie_gen: int | None = setting(None, integer(3, 6, allow_none=True), constructor_default=True)
    lanes: int | None = setting(None, lambda v, w: None if v is None else one_of_int(v, w), constructor_default=True)

    def to_dict(self) -> dict:
        return to_plain(self)


LANES = (1, 2, 4, 8, 16)


def one_of_int(value: Any, where: str) -> int:
    """A lane count: 1, 2, 4, 8 or 16."""
    if isinstance(value, bool) or value not in LANES:
        raise ConfigError(where, f"must be one of {', '.join(map(str, LANES))}, got {show(value)}")
    return int(value)


def host_from(value: Any, where: str) -> HostParts | None:
    """``hardware.host``: null, or a mapping of :class:`HostParts`'s keys (checked for shape; the parts are looked
    up by :func:`resolve`)."""
    if value is None:
        return None
    d = check_mapping(value, where)
    check_keys(d, where, ("cpu",), keys_of(HostParts), see="sim/config/machine.py")
    return HostParts(**read_settings(HostParts, d, where))


def link_from(value: Any, where: str) -> LinkParts | None:
    """``hardware.link``: null, or a mapping of :class:`LinkParts`'s keys."""
    if value is None:
        return None
    d = check_mapping(value, where)
    check_keys(d, where, (), keys_of(LinkParts), see="sim/config/machine.py")
    return LinkParts(**read_settings(LinkParts, d, where))


@dataclass(frozen=True)
class Composition:
    """A machine's parts, looked up and with every default filled: what :func:`derived_figures` reads."""

    gpu: Part | None
    gpu_count: int
    cpu: Part | None
    host: HostParts | None
    link: LinkParts | None

    def plain(self) -> dict:
        """The composition keys as a hardware mapping holds them (resolved), without those not given."""
        out: dict[str, Any] = {}
        if self.gpu is not None:
            out["gpu"] = self.gpu.name
            out["gpu_count"] = self.gpu_count
        if self.host is not None:
            out["host"] = self.host.to_dict()
        if self.link is not None:
            out["link"] = self.link.to_dict()
        return out


# --------------------------------------------------------------------------------------------- resolving
def has_parts(d: dict) -> bool:
    """Whether a hardware mapping names any part."""
    return any(d.get(k) is not None for k in COMPOSITION_KEYS)


def resolve(d: dict, where: str = "hardware") -> Composition | None:
    """The parts a hardware mapping names, looked up (a part not bundled is refused with the closest names), checked
    against each other and with every default filled; None when it names none."""
    if not has_parts(d):
        return None
    gpu = None if d.get("gpu") is None else gpu_part(d["gpu"], join(where, "gpu"))
    count = integer(1, 64)(1 if d.get("gpu_count") is None else d["gpu_count"], join(where, "gpu_count"))
    if count > MODELLED_GPUS:
        raise ConfigError(
            join(where, "gpu_count"),
            f"{count} GPUs are not modelled yet: the simulator has one GPU, one copy engine and one host link "
            f"(give 1, or simulate one GPU's share)",
        )
    given_host = host_from(d.get("host"), join(where, "host"))
    cpu = None if given_host is None else cpu_part(given_host.cpu, join(where, "host.cpu"))
    host = None if given_host is None or cpu is None else _resolved_host(given_host, cpu, join(where, "host"))
    link = _resolved_link(link_from(d.get("link"), join(where, "link")), gpu, cpu, join(where, "link"))
    return Composition(gpu, count, cpu, host, link)


def _resolved_host(host: HostParts, cpu: Part, where: str) -> HostParts:
    most = cpu.value("max_sockets")
    if host.sockets > most:
        raise ConfigError(join(where, "sockets"), f"is {host.sockets}, but {cpu.name} takes at most {most}")
    mem = host.memory or HostMemory()
    types = [t for t in MEMORY_TYPES if cpu.value(f"{t}_speed_mts") is not None]
    kind = mem.type or ("ddr5" if "ddr5" in types else types[0])
    if kind not in types:
        raise ConfigError(join(where, "memory.type"), f"is {kind}, but {cpu.name} takes {' or '.join(types)}")
    channels = cpu.value("memory_channels") if mem.channels is None else mem.channels
    if channels > cpu.value("memory_channels"):
        raise ConfigError(
            join(where, "memory.channels"),
            f"is {channels}, but {cpu.name} has {cpu.value('memory_channels')} memory channels per socket",
        )
    capacity = mem.capacity_gb
    most_gb = host.sockets * cpu.value("max_memory_gb")
    if capacity is not None and capacity > most_gb:
        raise ConfigError(
            join(where, "memory.capacity_gb"),
            f"is {capacity:g} GB, but {host.sockets} x {cpu.name} hold at most {most_gb:g} GB",
        )
    reserved = load_table("memory").figures["reserved_gb"].value if mem.reserved_gb is None else mem.reserved_gb
    speed = cpu.value(f"{kind}_speed_mts") if mem.speed_mts is None else mem.speed_mts
    memory = HostMemory(channels, kind, speed, capacity, reserved)
    return HostParts(cpu.name, host.sockets, memory)


def _resolved_link(link: LinkParts | None, gpu: Part | None, cpu: Part | None, where: str) -> LinkParts | None:
    """The link with its defaults: the lower of the GPU's and the CPU's PCIe generation, the GPU's lanes. A link
    faster than the GPU or the CPU supports is refused."""
    if link is None and gpu is None:
        return None
    link = link or LinkParts()
    gens = [(p.value("pcie_gen"), p.name) for p in (gpu, cpu) if p is not None]
    gen = link.pcie_gen if link.pcie_gen is not None else (min(g for g, _ in gens) if gens else None)
    if gen is None:
        raise ConfigError(join(where, "pcie_gen"), "missing: no GPU or CPU part gives the link's generation")
    for g, name in gens:
        if gen > g:
            raise ConfigError(join(where, "pcie_gen"), f"is {gen}, but {name} supports PCIe gen {g} at most")
    load_table("links").entry(gen, join(where, "pcie_gen"), "PCIe generation")
    lanes = link.lanes if link.lanes is not None else (gpu.value("pcie_lanes") if gpu is not None else 16)
    if gpu is not None and lanes > gpu.value("pcie_lanes"):
        raise ConfigError(join(where, "lanes"), f"is {lanes}, but {gpu.name} has {gpu.value('pcie_lanes')} lanes")
    return LinkParts(gen, lanes)


# --------------------------------------------------------------------------------------------- figures
def _r(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def derived_figures(comp: Composition) -> dict[str, tuple[float, str]]:
    """The hardware figures (file keys and units) the parts give, each with how it was derived."""
    out: dict[str, tuple[float, str]] = {}
    if comp.gpu is not None:
        out.update(_gpu_figures(comp.gpu))
    if comp.link is not None:
        out.update(_link_figures(comp.link))
    if comp.host is not None and comp.cpu is not None:
        out.update(_host_figures(comp.host, comp.cpu))
    return out


def _gpu_figures(g: Part) -> dict[str, tuple[float, str]]:
    def eff(peak: str, share: str) -> tuple[float, str]:
        p, s = g.value(peak), g.value(share)
        return _r(p * s), f"{peak} {p:g} x {share} {s:g} ({g.name})"

    return {
        "gpu_memory_gb": (g.value("memory_gb"), f"memory_gb of {g.name}"),
        "hbm_bw_gb_s": (g.value("memory_bw_gb_s"), f"memory_bw_gb_s of {g.name}"),
        "flops_tflops": eff("tensor_tflops", "tensor_efficiency"),
        "flops_fp32_tflops": eff("fp32_tflops", "fp32_efficiency"),
        "launch_overhead_us": (g.value("launch_overhead_us"), f"launch_overhead_us of {g.name}"),
        "reserved_gb": (g.value("reserved_gb"), f"reserved_gb of {g.name}"),
    }


def _link_figures(link: LinkParts) -> dict[str, tuple[float, str]]:
    table = load_table("links")
    usable = table.entries[link.pcie_gen]["usable_x16_gb_s"].value
    lanes = link.lanes or 16
    return {
        "pcie_bw_gb_s": (
            _r(usable * lanes / 16),
            f"usable_x16_gb_s {usable:g} of PCIe gen {link.pcie_gen} x {lanes} / 16 lanes (links.yaml)",
        ),
        "pcie_latency_us": (table.figures["latency_us"].value, "latency_us (links.yaml)"),
    }


def _host_figures(host: HostParts, cpu: Part) -> dict[str, tuple[float, str]]:
    mem = host.memory
    assert mem is not None and mem.type is not None and mem.channels is not None and mem.speed_mts is not None
    n = host.sockets
    channel_bytes = load_table("memory").entries[mem.type]["channel_bytes"].value
    eff = cpu.value("memory_efficiency")
    peak = n * mem.channels * mem.speed_mts * channel_bytes / 1000
    kernels = load_table("host_kernels")
    isa = kernels.entry(cpu.value("isa"), f"{cpu.file}: figures.isa", "instruction set")
    cores, clock, usable = cpu.value("cores"), cpu.value("vector_clock_ghz"), isa["usable_fraction"].value
    out = {
        "cpu_mem_bw_gb_s": (
            _r(peak * eff),
            f"{n} socket(s) x {mem.channels} channels x {mem.speed_mts:g} MT/s x {channel_bytes} B = {peak:g} GB/s "
            f"peak, x memory_efficiency {eff:g} ({cpu.name})",
        ),
    }
    for key, per_cycle in (
        ("cpu_bf16_tflops", "bf16_flops_per_cycle"),
        ("cpu_int8_tops", "int8_ops_per_cycle"),
        ("cpu_int4_tops", "int4_ops_per_cycle"),
    ):
        rate = isa[per_cycle].value
        out[key] = (
            _r(n * cores * clock * rate * usable / 1000),
            f"{n} x {cores} cores x {clock:g} GHz x {per_cycle} {rate} x usable_fraction {usable:g} "
            f"({cpu.value('isa')})",
        )
    out["cpu_cores"] = (n * cores, f"{n} socket(s) x {cores} cores ({cpu.name})")
    out["cpu_expert_overhead_us"] = (kernels.figures["call_overhead_us"].value, "call_overhead_us (host_kernels.yaml)")
    return out


#: The CPU figures of a hardware mapping (file keys), which a composition without a host must give itself.
CPU_KEYS = HOST_KEYS


def compose(d: dict, where: str = "hardware") -> tuple[dict, Composition | None]:
    """A hardware mapping with its parts resolved: the composition keys replaced by their resolved form, and every
    figure the parts give filled in where the mapping does not set it. A composition that names a GPU but no host
    must give the host's figures itself (else they would silently be another host's)."""
    comp = resolve(d, where)
    if comp is None:
        return d, None
    if comp.gpu is not None and comp.host is None:
        missing = [k for k in HOST_BW_KEYS + HOST_RATE_KEYS if d.get(k) is None]
        if missing:
            raise ConfigError(
                join(where, "host"),
                f"missing: a machine composed from parts names its host ({{cpu: NAME, sockets: N}}; "
                f"{closest_text('', part_names('cpu'), 'configs/parts/cpus/')}) or gives its figures "
                f"({', '.join(missing)})",
            )
    out = {k: v for k, v in d.items() if k not in COMPOSITION_KEYS}
    for key, (value, _) in derived_figures(comp).items():
        if out.get(key) is None:
            out[key] = value
    out.update(comp.plain())
    if out.get("name") is None and comp.gpu is not None:
        out["name"] = parts_name(comp)
    return out, comp


def parts_name(comp: Composition) -> str:
    """The machine's name in the one-string form of :func:`parse_parts_name` (every resolved part spelled out)."""
    assert comp.gpu is not None
    pieces = [comp.gpu.name if comp.gpu_count == 1 else f"{comp.gpu_count}x-{comp.gpu.name}"]
    if comp.host is not None and comp.host.memory is not None:
        m = comp.host.memory
        pieces.append(f"{comp.host.sockets}x-{comp.host.cpu}")
        pieces.append(f"{m.channels}x{m.type}-{m.speed_mts:g}")
        if m.capacity_gb is not None:
            pieces.append(f"{m.capacity_gb:g}gb")
    if comp.link is not None:
        pieces.append(f"gen{comp.link.pcie_gen}x{comp.link.lanes}")
    return "+".join(pieces)


# --------------------------------------------------------------------------------------------- one-string names
COUNTED = re.compile(r"(?:([0-9]{1,2})x-)?([a-z0-9][a-z0-9.-]*)")
MEMORY_TOKEN = re.compile(r"(?:([0-9]{1,2})x)?(ddr[45])(?:-([0-9]{3,5}))?")
CAPACITY_TOKEN = re.compile(r"([0-9]{1,7}(?:\.[0-9]+)?)gb")
LINK_TOKEN = re.compile(r"gen([3-6])(?:x([0-9]{1,2}))?")
MAX_NAME_CHARS = 200


def is_parts_name(value: Any) -> bool:
    """Whether a hardware reference is a machine named by its parts (``GPU+CPU...``) rather than a profile's name or
    a path."""
    if not isinstance(value, str) or "+" not in value or "/" in value:
        return False
    return not value.lower().endswith((".yaml", ".yml", ".json"))


def parse_parts_name(text_: str, where: str = "hardware") -> dict:
    """``GPU+[Nx-]CPU[+MEMORY][+CAPACITYgb][+genG[xL]]`` as a hardware mapping (the parts are looked up later): e.g.
    ``rtx4090-24gb+2x-epyc-9654+12xddr5-4800+768gb+gen4x16``. The host may be left out (``GPU+genG``) only where
    the mapping gives the host's figures. A first name that is a bundled machine and no GPU part is that machine
    with the rest laid over it as a child over its ``base`` (``rtx4090d-1x6454s+1024gb``: its installed memory)."""
    if len(text_) > MAX_NAME_CHARS:
        raise ConfigError(where, f"a machine named by its parts is at most {MAX_NAME_CHARS} characters")
    tokens = text_.strip().lower().split("+")
    gpu = COUNTED.fullmatch(tokens[0])
    if not gpu:
        raise ConfigError(where, f"{show(tokens[0])} is not a GPU part name (GPU+[Nx-]CPU[+MEMORY][+genG[xL]])")
    d: dict[str, Any] = {"gpu": gpu.group(2), "gpu_count": int(gpu.group(1) or 1)}
    if gpu.group(1) is None and tokens[0] not in part_names("gpu") and tokens[0] in available("hardware"):
        d = {"base": tokens[0]}  # a bundled machine, with what follows laid over it (``rtx4090d-1x6454s+1024gb``)
    memory: dict[str, Any] = {}
    for token in tokens[1:]:
        if m := MEMORY_TOKEN.fullmatch(token):
            memory.update({k: v for k, v in _memory_token(m).items() if v is not None})
        elif m := CAPACITY_TOKEN.fullmatch(token):
            memory["capacity_gb"] = float(m.group(1))
        elif m := LINK_TOKEN.fullmatch(token):
            d["link"] = {"pcie_gen": int(m.group(1)), **({"lanes": int(m.group(2))} if m.group(2) else {})}
        elif (m := COUNTED.fullmatch(token)) and "host" not in d:
            d["host"] = {"cpu": m.group(2), "sockets": int(m.group(1) or 1)}
        else:
            raise ConfigError(
                where,
                f"{show(token)} in {show(text_)} is not a CPU, memory (12xddr5-4800), capacity (768gb) or link "
                f"(gen4x16)",
            )
    if memory:
        if "host" not in d and "base" not in d:
            raise ConfigError(where, f"{show(text_)} gives memory but no CPU")
        d.setdefault("host", {})["memory"] = memory
    return d


def _memory_token(m: re.Match) -> dict[str, Any]:
    return {
        "channels": int(m.group(1)) if m.group(1) else None,
        "type": m.group(2),
        "speed_mts": int(m.group(3)) if m.group(3) else None,
    }


# --------------------------------------------------------------------------------------------- a base's parts
def _given_host(d: dict) -> dict | None:
    host = d.get("host")
    return dict(host) if isinstance(host, dict) else None


def merged_composition(base: dict, child: dict) -> dict:
    """The composition keys of ``child`` laid over ``base``'s: a host naming another CPU replaces the base's host
    whole (its memory and sockets were the other CPU's), else the host and its memory merge key by key; the link
    merges key by key."""
    out = {k: base[k] for k in COMPOSITION_KEYS if k in base}
    for k in ("gpu", "gpu_count"):
        if k in child:
            out[k] = child[k]
    host, base_host = _given_host(child), _given_host(base)
    if "host" in child:
        if host is None or base_host is None or host.get("cpu", base_host.get("cpu")) != base_host.get("cpu"):
            out["host"] = child["host"]
        else:
            merged = {**base_host, **host}
            if isinstance(base_host.get("memory"), dict) and isinstance(host.get("memory"), dict):
                merged["memory"] = {**base_host["memory"], **host["memory"]}
            out["host"] = merged
    if "link" in child:
        base_link, link = base.get("link"), child["link"]
        both = isinstance(base_link, dict) and isinstance(link, dict)
        out["link"] = {**base_link, **link} if both else link  # type: ignore[dict-item]
    return out


def _inputs(comp: Composition | None) -> dict[str, Any]:
    """What each group of derived figures depends on, for comparing a base's parts with a child's."""
    if comp is None:
        return {"gpu": None, "link": None, "host_bw": None, "host_rate": None, "host_call": None}
    host, mem = comp.host, comp.host.memory if comp.host is not None else None
    return {
        "gpu": None if comp.gpu is None else comp.gpu.name,
        "link": None if comp.link is None else (comp.link.pcie_gen, comp.link.lanes),
        "host_bw": None
        if host is None or mem is None
        else (host.cpu, host.sockets, mem.channels, mem.type, mem.speed_mts),
        "host_rate": None if host is None else (host.cpu, host.sockets),
        "host_call": None if host is None else host.cpu,
    }


_DROPPED = {
    "gpu": GPU_DEPENDENT_KEYS,
    "link": LINK_DEPENDENT_KEYS,
    "host_bw": HOST_BW_KEYS,
    "host_rate": HOST_RATE_KEYS,
    "host_call": HOST_CALL_KEYS,
}


def merge_hardware(base: dict, child: dict, where: str = "hardware") -> dict:
    """``child`` laid over its ``base`` (both hardware mappings): where the child changes a part, the base's figures
    that part determined are dropped (the new part's are derived, unless the child sets them itself), and the
    machine takes its parts' name unless the child names it. A base that names no parts, or that holds measured
    tables, may not have its parts changed: ConfigError naming the part's field."""
    if not any(k in child for k in COMPOSITION_KEYS):
        return {**base, **child}
    parts = merged_composition(base, child)
    before, after = resolve(base, join(where, "base")), resolve(parts, where)
    old, new = _inputs(before), _inputs(after)
    changed = [group for group in old if old[group] != new[group]]
    if not changed:
        return {**base, **{k: v for k, v in child.items() if k not in COMPOSITION_KEYS}, **parts}
    field = join(where, next(k for k in COMPOSITION_KEYS if k in child))
    if before is None:
        raise ConfigError(
            field,
            f"changes a part of a profile that names none ({show(base.get('name'))}): compose the machine from "
            f"parts instead (gpu, host and link, without base)",
        )
    for key in CALIBRATION_KEYS:
        if base.get(key) is not None and key not in child:
            raise ConfigError(
                field,
                f"changes a part of {show(base.get('name'))}, whose {key} were measured on that machine "
                f"(compose a machine from parts instead, or set {key}: null)",
            )
    out = {k: v for k, v in base.items() if k not in COMPOSITION_KEYS}
    for group in changed:
        for key in _DROPPED[group]:
            out.pop(key, None)
    out.update({k: v for k, v in child.items() if k not in COMPOSITION_KEYS})
    out.update(parts)
    if "name" not in child:
        out.pop("name", None)  # the parts' name (compose), not the base's: it is another machine
    return out


__all__ = [
    "COMPOSITION_KEYS",
    "CPU_KEYS",
    "Composition",
    "HostMemory",
    "HostParts",
    "LinkParts",
    "compose",
    "derived_figures",
    "has_parts",
    "host_from",
    "is_parts_name",
    "link_from",
    "merge_hardware",
    "merged_composition",
    "parse_parts_name",
    "parts_name",
    "resolve",
]
