"""Published rows in the v2 columns (``benchmarks/published/SCHEMA.md``) against the simulator: each row read,
checked and turned into a run config (``sim/row_settings.py``: every column value's setting, or the capability
the simulator lacks, by name); the system constants fitted on the expressible ``fit`` rows only
(``sim.fit_system.fit_rows``), every expressible row predicted blind, the others reported as misses grouped by
capability.

``benchmarks/published_systems.py`` prints the report; :func:`evaluate` is what it and the tests call.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moebase.errors import ConfigError, brief
from sim.fit_system import (
    INTEGER,
    MAX_ROWS,
    NAME,
    SYSTEMS,
    TRACES,
    Row,
    _model_of,
    _positive,
    _profile_exists,
    _read_bounded,
    fit_and_predict,
    printed,
    run_config,
    table_cell,
)
from sim.row_settings import RowPlan, plan_of

#: The v2 columns, in the schema's order.
COLUMNS_V2 = (
    "row",
    "source",
    "system",
    "system_version",
    "model",
    "expert_format",
    "expert_bpw",
    "dense_format",
    "gpu",
    "gpu_count",
    "cpu",
    "sockets",
    "memory",
    "memory_gb",
    "pcie",
    "batch",
    "metric",
    "prompt_tokens",
    "context_tokens",
    "decode_tokens",
    "placement",
    "options",
    "published_tok_s",
    "role",
    "notes",
)
FREE_TEXT = ("source", "notes")
INTEGER_COLUMNS = ("gpu_count", "sockets", "batch", "prompt_tokens", "context_tokens", "decode_tokens")
NUMBER_COLUMNS = ("expert_bpw", "memory_gb", "published_tok_s")
#: A machine-readable cell other than a name: placement, options, memory (``12xDDR5-6400``).
SPEC = r"[A-Za-z0-9][A-Za-z0-9_.+=;:,\-]*"
#: Requests simulated per model without an entry in TRACES (its synthetic trace, traces/data/synth_MODEL.npz).
SYNTH_REQUESTS = 16


@dataclass
class PublishedRow:
    """One v2 row: its cells, its plan (settings and misses) and, when expressible, the fit's :class:`Row`."""

    cells: dict[str, str]
    plan: RowPlan
    row: Row | None  # None: not expressible (plan.missing says why)
    line: int
    hardware: str | None = None  # the machine its parts name (None: a part is not bundled)

    @property
    def id(self) -> str:
        return self.cells["row"]


def _check(cells: dict[str, str], where: str) -> None:
    import re

    for col in COLUMNS_V2:
        v = cells[col]
        if col in FREE_TEXT:
            if not v.isprintable():
                raise ConfigError(where, f"{col} holds a control character, line break or tab")
        elif col in INTEGER_COLUMNS:
            least = 1 if col in ("gpu_count", "sockets", "batch") else 0
            if v and not (INTEGER.fullmatch(v) and len(v) <= 9 and int(v) >= least):
                raise ConfigError(where, f"{col} must be a whole number >= {least} or blank, got {brief(v)}")
        elif col in NUMBER_COLUMNS:
            _positive(v, col, where)
        elif col in ("row", "system", "role", "metric", "model", "gpu", "cpu"):
            if v and not NAME.fullmatch(v):
                raise ConfigError(where, f"{col} must be a plain name, got {brief(v)}")
        elif v and (len(v) > 200 or not re.fullmatch(SPEC, v)):
            raise ConfigError(where, f"{col} must be machine-readable (no spaces), got {brief(v)}")
    if not cells["row"]:
        raise ConfigError(where, "row (the id) is blank")
    if cells["role"] not in ("fit", "predict"):
        raise ConfigError(where, f"role must be fit or predict, got {brief(cells['role'])}")
    if cells["role"] == "fit" and not cells["published_tok_s"]:
        raise ConfigError(where, "published_tok_s is blank but the row is a fit row")


def trace_of(model: str) -> tuple[str, int] | None:
    """The trace a model replays and its requests: TRACES, else its synthetic trace if bundled."""
    from moebase.files import PROJECT_ROOT

    if model in TRACES:
        return TRACES[model]
    synth = f"traces/data/synth_{model.replace('-', '_').replace('.', '_')}.npz"
    return (synth, SYNTH_REQUESTS) if (PROJECT_ROOT / synth).is_file() else None


def _machine(cells: dict[str, str], where: str) -> tuple[str | None, str | None]:
    """(hardware reference, None) or (None, the missing part's capability name)."""
    from sim.row_machines import machine_of

    try:
        hw = machine_of(
            cells["gpu"],
            cells["cpu"] or None,
            int(cells["sockets"]) if cells["sockets"] else None,
            cells["memory"] or None,
            float(cells["memory_gb"]) if cells["memory_gb"] else None,
            cells["pcie"] or None,
            where,
        )
    except ConfigError as exc:
        return None, f"hardware part: {exc.problem.split(' (')[0]}"
    return hw, None


