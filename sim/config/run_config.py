"""Run configs: a YAML file (or a mapping) checked field by field into a typed, frozen :class:`RunConfig`.

Shape (``configs/switch_xxl.yaml`` is a commented example)::

    model: switch-xxl-128        # name in configs/models/, a path, or an inline mapping (may name a `base`)
    hardware: h200               # name in configs/hardware/, a path to a hardware/calibration file, or a mapping
    system: ideal                # the serving software: name in configs/systems/, a path, or a mapping (default ideal)
    workload: {trace, batch_size: 1, batching: static, max_decode_tokens: null, prefill: true, requests: null}
    cache: {hpc_slots, mpc_slots, lpc_buffers, prefetch_reserve: min(1, lpc_buffers - 1), layers: all,
            hot_profile: trace,  # or gpu_memory_gb + split {hpc, mpc, lpc} instead of the three sizes
            organization: per-layer, shared_slots: null}  # shared: one MPC for all cached layers
    policy: {name, params: {}}   # or just the name
    predictor: {name: none, params: {}}
    seed: 0

The accepted keys, their defaults and checks are declared on the dataclasses below (:func:`moebase.fields.setting`);
the ``--set`` schema and ``RunConfig.resolved`` are derived from them. Policy and predictor names and params are
checked against the registries (``sim.policies.POLICIES``, ``sim.predictors.PREDICTORS``) when the config loads.

Every problem raises :class:`~moebase.errors.ConfigError` with one line that starts with the field's dotted path.
``RunConfig.resolved`` is the whole config as plain data, defaults filled (policy and predictor params too), model
and hardware expanded; it loads back with :func:`config_from_dict` to an equal config.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moebase.checks import (
    INT_MAX,
    check_bool,
    check_int,
    check_keys,
    check_mapping,
    check_number,
    check_size,
    check_str,
    integer,
    known_text,
    number,
    one_of,
    show,
)
from moebase.errors import ConfigError, TraceError, brief
from moebase.fields import (
    check_setting,
    key_of,
    keys_of,
    plain,
    read_settings,
    required_keys,
    schema_of,
    setting,
    settings_of,
    wrapped,
)
from moebase.files import PROJECT_ROOT, file_status, read_structured_file, resolve_path
from moebase.model import ModelSpec, load_model
from moebase.profiles import PROFILE_SUFFIXES
from moebase.registry import Registry
from sim.config.hardware import HardwareSpec, check_tables, load_hardware
from sim.config.host_choice import choose_kernels, host_copies
from sim.config.host_kernels import format_class
from sim.config.host_memory import host_memory_check
from sim.config.memory import DoesNotFit, expert_slots, gb, gb_pair
from sim.config.overrides import apply_set
from sim.config.params import RunFacts
from sim.config.placement import apply_placement, policy_class
from sim.config.registries import POLICIES, PREDICTORS
from sim.config.serving import ArrivalsConfig, SloConfig, check_arrivals, check_serving, check_slo, drop_unset
from sim.config.system import DEFAULT_SYSTEM, SystemSpec, is_ideal, load_system
from sim.config.units import GB
from traces.summary import (
    TraceSummary,
    mismatch_message,
    model_mismatch,
    read_trace_summary,
    routed_tokens,
    trace_matches_model,
)

BATCHING = ("static", "continuous")
CACHE_LAYERS = ("all", "decoder", "encoder")
ORGANIZATIONS = ("per-layer", "shared")
DEFAULT_PREDICTOR = "none"
MAX_BATCH = 1 << 16  # requests per batch
MAX_REQUESTS = 1 << 20  # requests a run serves
MAX_BUFFERS = 1 << 16  # working buffers (lpc_buffers)
MAX_SEED = 2**32 - 1  # numpy's legacy seeding takes at most 32 bits
MAX_GPU_MEMORY_GB = 1e6


# --------------------------------------------------------------------------------------------- field checks
def _trace_file(value: Any, where: str) -> Path:
    """The resolved path of a trace file (a regular file; its content is read by :func:`_load_workload`)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(where, f"must be a path to a trace file, got {show(value)}")
    return resolve_path(value, where, "trace file").resolve()


def _hot_profile(value: Any, where: str) -> Any:
    """ "trace" (null too), the resolved path of a profiling trace (a string), or per-layer lists of expert ids."""
    if value is None or value == "trace":
        return "trace"
    if isinstance(value, str):
        return str(resolve_path(value, where, "profiling trace file").resolve())
    if isinstance(value, list) and all(
        isinstance(row, list) and all(isinstance(e, int) and not isinstance(e, bool) for e in row) for row in value
    ):
        return [list(row) for row in value]
    raise ConfigError(
        where, f"must be 'trace', a path to a profiling trace, or per-layer lists of expert ids, got {show(value)}"
    )


