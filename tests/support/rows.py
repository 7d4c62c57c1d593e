"""Rows files (sim/fit_system.py) for tests: a valid row to change, and a CSV written from rows."""

from __future__ import annotations

import csv
from pathlib import Path

from sim.fit_system import COLUMNS


def row(
    rid,
    role="fit",
    published="2.0",
    system="mixtral-offloading",
    variant="none",
    gpu="a100-sxm4-80gb",
    slots="0",
    host="server",
    model="mixtral-8x7b-instruct",
    fmt=("hqq-2bit", "hqq-4bit"),
    **kw,
) -> dict:
    """A valid mixtral-offloading row (a fit row on an A100 unless told), as a CSV record; ``kw`` sets other cells."""
    d = {
        "row": rid,
        "source": "test",
        "system": system,
        "variant": variant,
        "model": model,
        "expert_format": fmt[0],
        "dense_format": fmt[1],
        "gpu": gpu,
        "host": host,
        "pcie": "gen4",
        "batch": "1",
        "prompt_tokens": "",
        "decode_tokens": "",
        "gpu_experts_per_layer": slots,
        "measured_tok_s": published,
        "role": role,
    }
    d.update(kw)
    return d


def write_rows(path: Path, rows, columns=COLUMNS) -> Path:
    """``rows`` as a CSV file at ``path`` with the header ``columns`` (cells of other columns left out)."""
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


def row_v2(rid, role="fit", published="2.0", **kw) -> dict:
    """A valid published row in the v2 columns (benchmarks/published/SCHEMA.md): mixtral-offloading on an A100 with
    experts loaded on demand, a fit row unless told; ``kw`` sets other cells."""
    d = {
        "row": rid,
        "source": "test",
        "system": "mixtral-offloading",
        "system_version": "",
        "model": "mixtral-8x7b-instruct",
        "expert_format": "hqq-2bit",
        "expert_bpw": "3.11",
        "dense_format": "hqq-4bit",
        "gpu": "a100-sxm4-80gb",
        "gpu_count": "1",
        "cpu": "unspecified-server",
        "sockets": "",
        "memory": "",
        "memory_gb": "",
        "pcie": "gen4",
        "batch": "1",
        "metric": "decode",
        "prompt_tokens": "",
        "context_tokens": "",
        "decode_tokens": "",
        "placement": "gpu_experts_per_layer=0",
        "options": "expert_cache=none;speculative_prefetch=off;offload_buffers=4",
        "published_tok_s": published,
        "role": role,
        "notes": "",
    }
    d.update(kw)
    return d