def row_of(cells: dict[str, str], line: int, path: str) -> PublishedRow:
    """A checked record's plan and, when nothing is missing, the fit's Row."""
    where = f"{path}: row {line} ({cells['row']})"
    try:
        plan = plan_of(cells, set(SYSTEMS))
    except ValueError as exc:
        raise ConfigError(where, str(exc)) from None
    model = _model_of(cells["model"])
    trace = None
    if not _profile_exists("models", model):
        plan.missing.append(f"model {cells['model']} has no profile")
    elif (trace := trace_of(model)) is None:
        plan.missing.append(f"model {model} has no trace")
    hw, gap = _machine(cells, where)
    if gap:
        plan.missing.append(gap)
    if plan.missing:
        return PublishedRow(cells, plan, None, line, hw)
    assert hw is not None and trace is not None
    r = Row(
        row=cells["row"],
        source=cells["source"],
        system=plan.system,
        variant=plan.variant,
        model=model,
        expert_format=plan.expert_format,
        dense_format=plan.dense_format,
        gpu=cells["gpu"],
        host=cells["cpu"],
        pcie=cells["pcie"],
        batch=int(cells["batch"] or 1),
        prompt_tokens=int(cells["prompt_tokens"]) if cells["prompt_tokens"] else None,
        decode_tokens=int(cells["decode_tokens"]) if cells["decode_tokens"] else None,
        gpu_experts_per_layer=plan.slots,
        measured_tok_s=float(cells["published_tok_s"]) if cells["published_tok_s"] else None,
        role=cells["role"],
        hardware=hw,
        line=line,
        file=path,
        trace="" if model in TRACES else trace[0],
        measure=plan.measure,
    )
    return PublishedRow(cells, plan, r, line, hw)


def read_published(path: str | Path) -> list[PublishedRow]:
    """The rows of a v2 file, every one checked (ConfigError naming the file, the row and the problem)."""
    shown = str(path)
    text = _read_bounded(path, shown).decode("utf-8-sig", errors="strict")
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    lacking = [c for c in COLUMNS_V2 if c not in header]
    if lacking:
        raise ConfigError(shown, f"row 1 (the header) lacks the v2 columns {', '.join(lacking)} (SCHEMA.md)")
    out, seen, end = [], set(), reader.line_num
    for i, raw in enumerate(reader):
        line, end = end + 1, reader.line_num
        if i >= MAX_ROWS:
            raise ConfigError(shown, f"holds more than {MAX_ROWS} rows")
        if None in raw:
            raise ConfigError(f"{shown}: row {line}", f"has more fields than the header's {len(header)}")
        cells = {c: (raw.get(c) or "").strip() for c in COLUMNS_V2}
        where = f"{shown}: row {line}" + (f" ({cells['row']})" if NAME.fullmatch(cells["row"]) else "")
        _check(cells, where)
        if cells["row"] in seen:
            raise ConfigError(where, "row id repeats an earlier row's")
        seen.add(cells["row"])
        out.append(row_of(cells, line, shown))
    if not out:
        raise ConfigError(shown, "holds no rows")
    return out


def simulator(rows: list[PublishedRow]) -> Callable[[Row, dict], float]:
    """The simulation of a fit Row with its plan's settings laid over its run config."""
    plans = {p.id: p.plan for p in rows}

    def simulate_row(r: Row, constants: dict) -> float:
        from sim.config.run_config import config_from_dict
        from sim.run import simulate

        plan = plans[r.row]
        d = plan.overlay(run_config(r, constants))
        if plan.measure == "prefill":  # one static batch of prompts of prompt_tokens (the bench trace: no decode rows)
            d["workload"] = {**d["workload"], "prefill": True, "max_decode_tokens": None, "requests": r.batch}
        try:
            cfg = config_from_dict(d, source=f"row {r.row}")
        except ConfigError as exc:
            raise ConfigError(f"{r.file}: row {r.line} ({r.row})", f"cannot be simulated: {exc}") from None
        if plan.measure == "prefill":
            return prefill_tok_s(cfg, r.prompt_tokens or 0, r.batch)
        return float(simulate(cfg).summary["throughput_tok_s"])

    return simulate_row


def prefill_tok_s(cfg: Any, prompt_tokens: int, batch: int) -> float:
    """Prompt processing tokens/s as ``sim bench`` measures pp: ``batch`` prompts of ``prompt_tokens`` (the trace's
    prompt rows, else its decode rows: :func:`sim.core.prompt_rows.bench_trace`) over the prefill passes' time."""
    from sim.bench import phase_time
    from sim.core.prompt_rows import bench_trace
    from sim.run import simulate
    from traces.io import load_trace

    if prompt_tokens < 1:
        raise ConfigError("prompt_tokens", "a prefill row needs prompt_tokens >= 1")
    out = simulate(cfg, trace=bench_trace(load_trace(cfg.workload.trace), prompt_tokens, 0, batch))
    seconds = phase_time(out, "prefill")
    return prompt_tokens * batch / seconds