def _fraction(value: Any, where: str) -> float:
    return check_number(value, where, 0.0, strict=False, maximum=1.0)


# --------------------------------------------------------------------------------------------- the config
@dataclass(frozen=True)
class WorkloadConfig:
    """What a run serves: the trace's requests, in which batches, how much of each."""

    trace: Path = setting(check=_trace_file)  # resolved path of the trace file
    batch_size: int = setting(1, integer(1, MAX_BATCH))
    batching: str = setting("static", one_of(*BATCHING))  # static | continuous
    max_decode_tokens: int | None = setting(None, integer(0, INT_MAX, allow_none=True))  # per request; None = all
    prefill: bool = setting(True, check_bool)
    requests: int | None = setting(None, integer(1, MAX_REQUESTS, allow_none=True))  # None = the trace's count
    #                                                                    (rounded up to whole static batches)
    # serving (sim/config/serving.py): requests arriving over time, the token budget of an iteration (chunked
    # prefill), the SLO; all None (left out of the resolved config): every request at time zero, as before
    arrivals: ArrivalsConfig | None = setting(None, check_arrivals, nested=ArrivalsConfig, constructor_default=True)
    max_batch_tokens: int | None = setting(None, integer(1, INT_MAX, allow_none=True), constructor_default=True)
    slo: SloConfig | None = setting(None, check_slo, nested=SloConfig, constructor_default=True)
    # the KV depth at which each request starts (llama-bench -d): tokens already in its cache before its prompt,
    # attended by its prompt and generated tokens and held in the KV cache (None: none, left out of the resolved
    # config; docs/phases.md)
    context_tokens: int | None = setting(None, integer(0, 1 << 24, allow_none=True), constructor_default=True)


@dataclass(frozen=True)
class CacheConfig:
    """The expert tiers on the GPU. The slot counts are given as such, or derived from :class:`MemorySizing`."""

    hpc_slots: int = setting(check=integer(0))  # per cached MoE layer
    mpc_slots: int = setting(check=integer(0))  # per cached MoE layer
    lpc_buffers: int = setting(check=integer(1, MAX_BUFFERS))  # shared working buffers for copies from host
    prefetch_reserve: int = setting(None)  # working buffers prefetches may not take
    layers: str = setting("all", one_of(*CACHE_LAYERS))  # all | decoder | encoder: the cached MoE layers
    hot_profile: Any = setting("trace", _hot_profile, constructor_default=True)
    #                                 "trace", a resolved trace path (str), or per-layer lists of hot expert ids
    organization: str = setting("per-layer", one_of(*ORGANIZATIONS), constructor_default=True)
    #   per-layer: each cached layer has its HPC and MPC slots; shared: one cache of ``shared_slots`` experts for
    #   all cached layers together (the HPC, if a policy pins one, stays per layer and counts in the budget)
    shared_slots: int | None = setting(None, integer(0, INT_MAX, allow_none=True), constructor_default=True)
    #   with shared: the experts the shared cache holds (None: (hpc_slots + mpc_slots) x cached layers, the same
    #   GPU memory as per-layer slots)

    def total_slots(self, n_layers: int) -> int:
        """Cached-expert slots on the GPU over ``n_layers`` cached layers (working buffers aside): per-layer,
        ``(hpc_slots + mpc_slots) x n_layers``; shared, ``shared_slots`` (by default the same): :func:`expert_slots`."""
        shared = self.shared_slots if self.organization == "shared" else None
        return expert_slots(self.hpc_slots, self.mpc_slots, n_layers, shared)


@dataclass(frozen=True)
class TierSplit:
    """The fractions of ``cache.gpu_memory_gb`` given to each tier (adding up to at most 1)."""

    hpc: float = setting(check=_fraction)
    mpc: float = setting(check=_fraction)
    lpc: float = setting(check=_fraction)


@dataclass(frozen=True)
class MemorySizing:
    """Cache tiers sized from memory instead of slot counts (keys of ``cache``, not kept in the resolved config)."""

    gpu_memory_gb: float = setting(None, number(0.0, MAX_GPU_MEMORY_GB))
    split: TierSplit = setting(None, nested=TierSplit)


@dataclass(frozen=True)
class NamedConfig:
    """A part chosen by name (a policy, a predictor) and its params, every declared one filled in."""

    name: str = setting(check=check_str)
    params: dict = setting(None, free=True)


