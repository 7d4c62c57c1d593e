"""Hardware profiles: a GPU, its host link and the host CPU (``configs/hardware/NAME.yaml``, a path to a profile or
calibration file, or an inline mapping that may name a ``base`` profile).

Files use readable units, converted to SI in :class:`HardwareSpec` (GB = 1e9 bytes); each field of the dataclass
declares its key and unit (see :mod:`moebase.fields`). Every figure has a sane range, so that no value
overflows later (``gpu_memory_gb`` up to 1e6, rates at least 1e-6 GB/s or TFLOP/s, host times at most 1e9 us,
slowdowns in [1, 1000]). Optional measured ``tables`` override the roofline; see :class:`CalibrationTables`.

The host CPU (for experts computed beside their weights in host memory, as Fiddler, kTransformers and llama.cpp
``--n-cpu-moe`` do, moving only activations across the link) is described by the ``cpu_*`` keys: usable memory
bandwidth, usable matrix throughput for 16-bit, 8-bit and 4-bit weights, the cores given to experts and a fixed cost
per expert call; ``d2h_bw_gb_s`` and ``activation_latency_us`` price the activations crossing the link. Their
defaults (one Sapphire Rapids socket with AMX, see ``configs/hardware/h200.yaml`` for the sources) only matter when
host compute is used: nothing that existed before reads them.

A hardware file, every key (the ``# ->`` names the :class:`HardwareSpec` field)::

    name: h200                  # optional: the file's stem
    gpu_memory_gb: 141          # -> gpu_memory_bytes
    hbm_bw_gb_s: 4800           # -> hbm_bw (bytes/s)
    flops_tflops: 790           # -> flops (FLOP/s at 16-bit)
    flops_fp32_tflops: 60       # -> flops_fp32 (used when the model's dtype_bytes is 4)
    pcie_bw_gb_s: 52            # -> pcie_bw: host -> device, pinned
    pcie_latency_us: 10         # -> pcie_latency_s: fixed cost per copy
    d2d_bw_gb_s: 2400           # optional (default hbm_bw_gb_s / 2: a copy reads and writes) -> d2d_bw
    launch_overhead_us: 3       # -> launch_overhead_s: per kernel
    handoff_us: 0               # optional: host threads' wake-up time between a landed copy and its compute,
                                #   and between asking an idle link for a copy and its start
    copy_gap_us: 0              # optional: the link idles this long between a copy landing and the start of the
                                #   next one already queued (the copy thread's wake-up, under load)
    layer_roundtrip_us: 0       # optional: per MoE layer, the gate's choice is brought to the host (a device ->
                                #   host sync) before any copy or expert of the layer is issued
    copy_issue_us: 0            # optional: host time to issue one copy (the compute thread waits that long)
    expert_issue_us: 0          # optional: host time to issue one copied expert's compute (taking the landed copy,
                                #   ordering, launching, releasing its buffer); an expert takes at least this long
    hit_issue_us: 0             # optional: host time to issue one cached expert's compute
    compute_slowdown: 1.0       # optional: expert compute runs this many times longer while a copy crosses the link
    dense_slowdown: 1.0         # optional: the same for dense work and the LM head (default: compute_slowdown)
    copy_slowdown: 1.0          # optional: a copy runs this many times longer while compute runs (both measured
                                #   by validate microbench: copies and compute share memory bandwidth)
    reserved_gb: 4              # -> reserved_bytes: runtime, activations, fragmentation
    tables:                     # optional, measured (a calibration file from validate/ writes these); SI units
      model: switch-xxl-128     #   the model the expert/dense tables were measured for
      copy: [[bytes, seconds], ...]            # host -> device
      d2d: [[bytes, seconds], ...]             # device -> device
      expert: [[tokens, seconds], ...]         # one expert of `model` on that many tokens
      dense: [[tokens, context, seconds], ...] # dense work per MoE layer; a full grid over (tokens, context)
      lm_head: [[tokens, seconds], ...]        # the LM head of `model` over that many tokens

A calibration file is the same schema, in YAML or JSON, usually ``{"base": "h200", "tables": {...}}`` plus any
fitted scalar (e.g. ``pcie_bw_gb_s``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from moebase.checks import NAME_CHARS, Check, check_keys, check_mapping, integer, join, number, real, show, text
from moebase.errors import ConfigError
from moebase.fields import keys_of, read_settings, required_keys, setting, to_plain, to_si
from moebase.model import ModelSpec
from moebase.profiles import load_profile
from sim.config.machine import (
    COMPOSITION_KEYS,
    HostParts,
    LinkParts,
    compose,
    host_from,
    is_parts_name,
    link_from,
    merge_hardware,
    parse_parts_name,
)
from sim.config.units import GB


def _rate() -> Check:
    """A rate in GB/s or TFLOP/s: at least 1e-6 (a slower one would make durations overflow), at most 1e7."""
    return number(1e-6, 1e7, strict=False)


def _time() -> Check:
    """A host or latency time in microseconds: 0 to 1e9 (over a quarter of an hour per event)."""
    return number(0.0, 1e9, strict=False)


def _slowdown() -> Check:
    """A stretch factor while the link (or compute) is busy: 1 (no interference) to 1000."""
    return number(1.0, 1000.0, strict=False)


def _per_policy_time(value: Any, where: str) -> tuple[tuple[str, float], ...]:
    """``{policy name: microseconds}`` -> sorted (name, microseconds) pairs (a frozen spec holds no dict)."""
    if value is None or value == ():
        return ()
    d = check_mapping(value, where)
    check = _time()
    out = []
    for name, us in d.items():
        if not isinstance(name, str) or not name.strip() or len(name) > NAME_CHARS:
            raise ConfigError(where, f"keys must be policy names, got {show(name)}")
        out.append((name, float(check(us, join(where, name)))))
    return tuple(sorted(out))


Points2 = tuple[tuple[float, float], ...]
Points3 = tuple[tuple[float, float, float], ...]


@dataclass(frozen=True)
class CalibrationTables:
    """Measured tables that override the roofline (all optional; each a list of points sorted by its inputs)."""

    copy: Points2 | None = None  # (bytes, seconds) host->device
    d2d: Points2 | None = None  # (bytes, seconds) device->device
    expert: Points2 | None = None  # (tokens routed to one expert, seconds) for THIS model's expert shape
    dense: Points3 | None = None  # (batch tokens, context length, seconds) dense work per MoE layer
    lm_head: Points2 | None = None  # (tokens, seconds) the LM head of THIS model
    # (tokens routed to one expert, seconds) one expert on the host CPU (all cpu_cores), THIS model's expert shape
    cpu_expert: Points2 | None = None
    # (bytes of one quantized expert, seconds) de-quantizing it on the GPU into 16-bit weights, weight-only int8
    # (per-channel scales) and packed int4 (group scales): measured by ``validate microbench`` for the model's shape
    dequant_int8: Points2 | None = None
    dequant_int4: Points2 | None = None
    model: str | None = None  # the model the expert/dense/lm_head/cpu_expert/dequant tables were measured for

    def to_dict(self) -> dict:
        """The tables in the hardware-file schema (lists of lists, SI units)."""

        def pts(v):
            return None if v is None else [list(p) for p in v]

        out = {
            "model": self.model,
            "copy": pts(self.copy),
            "d2d": pts(self.d2d),
            "expert": pts(self.expert),
            "dense": pts(self.dense),
            "lm_head": pts(self.lm_head),
            "cpu_expert": pts(self.cpu_expert),
        }
        for key in ("dequant_int8", "dequant_int4"):  # only when measured: older files and results read as before
            if getattr(self, key) is not None:
                out[key] = pts(getattr(self, key))
        return out

    @property
    def has_model_tables(self) -> bool:
        """Whether any table here holds for one model's shapes (expert, dense, lm_head, cpu_expert)."""
        return any(
            t is not None
            for t in (self.expert, self.dense, self.lm_head, self.cpu_expert, self.dequant_int8, self.dequant_int4)
        )

    def dequant_for(self, bits_per_weight: float) -> Points2 | None:
        """The measured de-quantization table for experts stored at ``bits_per_weight`` (scales included): packed
        int4 up to 4.5 bits, int8 up to 8.5, none otherwise (or when not measured)."""
        if bits_per_weight <= 4.5:
            return self.dequant_int4
        if bits_per_weight <= 8.5:
            return self.dequant_int8
        return None