def evaluate(rows: list[PublishedRow], simulate: Callable[[Row, dict], float] | None = None) -> dict[str, Any]:
    """Fit on the expressible fit rows only, predict every expressible row (blind), and summarise."""
    sim = simulate or simulator(rows)
    runnable = [p.row for p in rows if p.row is not None]
    fits, predicted = fit_and_predict(runnable, sim)
    results = {r["row"]: r for r in predicted}
    out = []
    for p in rows:
        res = results.get(p.id)
        missing = list(p.plan.missing)
        if res is not None and res["problem"]:
            why = res["problem"].split("cannot be simulated: ")[-1]
            missing.append("does not run: " + ": ".join(why.split(": ")[:2])[:80])
            p.plan.missing.append(missing[-1])
        out.append(
            {
                "row": p.id,
                "role": p.cells["role"],
                "system": p.cells["system"],
                "metric": p.cells["metric"],
                "hardware": p.hardware,
                "published_tok_s": float(p.cells["published_tok_s"]) if p.cells["published_tok_s"] else None,
                "predicted_tok_s": None if res is None else res["predicted_tok_s"],
                "error": None if res is None else res["error"],
                "constants": {} if res is None else res["constants"],
                "missing": missing,
            }
        )
    return {"fits": fits, "rows": out, "summary": summary(out)}


def _quantile(xs: list[float], q: float) -> float | None:
    """The q-quantile (linear interpolation between order statistics) of xs; None when empty."""
    if not xs:
        return None
    xs = sorted(xs)
    at = q * (len(xs) - 1)
    lo = math.floor(at)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (at - lo)


def summary(results: list[dict]) -> dict[str, Any]:
    """Predict rows predicted / total; decode median and 90th percentile |error|, prefill median; misses by
    capability (every row, fit rows too)."""
    predict = [r for r in results if r["role"] == "predict"]
    done = [r for r in predict if r["error"] is not None]
    errs = {m: [abs(r["error"]) for r in done if r["metric"] == m] for m in ("decode", "prefill", "mixed")}
    misses: Counter[str] = Counter(c for r in results for c in dict.fromkeys(r["missing"]))
    return {
        "predict_rows": len(predict),
        "predicted": len(done),
        "fit_rows": sum(r["role"] == "fit" for r in results),
        "fit_rows_used": sum(r["role"] == "fit" and r["predicted_tok_s"] is not None for r in results),
        "decode_rows": len(errs["decode"]),
        "decode_median": _quantile(errs["decode"], 0.5),
        "decode_p90": _quantile(errs["decode"], 0.9),
        "prefill_rows": len(errs["prefill"]),
        "prefill_median": _quantile(errs["prefill"], 0.5),
        "misses": dict(sorted(misses.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def format_report(ev: dict[str, Any]) -> str:
    """The per-row table, the fits, the figures and the misses by capability, as printed."""
    lines = [
        "| row | role | system | metric | hardware | published tok/s | simulated tok/s | error |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for r in ev["rows"]:
        sim = "miss" if r["predicted_tok_s"] is None else f"{r['predicted_tok_s']:.3g}"
        pub = "" if r["published_tok_s"] is None else f"{r['published_tok_s']:.4g}"
        err = "" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        role = "fitted" if r["role"] == "fit" else "predicted"
        cells = [table_cell(r[k] or "") for k in ("row", "system", "metric", "hardware")]
        lines.append(f"| {' | '.join(cells[:1] + [role] + cells[1:])} | {pub} | {sim} | {err} |")
    lines += ["", "Fitted constants (on the expressible fit rows only):"]
    for f in ev["fits"].values():
        per = "".join(f"; on {printed(hw)} {v:g}" for hw, v in f.per_gpu.items() if len(f.per_gpu) > 1)
        value = "none (no fit row of its measure)" if f.value is None else f"{f.value:g}"
        lines.append(f"- {printed(f.system)}: {f.key} = {value} (fitted on {', '.join(f.rows)}){per}")
        for key, v in f.extra.items():
            lines.append(f"- {printed(f.system)}: {key} = {v:g} (fitted on {', '.join(f.extra_rows[key])})")
    s = ev["summary"]
    lines += [
        "",
        f"predict rows predicted: {s['predicted']} / {s['predict_rows']} (fit rows used: {s['fit_rows_used']} / "
        f"{s['fit_rows']})",
        f"decode: {s['decode_rows']} rows, median |error| {_pct(s['decode_median'])}, 90th percentile "
        f"{_pct(s['decode_p90'])}",
        f"prefill: {s['prefill_rows']} rows, median |error| {_pct(s['prefill_median'])}",
        "",
        "Misses by missing capability (rows, fit and predict; a row may lack several):",
    ]
    lines += [f"- {n:>3}  {printed(cap)}" for cap, n in s["misses"].items()] or ["- none"]
    lines += ["", "Rows not predicted:"]
    lines += [f"- {printed(r['row'])}: {'; '.join(r['missing'])}" for r in ev["rows"] if r["missing"]] or ["- none"]
    return "\n".join(lines)


__all__ = ["COLUMNS_V2", "PublishedRow", "evaluate", "format_report", "read_published", "summary", "trace_of"]
