"""Run configs: a YAML file (or a mapping) checked field by field into a typed, frozen :class:`RunConfig`.

Shape (``configs/switch_xxl.yaml`` is a commented example)::

    model: switch-xxl-128        # name in configs/models/, a path, or an inline mapping (may name a `base`)
    hardware: h200               # name in configs/hardware/, a path to a hardware/calibration file, or a mapping
    workload: {trace, batch_size: 1, batching: static, max_decode_tokens: null, prefill: true, requests: null}
    cache: {hpc_slots, mpc_slots, lpc_buffers, prefetch_reserve: min(1, lpc_buffers - 1), layers: all,
            hot_profile: trace}  # or gpu_memory_gb + split {hpc, mpc, lpc} instead of the three sizes
    policy: {name, params: {}}   # or just the name
    predictor: {name: none, params: {}}
    seed: 0

Every problem raises :class:`~sim.errors.ConfigError` with one line that starts with the field's dotted path.
``RunConfig.resolved`` is the whole config as plain data, defaults filled, model and hardware expanded; it loads
back with :func:`config_from_dict` to an equal config.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import yaml

from sim.costs import check_tables
from sim.errors import ConfigError
from sim.specs import (GB, HARDWARE_KEYS, MODEL_KEYS, PROJECT_ROOT, TABLE_KEYS, HardwareSpec, ModelSpec,
                       check_bool, check_choice, check_int, check_keys, check_mapping, check_number, check_str,
                       load_hardware, load_model, read_structured_file, resolve_path)
from traces.errors import TraceError
from traces.format import TraceMeta
from traces.io import load_trace_header

BATCHING = ("static", "continuous")
CACHE_LAYERS = ("all", "decoder", "encoder")
GPU_ONLY = "gpu-only"          # the policy whose run is a hypothetical ceiling: no memory check
DEFAULT_PREDICTOR = "none"

TOP_KEYS = ("model", "hardware", "workload", "cache", "policy", "predictor", "seed")
WORKLOAD_KEYS = ("trace", "batch_size", "batching", "max_decode_tokens", "prefill", "requests")
SLOT_KEYS = ("hpc_slots", "mpc_slots", "lpc_buffers")
CACHE_KEYS = SLOT_KEYS + ("prefetch_reserve", "layers", "hot_profile", "gpu_memory_gb", "split")
SPLIT_KEYS = ("hpc", "mpc", "lpc")
NAMED_KEYS = ("name", "params")


@dataclass(frozen=True)
class WorkloadConfig:
    trace: Path                      # resolved path of the trace file
    batch_size: int
    batching: str                    # static | continuous
    max_decode_tokens: int | None    # per request; None = all of the trace's
    prefill: bool
    requests: int | None             # None = the trace's count (rounded up to whole static batches)


@dataclass(frozen=True)
class CacheConfig:
    hpc_slots: int                   # per cached MoE layer
    mpc_slots: int                   # per cached MoE layer
    lpc_buffers: int                 # shared working buffers for copies from host
    prefetch_reserve: int            # working buffers prefetches may not take
    layers: str                      # all | decoder | encoder: the cached MoE layers
    hot_profile: Any = "trace"       # "trace", a resolved trace path (str), or per-layer lists of hot expert ids


@dataclass(frozen=True)
class NamedConfig:
    name: str
    params: dict


@dataclass(frozen=True)
class RunConfig:
    model: ModelSpec
    hardware: HardwareSpec
    workload: WorkloadConfig
    cache: CacheConfig
    policy: NamedConfig
    predictor: NamedConfig
    seed: int
    source: str                      # the config file, or "inline"
    resolved: dict                   # the whole config as plain data, defaults filled, model/hardware expanded


# --------------------------------------------------------------------------------------------- trace metadata
@dataclass(frozen=True)
class TraceSummary:
    """What a config needs from a trace without reading its routing: metadata and request lengths."""

    path: Path
    meta: TraceMeta
    prefill_lengths: np.ndarray  # int64 [R]
    decode_lengths: np.ndarray   # int64 [R]

    @property
    def num_requests(self) -> int:
        return int(self.prefill_lengths.shape[0])

    def layer_counts(self) -> tuple[int, int]:
        roles = [x.role for x in self.meta.model.layers]
        return roles.count("encoder"), roles.count("decoder")

    def max_request_tokens(self, max_decode_tokens: int | None) -> int:
        """The most KV-cache tokens one request holds: its prompt plus its (capped) generated tokens."""
        decode = self.decode_lengths
        if max_decode_tokens is not None:
            decode = np.minimum(decode, max_decode_tokens)
        return int((self.prefill_lengths + decode).max()) if self.num_requests else 0


def read_trace_summary(path: str | Path) -> TraceSummary:
    """Metadata and request lengths of a trace file, read without its expert arrays (cached per file version).
    Raises TraceError naming the file, like :func:`traces.io.load_trace`."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        raise TraceError(path, "no such file") from None
    return _trace_summary(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=32)