@dataclass(frozen=True)
class RunConfig:
    """A checked run config. Its settings are the top-level keys of a config file."""

    model: ModelSpec = setting(nested=ModelSpec, wrap="base")
    hardware: HardwareSpec = setting(nested=HardwareSpec, wrap="base")
    # the serving software (sim/config/system.py); ``model`` holds its expert_format's bits when it sets one
    system: SystemSpec = setting(DEFAULT_SYSTEM, nested=SystemSpec, wrap="base")
    workload: WorkloadConfig = setting(nested=WorkloadConfig)
    cache: CacheConfig = setting(None, nested=(CacheConfig, MemorySizing))
    policy: NamedConfig = setting(nested=NamedConfig, wrap="name")
    predictor: NamedConfig = setting(DEFAULT_PREDICTOR, nested=NamedConfig, wrap="name")
    seed: int = setting(0, integer(0, MAX_SEED))
    source: str = field(default="inline")  # the config file, or "inline"
    resolved: dict = field(default_factory=dict)  # the whole config as plain data, defaults filled, profiles expanded


TOP_KEYS = keys_of(RunConfig)
WORKLOAD_KEYS = keys_of(WorkloadConfig)
SLOT_KEYS = ("hpc_slots", "mpc_slots", "lpc_buffers")
CACHE_KEYS = keys_of(CacheConfig) + keys_of(MemorySizing)
SPLIT_KEYS = keys_of(TierSplit)
NAMED_KEYS = keys_of(NamedConfig)
_SECTIONS = ("model", "hardware", "system", "workload", "cache", "policy", "predictor")  # read by their own functions


# --------------------------------------------------------------------------------------------- sections
def _load_workload(d: Any, model: ModelSpec) -> tuple[WorkloadConfig, TraceSummary]:
    d = check_mapping(d, "workload")
    check_keys(d, "workload", required_keys(WorkloadConfig), WORKLOAD_KEYS)
    w = WorkloadConfig(**read_settings(WorkloadConfig, d, "workload"))
    try:
        summary = read_trace_summary(w.trace)
    except TraceError as exc:
        raise ConfigError("workload.trace", str(exc)) from None
    problem = model_mismatch(summary, model)
    if problem:  # what differs first, whole; then both shapes and the file, within the message's bound
        raise ConfigError("workload.trace", mismatch_message(problem, summary, model))
    has_prefill = w.prefill and int(summary.prefill_lengths.sum()) > 0
    has_decode = w.max_decode_tokens != 0 and int(summary.decode_lengths.sum()) > 0
    if not (has_prefill or has_decode):
        field_ = "workload.max_decode_tokens" if w.max_decode_tokens == 0 else "workload.prefill"
        raise ConfigError(
            field_,
            f"leaves nothing to simulate: the trace has {int(summary.prefill_lengths.sum())} "
            f"prompt and {int(summary.decode_lengths.sum())} generated tokens, with prefill "
            f"{str(w.prefill).lower()} and max_decode_tokens {w.max_decode_tokens}",
        )
    return w, summary


def cached_layer_count(model: ModelSpec, layers: str) -> int:
    """How many MoE layers ``cache.layers`` caches."""
    if layers == "all":
        return model.moe_layers
    return model.encoder_moe_layers if layers == "encoder" else model.decoder_moe_layers