@dataclass(frozen=True)
class HardwareSpec:
    """A GPU, its host link and the host CPU, in SI units."""

    name: str = setting("inline", text())
    gpu_memory_bytes: int = setting(check=number(0.0, 1e6), key="gpu_memory_gb", scale=GB, as_int=True)
    hbm_bw: float = setting(check=_rate(), key="hbm_bw_gb_s", scale=GB)  # bytes/s
    flops: float = setting(check=_rate(), key="flops_tflops", scale=1e12)  # dense 16-bit FLOP/s
    flops_fp32: float = setting(check=_rate(), key="flops_fp32_tflops", scale=1e12)  # when dtype_bytes == 4
    pcie_bw: float = setting(check=_rate(), key="pcie_bw_gb_s", scale=GB)  # host->device, pinned
    pcie_latency_s: float = setting(check=_time(), key="pcie_latency_us", divisor=1e6)  # fixed cost per copy
    d2d_bw: float = setting(
        lambda v, where: v["hbm_bw"] / 2, _rate(), key="d2d_bw_gb_s", scale=GB, null_is_default=True
    )  # device->device copy bytes/s (default hbm / 2: read + write)
    launch_overhead_s: float = setting(check=_time(), key="launch_overhead_us", divisor=1e6)  # per kernel
    reserved_bytes: int = setting(
        check=number(0.0, 1e6, strict=False), key="reserved_gb", scale=GB, as_int=True
    )  # runtime, activations, fragmentation: not for weights/KV/tiers
    # -- the link for host experts' activations: device->host bytes/s (default: pcie_bw_gb_s, a symmetric link) and
    # the fixed cost of one small activation copy either way (default: pcie_latency_us)
    d2h_bw: float = setting(lambda v, where: v["pcie_bw"], _rate(), key="d2h_bw_gb_s", scale=GB, null_is_default=True)
    activation_latency_s: float = setting(
        lambda v, where: v["pcie_latency_s"], _time(), key="activation_latency_us", divisor=1e6, null_is_default=True
    )
    # -- the host CPU computing experts beside their weights; defaults: one Sapphire Rapids socket
    cpu_mem_bw: float = setting(230.0, _rate(), key="cpu_mem_bw_gb_s", scale=GB)  # usable host memory bytes/s
    # usable matrix FLOP/s for experts whose weights are 16-bit (bf16/fp16; wider ones are taken at this rate too)
    cpu_bf16_flops: float = setting(20.0, _rate(), key="cpu_bf16_tflops", scale=1e12)
    # usable ops/s (a multiply-add is 2) for 8-bit weights (int8, fp8: more than 5 and at most 9 bits per weight)
    cpu_int8_flops: float = setting(40.0, _rate(), key="cpu_int8_tops", scale=1e12)
    # usable ops/s for 4-bit weights (int4, MXFP4, Q4 blocks: at most 5 bits per weight, scales included)
    cpu_int4_flops: float = setting(40.0, _rate(), key="cpu_int4_tops", scale=1e12)
    cpu_cores: int = setting(56, integer(1, 100_000))  # cores given to experts (the rates above are for all of them)
    # fixed host cost per expert call (thread-pool dispatch and join, weight pointers): us -> s
    cpu_expert_overhead_s: float = setting(5.0, _time(), key="cpu_expert_overhead_us", divisor=1e6)
    tables: CalibrationTables | None = setting(
        None, lambda v, where: tables_from_dict(v, where), nested=CalibrationTables
    )
    source: str = setting("inline", text(max_chars=4096))  # the file it came from, or "inline"
    # expert compute stretch while the link is busy (shared memory bandwidth), >= 1
    compute_slowdown: float = setting(1.0, _slowdown(), constructor_default=True)
    # dense work and LM head stretch while the link is busy (default: compute_slowdown)
    dense_slowdown: float = setting(lambda v, where: v["compute_slowdown"], _slowdown(), constructor_default=True)
    copy_slowdown: float = setting(1.0, _slowdown(), constructor_default=True)  # copy stretch while compute runs
    # host wake-up between a copy and the compute that waits for it (and back)
    handoff_s: float = setting(0.0, _time(), key="handoff_us", divisor=1e6, constructor_default=True)
    # link idle between a landed copy and the next queued one's start
    copy_gap_s: float = setting(0.0, _time(), key="copy_gap_us", divisor=1e6, constructor_default=True)
    # per MoE layer: the gate's choice to the host before the layer's copies/experts
    layer_roundtrip_s: float = setting(0.0, _time(), key="layer_roundtrip_us", divisor=1e6, constructor_default=True)
    # host time per copy issued
    copy_issue_s: float = setting(0.0, _time(), key="copy_issue_us", divisor=1e6, constructor_default=True)
    # host time per copied expert's compute issued (a floor on its duration)
    expert_issue_s: float = setting(0.0, _time(), key="expert_issue_us", divisor=1e6, constructor_default=True)
    # host time per cached expert's compute issued
    hit_issue_s: float = setting(0.0, _time(), key="hit_issue_us", divisor=1e6, constructor_default=True)
    # host time to issue one MoE layer's dense work (a floor on its duration)
    dense_issue_s: float = setting(0.0, _time(), key="dense_issue_us", divisor=1e6, constructor_default=True)
    # host work (issuing dense work) stretch while copies land: the copy thread takes the interpreter lock, >= 1
    host_slowdown: float = setting(1.0, _slowdown(), constructor_default=True)
    # host time per MoE layer to take the layer's decisions, by policy (microseconds; a policy not listed: 0)
    decide_us: tuple = setting((), _per_policy_time, free=True, constructor_default=True)
    # -- the parts the machine is composed from (sim/config/machine.py; None: a profile that names none): a GPU
    # part, how many GPUs (only 1 is modelled), the host (CPU part, sockets, memory) and the PCIe link
    gpu: str | None = setting(None, text(allow_none=True), constructor_default=True)
    gpu_count: int | None = setting(None, integer(1, 64, allow_none=True), constructor_default=True)
    host: HostParts | None = setting(None, host_from, nested=HostParts, constructor_default=True)
    link: LinkParts | None = setting(None, link_from, nested=LinkParts, constructor_default=True)

    def decide_s(self, policy: str) -> float:
        """Host seconds a policy's decisions take per MoE layer on this machine (0 unless calibrated)."""
        return dict(self.decide_us).get(policy, 0.0) / 1e6

    def rate(self, dtype_bytes: int) -> float:
        """Dense FLOP/s for weights of ``dtype_bytes`` per element."""
        return self.flops_fp32 if dtype_bytes >= 4 else self.flops

    def cpu_rate(self, bits_per_weight: float) -> float:
        """The host CPU's usable FLOP/s (ops/s) for expert weights stored at ``bits_per_weight`` (scales included):
        at most 5 bits -> ``cpu_int4_tops`` (MXFP4 4.25, Q4 blocks 4.5), at most 9 -> ``cpu_int8_tops`` (int8, fp8,
        Q8_0 8.5), wider -> ``cpu_bf16_tflops`` (fp32 weights too: taken as computed at the 16-bit rate)."""
        return cpu_format_rate(self, bits_per_weight)[1]

    def to_dict(self) -> dict:
        """The profile in the hardware-file schema (readable units); loads back with :func:`load_hardware`."""
        d = to_plain(self)
        d["decide_us"] = dict(self.decide_us)
        for key in COMPOSITION_KEYS:  # only a machine that names its parts has them (older results read as before)
            if d[key] is None:
                del d[key]
        return {
            **{k: v for k, v in d.items() if k not in ("tables", "source")},
            "tables": d["tables"],
            "source": d["source"],
        }


