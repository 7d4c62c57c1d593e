"""`python -m sim compare CONFIG --policies a,b,c [--baseline NAME]`: the same workload under several policies.

Each entry of ``--policies`` is a policy name, optionally with a predictor: ``pregated@oracle``,
``moe-infinity@moe-infinity``; without one the config's predictor is used. ``all`` stands for every registered
policy, each with its default predictor (:func:`default_predictor`: MoE-Infinity with its own, Pre-gated and the
Diff-MoE tiers with the oracle pre-gate, as ``benchmarks/policy_study.py`` runs them; the others with the config's),
in the order of :func:`all_entries`. A policy other than the config's starts from empty params (the config's
``policy.params`` belong to its own policy); ``--set`` applies to every run. The table gives each policy's origin
(:func:`origin_of`: ceiling, baseline, published, ours or bound), throughput, its ratio to the baseline, iteration
latency, hit rates, PCIe traffic, stall time, and the gap between each policy's cache hit rate (HPC + MPC) and the
Belady bound: the hit rate of an offline optimal cache with the same slots per layer (HPC + MPC), which no policy
can beat in cache hits.
"""

from __future__ import annotations

import copy
import csv
import datetime as dt
import io
import json
from pathlib import Path

from sim.config import RunConfig, config_from_dict, load_run_config
from sim.errors import ConfigError
from sim.policies import POLICIES, is_ceiling
from sim.predictors import PREDICTORS
from sim.run import cached_layers, simulate
from traces.io import atomic_write_bytes, load_trace

COLUMNS = ["policy", "predictor", "origin", "throughput_tok_s", "ratio_vs_baseline", "iteration_ms_mean",
           "iteration_ms_p99", "hit_rate", "cache_hit_rate", "prefetch_hit_rate", "pcie_gb", "stall_s",
           "link_busy_frac", "prefetch_precision", "prefetch_recall", "belady_cache_hit_rate", "gap_to_belady"]


#: Where a policy comes from, in the order ``--policies all`` runs them: the hypothetical ceiling (every expert
#: resident), baselines that cache nothing, published caching policies, this project's own, and the offline bound.
ORIGINS = ("ceiling", "baseline", "published", "ours", "bound")

#: The origin of the policies whose class declares none (a class's ``origin`` attribute takes precedence).
KNOWN_ORIGINS = {"gpu-only": "ceiling", "on-demand": "baseline", "prefetch-all": "baseline", "pregated": "baseline",
                 "lru": "published", "lfu": "published", "moe-infinity": "published", "diffmoe": "published",
                 "diffmoe-arc": "ours", "belady": "bound"}

#: The predictor a policy runs with under ``--policies all`` when its class declares no ``default_predictor``
#: (None: the config's), as ``benchmarks/policy_study.py`` runs them. ``diffmoe-arc`` keeps Diff-MoE's oracle
#: pre-gate so that the two differ only in the MPC's replacement rule.
DEFAULT_PREDICTORS = {"moe-infinity": "moe-infinity", "pregated": "oracle", "diffmoe": "oracle",
                      "diffmoe-arc": "oracle"}

#: Order within an origin under ``--policies all`` (the policy study's); others follow by name.
STUDY_ORDER = ("gpu-only", "on-demand", "prefetch-all", "pregated", "lru", "lfu", "moe-infinity", "diffmoe",
               "diffmoe-arc", "belady")


def origin_of(policy_class) -> str | None:
    """The origin of a policy (its class, or its registered name): the class's ``origin`` attribute if it has one,
    else ``KNOWN_ORIGINS`` by its name (None when neither says)."""
    cls = POLICIES.get(policy_class) if isinstance(policy_class, str) else policy_class
    origin = getattr(cls, "origin", None)
    return origin if origin is not None else KNOWN_ORIGINS.get(getattr(cls, "name", None))


def default_predictor(policy: str) -> str | None:
    """The predictor ``policy`` runs with under ``--policies all`` (None: the config's)."""
    return getattr(POLICIES.get(policy), "default_predictor", None) or DEFAULT_PREDICTORS.get(policy)


def all_entries() -> list[tuple[str, str | None]]:
    """Every registered policy with its default predictor, by origin (``ORIGINS``), then the study's order, then
    name."""
    def key(name):
        origin = origin_of(name)
        rank = ORIGINS.index(origin) if origin in ORIGINS else len(ORIGINS)
        return rank, STUDY_ORDER.index(name) if name in STUDY_ORDER else len(STUDY_ORDER), name

    return [(name, default_predictor(name)) for name in sorted(POLICIES.names(), key=key)]


def parse_entries(text: str) -> list[tuple[str, str | None]]:
    """``a,b@p`` -> [(a, None), (b, p)], checking the names; ``all`` -> :func:`all_entries`."""
    entries = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if item == "all":
            entries.extend(all_entries())
            continue
        policy, _, predictor = item.partition("@")
        if policy not in POLICIES:
            raise ConfigError("--policies", f"unknown policy {policy!r} (known: {', '.join(POLICIES.names())})")
        if predictor and predictor not in PREDICTORS:
            raise ConfigError("--policies", f"unknown predictor {predictor!r} in {item!r} "
                              f"(known: {', '.join(PREDICTORS.names())})")
        entries.append((policy, predictor or None))
    if not entries:
        raise ConfigError("--policies", "give at least one policy")
    return entries


def variant(base: RunConfig, policy: str, predictor: str | None) -> RunConfig:
    """The base config with another policy (and predictor), params reset where the part changes."""
    d = copy.deepcopy(base.resolved)
    if policy != base.policy.name:
        d["policy"] = {"name": policy, "params": {}}
    if predictor is not None and predictor != base.predictor.name:
        d["predictor"] = {"name": predictor, "params": {}}
    return config_from_dict(d, base.source, POLICIES.names(), PREDICTORS.names())