def _trace_summary(path_str: str, mtime_ns: int, size: int) -> TraceSummary:
    path = Path(path_str)
    meta, experts_shape, offsets, prefill = load_trace_header(path)
    if offsets.dtype != np.int64 or offsets.ndim != 1 or offsets.shape[0] < 2 or offsets[0] != 0 \
            or np.any(np.diff(offsets) < 0):
        raise TraceError(path, "request_offsets must be non-decreasing int64 [requests + 1] starting at 0")
    if len(experts_shape) != 3 or experts_shape[0] != offsets[-1] or experts_shape[1] != len(meta.model.layers):
        raise TraceError(path, f"experts shape {list(experts_shape)} does not match request_offsets "
                               f"(ending at {offsets[-1]}) and the {len(meta.model.layers)} layers of its metadata")
    lengths = np.diff(offsets)
    if prefill.dtype != np.int64 or prefill.shape != lengths.shape or np.any(prefill < 0) \
            or np.any(prefill > lengths):
        raise TraceError(path, "prefill_lengths must be int64, one per request, between 0 and its token count")
    return TraceSummary(path, meta, prefill, lengths - prefill)


def _norm_name(name: str) -> str:
    return name.strip().lower().rsplit("/", 1)[-1]


def trace_matches_model(summary: TraceSummary, model: ModelSpec) -> bool:
    """Same experts, top-k and encoder/decoder MoE layer counts, and the same model name; a trace name may carry
    an organisation prefix and a variant suffix ("mistralai/Mixtral-8x7B-Instruct-v0.1" is a "mixtral-8x7b")."""
    m = summary.meta.model
    enc, dec = summary.layer_counts()
    tn, mn = _norm_name(m.name), _norm_name(model.name)
    return ((tn == mn or tn.startswith(mn + "-"))
            and (m.num_experts, m.top_k, enc, dec)
            == (model.num_experts, model.top_k, model.encoder_moe_layers, model.decoder_moe_layers))


# --------------------------------------------------------------------------------------------- sections
def _load_workload(d: Any, model: ModelSpec) -> tuple[WorkloadConfig, TraceSummary]:
    d = check_mapping(d, "workload")
    check_keys(d, "workload", ("trace",), WORKLOAD_KEYS)
    trace_value = d["trace"]
    if not isinstance(trace_value, str) or not trace_value.strip():
        raise ConfigError("workload.trace", f"must be a path to a trace file, got {trace_value!r}")
    path = resolve_path(trace_value, "workload.trace", "trace file").resolve()
    try:
        summary = read_trace_summary(path)
    except TraceError as exc:
        raise ConfigError("workload.trace", str(exc)) from None
    if not trace_matches_model(summary, model):
        m = summary.meta.model
        enc, dec = summary.layer_counts()
        theirs = _shape(m.num_experts, m.top_k, enc, dec)
        ours = _shape(model.num_experts, model.top_k, model.encoder_moe_layers, model.decoder_moe_layers)
        raise ConfigError("workload.trace", f"trace model {m.name!r} ({theirs}) does not match model "
                                            f"{model.name!r} ({ours}) in {path}")
    w = WorkloadConfig(
        trace=path,
        batch_size=check_int(d.get("batch_size", 1), "workload.batch_size", 1),
        batching=check_choice(d.get("batching", "static"), "workload.batching", BATCHING),
        max_decode_tokens=check_int(d.get("max_decode_tokens"), "workload.max_decode_tokens", 0, allow_none=True),
        prefill=check_bool(d.get("prefill", True), "workload.prefill"),
        requests=check_int(d.get("requests"), "workload.requests", 1, allow_none=True))
    has_prefill = w.prefill and int(summary.prefill_lengths.sum()) > 0
    has_decode = w.max_decode_tokens != 0 and int(summary.decode_lengths.sum()) > 0
    if not (has_prefill or has_decode):
        field = "workload.max_decode_tokens" if w.max_decode_tokens == 0 else "workload.prefill"
        raise ConfigError(field, f"leaves nothing to simulate: the trace has {int(summary.prefill_lengths.sum())} "
                                 f"prompt and {int(summary.decode_lengths.sum())} generated tokens, with prefill "
                                 f"{str(w.prefill).lower()} and max_decode_tokens {w.max_decode_tokens}")
    return w, summary


