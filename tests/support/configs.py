"""Small run configs written to a folder, shared by tests that need a config file on disk: a static-batch lru run of
a random trace, and a serving run (continuous batching, chunked prefill) fast enough for capacity searches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from tests.support.engine import tiny_model
from tests.support.traces import make_trace, random_trace
from traces.io import save_trace


def tiny_lru_config(folder: Path, tokens: int) -> Path:
    """``folder/tiny.yaml``: lru on a random 2-layer, 8-expert top-2 trace of ``tokens`` tokens over 4 requests,
    batch 2 (static), HPC 1 + MPC 2 slots, no predictor."""
    trace = random_trace(np.random.default_rng(4), tokens=tokens, layers=2, experts=8, k=2, requests=4)
    path = save_trace(trace, folder / "tiny.npz")
    cfg = {
        "model": tiny_model(trace),
        "hardware": "h200",
        "workload": {"trace": str(path), "batch_size": 2, "batching": "static"},
        "cache": {"hpc_slots": 1, "mpc_slots": 2, "lpc_buffers": 4, "prefetch_reserve": 1, "layers": "all"},
        "policy": {"name": "lru", "params": {}},
        "predictor": {"name": "none", "params": {}},
        "seed": 0,
    }
    out = folder / "tiny.yaml"
    out.write_text(yaml.safe_dump(cfg))
    return out


def serving_config(folder: Path) -> str:
    """``folder/c.yaml``: 24 requests of a 6-token prompt and 8 decode rows on a tiny model, batch 4 (continuous),
    chunked prefill of 8 tokens, lru on 2 MPC slots."""
    rng = np.random.default_rng(0)
    e = np.argsort(rng.random((24 * 14, 2, 8)), axis=2)[:, :, :2]
    trace = make_trace(e, [14] * 24, [6] * 24, num_experts=8)
    path = save_trace(trace, folder / "t.npz")
    cfg = {
        "model": tiny_model(trace),
        "hardware": "h200",
        "workload": {"trace": str(path), "batch_size": 4, "batching": "continuous", "max_batch_tokens": 8},
        "cache": {"hpc_slots": 0, "mpc_slots": 2, "lpc_buffers": 4, "prefetch_reserve": 1},
        "policy": "lru",
        "predictor": "none",
    }
    (folder / "c.yaml").write_text(yaml.safe_dump(cfg))
    return str(folder / "c.yaml")