#: Widest storage (bits per weight, scales included) the host computes at its 4-bit and 8-bit rates.
CPU_INT4_MAX_BITS = 5.0
CPU_INT8_MAX_BITS = 9.0
#: The host-CPU keys of a hardware profile (for experts computed on the host), in file units.
CPU_FIELDS = (
    "cpu_mem_bw_gb_s",
    "cpu_bf16_tflops",
    "cpu_int8_tops",
    "cpu_int4_tops",
    "cpu_cores",
    "cpu_expert_overhead_us",
)


def cpu_format_rate(hw: HardwareSpec, bits_per_weight: float) -> tuple[str, float]:
    """(format name, usable FLOP/s) the host computes weights of ``bits_per_weight`` at: "int4", "int8" or "bf16"."""
    if bits_per_weight <= CPU_INT4_MAX_BITS:
        return "int4", hw.cpu_int4_flops
    if bits_per_weight <= CPU_INT8_MAX_BITS:
        return "int8", hw.cpu_int8_flops
    return "bf16", hw.cpu_bf16_flops


#: Host costs a calibration measures. They describe the software more than the silicon: a serving-system profile
#: (``sim/config/system.py``) may set the first four (``HOST_ISSUE_FIELDS`` there), and then its values replace these;
#: they stay here so that calibration files keep loading and keep their meaning.
HOST_COST_FIELDS = (
    "layer_roundtrip_us",
    "copy_issue_us",
    "expert_issue_us",
    "hit_issue_us",
    "dense_issue_us",
    "decide_us",
)
HARDWARE_FIELDS = keys_of(HardwareSpec)
HARDWARE_KEYS = HARDWARE_FIELDS + ("base",)
TABLE_KEYS = tuple(f.name for f in dataclasses.fields(CalibrationTables))
MAX_POINTS = 100_000  # the most points a table holds
MAX_COORDINATE = 1e15  # the largest number a table point holds (bytes, tokens, seconds)