def _load_cache(d: Any, model: ModelSpec, all_resident: bool) -> tuple[CacheConfig, dict | None]:
    """The tiers, and the memory sizing they came from (None when given as slot counts). ``all_resident``: the
    policy keeps every expert (no sizes needed)."""
    d = {} if d is None else check_mapping(d, "cache")
    check_keys(d, "cache", (), CACHE_KEYS)
    values = read_settings(CacheConfig, d, "cache", skip=SLOT_KEYS + ("prefetch_reserve",))
    layers = values["layers"]
    n_layers = cached_layer_count(model, layers)
    if n_layers == 0:
        raise ConfigError("cache.layers", f"model {show(model.name)} has no {layers} MoE layers")
    slots_given = [k for k in SLOT_KEYS if d.get(k) is not None]
    split_given = [k for k in keys_of(MemorySizing) if d.get(k) is not None]
    sized_from = None
    if slots_given and split_given:
        raise ConfigError(
            "cache",
            f"give either hpc_slots/mpc_slots/lpc_buffers or gpu_memory_gb/split, not both "
            f"(got {', '.join(slots_given + split_given)})",
        )
    if split_given:
        hpc, mpc, lpc, sized_from = _slots_from_split(d, model, n_layers)
    elif slots_given:
        for k in SLOT_KEYS:
            if d.get(k) is None:
                raise ConfigError(
                    f"cache.{k}",
                    "missing (give hpc_slots, mpc_slots and lpc_buffers together, or gpu_memory_gb and split)",
                )
        hpc, mpc, lpc = (check_setting(CacheConfig, k, d[k], f"cache.{k}") for k in SLOT_KEYS)
    elif all_resident:
        hpc, mpc, lpc = 0, 0, 1
    else:
        raise ConfigError(
            "cache",
            "give the tier sizes: hpc_slots, mpc_slots and lpc_buffers, or gpu_memory_gb and split {hpc, mpc, lpc}",
        )
    if hpc + mpc > model.num_experts:
        raise ConfigError(
            "cache.mpc_slots" if mpc else "cache.hpc_slots",
            f"hpc_slots + mpc_slots ({hpc} + {mpc}) exceed the {model.num_experts} experts of a layer of {model.name}",
        )
    given = d.get("prefetch_reserve")
    reserve = min(1, lpc - 1) if given is None else check_int(given, "cache.prefetch_reserve", 0, lpc - 1)
    _check_hot_lists(values["hot_profile"], model)
    _check_hot_trace(values["hot_profile"], model)
    shared = values["shared_slots"]
    if shared is not None:
        if values["organization"] != "shared":
            raise ConfigError(
                "cache.shared_slots",
                f"applies only with cache.organization: shared (got {show(values['organization'])})",
            )
        if shared > model.num_experts * n_layers:
            raise ConfigError(
                "cache.shared_slots",
                f"{shared} exceeds the {model.num_experts * n_layers} experts of "
                f"the {n_layers} cached layers of {model.name}",
            )
    return CacheConfig(hpc, mpc, lpc, reserve, **values), sized_from


def _check_hot_trace(profile: Any, model: ModelSpec) -> None:
    """A profiling trace (``cache.hot_profile`` as a path) has the model's MoE layers and experts per layer, and
    routed tokens to rank the experts by (without any, every ranking would silently be by expert id)."""
    if not isinstance(profile, str) or profile == "trace":
        return
    where = "cache.hot_profile"
    try:
        summary = read_trace_summary(profile)
        tokens, routed = routed_tokens(profile)
    except TraceError as exc:
        raise ConfigError(where, str(exc)) from None
    m = summary.meta.model
    if (len(m.layers), m.num_experts) != (model.moe_layers, model.num_experts):
        raise ConfigError(
            where,
            f"profiling trace {brief(profile)} has {len(m.layers)} MoE layers x {m.num_experts} "
            f"experts, model {show(model.name)} {model.moe_layers} x {model.num_experts}",
        )
    if routed == 0:
        raise ConfigError(
            where,
            f"profiling trace {brief(profile)} has no routed tokens ({tokens} tokens): no "
            f"expert ranking to take from it",
        )


def _check_hot_lists(profile: Any, model: ModelSpec) -> None:
    """Per-layer hot expert lists: one per MoE layer of the model, of distinct expert ids."""
    if not isinstance(profile, list):
        return
    if len(profile) != model.moe_layers:
        raise ConfigError(
            "cache.hot_profile",
            f"must hold {model.moe_layers} per-layer lists (one per MoE layer of "
            f"{show(model.name)}), got {len(profile)}",
        )
    for i, row in enumerate(profile):
        if any(not 0 <= e < model.num_experts for e in row) or len(set(row)) != len(row):
            raise ConfigError(
                f"cache.hot_profile[{i}]",
                f"must list distinct expert ids in 0..{model.num_experts - 1}, got {show(row)}",
            )


