"""Real routing from ../shared built into in-memory traces for tests (each loader skips the test when its files
are absent): gpt-oss-20b (``routing.npz``) and switch-base-128 (the Pre-gated MoE authors' batch-1 logs)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.paths import SHARED_TRACES
from traces.format import ModelInfo, Provenance, Trace, TraceMeta

SHARED = SHARED_TRACES
GPT_OSS = SHARED / "gpt-oss-20b" / "routing.npz"
SWITCH_LOGS = [SHARED / "switch-base-pregated-logs" / f"experts_e128_{m}_b1.txt" for m in ("Pre-gated", "GPU-only")]
SWITCH_DECODE_LAYERS, SWITCH_STEPS = 6, 256


def gpt_oss(layers: int | None = None, requests: int | None = None) -> Trace:
    """openai/gpt-oss-20b: 539 requests of decode steps, 24 layers, top-4 of 32 (expert_ids int8 [T, 24, 4]);
    only the first ``layers`` MoE layers and the first ``requests`` requests when given (a smaller input for a slow
    test)."""
    if not GPT_OSS.is_file():
        pytest.skip(f"real gpt-oss trace not found ({GPT_OSS}): ../shared is absent in this checkout")
    with np.load(GPT_OSS) as z:
        experts = z["expert_ids"].astype(np.int16)
        offsets = z["request_offsets"].astype(np.int64)
    if requests is not None:
        offsets = offsets[: requests + 1]
    experts = np.ascontiguousarray(experts[: offsets[-1], :layers])
    meta = TraceMeta(
        ModelInfo.decoder_only("gpt-oss-20b", 32, 4, experts.shape[1]),
        Provenance("imported", "tests", "gpt-oss-20b", "gpt-oss-20b routing.npz", "2026-01-01"),
    )
    return Trace(experts, offsets, np.zeros(offsets.size - 1, dtype=np.int64), meta)


def switch_decode() -> Trace:
    """google/switch-base-128 at batch 1, decoder MoE layers only: one request per distinct run of the logs.

    A log is 6 encoder lines (256 prompt tokens each), then 256 decode steps of 6 decoder lines (one expert
    each), per run; runs of one file repeat the same prompt, so identical runs are kept once."""
    missing = [p for p in SWITCH_LOGS if not p.is_file()]
    if missing:
        pytest.skip(f"real Switch logs not found ({missing[0]}): ../shared is absent in this checkout")
    runs = []
    per_run = SWITCH_DECODE_LAYERS + SWITCH_STEPS * SWITCH_DECODE_LAYERS
    for path in SWITCH_LOGS:
        lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
        assert all(x[0] == "permuted_experts_" for x in lines), path
        for r in range(len(lines) // per_run):
            decode = lines[r * per_run + SWITCH_DECODE_LAYERS : (r + 1) * per_run]
            assert all(len(x) == 2 for x in decode), f"{path}: a decode line with more than one token"
            ids = np.array([int(x[1]) for x in decode], dtype=np.int16).reshape(SWITCH_STEPS, SWITCH_DECODE_LAYERS)
            if not any(np.array_equal(ids, seen) for seen in runs):
                runs.append(ids)
    experts = np.concatenate(runs)[:, :, None]
    offsets = np.arange(len(runs) + 1, dtype=np.int64) * SWITCH_STEPS
    meta = TraceMeta(
        ModelInfo.decoder_only("switch-base-128", 128, 1, SWITCH_DECODE_LAYERS),
        Provenance("imported", "tests", "switch-base-128", "pregated logs b1, decode", "2026-01-01"),
    )
    return Trace(experts, offsets, np.zeros(len(runs), dtype=np.int64), meta)