def hardware_from_dict(d: Any, where: str = "hardware", suffix: str = "", source: str = "inline") -> HardwareSpec:
    """Validate a hardware mapping (no ``base``) into a :class:`HardwareSpec`."""
    d = check_mapping(d, where)
    check_keys(d, where, (), HARDWARE_FIELDS, suffix, see="sim/config/hardware.py")
    try:
        d, _ = compose(d, where)  # the figures its parts give, where it does not set them (sim/config/machine.py)
    except ConfigError as exc:
        raise ConfigError(exc.field, exc.problem + suffix) from None
    check_keys(d, where, required_keys(HardwareSpec), HARDWARE_FIELDS, suffix, see="sim/config/hardware.py")
    values = read_settings(HardwareSpec, d, where, suffix, defaults={"source": source})
    memory, reserved = values["gpu_memory_bytes"], values["reserved_bytes"]
    if reserved >= memory:
        raise ConfigError(
            join(where, "reserved_gb"), f"({reserved:g}) must be below gpu_memory_gb ({memory:g}){suffix}"
        )
    return HardwareSpec(**to_si(HardwareSpec, values))


def tables_from_dict(d: Any, where: str = "hardware.tables", suffix: str = "") -> CalibrationTables | None:
    if d is None:
        return None
    d = check_mapping(d, where)
    check_keys(d, where, (), TABLE_KEYS, suffix)
    model = d.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip() or len(model) > NAME_CHARS):
        raise ConfigError(join(where, "model"), f"must be a model name or null, got {show(model)}{suffix}")
    out = {
        k: _points(d.get(k), join(where, k), 2, suffix)
        for k in ("copy", "d2d", "expert", "lm_head", "cpu_expert", "dequant_int8", "dequant_int4")
    }
    out["dense"] = _points(d.get("dense"), join(where, "dense"), 3, suffix)
    per_model = ("expert", "dense", "lm_head", "cpu_expert", "dequant_int8", "dequant_int4")
    if any(out[k] for k in per_model) and model is None:
        raise ConfigError(
            join(where, "model"),
            f"missing: expert, dense, lm_head and cpu_expert tables hold for one model's shapes{suffix}",
        )
    if all(v is None for v in out.values()):
        return None if model is None else CalibrationTables(model=model)
    return CalibrationTables(model=model, **out)