def _slots_from_split(d: dict, model: ModelSpec, n_layers: int) -> tuple[int, int, int, dict]:
    if d.get("gpu_memory_gb") is None:
        raise ConfigError("cache.gpu_memory_gb", "missing: cache.split needs the memory it splits")
    if d.get("split") is None:
        raise ConfigError("cache.split", "missing: give the fractions {hpc, mpc, lpc} of cache.gpu_memory_gb")
    sizing = read_settings(MemorySizing, d, "cache", skip=("split",))
    budget = sizing["gpu_memory_gb"] * GB
    split = check_mapping(d["split"], "cache.split")
    check_keys(split, "cache.split", required_keys(TierSplit), SPLIT_KEYS)
    frac = read_settings(TierSplit, split, "cache.split")
    total = sum(frac.values())
    if total > 1.0 + 1e-9:
        raise ConfigError("cache.split", f"fractions add up to {total:g}, more than 1")
    eb = model.expert_bytes
    hpc = math.floor(budget * frac["hpc"] / (eb * n_layers) + 1e-9)
    mpc = math.floor(budget * frac["mpc"] / (eb * n_layers) + 1e-9)
    lpc = math.floor(budget * frac["lpc"] / eb + 1e-9)
    # more slots than a layer has experts buy nothing: keep the layer's experts
    hpc = min(hpc, model.num_experts)
    mpc = min(mpc, model.num_experts - hpc)
    if lpc < 1:
        raise ConfigError(
            "cache.split.lpc",
            f"gives {budget * frac['lpc'] / GB:g} GB, less than one working buffer "
            f"({eb / GB:.3g} GB per expert of {model.name})",
        )
    lpc = min(lpc, MAX_BUFFERS)
    return hpc, mpc, lpc, {"gpu_memory_gb": d["gpu_memory_gb"], "split": dict(frac)}


def _registry(section: str) -> Registry:
    """The registry of the parts ``section`` ("policy" or "predictor") names."""
    return POLICIES if section == "policy" else PREDICTORS


def _load_named(d: Any, where: str, names: Iterable[str] | None, default: str | None = None) -> NamedConfig:
    """A policy or predictor: a known name in its registry (and in ``names``, when given), and its params as the
    part declares them, defaults filled."""
    if d is None and default is not None:
        d = {"name": default}
    if isinstance(d, str):
        d = {"name": d}
    d = check_mapping(d, where)
    check_keys(d, where, required_keys(NamedConfig), NAMED_KEYS)
    name = check_str(d["name"], f"{where}.name")
    registry = _registry(where)
    allowed = None if names is None else set(names)
    known = [n for n in registry.names() if allowed is None or n in allowed]
    if name not in known:
        raise ConfigError(
            f"{where}.name", f"unknown {where} {brief(name)} ({known_text(name, known, registry.folder)})"
        )
    params = d.get("params")
    params = {} if params is None else check_mapping(params, f"{where}.params")
    try:
        json.dumps(params, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{where}.params", f"must hold plain values (numbers, strings, lists, mappings): {exc}"
        ) from None
    params = registry.get(name).check_params(copy.deepcopy(params), f"{where}.params")
    return NamedConfig(name, params)


def check_organization(policy: str, organization: str) -> None:
    """A shared cache needs a policy that manages one (``supports_shared``); others refuse it on one line."""
    if organization != "shared":
        return
    registry = _registry("policy")
    if not getattr(registry.get(policy), "supports_shared", False):
        able = [n for n in registry.names() if getattr(registry.get(n), "supports_shared", False)]
        raise ConfigError(
            "cache.organization",
            f"policy {show(policy)} manages per-layer slots only; shared works with {', '.join(able)}",
        )


def dense_bytes_of(model: ModelSpec, system: SystemSpec | None = None) -> int:
    """Bytes of the model's dense weights on the GPU: at ``dtype_bytes``, or at the system's ``dense_format`` (all
    dense weights, embeddings and LM head too: an assumption, some systems keep those at 16 bits)."""
    bits = None if system is None else system.dense_bits
    if bits is None:
        return model.dense_bytes
    return math.ceil(model.dense_params * bits / 8)


def kv_cache_check(
    model: ModelSpec,
    hw: HardwareSpec,
    batch_size: int,
    request_tokens: int,
    longest: tuple[int, int] | None = None,
    dense_bytes: int | None = None,
) -> int:
    """The KV cache of the largest batch of contexts (``batch_size`` requests of ``request_tokens`` tokens each,
    the longest request's prompt plus its generated tokens: an upper bound on what a batch holds at once) beside the
    dense weights and the reserved memory, which every policy keeps on the GPU whatever its tiers (the all-resident
    ceiling too). Returns the KV-cache bytes; ConfigError("cache: ...") with the numbers when they exceed the
    GPU's memory.

    A token's KV bytes are ``decoder_blocks x 2 x n_kv_heads x head_dim x dtype_bytes``
    (:attr:`ModelSpec.kv_bytes_per_token`); a profile without ``n_kv_heads`` or ``head_dim`` takes ``n_heads`` and
    ``d_model / n_heads`` (full multi-head attention: an upper bound for grouped-query or latent attention)."""
    kv = batch_size * request_tokens * model.kv_bytes_per_token
    dense = model.dense_bytes if dense_bytes is None else dense_bytes
    fixed = dense + hw.reserved_bytes
    if kv + fixed > hw.gpu_memory_bytes:
        prompt, generated = longest if longest is not None else (request_tokens, 0)
        raise DoesNotFit(
            "cache",
            f"the KV cache alone does not fit: batch {batch_size} x {request_tokens} tokens "
            f"(the longest request: {prompt} prompt + {generated} generated) x "
            f"{model.kv_bytes_per_token / 1024:g} KiB per token of {show(model.name)} needs "
            f"{kv / GB:.1f} GB beside {dense / GB:.1f} GB of dense weights and "
            f"{hw.reserved_bytes / GB:g} GB reserved, but hardware.gpu_memory_gb is "
            f"{hw.gpu_memory_bytes / GB:g} (lower workload.batch_size or the trace's prompt "
            f"lengths)",
            kv + fixed,
            hw.gpu_memory_bytes,
            {"dense": dense, "kv_cache": kv, "reserved": hw.reserved_bytes},
        )
    return kv


