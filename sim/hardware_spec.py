"""Hardware profiles: a GPU and its host link (``configs/hardware/NAME.yaml``, a path to a profile or calibration
file, or an inline mapping that may name a ``base`` profile).

Files use readable units, converted to SI in :class:`HardwareSpec` (GB = 1e9 bytes); each field of the dataclass
declares its key and unit (see :mod:`sim.fields`). Every figure has a sane range, so that no value overflows later
(``gpu_memory_gb`` up to 1e6, rates at least 1e-6 GB/s or TFLOP/s, host times at most 1e9 us, slowdowns in
[1, 1000]). Optional measured ``tables`` override the roofline; see :class:`CalibrationTables`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sim.checks import NAME_CHARS, Check, check_keys, check_mapping, join, number, real, show, text
from sim.errors import ConfigError
from sim.fields import keys_of, read_settings, required_keys, setting, to_plain, to_si
from sim.profiles import load_profile
from sim.units import GB


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

    copy: Points2 | None = None    # (bytes, seconds) host->device
    d2d: Points2 | None = None     # (bytes, seconds) device->device
    expert: Points2 | None = None  # (tokens routed to one expert, seconds) for THIS model's expert shape
    dense: Points3 | None = None   # (batch tokens, context length, seconds) dense work per MoE layer
    lm_head: Points2 | None = None  # (tokens, seconds) the LM head of THIS model
    model: str | None = None       # the model the expert/dense/lm_head tables were measured for

    def to_dict(self) -> dict:
        """The tables in the hardware-file schema (lists of lists, SI units)."""
        def pts(v):
            return None if v is None else [list(p) for p in v]
        return {"model": self.model, "copy": pts(self.copy), "d2d": pts(self.d2d), "expert": pts(self.expert),
                "dense": pts(self.dense), "lm_head": pts(self.lm_head)}


@dataclass(frozen=True)
class HardwareSpec:
    """A GPU and its host link, in SI units."""

    name: str = setting("inline", text())
    gpu_memory_bytes: int = setting(check=number(0.0, 1e6), key="gpu_memory_gb", scale=GB, as_int=True)
    hbm_bw: float = setting(check=_rate(), key="hbm_bw_gb_s", scale=GB)                  # bytes/s
    flops: float = setting(check=_rate(), key="flops_tflops", scale=1e12)               # dense 16-bit FLOP/s
    flops_fp32: float = setting(check=_rate(), key="flops_fp32_tflops", scale=1e12)     # when dtype_bytes == 4
    pcie_bw: float = setting(check=_rate(), key="pcie_bw_gb_s", scale=GB)               # host->device, pinned
    pcie_latency_s: float = setting(check=_time(), key="pcie_latency_us", divisor=1e6)  # fixed cost per copy
    d2d_bw: float = setting(lambda v, where: v["hbm_bw"] / 2, _rate(), key="d2d_bw_gb_s", scale=GB,
                            null_is_default=True)  # device->device copy bytes/s (default hbm / 2: read + write)
    launch_overhead_s: float = setting(check=_time(), key="launch_overhead_us", divisor=1e6)  # per kernel
    reserved_bytes: int = setting(check=number(0.0, 1e6, strict=False), key="reserved_gb", scale=GB,
                                  as_int=True)  # runtime, activations, fragmentation: not for weights/KV/tiers
    tables: CalibrationTables | None = setting(None, lambda v, where: tables_from_dict(v, where),
                                               nested=CalibrationTables)
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

    def decide_s(self, policy: str) -> float:
        """Host seconds a policy's decisions take per MoE layer on this machine (0 unless calibrated)."""
        return dict(self.decide_us).get(policy, 0.0) / 1e6

    def rate(self, dtype_bytes: int) -> float:
        """Dense FLOP/s for weights of ``dtype_bytes`` per element."""
        return self.flops_fp32 if dtype_bytes >= 4 else self.flops

    def to_dict(self) -> dict:
        """The profile in the hardware-file schema (readable units); loads back with :func:`load_hardware`."""
        d = to_plain(self)
        d["decide_us"] = dict(self.decide_us)
        return {**{k: v for k, v in d.items() if k not in ("tables", "source")}, "tables": d["tables"],
                "source": d["source"]}


