"""The run config a recorded or imported trace is simulated with unless the user writes another: the trace's model,
one H200 (``configs/hardware/h200.yaml``), LRU over CACHED_SHARE of each layer's experts (fewer when they would not
fit beside the dense weights, the longest request's KV cache and the reserve), batch 1, no predictor; checked by
the simulator's own loader before anything is written.

``python -m traces import`` and ``record`` write it beside the trace: the trace tools import nothing of the
simulator, so their entry point (``traces/__main__.py``) hands them :func:`default_run_config`."""

from __future__ import annotations

from pathlib import Path

from moebase.errors import ConfigError, InputError
from moebase.model import ModelSpec
from moebase.outputs import staged_path
from sim.config.hardware import load_hardware
from sim.config.run_config import config_from_dict, dense_bytes_of
from traces.summary import TraceSummary

DEFAULT_HARDWARE = "h200"
DEFAULT_POLICY = "lru"
#: The share of a layer's experts the run config's LRU cache holds (when they fit on the GPU).
CACHED_SHARE = 0.5


def default_run_config(spec: ModelSpec, model_value, trace_path: str | Path, trace: TraceSummary) -> dict:
    """A run config mapping for the trace at ``trace_path`` (``model_value``: the profile as the loader reads it, a
    bundled name or the fields themselves; ``trace``: its summary). InputError when it does not load (e.g. the
    dense weights alone exceed the GPU)."""
    d = {
        "model": model_value,
        "hardware": DEFAULT_HARDWARE,
        "workload": {
            "trace": str(Path(trace_path).resolve()),
            "batch_size": 1,
            "batching": "static",
            "max_decode_tokens": None,
            "prefill": True,
            "requests": None,
        },
        "cache": _cache(spec, trace),
        "policy": {"name": DEFAULT_POLICY, "params": {}},
        "predictor": {"name": "none", "params": {}},
        "seed": 0,
    }
    checked = {**d, "workload": {**d["workload"], "trace": str(staged_path(trace_path).resolve())}}
    try:
        config_from_dict(checked)  # the trace as written now (its final name once the command's files appear)
    except ConfigError as exc:
        raise InputError(f"no run config for the trace on {DEFAULT_HARDWARE}: {exc}") from None
    return d


def _cache(spec: ModelSpec, trace: TraceSummary) -> dict:
    """Cache tiers for LRU at batch 1: ``max(2, top_k)`` working buffers (a layer's experts of one token, one
    more to prefetch into) and CACHED_SHARE of each layer's experts, fewer when that would not fit in the GPU's
    memory beside the dense weights, the longest request's KV cache and the reserve."""
    hw = load_hardware(DEFAULT_HARDWARE)
    lpc = max(2, spec.top_k)
    longest = trace.max_request_tokens(None)
    room = (
        hw.gpu_memory_bytes
        - hw.reserved_bytes
        - dense_bytes_of(spec)
        - longest * spec.kv_bytes_per_token
        - lpc * spec.expert_bytes
    )
    fits = max(room, 0) // (spec.expert_bytes * spec.moe_layers)
    mpc = int(min(int(spec.num_experts * CACHED_SHARE), fits))
    return {"hpc_slots": 0, "mpc_slots": mpc, "lpc_buffers": lpc}