def memory_check(
    model: ModelSpec,
    hw: HardwareSpec,
    cache: CacheConfig,
    batch_size: int,
    request_tokens: int,
    dense_bytes: int | None = None,
    resident: str | None = None,
) -> dict:
    """Bytes each part a run keeps on the GPU needs (``dense``, ``kv_cache``, ``tiers`` or ``experts``,
    ``reserved``); :class:`~sim.config.memory.DoesNotFit` when together they exceed the GPU's memory, one line
    listing each part, their sum and ``hardware.gpu_memory_gb``. ``dense_bytes``: the dense weights' (default: at
    the model's ``dtype_bytes``). ``resident``: the name of a policy that keeps every expert of every MoE layer on
    the GPU (``all_resident``, e.g. gpu-only): then ``experts`` (all of them) replaces ``tiers``, and the field
    named is ``policy.name``."""
    n_layers = cached_layer_count(model, cache.layers)
    eb = model.expert_bytes
    need = {
        "dense": model.dense_bytes if dense_bytes is None else dense_bytes,
        "kv_cache": batch_size * request_tokens * model.kv_bytes_per_token,
    }
    if resident is not None:
        need["experts"] = model.num_experts * model.moe_layers * eb
    else:
        need["tiers"] = cache.total_slots(n_layers) * eb + cache.lpc_buffers * eb
    need["reserved"] = hw.reserved_bytes
    total = sum(need.values())
    if total <= hw.gpu_memory_bytes:
        return need
    in_all = gb_pair(total, hw.gpu_memory_bytes)[0]
    rest = (
        f"the dense weights {gb(need['dense'])} GB, the KV cache {gb(need['kv_cache'])} GB (batch {batch_size} x "
        f"{request_tokens:,} tokens), reserved {gb(need['reserved'])} GB; in all {in_all} GB, but "
        f"hardware.gpu_memory_gb is {hw.gpu_memory_bytes / GB:g}"
    )
    if resident is not None:
        raise DoesNotFit(
            "policy.name",
            f"{resident} keeps every expert on the GPU, which does not fit: the experts need "
            f"{gb(need['experts'])} GB ({model.num_experts} experts x {model.moe_layers} MoE layers, "
            f"{gb(eb)} GB each), {rest} (a policy that offloads experts fits in less)",
            total,
            hw.gpu_memory_bytes,
            need,
        )
    slots = (
        f"shared_slots {cache.total_slots(n_layers)}"
        if cache.organization == "shared"
        else f"(hpc_slots {cache.hpc_slots} + mpc_slots {cache.mpc_slots}) x {n_layers} layers"
    )
    raise DoesNotFit(
        "cache",
        f"does not fit: the tiers need {gb(need['tiers'])} GB ({slots} + lpc_buffers {cache.lpc_buffers}, "
        f"{gb(eb)} GB per expert), {rest}",
        total,
        hw.gpu_memory_bytes,
        need,
    )


def check_dequant_table(system: SystemSpec, hardware: HardwareSpec, model: ModelSpec) -> None:
    """A ``dequant: table`` system needs a measured table for quantized experts: its own ``tables.dequant``, or the
    calibration's for the experts' width (``dequant_int4`` up to 4.5 bits, ``dequant_int8`` up to 8.5)."""
    if system.dequant != "table":
        return
    if system.tables is not None and system.tables.dequant is not None:
        return
    if hardware.tables is None or hardware.tables.dequant_for(model.expert_bits_per_weight) is None:
        raise ConfigError(
            "system.dequant",
            f"is 'table' but neither the system's tables.dequant nor the hardware's "
            f"measured table for {model.expert_bits_per_weight:g}-bit experts exists "
            f"(validate microbench measures them; 'measured' falls back to the "
            f"roofline)",
        )