HOST_COST_FIELDS = ("layer_roundtrip_us", "copy_issue_us", "expert_issue_us", "hit_issue_us", "dense_issue_us",
                    "decide_us")
HARDWARE_FIELDS = keys_of(HardwareSpec)
HARDWARE_KEYS = HARDWARE_FIELDS + ("base",)
TABLE_KEYS = tuple(f.name for f in dataclasses.fields(CalibrationTables))
MAX_POINTS = 100_000   # the most points a table holds
MAX_COORDINATE = 1e15  # the largest number a table point holds (bytes, tokens, seconds)


def hardware_from_dict(d: Any, where: str = "hardware", suffix: str = "", source: str = "inline") -> HardwareSpec:
    """Validate a hardware mapping (no ``base``) into a :class:`HardwareSpec`."""
    d = check_mapping(d, where)
    check_keys(d, where, required_keys(HardwareSpec), HARDWARE_FIELDS, suffix)
    values = read_settings(HardwareSpec, d, where, suffix, defaults={"source": source})
    memory, reserved = values["gpu_memory_bytes"], values["reserved_bytes"]
    if reserved >= memory:
        raise ConfigError(join(where, "reserved_gb"),
                          f"({reserved:g}) must be below gpu_memory_gb ({memory:g}){suffix}")
    return HardwareSpec(**to_si(HardwareSpec, values))


def tables_from_dict(d: Any, where: str = "hardware.tables", suffix: str = "") -> CalibrationTables | None:
    if d is None:
        return None
    d = check_mapping(d, where)
    check_keys(d, where, (), TABLE_KEYS, suffix)
    model = d.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip() or len(model) > NAME_CHARS):
        raise ConfigError(join(where, "model"), f"must be a model name or null, got {show(model)}{suffix}")
    out = {k: _points(d.get(k), join(where, k), 2, suffix) for k in ("copy", "d2d", "expert", "lm_head")}
    out["dense"] = _points(d.get("dense"), join(where, "dense"), 3, suffix)
    if (out["expert"] or out["dense"] or out["lm_head"]) and model is None:
        raise ConfigError(join(where, "model"), f"missing: expert, dense and lm_head tables hold for one model's "
                                                 f"shapes{suffix}")
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
        good = (isinstance(p, (list, tuple)) and len(p) == arity
                and all(real(x) is not None and 0 <= x <= MAX_COORDINATE for x in p))
        if not good:
            raise ConfigError(f"{where}[{i}]", f"must be {what} with numbers in [0, {MAX_COORDINATE:g}], "
                                               f"got {show(p)}{suffix}")
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
                    raise ConfigError(where, f"points must form a full grid over (tokens, context): "
                                             f"missing [{t:g}, {c:g}]{suffix}")
    return tuple(pts)


def load_hardware(spec_or_name: Any, where: str = "hardware") -> HardwareSpec:
    """A hardware profile from a name (``configs/hardware/NAME.yaml``), a path to a YAML/JSON profile or calibration
    file, an inline mapping (optionally with ``base``), or a :class:`HardwareSpec` (returned as is)."""
    if isinstance(spec_or_name, HardwareSpec):
        return spec_or_name
    d, source = load_profile(spec_or_name, where, "hardware", HARDWARE_KEYS)
    suffix = "" if source == "inline" else f" (in {source})"
    return hardware_from_dict(d, where, suffix, source)


__all__ = ["HARDWARE_FIELDS", "HARDWARE_KEYS", "HOST_COST_FIELDS", "TABLE_KEYS", "CalibrationTables", "HardwareSpec",
           "hardware_from_dict", "load_hardware", "tables_from_dict"]