def _shape(experts: int, top_k: int, enc: int, dec: int) -> str:
    return f"{experts} experts, top-{top_k}, {enc} encoder + {dec} decoder MoE layers"


def cached_layer_count(model: ModelSpec, layers: str) -> int:
    """How many MoE layers ``cache.layers`` caches."""
    if layers == "all":
        return model.moe_layers
    return model.encoder_moe_layers if layers == "encoder" else model.decoder_moe_layers


def _load_cache(d: Any, model: ModelSpec, policy: str) -> tuple[CacheConfig, dict | None]:
    d = {} if d is None else check_mapping(d, "cache")
    check_keys(d, "cache", (), CACHE_KEYS)
    layers = check_choice(d.get("layers", "all"), "cache.layers", CACHE_LAYERS)
    n_layers = cached_layer_count(model, layers)
    if n_layers == 0:
        raise ConfigError("cache.layers", f"model {model.name!r} has no {layers} MoE layers")
    slots_given = [k for k in SLOT_KEYS if d.get(k) is not None]
    split_given = [k for k in ("gpu_memory_gb", "split") if d.get(k) is not None]
    sized_from = None
    if slots_given and split_given:
        raise ConfigError("cache", f"give either hpc_slots/mpc_slots/lpc_buffers or gpu_memory_gb/split, not both "
                                   f"(got {', '.join(slots_given + split_given)})")
    if split_given:
        hpc, mpc, lpc, sized_from = _slots_from_split(d, model, n_layers)
    elif slots_given:
        for k in SLOT_KEYS:
            if d.get(k) is None:
                raise ConfigError(f"cache.{k}", "missing (give hpc_slots, mpc_slots and lpc_buffers together, "
                                                "or gpu_memory_gb and split)")
        hpc = check_int(d["hpc_slots"], "cache.hpc_slots", 0)
        mpc = check_int(d["mpc_slots"], "cache.mpc_slots", 0)
        lpc = check_int(d["lpc_buffers"], "cache.lpc_buffers", 1)
    elif policy == GPU_ONLY:
        hpc, mpc, lpc = 0, 0, 1
    else:
        raise ConfigError("cache", "give the tier sizes: hpc_slots, mpc_slots and lpc_buffers, "
                                   "or gpu_memory_gb and split {hpc, mpc, lpc}")
    if hpc + mpc > model.num_experts:
        raise ConfigError("cache.mpc_slots" if mpc else "cache.hpc_slots",
                          f"hpc_slots + mpc_slots ({hpc} + {mpc}) exceed the {model.num_experts} experts of a layer "
                          f"of {model.name}")
    reserve = d.get("prefetch_reserve")
    reserve = min(1, lpc - 1) if reserve is None else check_int(reserve, "cache.prefetch_reserve", 0, lpc - 1)
    return CacheConfig(hpc, mpc, lpc, reserve, layers, _hot_profile(d.get("hot_profile", "trace"))), sized_from


def _slots_from_split(d: dict, model: ModelSpec, n_layers: int) -> tuple[int, int, int, dict]:
    if d.get("gpu_memory_gb") is None:
        raise ConfigError("cache.gpu_memory_gb", "missing: cache.split needs the memory it splits")
    if d.get("split") is None:
        raise ConfigError("cache.split", "missing: give the fractions {hpc, mpc, lpc} of cache.gpu_memory_gb")
    budget = check_number(d["gpu_memory_gb"], "cache.gpu_memory_gb", 0.0) * GB
    split = check_mapping(d["split"], "cache.split")
    check_keys(split, "cache.split", SPLIT_KEYS)
    frac = {k: check_number(split[k], f"cache.split.{k}", 0.0, strict=False, maximum=1.0) for k in SPLIT_KEYS}
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
        raise ConfigError("cache.split.lpc", f"gives {budget * frac['lpc'] / GB:g} GB, less than one working buffer "
                                             f"({eb / GB:.3g} GB per expert of {model.name})")
    return hpc, mpc, lpc, {"gpu_memory_gb": d["gpu_memory_gb"], "split": dict(frac)}