def with_formats(model: ModelSpec, system: SystemSpec) -> ModelSpec:
    """``model`` with the experts' storage width of the system's ``expert_format`` (unchanged without one): what a
    copy moves, a GPU expert reads, a host expert reads and a cache slot holds."""
    bits = system.expert_bits
    if bits is None or bits == model.expert_bits_per_weight:
        return model
    return dataclasses.replace(model, expert_bits=bits)


# --------------------------------------------------------------------------------------------- entry points
def config_from_dict(
    d: Any,
    source: str = "inline",
    policy_names: Iterable[str] | None = None,
    predictor_names: Iterable[str] | None = None,
) -> RunConfig:
    """Check a whole config mapping into a :class:`RunConfig` (the mapping is not modified). Policy and predictor
    names are those registered; ``policy_names``/``predictor_names``, when given, narrow them further."""
    if not isinstance(d, dict):
        raise ConfigError(source, f"must hold a mapping of config fields, got {type(d).__name__}")
    check_mapping(d, "config")
    check_size(d, "")
    check_keys(d, "", required_keys(RunConfig), TOP_KEYS)
    d = copy.deepcopy(d)
    given_model = load_model(d["model"], "model")
    hardware = load_hardware(d["hardware"], "hardware")
    check_tables(given_model, hardware)
    system = load_system(d.get("system"), "system")
    model = with_formats(given_model, system)
    check_dequant_table(system, hardware, model)
    apply_placement(d, system.placement, model, policy_class(d["policy"], _registry("policy")))  # sets policy, cache
    policy = _load_named(d["policy"], "policy", policy_names)
    predictor = _load_named(
        d.get("predictor", system.predictor), "predictor", predictor_names, default=DEFAULT_PREDICTOR
    )
    workload, summary = _load_workload(d["workload"], model)
    check_serving(workload, policy.name, getattr(_registry("policy").get(policy.name), "origin", None))
    facts = RunFacts(model, workload.trace, summary)
    for where, part in (("policy", policy), ("predictor", predictor)):
        _registry(where).get(part.name).check_for_run(part.params, f"{where}.params", facts)
    all_resident = bool(getattr(_registry("policy").get(policy.name), "all_resident", False))
    cache, _ = _load_cache(d.get("cache"), model, all_resident)
    for where, part in (("policy", policy), ("predictor", predictor)):
        _registry(where).get(part.name).check_with_cache(part.params, f"{where}.params", facts, cache)
    check_organization(policy.name, cache.organization)
    parts = {
        "model": model,
        "hardware": hardware,
        "system": system,
        "workload": workload,
        "cache": cache,
        "policy": policy,
        "predictor": predictor,
        **read_settings(RunConfig, d, "", skip=tuple(_SECTIONS)),
    }
    resolved = {key_of(f): plain(parts[f.name]) for f in settings_of(RunConfig)}
    resolved["model"] = plain(given_model)  # the model as given: the system's formats apply again on loading
    drop_unset(resolved["workload"])  # the serving keys, when unset: a config reads as before they existed
    if workload.context_tokens is None:
        resolved["workload"].pop("context_tokens", None)
    if workload.arrivals is not None and (workload.context_tokens or system.ubatch is not None):
        raise ConfigError(
            "workload.context_tokens" if workload.context_tokens else "system.ubatch",
            "is not supported with workload.arrivals yet (docs/phases.md)",
        )
    if is_ideal(system):  # the default: left out, so that a config (and its sweep point's hash) reads as before
        resolved.pop("system")  # systems existed; the run's config.resolved.yaml shows it (sim/run.py)
    if cache.organization == "per-layer":  # the default: left out, so that a per-layer config (and its sweep
        for key in ("organization", "shared_slots"):  # point's hash) reads as before the option existed
            resolved["cache"].pop(key, None)
    config = RunConfig(**parts, source=source, resolved=resolved)
    try:
        check_fits(config, summary, all_resident)
    except DoesNotFit as exc:  # the config as loaded rides along: a comparison or a sweep shows it as a row
        exc.config = config
        raise
    return config


