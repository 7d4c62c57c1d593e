"""What each cell of a published row (``benchmarks/published/SCHEMA.md``, schema v2) sets in a run config, or the
capability the simulator lacks to express it: the one table to edit when a capability lands.

Each column value maps to either a :class:`Setting` (keys laid over the run config that
``sim.fit_system.run_config`` builds: ``system``, ``workload``, ``cache`` mappings, or the row's own fields:
``variant``, ``slots``) or a :class:`Missing` capability, named as the report prints it
(``prefill (metric=prefill) not modelled``). A row with any :class:`Missing` is not simulated and counts as a miss;
nothing is approximated silently. To wire a capability once it lands, replace its ``missing(...)`` entry by the
setting (one line): e.g. ``"nkvo": {"on": Setting(system={"kv_on_host": True})}``.

:func:`plan_of` turns a row's cells into a :class:`RowPlan`: the row's machine (``row_machines.machine_of``), model,
system, placement and options as settings, plus every missing capability.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sim.config.system import format_bits


@dataclass(frozen=True)
class Setting:
    """Keys a cell sets: mappings laid over the run config's ``system``, ``workload`` and ``cache``, over its model
    (``model``: keys of the model profile, the row's model its ``base``), and the row's fields the fit reads
    (``variant``: the system's mode; ``slots``: routed experts per layer on the GPU)."""

    system: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    workload: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)
    row: dict = field(default_factory=dict)
    drop: tuple[str, ...] = ()  # run-config keys removed (a placement decides the cache)


@dataclass(frozen=True)
class Missing:
    """A capability the simulator lacks, by name (the report groups misses by it)."""

    capability: str


NOTHING = Setting()  # a value that changes nothing in the simulation (stated, e.g. mmap=off: load time only)
Rule = Setting | Missing | Callable[[str, dict], "Setting | Missing"]


def missing(capability: str) -> Missing:
    return Missing(capability)


def _int(v: str) -> int:
    if not re.fullmatch(r"[0-9]{1,9}", v):
        raise ValueError(f"must be a whole number, got {v[:20]!r}")
    return int(v)


def _decode_only(capability: str) -> Callable[[str, dict], Setting | Missing]:
    """An option that acts on prompt processing only: nothing in a decode row (one token per step), else missing."""
    return lambda v, cells: NOTHING if cells["metric"] == "decode" else Missing(capability)


# ------------------------------------------------------------------------------------------------ the table
#: (system, system_version pattern) -> the fit's system of builds that have a profile of their own (others: the
#: system's); a name absent from the fit's SYSTEMS is missing, named with the build.
VERSIONS: dict[tuple[str, str], str] = {
    ("ktransformers", r"sosp25-ae"): "ktransformers-sosp25",
}
#: metric -> setting.
METRICS: dict[str, Rule] = {
    "decode": NOTHING,  # decode tokens/s over the trace's generated tokens
    "prefill": Setting(row={"measure": "prefill"}),  # prompt_tokens x batch over the prefill passes' time
    "mixed": missing("mixed metric (time including prompt processing) not modelled"),
}


def _depth(v: str, cells: dict) -> Setting | Missing:
    """context_tokens: the KV depth at the start of the measured phase (0: an empty cache)."""
    if v == "" or _int(v) == 0:
        return NOTHING
    return Setting(workload={"context_tokens": _int(v)})


def _dense_blocks(model: str) -> int:
    """Blocks before the first MoE block (llama.cpp counts blocks, the placement MoE layers): DeepSeek-V3's 3."""
    from moebase.model import load_model

    m = load_model(model)
    return m.decoder_blocks - m.decoder_moe_layers


def _moe_ranges(blocks: str, dense: int) -> str:
    """Block ranges ``A-B[,C-D]`` as MoE-layer ranges (block B is MoE layer B - dense; dense blocks dropped)."""
    out = []
    for part in blocks.split(","):
        a, _, b = part.partition("-")
        lo, hi = _int(a) - dense, _int(b or a) - dense
        if hi >= 0:
            out.append(f"{max(lo, 0)}-{hi}")
    return ",".join(out)


def _placement(v: str, cells: dict) -> Setting | Missing:
    key, _, value = v.partition("=")
    if v == "cpu_experts=all":
        return Setting(row={"slots": 0})
    if key == "gpu_experts_per_layer":
        return Setting(row={"slots": _int(value)})
    if key in ("n_cpu_moe", "experts_on_gpu_layers"):
        from moebase.errors import ConfigError
        from sim.fit_system import _model_of

        try:
            dense = _dense_blocks(_model_of(cells["model"]))
        except ConfigError:
            return Missing(f"placement {key} (model {cells['model']} has no profile)")
        if key == "n_cpu_moe":
            return Setting(system={"placement": {"n_cpu_moe": max(_int(value) - dense, 0)}}, drop=("cache",))
        return Setting(system={"placement": {"experts_on_gpu_layers": _moe_ranges(value, dense)}}, drop=("cache",))
    if v == "unstated":  # the system's own rule (Fiddler's: as many popular experts as the GPU holds)
        return NOTHING if cells["system"] == "fiddler" else Missing("placement unstated (system has no own rule)")
    return Missing(f"placement {key}")


#: options key -> {value: rule} or a rule of (value, cells).
OPTIONS: dict[str, dict[str, Rule] | Callable[[str, dict], Setting | Missing]] = {
    "threads": lambda v, c: Setting(system={"host_threads": _int(v)}),
    "cpu_infer": lambda v, c: Setting(system={"host_threads": _int(v)}),
    "threads_batch": _decode_only("threads_batch (prompt processing threads)"),
    "ubatch": lambda v, c: Setting(system={"ubatch": _int(v)}),
    "nbatch": _decode_only("nbatch (logical batch of prompt processing)"),
    "fa": {"on": NOTHING, "off": missing("fa=off (attention without flash attention)")},
    # ik_llama.cpp -mla 0: the KV cache holds every head's decompressed keys and values (the model's latent_cache);
    # the other MLA modes (1-3: which kernels compute the attention over the latent cache) are not modelled
    "mla": lambda v, c: Setting(model={"latent_cache": False}) if v == "off" else Missing(f"mla={v} (MLA mode)"),
    "amb": lambda v, c: Missing("amb (attention max batch)"),
    # ik_llama.cpp switches (sim/config/switches.py): they set the host kernel family / per-layer call cost
    "fmoe": {"on": Setting(system={"fmoe": True}), "off": Setting(system={"fmoe": False})},
    "rtr": {"on": Setting(system={"rtr": True}), "off": Setting(system={"rtr": False})},
    "kv_type": {"f16": NOTHING, "q8_0": missing("kv_type=q8_0 (quantized KV cache)")},
    "nkvo": {"on": Setting(system={"kv_on_host": True})},
    "mmap": {"off": NOTHING},  # load time only
    "numa": {
        "node1": Setting(system={"numa": "one_socket"}),
        "replicate": Setting(system={"numa": "replicated"}),
        "distribute": Setting(system={"numa": "interleaved"}),
        "numactl": missing("numa=numactl (unstated numactl policy)"),
    },
    "numa_tp": {"on": Setting(system={"numa": "numa_tp"}), "off": NOTHING},
    # the host's experts run as one call per layer over all its threads, evenly split: what dynamic scheduling
    # aims at (stated in configs/systems/ktransformers-sosp25.yaml); a static split's imbalance is not modelled
    "dynamic_sched": {"on": NOTHING, "off": missing("dynamic_sched=off (static work split's imbalance)")},
    "cpu_backend": {
        "amx_bf16": Setting(system={"host_kernel": "kt-amx"}),
        "amx_int8": Setting(system={"host_kernel": "kt-amx"}),
        "amx_int4": Setting(system={"host_kernel": "kt-amx"}),
    },
    "kernel": {
        "auto": NOTHING,  # AMX from the family's min_tokens, AVX-512 below: the kernel family's own rule
        "avx512": Setting(system={"host_isa": "avx512"}),
        "amx": Setting(system={"host_isa": "amx"}),
    },
    # the GPU's work is priced without per-kernel launch costs, as one graph per decode step gives (stated in the
    # ik-llama-cpp and ktransformers-sosp25 profiles); launch costs without graphs are not modelled
    "cuda_graph": {"on": NOTHING, "off": missing("cuda_graph=off (kernel launch costs)")},
    "deferral": lambda v, c: Setting(system={"deferral": _int(v)}),
    "experts_per_token": lambda v, c: Setting(system={"experts_per_token": _int(v)}),
    "experts_upload_for_prefill": {
        "on": Setting(system={"prefill_upload": True}),
        "off": Setting(system={"prefill_upload": False}),
    },
    "gpu_moe_layers": lambda v, c: Missing("gpu_moe_layers (expert layers on the GPU, ids unstated)"),
    "expert_cache": {"lru": NOTHING, "none": Setting(row={"variant": "none"})},
    "speculative_prefetch": {"on": Setting(row={"variant": "full"}), "off": NOTHING},
    "offload_buffers": lambda v, c: Setting(cache={"lpc_buffers": _int(v)}),
    "backend_type": lambda v, c: Missing(f"backend_type={v} (kTransformers server engine)"),
    "kt_method": lambda v, c: Missing(f"kt_method={v} (kt-kernel method)"),
}


# ------------------------------------------------------------------------------------------------ a row's plan
@dataclass
class RowPlan:
    """What a row runs as: the fit's row fields, the settings laid over its run config, and what is missing."""

    system: str
    variant: str
    slots: int | None
    measure: str  # decode | prefill: what the published figure times
    expert_format: str | None
    dense_format: str | None
    settings: list[Setting]
    missing: list[str]

    def overlay(self, d: dict[str, Any]) -> dict[str, Any]:
        """``d`` (a run config mapping) with every setting laid over it."""
        out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
        for s in self.settings:
            for key in s.drop:
                out.pop(key, None)
            if s.model:  # the row's model profile as the base of these keys
                base = out.get("model")
                out["model"] = {**base, **s.model} if isinstance(base, dict) else {"base": base, **s.model}
            for key in ("system", "workload", "cache"):
                part = getattr(s, key)
                if part:
                    base = out.get(key)
                    out[key] = {**(base if isinstance(base, dict) else {}), **part}
        return out


def apply(rule: Rule, value: str, cells: dict) -> Setting | Missing:
    return rule(value, cells) if callable(rule) else rule


def options_of(text: str) -> list[tuple[str, str]]:
    """``key=value`` pairs of an options cell (``;``-joined); ValueError naming a malformed one."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ValueError(f"options: {part[:40]!r} is not key=value")
        out.append((key.strip(), value.strip()))
    return out


#: How far a stated ``expert_bpw`` may be from the named format's bits (FORMATS) before the row is a miss: the
#: published Q4_K_M files average 4.8 against the table's 4.85, HQQ 2-bit 3.11 (paper sizes) against 3.016.
BPW_TOLERANCE = 0.10


def _format(col: str, name: str, bpw: str) -> tuple[str | None, Missing | None]:
    """A weight format cell: its name where the simulator knows its bits (a stated ``expert_bpw`` within
    :data:`BPW_TOLERANCE` of them, else a miss naming both); an unknown name with ``expert_bpw`` stated runs at that
    width (``4.25bpw``: the source's bits, the name's kernel class unknown); else missing."""
    if not name or name == "unstated":
        return None, None
    bits = format_bits(name)
    if bits is not None:
        if bpw and abs(float(bpw) - bits) > BPW_TOLERANCE * bits:
            return None, Missing(f"{col} {name} at expert_bpw {bpw} (the format table says {bits:.3g})")
        return name, None
    if bpw:
        return f"{float(bpw):g}bpw", None
    return None, Missing(f"{col} {name} (bits unknown)")


def plan_of(cells: dict[str, str], systems: frozenset[str] | set[str]) -> RowPlan:
    """The plan of a row's cells (stripped strings by column), ``systems`` being the systems the fit knows."""
    miss: list[str] = []
    settings: list[Setting] = []

    def take(result: Setting | Missing) -> None:
        if isinstance(result, Missing):
            miss.append(result.capability)
        else:
            settings.append(result)

    system = cells["system"]  # the schema names systems as the fit does (sim/fit_system.py SYSTEMS)
    build = ""
    for (name, pattern), target in VERSIONS.items():
        if name == cells["system"] and re.fullmatch(pattern, cells["system_version"]):
            system, build = target, f" {cells['system_version']} ({target})"
    if system not in systems:
        miss.append(f"system {cells['system']}{build} has no profile")
    take(apply(METRICS.get(cells["metric"], missing(f"metric {cells['metric']}")), cells["metric"], cells))
    take(_depth(cells["context_tokens"], cells))
    take(_placement(cells["placement"], cells))
    for key, value in options_of(cells["options"]):
        entry = OPTIONS.get(key)
        rule: Rule
        if entry is None:
            rule = missing(f"option {key}")
        elif isinstance(entry, dict):
            rule = entry.get(value, missing(f"option {key}={value}"))
        else:
            rule = entry
        take(apply(rule, value, cells))
    if cells["gpu_count"] not in ("", "1"):
        miss.append(f"gpu_count={cells['gpu_count']} (several GPUs)")
    expert, expert_gap = _format("expert_format", cells["expert_format"], cells["expert_bpw"])
    same = cells["dense_format"] == cells["expert_format"]  # the same format has the same bits per weight
    dense, dense_gap = _format("dense_format", cells["dense_format"], cells["expert_bpw"] if same else "")
    miss += [g.capability for g in (expert_gap, dense_gap) if g is not None]
    row: dict[str, Any] = {}
    for s in settings:
        row.update(s.row)
    variant = row.get("variant", "")
    if system == "mixtral-offloading" and not variant:
        variant = "lru"  # expert_cache=lru without speculative loading
    return RowPlan(system, variant, row.get("slots"), row.get("measure", "decode"), expert, dense, settings, miss)


__all__ = ["METRICS", "Missing", "OPTIONS", "RowPlan", "Setting", "VERSIONS", "missing", "plan_of"]
