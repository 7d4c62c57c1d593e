"""Engine runs of small test traces: an inline model of a trace's shape and a run config around it."""

from __future__ import annotations

import dataclasses

from sim.config.run_config import config_from_dict
from sim.policies import POLICIES
from sim.predictors import PREDICTORS

POLICY_NAMES = POLICIES.names()
PREDICTOR_NAMES = PREDICTORS.names()


def tiny_model(trace, d_model=256, d_ff=512):
    """An inline model matching a test trace's shape (small experts, so copies are ~100 us)."""
    roles = [x.role for x in trace.meta.model.layers]
    enc, dec = roles.count("encoder"), roles.count("decoder")
    return {
        "name": trace.meta.model.name,
        "d_model": d_model,
        "d_ff": d_ff,
        "expert_matrices": 2,
        "num_experts": trace.num_experts,
        "top_k": trace.top_k,
        "encoder_blocks": enc,
        "decoder_blocks": dec,
        "encoder_moe_layers": enc,
        "decoder_moe_layers": dec,
        "n_heads": 4,
        "n_kv_heads": 4,
        "head_dim": 64,
        "dense_d_ff": 0,
        "dense_ffn_matrices": 2,
        "shared_expert_d_ff": 0,
        "dtype_bytes": 2,
        "vocab_size": 1000,
    }


def config_for(
    trace_path,
    trace,
    policy="lru",
    predictor="none",
    batch=1,
    hpc=0,
    mpc=2,
    buffers=4,
    batching="static",
    layers="all",
    seed=0,
    policy_params=None,
    predictor_params=None,
    **workload,
):
    """A run config of ``trace`` (saved at ``trace_path``) on the h200 with ``tiny_model``; the workload's other
    fields from ``workload``."""
    d = {
        "model": tiny_model(trace),
        "hardware": "h200",
        "workload": {"trace": str(trace_path), "batch_size": batch, "batching": batching, **workload},
        "cache": {
            "hpc_slots": hpc,
            "mpc_slots": mpc,
            "lpc_buffers": buffers,
            "prefetch_reserve": min(1, buffers - 1),
            "layers": layers,
        },
        "policy": {"name": policy, "params": policy_params or {}},
        "predictor": {"name": predictor, "params": predictor_params or {}},
        "seed": seed,
    }
    return config_from_dict(d, "test", POLICY_NAMES, PREDICTOR_NAMES)


def comparable(summary):
    """A run summary less its wall-clock figures (what two equal runs share)."""
    return {k: v for k, v in summary.items() if k not in ("wall_s", "events_per_s")}


def engine_figures(result) -> dict:
    """An engine result's every figure but the wall clock's and the events', as plain data (two runs that must
    agree bit for bit compare these)."""
    d = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    for name in ("wall_s", "prediction", "timeline", "decisions"):
        d.pop(name)
    d["prediction"] = result.prediction.per_layer()
    return d