def _hot_profile(value: Any) -> Any:
    where = "cache.hot_profile"
    if value is None or value == "trace":
        return "trace"
    if isinstance(value, str):
        return str(resolve_path(value, where, "profiling trace file").resolve())
    if isinstance(value, list) and all(isinstance(row, list) and all(isinstance(e, int) and not isinstance(e, bool)
                                                                     for e in row) for row in value):
        return [list(row) for row in value]
    raise ConfigError(where, f"must be 'trace', a path to a profiling trace, or per-layer lists of expert ids, "
                             f"got {value!r}"[:200])


def _load_named(d: Any, where: str, names: Iterable[str] | None, default: str | None = None) -> NamedConfig:
    if d is None and default is not None:
        d = {"name": default}
    if isinstance(d, str):
        d = {"name": d}
    d = check_mapping(d, where)
    check_keys(d, where, ("name",), NAMED_KEYS)
    name = check_str(d["name"], f"{where}.name")
    if names is not None:
        known = sorted(names)
        if name not in known:
            raise ConfigError(f"{where}.name", f"unknown {where} {name!r} (known: {', '.join(known)})")
    params = d.get("params")
    params = {} if params is None else check_mapping(params, f"{where}.params")
    try:
        json.dumps(params, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}.params", f"must hold plain values (numbers, strings, lists, mappings): {exc}") \
            from None
    return NamedConfig(name, copy.deepcopy(params))


def memory_check(model: ModelSpec, hw: HardwareSpec, cache: CacheConfig, batch_size: int,
                 request_tokens: int) -> dict:
    """Bytes each resident thing needs; raises ConfigError("cache: ...") when they exceed the GPU's memory."""
    n_layers = cached_layer_count(model, cache.layers)
    eb = model.expert_bytes
    need = {
        "dense": model.dense_bytes,
        "kv_cache": batch_size * request_tokens * model.kv_bytes_per_token,
        "tiers": (cache.hpc_slots + cache.mpc_slots) * n_layers * eb + cache.lpc_buffers * eb,
        "reserved": hw.reserved_bytes,
    }
    if sum(need.values()) > hw.gpu_memory_bytes:
        raise ConfigError("cache", f"tiers need {need['tiers'] / GB:.1f} GB ((hpc_slots {cache.hpc_slots} + "
                                   f"mpc_slots {cache.mpc_slots}) x {n_layers} layers + lpc_buffers "
                                   f"{cache.lpc_buffers}, at {eb / GB:.3g} GB per expert) beside "
                                   f"{need['dense'] / GB:.1f} GB of dense weights and {need['kv_cache'] / GB:.1f} GB of "
                                   f"KV cache (batch {batch_size} x {request_tokens} tokens) and "
                                   f"{need['reserved'] / GB:g} GB reserved, but hardware.gpu_memory_gb is "
                                   f"{hw.gpu_memory_bytes / GB:g}")
    return need


# --------------------------------------------------------------------------------------------- entry points
def config_from_dict(d: Any, source: str = "inline", policy_names: Iterable[str] | None = None,
                     predictor_names: Iterable[str] | None = None) -> RunConfig:
    """Check a whole config mapping into a :class:`RunConfig` (the mapping is not modified)."""
    if not isinstance(d, dict):
        raise ConfigError(source, f"must hold a mapping of config fields, got {type(d).__name__}")
    check_mapping(d, "config")
    check_keys(d, "", ("model", "hardware", "workload", "policy"), TOP_KEYS)
    d = copy.deepcopy(d)
    model = load_model(d["model"], "model")
    hardware = load_hardware(d["hardware"], "hardware")
    check_tables(model, hardware)
    policy = _load_named(d["policy"], "policy", policy_names)
    predictor = _load_named(d.get("predictor"), "predictor", predictor_names, default=DEFAULT_PREDICTOR)
    workload, summary = _load_workload(d["workload"], model)
    cache, _ = _load_cache(d.get("cache"), model, policy.name)
    seed = check_int(d.get("seed", 0), "seed", 0)
    if policy.name != GPU_ONLY:
        memory_check(model, hardware, cache, workload.batch_size, summary.max_request_tokens(workload.max_decode_tokens))
    resolved = {
        "model": model.to_dict(),
        "hardware": hardware.to_dict(),
        "workload": {"trace": str(workload.trace), "batch_size": workload.batch_size, "batching": workload.batching,
                     "max_decode_tokens": workload.max_decode_tokens, "prefill": workload.prefill,
                     "requests": workload.requests},
        "cache": {"hpc_slots": cache.hpc_slots, "mpc_slots": cache.mpc_slots, "lpc_buffers": cache.lpc_buffers,
                  "prefetch_reserve": cache.prefetch_reserve, "layers": cache.layers,
                  "hot_profile": copy.deepcopy(cache.hot_profile)},
        "policy": {"name": policy.name, "params": copy.deepcopy(policy.params)},
        "predictor": {"name": predictor.name, "params": copy.deepcopy(predictor.params)},
        "seed": seed,
    }
    return RunConfig(model, hardware, workload, cache, policy, predictor, seed, source, resolved)


