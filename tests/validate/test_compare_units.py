"""`validate compare`'s report writes its figures in human units: milliseconds and tokens/s with thousands
separators, never a raw 10-digit count."""

from __future__ import annotations

import re

from validate.compare import COLUMNS, markdown

LONG_NUMBER = re.compile(r"(?<![\d.,])\d{4,}(?![\d])")  # 4+ digits without a separator


def _row(name: str, ms: float, frac: float = 0.0) -> dict:
    r = dict.fromkeys(COLUMNS, 0.0)
    r.update(
        config=name,
        real_mean_ms=ms,
        sim_mean_ms=ms * 1.01,
        err_mean_pct=1.0,
        real_p50_ms=ms,
        sim_p50_ms=ms * 0.99,
        err_p50_pct=-1.0,
        real_tok_s=32e3 / ms * 1000,
        sim_tok_s=31e3 / ms * 1000,
        err_tok_s_pct=-3.1,
        cpu_expert_frac=frac,
        real_cpu_experts=1_234_567_890_123,
        sim_cpu_experts=1_234_567_890_000,
        real_cpu_busy_ms=12_345.6,
        sim_cpu_busy_ms=12_000.0,
        real_cpu_wait_ms=1_500.0,
        sim_cpu_wait_ms=1_250.0,
        decisions_identical=True,
    )
    return r


def test_the_report_separates_thousands():
    md = markdown([_row("on-demand-b32", 1355.17), _row("fiddler-b8-c6", 27.5, frac=0.4)], {"suite": "gpu"})
    assert "| on-demand-b32 | 1,355.17 | 1,368.72 | +1.0% | 1,355.17 | 1,341.62 | -1.0% | 23,613.3 | 22,875.4 |" in md
    assert "| 1,234,567,890,123 / 1,234,567,890,000 | 12,345.60 / 12,000.00 | 1,500.00 / 1,250.00 |" in md
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(table) >= 4 and not [line for line in table if LONG_NUMBER.search(line)], table