def _points(value: Any, where: str, arity: int, suffix: str):
    """A list of [x, y] (or [tokens, context, y]) points: finite, inputs >= 0, outputs >= 0, sorted, no repeats."""
    if value is None:
        return None
    what = "[x, seconds]" if arity == 2 else "[tokens, context, seconds]"
    if not isinstance(value, (list, tuple)):
        raise ConfigError(where, f"must be a list of {what} points, got {show(value)}{suffix}")
    if len(value) > MAX_POINTS:
        raise ConfigError(where, f"holds {len(value)} points, more than {MAX_POINTS}{suffix}")
    pts = []
    for i, p in enumerate(value):
        good = (
            isinstance(p, (list, tuple))
            and len(p) == arity
            and all(real(x) is not None and 0 <= x <= MAX_COORDINATE for x in p)
        )
        if not good:
            raise ConfigError(
                f"{where}[{i}]", f"must be {what} with numbers in [0, {MAX_COORDINATE:g}], got {show(p)}{suffix}"
            )
        pts.append(tuple(float(x) for x in p))
    pts.sort()
    keys = [p[:-1] for p in pts]
    for a, b in zip(keys, keys[1:]):
        if a == b:
            raise ConfigError(where, f"repeats the point at {list(a)}{suffix}")
    if arity == 2:
        if len(pts) < 2:
            raise ConfigError(where, f"needs at least 2 points, got {len(pts)}{suffix}")
    else:
        if not pts:
            raise ConfigError(where, f"needs at least 1 point{suffix}")
        ts = sorted({p[0] for p in pts})
        cs = sorted({p[1] for p in pts})
        have = set(keys)
        for t in ts:
            for c in cs:
                if (t, c) not in have:
                    raise ConfigError(
                        where, f"points must form a full grid over (tokens, context): missing [{t:g}, {c:g}]{suffix}"
                    )
    return tuple(pts)