def load_run_config(path: str | Path, overrides: Iterable[str] = (), policy_names: Iterable[str] | None = None,
                    predictor_names: Iterable[str] | None = None) -> RunConfig:
    """Read a YAML run config, apply ``--set`` overrides in order, and check it."""
    given = str(path)
    p = Path(path).expanduser()
    if not p.is_absolute() and not p.exists() and (PROJECT_ROOT / p).exists():
        p = PROJECT_ROOT / p
    if not p.exists():
        raise ConfigError(given, "no such config file")
    if p.is_dir():
        raise ConfigError(given, "is a folder, not a config file")
    d = read_structured_file(p, given, name_file=False)
    if not isinstance(d, dict):
        raise ConfigError(given, f"must hold a mapping of config fields, got {type(d).__name__}")
    for text in overrides:
        apply_override(d, text)
    return config_from_dict(d, given, policy_names, predictor_names)


# --------------------------------------------------------------------------------------------- --set
_ANY = "any"  # free-form below this key (policy/predictor params)
_SCHEMA: dict = {
    "model": {k: None for k in MODEL_KEYS},
    "hardware": {**{k: None for k in HARDWARE_KEYS}, "tables": {k: None for k in TABLE_KEYS}},
    "workload": {k: None for k in WORKLOAD_KEYS},
    "cache": {**{k: None for k in CACHE_KEYS}, "split": {k: None for k in SPLIT_KEYS}},
    "policy": {"name": None, "params": _ANY},
    "predictor": {"name": None, "params": _ANY},
    "seed": None,
}
_PROFILES = ("model", "hardware")   # a name/path there becomes {base: name/path} when a field is set
_NAMED = ("policy", "predictor")    # a bare name there becomes {name: name}


def apply_override(d: dict, text: str) -> None:
    """Apply one ``--set key.path=value`` to a raw config mapping, in place. The value is parsed as YAML
    (``null`` unsets an optional field). The path must name a config field (any key under ``*.params``);
    setting a field of a model/hardware given by name turns it into ``{base: NAME, field: value}``."""
    key, sep, raw = str(text).partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError("--set", f"expected KEY.PATH=VALUE, got {text!r}")
    parts = key.split(".")
    if any(not part.strip() for part in parts):
        raise ConfigError("--set", f"bad key path {key!r} in {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(key, f"cannot parse the value {raw!r} ({problem})") from None
    node, schema = d, _SCHEMA
    for i, part in enumerate(parts):
        path = ".".join(parts[: i + 1])
        if schema is not _ANY:
            if not isinstance(schema, dict) or part not in schema:
                if isinstance(schema, dict):
                    known = ", ".join(schema)
                    raise ConfigError(path, f"unknown key (known: {known})")
                raise ConfigError(path, f"{'.'.join(parts[:i])} has no fields to set")
            sub = schema[part]
        else:
            sub = _ANY
        if i == len(parts) - 1:
            node[part] = value
            return
        child = node.get(part)
        if not isinstance(child, dict):
            if i == 0 and part in _PROFILES and isinstance(child, str):
                child = {"base": child}
            elif i == 0 and part in _NAMED and isinstance(child, str):
                child = {"name": child}
            else:
                child = {}
            node[part] = child
        node, schema = child, sub


__all__ = ["CacheConfig", "NamedConfig", "RunConfig", "TraceSummary", "WorkloadConfig", "apply_override",
           "config_from_dict", "load_run_config", "memory_check", "read_trace_summary", "trace_matches_model"]