def check_fits(config: RunConfig, summary: TraceSummary, all_resident: bool) -> None:
    """The run's KV cache, dense weights and experts fit in the GPU's memory (:func:`kv_cache_check`, then
    :func:`memory_check`: the tiers, or every expert for a policy that keeps them all resident), and the experts
    the host holds in its memory where the machine states it (:func:`host_memory_check`); DoesNotFit otherwise."""
    model, hardware, workload = config.model, config.hardware, config.workload
    tokens = summary.max_request_tokens(workload.max_decode_tokens)
    dense = dense_bytes_of(model, config.system)
    longest = summary.longest_request(workload.max_decode_tokens)
    if workload.context_tokens:  # the depth each request starts at is in its cache too
        tokens += workload.context_tokens
        longest = (longest[0] + workload.context_tokens, longest[1])
    if config.system.kv_on_host:  # -nkvo: the KV cache is in host memory, none on the GPU
        tokens = 0
    kv_cache_check(model, hardware, workload.batch_size, tokens, longest, dense)
    resident = config.policy.name if all_resident else None
    memory_check(model, hardware, config.cache, workload.batch_size, tokens, dense, resident)
    policy_class = _registry("policy").get(config.policy.name)
    copies = host_copies(config.system, hardware)
    host_memory_check(model, hardware, policy_class, config.policy.params, all_resident, copies)
    system = config.system
    if system.host_kernel is not None or system.host_isa is not None:  # a family or ISA the host lacks: refused
        choose_kernels(system, hardware, format_class(system.expert_format, model.expert_bits_per_weight))


def resolve_config(base: Any, overrides: Iterable[str], source: str) -> RunConfig:
    """The run config ``base`` (a path, or an inline mapping such as a sweep point's resolved config, named
    ``source`` in errors) with ``--set`` ``overrides`` applied in order, checked."""
    if isinstance(base, dict):
        raw = copy.deepcopy(base)
        for o in overrides:
            apply_override(raw, o)
        return config_from_dict(raw, source)
    return load_run_config(base, overrides)


def load_run_config(
    path: str | Path,
    overrides: Iterable[str] = (),
    policy_names: Iterable[str] | None = None,
    predictor_names: Iterable[str] | None = None,
) -> RunConfig:
    """Read a YAML run config (a regular file: the current folder first, then the project root), apply ``--set``
    overrides in order, and check it."""
    given = str(path)
    p = Path(path)
    try:
        p = p.expanduser()
    except (RuntimeError, ValueError):  # ~nosuchuser
        pass
    if not p.is_absolute() and file_status(p) is None and file_status(PROJECT_ROOT / p) is not None:
        p = PROJECT_ROOT / p
    st = file_status(p)
    if st is None:
        raise ConfigError(given, "no such config file")
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(given, "is a folder, not a config file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(given, "is not a regular file (a pipe or a device?), not a config file")
    if p.suffix.lower() not in PROFILE_SUFFIXES:  # any other file would be parsed, and its lines shown as keys
        raise ConfigError(given, f"is not a config file: a run config is a {'/'.join(PROFILE_SUFFIXES)} file")
    d = read_structured_file(p, given, name_file=False)
    if not isinstance(d, dict):
        raise ConfigError(given, f"must hold a mapping of config fields, got {type(d).__name__}")
    for text in overrides:
        apply_override(d, text)
    return config_from_dict(d, given, policy_names, predictor_names)


# --------------------------------------------------------------------------------------------- --set
SCHEMA: dict = schema_of(RunConfig)  # every key a config may hold (FREE below params)
_WRAP = wrapped(RunConfig)  # a profile name there becomes {base: NAME}, a part's name {name: NAME}
_SEE = {
    "model": "moebase/model.py",
    "hardware": "sim/config/hardware.py",  # where their many keys are listed
    "system": "sim/config/system.py",
}


def apply_override(d: dict, text: str) -> None:
    """Apply one ``--set key.path=value`` to a raw config mapping, in place. The value is parsed as YAML
    (``null`` unsets an optional field). The path must name a config field (any key under ``*.params``);
    setting a field of a model/hardware given by name turns it into ``{base: NAME, field: value}``."""
    apply_set(d, text, SCHEMA, _WRAP, _SEE)


__all__ = [
    "CacheConfig",
    "DoesNotFit",
    "MemorySizing",
    "NamedConfig",
    "RunConfig",
    "TierSplit",
    "TraceSummary",
    "WorkloadConfig",
    "apply_override",
    "cached_layer_count",
    "check_fits",
    "check_organization",
    "config_from_dict",
    "load_run_config",
    "dense_bytes_of",
    "kv_cache_check",
    "memory_check",
    "read_trace_summary",
    "trace_matches_model",
]