def check_tables(model: ModelSpec, hw: HardwareSpec, where: str = "hardware") -> None:
    """Raise ConfigError when ``hw`` carries expert/dense tables measured for a model other than ``model``."""
    t = hw.tables
    if t is not None and t.has_model_tables and t.model != model.name:
        raise ConfigError(
            f"{where}.tables.model",
            f"the expert/dense/lm_head/cpu_expert tables in {hw.source} were measured for model "
            f"{t.model!r}, but the run's model is {model.name!r} (calibrate for it, or drop those "
            f"tables)",
        )


def load_hardware(spec_or_name: Any, where: str = "hardware") -> HardwareSpec:
    """A hardware profile from a name (``configs/hardware/NAME.yaml``), a path to a YAML/JSON profile or calibration
    file, an inline mapping (optionally with ``base``), or a :class:`HardwareSpec` (returned as is)."""
    if isinstance(spec_or_name, HardwareSpec):
        return spec_or_name
    if is_parts_name(spec_or_name):
        d = {**parse_parts_name(spec_or_name, where), "name": spec_or_name.strip().lower()}
        if "base" in d:  # a bundled machine with parts laid over it
            return load_hardware(d, where)
        return hardware_from_dict(d, where, "", PARTS_SOURCE)
    if isinstance(spec_or_name, dict) and is_parts_name(spec_or_name.get("base")):
        child = {k: v for k, v in spec_or_name.items() if k != "base"}
        base = {**parse_parts_name(spec_or_name["base"], join(where, "base")), "name": spec_or_name["base"]}
        d = merge_hardware(base, child, where)
        return hardware_from_dict(d, where, "", f"{PARTS_SOURCE} (modified inline)")
    d, source = load_profile(spec_or_name, where, "hardware", HARDWARE_KEYS, merge=merge_hardware)
    suffix = "" if source == "inline" else f" (in {source})"
    return hardware_from_dict(d, where, suffix, source)


#: The source of a machine named by its parts (``GPU+CPU...``, sim/config/machine.py).
PARTS_SOURCE = "composed from configs/parts/"


__all__ = [
    "CPU_FIELDS",
    "CPU_INT4_MAX_BITS",
    "CPU_INT8_MAX_BITS",
    "HARDWARE_FIELDS",
    "HARDWARE_KEYS",
    "HOST_COST_FIELDS",
    "TABLE_KEYS",
    "CalibrationTables",
    "HardwareSpec",
    "cpu_format_rate",
    "hardware_from_dict",
    "load_hardware",
    "tables_from_dict",
]