def belady_cache_hit_rate(cfg: RunConfig, trace) -> float | None:
    """Hit rate of an offline optimal cache with HPC + MPC slots per cached layer (None when none is given)."""
    capacity = cfg.cache.hpc_slots + cfg.cache.mpc_slots
    try:
        from sim.policies.belady import belady_bound
    except ImportError:
        return None
    from sim.workload import build_iterations

    w = cfg.workload
    iterations, _ = build_iterations(trace, w.batch_size, w.batching, w.max_decode_tokens, w.prefill, w.requests)
    out = belady_bound(trace, iterations, capacity, cached_layers(trace, cfg.cache.layers))
    return out["hit_rate"]


def compare(base: RunConfig, entries: list[tuple[str, str | None]], baseline: str | None = None,
            log=None) -> list[dict]:
    """One row per entry (see COLUMNS)."""
    trace = load_trace(base.workload.trace)
    bound = belady_cache_hit_rate(base, trace)
    rows = []
    for policy, predictor in entries:
        cfg = variant(base, policy, predictor)
        if log:
            log(f"  {policy} (predictor {cfg.predictor.name}) ...")
        s = simulate(cfg, trace=trace).summary
        hr = s["hit_rate"]
        cache_hits = None if hr["hpc"] is None else hr["hpc"] + hr["mpc"]
        rows.append({
            "policy": policy, "predictor": cfg.predictor.name, "origin": origin_of(policy),
            "throughput_tok_s": s["throughput_tok_s"],
            "ratio_vs_baseline": None, "iteration_ms_mean": s["iteration_ms"]["mean"],
            "iteration_ms_p99": s["iteration_ms"]["p99"], "hit_rate": hr["overall"], "cache_hit_rate": cache_hits,
            "prefetch_hit_rate": hr["lpc"], "pcie_gb": s["pcie_bytes"] / 1e9, "stall_s": s["stall_ms"] / 1e3,
            "link_busy_frac": s["link_busy_frac"], "prefetch_precision": s["prefetch"]["precision"],
            "prefetch_recall": s["prefetch"]["recall"],
            # gpu-only keeps every expert, so the bound at the configured slots does not apply to it
            "belady_cache_hit_rate": None if is_ceiling(policy) else bound,
            "gap_to_belady": None if bound is None or cache_hits is None or is_ceiling(policy)
            else bound - cache_hits,
        })
    names = [r["policy"] for r in rows]
    if baseline is None:
        baseline = "on-demand" if "on-demand" in names else names[0]
    if baseline not in names:
        raise ConfigError("--baseline", f"{baseline!r} is not among the compared policies ({', '.join(names)})")
    ref = rows[names.index(baseline)]["throughput_tok_s"]
    for r in rows:
        r["ratio_vs_baseline"] = r["throughput_tok_s"] / ref if ref else None
    return rows


def _fmt(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


def table_markdown(rows: list[dict], baseline: str, title: str) -> str:
    head = ["policy", "predictor", "origin", "tokens/s", f"x {baseline}", "iter ms (mean)", "hit rate",
            "cache hits", "prefetched", "PCIe GB", "stall s", "Belady bound", "gap"]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([
            r["policy"], r["predictor"], r["origin"] or "-", _fmt(r["throughput_tok_s"], ",.1f"),
            _fmt(r["ratio_vs_baseline"], ".2f"),
            _fmt(r["iteration_ms_mean"], ".1f"), _fmt(r["hit_rate"]), _fmt(r["cache_hit_rate"]),
            _fmt(r["prefetch_hit_rate"]), _fmt(r["pcie_gb"], ",.1f"), _fmt(r["stall_s"], ",.2f"),
            _fmt(r["belady_cache_hit_rate"]), _fmt(r["gap_to_belady"], "+.3f")]) + " |")
    return "\n".join(lines) + "\n"


def table_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else (f"{v:.6g}" if isinstance(v, float) else v)) for k, v in r.items()})
    return buf.getvalue()


def register(sub) -> None:
    p = sub.add_parser("compare", help="run one workload under several policies and compare them")
    p.add_argument("config")
    p.add_argument("--policies", required=True, help="comma-separated policies, each optionally POLICY@PREDICTOR; "
                   "'all': every registered policy with its default predictor")
    p.add_argument("--baseline", default=None, help="policy the throughput ratios refer to (default on-demand)")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a config field (repeatable)")
    p.add_argument("--out", help="folder for compare.csv and compare.md (default runs/compare-CONFIG-TIMESTAMP)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    entries = parse_entries(args.policies)
    base = load_run_config(args.config, args.set or [], POLICIES.names(), PREDICTORS.names())
    for policy, predictor in entries:  # every variant must be valid before anything runs or is written
        variant(base, policy, predictor)
    out = Path(args.out) if args.out else Path("runs") / f"compare-{Path(args.config).stem}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    rows = compare(base, entries, args.baseline, log=lambda m: print(m, file=sys.stderr))
    baseline = args.baseline or ("on-demand" if any(p == "on-demand" for p, _ in entries) else entries[0][0])
    w = base.workload
    title = (f"{base.model.name} on {base.hardware.name}, batch {w.batch_size} ({w.batching}), trace "
             f"{Path(w.trace).name}, slots HPC {base.cache.hpc_slots} + MPC {base.cache.mpc_slots}, "
             f"{base.cache.lpc_buffers} working buffers")
    md = table_markdown(rows, baseline, title)
    atomic_write_bytes(out / "compare.csv", table_csv(rows).encode())
    atomic_write_bytes(out / "compare.md", md.encode())
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(md)
        print(f"written: {out}/compare.csv, {out}/compare.md")
    return 0
