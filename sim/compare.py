"""`python -m sim compare CONFIG --policies a,b,c [--baseline NAME]`: the same workload under several policies.

Each entry of ``--policies`` is a policy name, optionally with a predictor: ``pregated@oracle``,
``moe-infinity@moe-infinity``; without one the config's predictor is used. ``all`` stands for every registered
policy in the order of :func:`all_entries`, each with the same predictor, the config's, so that the rows differ by
their policy alone; ``--own-predictors`` gives each instead the predictor its design pairs it with
(:func:`default_predictor`: MoE-Infinity its own, Pre-gated and the Diff-MoE tiers the oracle pre-gate, as
``benchmarks/policy_study.py`` runs them). A policy that never reads the predictor's guesses (``uses_predictor``:
gpu-only, on-demand, prefetch-all, fiddler, ktransformers, hybrid-cache without ``max_prefetch``) runs with ``none``
and the table shows no predictor for it ("-"; the CSV's ``uses_predictor`` is False). A policy other than the
config's starts from empty params (the config's ``policy.params`` belong to its own policy); ``--set`` applies to
every run. The table gives each policy's origin (:func:`origin_of`: ceiling, baseline, published, ours or bound),
throughput, its ratio to the baseline, iteration latency, hit rates, the share of expert accesses computed on the
host CPU (``cpu_expert_frac``), PCIe traffic, stall time, and the gap between each policy's cache hits (HPC + MPC)
and the Belady bound: the cache hits of an offline optimal cache with the same slots per layer (HPC + MPC), over the
same accesses, which no policy can beat in cache hits. It bounds cache hits only: experts prefetched into working
buffers (LPC) hit on top of it, so a policy's hit rate (all tiers) may exceed it; a line under the table says so.
Every row names its predictor; one line under the table says which predictor the rows that named none ran with
(:func:`predictor_note`), so that a config's predictor (the oracle, say) never reaches a row unsaid. Figures are
shown to 4 significant digits, so a tiny model's 0.0123 ms reads as such and not as 0.0.

A variant whose dense weights, KV cache and experts (its tiers, or every expert for gpu-only) do not fit in the
GPU's memory is not run: its row says ``does not fit (X GB > Y GB)`` instead of a throughput (the ``status``
column; ``ok`` for the others), and the others run. When no entry fits, the command exits 2 with the memory table.

Before any policy runs: each ``--policies`` entry names a known policy (and predictor, after ``@``), none twice
(``all`` counts as each of its entries, and ``lru`` equals ``lru@P`` when P is the config's predictor), ``--baseline``
is among them, every variant is a valid config, and ``--out`` (with compare.csv and compare.md in it) can be written:
a FIFO, a device or a file where the folder goes is refused. Each problem is one line, exit 2; a message listing the
known names shows the first few and their count.
"""

from __future__ import annotations

import copy
import csv
import datetime as dt
import io
import json
import math
import sys
from pathlib import Path

from moebase.errors import ConfigError
from moebase.outputs import check_not_input
from sim.config.memory import DoesNotFit
from sim.config.run_config import RunConfig, config_from_dict, load_run_config
from sim.policies import POLICIES, is_ceiling
from sim.predictors import PREDICTORS
from sim.results import hardware_words
from sim.run import cached_layers, simulate
from traces.io import atomic_write_bytes, check_output_file, check_output_folder, load_trace

COLUMNS = [
    "policy",
    "predictor",
    "uses_predictor",
    "origin",
    "status",
    "throughput_tok_s",
    "ratio_vs_baseline",
    "iteration_ms_mean",
    "iteration_ms_p99",
    "hit_rate",
    "cache_hit_rate",
    "prefetch_hit_rate",
    "cpu_expert_frac",
    "pcie_gb",
    "stall_s",
    "link_busy_frac",
    "prefetch_precision",
    "prefetch_recall",
    "belady_cache_hit_rate",
    "gap_to_belady",
]


#: Where a policy comes from, in the order ``--policies all`` runs them: the hypothetical ceiling (every expert
#: resident), baselines that cache nothing, published caching policies, this project's own, and the offline bound.
ORIGINS = ("ceiling", "baseline", "published", "ours", "bound")

#: Order within an origin under ``--policies all`` (the policy study's); others follow by name.
STUDY_ORDER = (
    "gpu-only",
    "on-demand",
    "prefetch-all",
    "pregated",
    "lru",
    "lfu",
    "moe-infinity",
    "diffmoe",
    "diffmoe-arc",
    "lookahead",
    "belady",
)


def origin_of(policy_class) -> str | None:
    """The origin a policy's module declares (its class, or its registered name): ``Policy.origin``."""
    cls = POLICIES.get(policy_class) if isinstance(policy_class, str) else policy_class
    return getattr(cls, "origin", None)


def default_predictor(policy: str) -> str | None:
    """The predictor ``policy``'s design pairs it with, which ``--policies all --own-predictors`` gives it
    (``Policy.default_predictor``; None: the config's)."""
    return getattr(POLICIES.get(policy), "default_predictor", None)


def reads_predictions(policy: str, params: dict) -> bool:
    """Whether ``policy`` with these checked params reads the predictor's guesses (``Policy.reads_predictions``)."""
    return bool(POLICIES.get(policy).reads_predictions(params))


def all_entries() -> list[tuple[str, str | None]]:
    """Every registered policy with its own predictor (:func:`default_predictor`), by origin (``ORIGINS``), then the
    study's order, then name."""

    def key(name):
        origin = origin_of(name)
        rank = ORIGINS.index(origin) if origin in ORIGINS else len(ORIGINS)
        return rank, STUDY_ORDER.index(name) if name in STUDY_ORDER else len(STUDY_ORDER), name

    return [(name, default_predictor(name)) for name in sorted(POLICIES.names(), key=key)]


def choices(names, shown: int = 8) -> str:
    """A bounded list of the known names for a message: the first ``shown`` and how many more."""
    names = list(names)
    more = f", ... ({len(names)} in all)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _name_text(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"


def parse_entries(text: str, shared: bool = False, own_predictors: bool = False) -> list[tuple[str, str | None]]:
    """``a,b@p`` -> [(a, None), (b, p)], checking the names; ``all`` -> every policy of :func:`all_entries`, each
    with no predictor of its own (the config's, the same for all), or with ``own_predictors`` with its own (with
    ``shared``: those that manage a cache shared by all layers, ``Policy.supports_shared``). An empty entry,
    ``lru@`` or ``@oracle``, an unknown name, or an entry given twice (``all`` counts as each of its entries) is a
    ConfigError naming ``--policies``, before anything runs."""
    return [entry for entry, _ in _parsed_entries(text, shared, own_predictors)]


def _parsed_entries(text: str, shared: bool, own_predictors: bool) -> list[tuple[tuple[str, str | None], str]]:
    """:func:`parse_entries`, each entry with the item of ``--policies`` it came from (``all`` for its own)."""
    entries: list[tuple[tuple[str, str | None], str]] = []
    given: dict[tuple[str, str | None], str] = {}

    def add(entry: tuple[str, str | None], item: str) -> None:
        if entry in given:
            raise ConfigError("--policies", _twice(entry, item, given[entry]))
        given[entry] = item
        entries.append((entry, item))

    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise ConfigError(
            "--policies", "give at least one policy (POLICY or POLICY@PREDICTOR, comma-separated, or all)"
        )
    for item in items:
        if not item:
            raise ConfigError("--policies", "an empty entry (two commas, or one at an end)")
        if item == "all":
            for name, own in all_entries():
                if not shared or POLICIES.get(name).supports_shared:
                    add((name, own if own_predictors else None), "all")
            continue
        add(_entry(item), item)
    return entries


def _shared_only(parsed: list[tuple[tuple[str, str | None], str]]) -> list[tuple[str, str | None]]:
    """The entries of a parse without ``shared`` that a shared cache keeps: those ``all`` brought in that manage a
    cache shared by all layers, and every one named (the same as :func:`parse_entries` with ``shared``, once the
    parse without it has passed its checks)."""
    return [entry for entry, item in parsed if item != "all" or POLICIES.get(entry[0]).supports_shared]


def _entry(item: str) -> tuple[str, str | None]:
    """One ``POLICY`` or ``POLICY@PREDICTOR``, both names known."""
    policy, at, predictor = item.partition("@")
    policy, predictor = policy.strip(), predictor.strip()
    if not policy:
        raise ConfigError("--policies", f"{_name_text(item)}: no policy before '@'")
    if at and not predictor:
        raise ConfigError(
            "--policies", f"{_name_text(item)}: no predictor after '@' (leave out the '@' to use the config's)"
        )
    if policy not in POLICIES:
        raise ConfigError("--policies", f"unknown policy {_name_text(policy)} (known: {choices(POLICIES.names())})")
    if at and predictor not in PREDICTORS:
        raise ConfigError(
            "--policies",
            f"unknown predictor {_name_text(predictor)} in {_name_text(item)} (known: {choices(PREDICTORS.names())})",
        )
    return policy, predictor or None


def _twice(entry: tuple[str, str | None], item: str, first: str) -> str:
    what = entry[0] if entry[1] is None else f"{entry[0]}@{entry[1]}"
    where = "is listed twice" if item == first else f"is listed twice ({first} and {item})"
    return f"{_name_text(what)} {where}: each policy (and predictor) runs once"


def check_baseline(baseline: str | None, entries: list[tuple[str, str | None]]) -> str:
    """The policy the ratios refer to: ``baseline`` when it is among ``entries`` (else a ConfigError naming
    ``--baseline``, before anything runs), by default on-demand when compared, else the first policy."""
    names = list(dict.fromkeys(p for p, _ in entries))
    if baseline is None:
        return "on-demand" if "on-demand" in names else names[0]
    if baseline not in names:
        raise ConfigError(
            "--baseline", f"{_name_text(str(baseline))} is not among the compared policies ({choices(names)})"
        )
    return baseline


def variant(base: RunConfig, policy: str, predictor: str | None) -> RunConfig:
    """The base config with another policy (and predictor), params reset where the part changes: an entry naming
    the config's own predictor (``lru@transition`` on a config whose predictor is transition) keeps its params. An
    entry without a predictor whose policy never reads one runs with ``none``. DoesNotFit when the variant does not
    fit in the GPU's memory (:func:`load_variant` keeps it as a row)."""
    d = copy.deepcopy(base.resolved)
    params = base.policy.params
    if policy != base.policy.name:
        d["policy"] = {"name": policy, "params": {}}
        params = POLICIES.get(policy).check_params({})
    if predictor is None and not reads_predictions(policy, params):
        predictor = "none"
    if predictor is not None and predictor != base.predictor.name:
        d["predictor"] = {"name": predictor, "params": {}}
    return config_from_dict(d, base.source, POLICIES.names(), PREDICTORS.names())


def load_variant(base: RunConfig, policy: str, predictor: str | None) -> tuple[RunConfig, DoesNotFit | None]:
    """:func:`variant`, and None; or, for a variant that does not fit in the GPU's memory, the config as loaded but
    for that check and the DoesNotFit that says by how much (any other bad config is raised)."""
    try:
        return variant(base, policy, predictor), None
    except DoesNotFit as exc:
        return exc.config, exc


def describe_predictor(part) -> str:
    """A predictor as a config names it (a :class:`sim.config.run_config.NamedConfig`): its name and its params that
    hold a value (defaults included, nulls left out), ``transition (train: other-requests)``."""
    given = [f"{k}: {v}" for k, v in part.params.items() if v is not None]
    return part.name + (f" ({', '.join(given)})" if given else "")


def config_predictor_note(base: RunConfig, entries: list[tuple[str, str | None]]) -> str | None:
    """One line naming the policies that read a predictor and ran with the config's because their entry named none
    (None when there are none)."""
    names = [p for p, predictor in entries if predictor is None and _reads(base, p)]
    if not names:
        return None
    what = _predictor_words(base)
    if base.predictor.name == "none":
        return f"{', '.join(names)} ran with the config's predictor {what}"
    return f"{', '.join(names)} ran with the config's predictor {what}; give {names[0]}@none to run without prediction"


def predictor_note(base: RunConfig, entries: list[tuple[str, str | None]], same_for_all: bool) -> str | None:
    """The one line under the table on predictors. ``same_for_all`` (``--policies all`` without
    ``--own-predictors``): every policy that reads a predictor ran with the same one, the config's; "-" marks those
    that never read one; and the flag that gives each its own, with those it would give. Otherwise
    :func:`config_predictor_note`."""
    if not same_for_all:
        return config_predictor_note(base, entries)
    own = [
        f"{p}@{d}"
        for p, d in all_entries()
        if d is not None and d != base.predictor.name and reads_predictions(p, POLICIES.get(p).check_params({}))
    ]
    mine = f" ({', '.join(own)})" if own else ""
    return (
        f"every policy that reads a predictor ran with the same one, the config's predictor {_predictor_words(base)}; "
        f"-: the policy never reads one; --own-predictors gives each the predictor its design pairs it with{mine}"
    )


def _predictor_words(base: RunConfig) -> str:
    what = describe_predictor(base.predictor)
    if base.predictor.name == "oracle":
        what += ", perfect knowledge of the next layer's experts"
    if base.predictor.name == "none":
        what += " (no prediction)"
    return what


def _reads(base: RunConfig, policy: str) -> bool:
    """Whether ``policy``, as a variant of ``base`` runs it, reads the predictor's guesses."""
    params = base.policy.params if policy == base.policy.name else POLICIES.get(policy).check_params({})
    return reads_predictions(policy, params)


#: The line under the table that says what the Belady bound covers.
BELADY_NOTE = (
    "hit rate = prefetched (LPC) + cache hits (HPC + MPC), over every expert access; Belady: the cache hits of an "
    "offline optimal cache with the same slots over the same accesses, the bound on cache hits (prefetched hits "
    "come on top, so hit rate may exceed it); gap = Belady - cache hits"
)


def belady_cache_hit_rate(cfg: RunConfig, trace) -> float | None:
    """Hit rate of an offline optimal cache of the config's organization and size: HPC + MPC slots per cached
    layer, or ``shared_slots`` shared by all cached layers (None when the bound is not available)."""
    try:
        from sim.policies.belady import belady_bound, belady_bound_shared
    except ImportError:
        return None
    from sim.core.workload import build_iterations

    w = cfg.workload
    iterations, _ = build_iterations(
        trace, w.batch_size, w.batching, w.max_decode_tokens, w.prefill, w.requests, w.context_tokens, cfg.system.ubatch
    )
    cached = cached_layers(trace, cfg.cache.layers)
    if cfg.cache.organization == "shared":
        out = belady_bound_shared(trace, iterations, cfg.cache.total_slots(len(cached)), cached)
    else:
        out = belady_bound(trace, iterations, cfg.cache.hpc_slots + cfg.cache.mpc_slots, cached)
    return out["hit_rate"]


def compare(
    base: RunConfig, entries: list[tuple[str, str | None]], baseline: str | None = None, log=None
) -> list[dict]:
    """One row per entry (see COLUMNS)."""
    baseline = check_baseline(baseline, entries)  # before any policy runs
    trace = load_trace(base.workload.trace)
    bound = belady_cache_hit_rate(base, trace)
    return compare_variants(base, load_variants(base, entries), baseline, trace, bound, log)


#: A compared variant: its policy, its config (as loaded, for one that does not fit) and its DoesNotFit or None.
Variant = tuple[str, RunConfig, DoesNotFit | None]


def load_variants(base: RunConfig, entries: list[tuple[str, str | None]]) -> list[Variant]:
    """Each entry's variant of ``base``, built and checked once (:func:`load_variant`)."""
    return [(policy, *load_variant(base, policy, predictor)) for policy, predictor in entries]


def compare_variants(
    base: RunConfig, loaded: list[Variant], baseline: str, trace, bound: float | None, log=None
) -> list[dict]:
    """One row per variant (see COLUMNS), from variants already built (:func:`load_variants`): ``baseline`` a
    checked policy among them (:func:`check_baseline`), ``trace`` the base config's, ``bound`` its Belady cache hit
    rate (:func:`belady_cache_hit_rate`)."""
    rows = []
    misfits = [m for _, _, m in loaded if m is not None]
    if misfits and len(misfits) == len(loaded):
        raise misfits[0]  # nothing to compare: the memory table of the first, exit 2
    for policy, cfg, misfit in loaded:
        uses = reads_predictions(policy, cfg.policy.params)
        if misfit is not None:
            if log:
                log(f"  {policy}: {misfit.short()}, not run")
            rows.append(misfit_row(policy, cfg.predictor.name, uses, misfit))
            continue
        if log:
            log(f"  {policy} (predictor {cfg.predictor.name}) ...")
        s = simulate(cfg, trace=trace).summary
        hr = s["hit_rate"]
        cache_hits = None if hr["hpc"] is None else hr["hpc"] + hr["mpc"]
        rows.append(
            {
                "policy": policy,
                "predictor": cfg.predictor.name,
                "uses_predictor": uses,
                "origin": origin_of(policy),
                "status": "ok",
                "throughput_tok_s": s["throughput_tok_s"],
                "ratio_vs_baseline": None,
                "iteration_ms_mean": s["iteration_ms"]["mean"],
                "iteration_ms_p99": s["iteration_ms"]["p99"],
                "hit_rate": hr["overall"],
                "cache_hit_rate": cache_hits,
                "prefetch_hit_rate": hr["lpc"],
                "cpu_expert_frac": s.get("cpu_expert_frac"),
                "pcie_gb": s["pcie_bytes"] / 1e9,
                "stall_s": s["stall_ms"] / 1e3,
                "link_busy_frac": s["link_busy_frac"],
                "prefetch_precision": s["prefetch"]["precision"],
                "prefetch_recall": s["prefetch"]["recall"],
                # gpu-only keeps every expert, so the bound at the configured slots does not apply to it
                "belady_cache_hit_rate": None if is_ceiling(policy) else bound,
                "gap_to_belady": None
                if bound is None or cache_hits is None or is_ceiling(policy)
                else bound - cache_hits,
            }
        )
    names = [r["policy"] for r in rows]
    ref = rows[names.index(baseline)]["throughput_tok_s"]
    for r in rows:
        r["ratio_vs_baseline"] = r["throughput_tok_s"] / ref if ref and r["throughput_tok_s"] is not None else None
    return rows


def misfit_row(policy: str, predictor: str, uses: bool, misfit: DoesNotFit) -> dict:
    """The row of a variant that does not fit in the GPU's memory: its ``status`` says by how much, no figures."""
    row: dict = dict.fromkeys(COLUMNS)
    row.update(policy=policy, predictor=predictor, uses_predictor=uses, origin=origin_of(policy))
    row["status"] = misfit.short()
    return row


def _fmt(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


def significant(v, digits: int = 4) -> str:
    """``v`` to ``digits`` significant digits, never in exponent form, with thousands separators: ``450.0``,
    ``0.01234``, ``9,192``; whole from ``10**digits`` up; ``-`` for none."""
    if v is None:
        return "-"
    v = float(v)
    if v == 0 or v != v or abs(v) == float("inf"):
        return format(v, "g")
    decimals = max(0, min(12, digits - 1 - math.floor(math.log10(abs(v)))))
    return f"{v:,.{decimals}f}"


def table_markdown(rows: list[dict], baseline: str, title: str, note: str | None = None) -> str:
    """The table, with ``note`` (the predictors' line) and the line on what the Belady bound covers under it.
    Throughput, latency, traffic and stall time to 4 significant digits; a variant that does not fit shows
    ``does not fit (X GB > Y GB)`` in place of its throughput."""
    head = [
        "policy",
        "predictor",
        "origin",
        "tokens/s",
        f"x {baseline}",
        "iter ms (mean)",
        "hit rate",
        "prefetched",
        "cache hits",
        "Belady (cache hits)",
        "gap",
        "cpu_expert_frac",
        "PCIe GB",
        "stall s",
    ]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        fits = r.get("status") in (None, "ok")
        lines.append(
            "| "
            + " | ".join(
                [
                    r["policy"],
                    r["predictor"] if r.get("uses_predictor", True) else "-",
                    r["origin"] or "-",
                    significant(r["throughput_tok_s"]) if fits else str(r["status"]),
                    significant(r["ratio_vs_baseline"], 3),
                    significant(r["iteration_ms_mean"]),
                    _fmt(r["hit_rate"]),
                    _fmt(r["prefetch_hit_rate"]),
                    _fmt(r["cache_hit_rate"]),
                    _fmt(r["belady_cache_hit_rate"]),
                    _fmt(r["gap_to_belady"], "+.3f"),
                    _fmt(r.get("cpu_expert_frac")),
                    significant(r["pcie_gb"]),
                    significant(r["stall_s"]),
                ]
            )
            + " |"
        )
    lines += [""] + ([note] if note else []) + [BELADY_NOTE]
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
    p.add_argument(
        "config",
        help="run config (YAML) whose workload, model, hardware and cache every policy runs "
        "on; its predictor serves each entry without @PREDICTOR (said under the table)",
    )
    p.add_argument(
        "--policies",
        required=True,
        help="comma-separated policies, each optionally POLICY@PREDICTOR "
        "(without one: the config's predictor); 'all': every registered policy, each with the config's predictor "
        "(a policy that never reads one with none)",
    )
    p.add_argument(
        "--own-predictors",
        action="store_true",
        help="with 'all': each policy with the predictor its design pairs it with (pregated and diffmoe the "
        "oracle, moe-infinity its own, ...: python -m sim policies lists them) instead of the same one for all",
    )
    p.add_argument("--baseline", default=None, help="policy the throughput ratios refer to (default on-demand)")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a config field (repeatable)")
    p.add_argument("--out", help="folder for compare.csv and compare.md (default runs/compare-CONFIG-TIMESTAMP)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.out is not None:
        check_output_folder(args.out, "results folder (--out)")
    own = bool(getattr(args, "own_predictors", False))
    parsed = _parsed_entries(args.policies, False, own)  # the names, before the config is read
    entries_given = [entry for entry, _ in parsed]
    baseline = check_baseline(args.baseline, entries_given)
    base = _base_config(args, parsed)
    shared = base.cache.organization == "shared"
    entries = _shared_only(parsed) if shared else entries_given
    with_all = any(item == "all" for _, item in parsed)
    if own and not with_all:
        raise ConfigError("--own-predictors", "applies to --policies all (give POLICY@PREDICTOR for one policy)")
    if shared and with_all:
        left = sorted(set(POLICIES.names()) - {p for p, _ in entries})
        print(
            f"cache.organization: shared: leaving out the policies that manage per-layer slots only: {choices(left)}",
            file=sys.stderr,
        )
    if entries != entries_given:  # a shared cache left some out: the baseline must be among the others
        baseline = check_baseline(args.baseline, entries)
    loaded = _check_variants(base, entries)
    out = Path(args.out) if args.out is not None else default_out(args.config)
    check_output_folder(out, "results folder (--out)")
    for name in OUTPUT_FILES:
        check_output_file(out / name, "comparison")
        check_not_input(out / name, [args.config])
    w = base.workload
    trace = load_trace(w.trace)
    rows = compare_variants(
        base, loaded, baseline, trace, belady_cache_hit_rate(base, trace), log=lambda m: print(m, file=sys.stderr)
    )
    n_cached = len(cached_layers(trace, base.cache.layers))
    slots = (
        f"one cache of {base.cache.total_slots(n_cached)} experts shared by {n_cached} layers"
        if shared
        else f"slots HPC {base.cache.hpc_slots} + MPC {base.cache.mpc_slots}"
    )
    hardware = hardware_words({"hardware": base.hardware.name, "hardware_source": base.hardware.source})
    title = (
        f"{base.model.name} on {hardware}, batch {w.batch_size} ({w.batching}), trace "
        f"{Path(w.trace).name}, {slots}, {base.cache.lpc_buffers} working buffers"
    )
    note = predictor_note(base, entries, with_all and not own)
    md = table_markdown(rows, baseline, title, note)
    atomic_write_bytes(out / "compare.csv", table_csv(rows).encode())
    atomic_write_bytes(out / "compare.md", md.encode())
    if args.json:
        print(json.dumps(rows, indent=1))
        if note:
            print(note, file=sys.stderr)
    else:
        print(md)
        print(f"written: {out}/compare.csv, {out}/compare.md")
    return 0


OUTPUT_FILES = ("compare.csv", "compare.md")


def default_out(config: str) -> Path:
    """``runs/compare-CONFIG-TIMESTAMP``, CONFIG the config file's name made plain (inside ``runs/``)."""
    from sim.sweep.spec import safe_name

    stem = safe_name(Path(str(config)).stem, "config")[:80]
    return Path("runs") / f"compare-{stem}-{dt.datetime.now():%Y%m%d-%H%M%S}"


def _base_config(args, parsed: list[tuple[tuple[str, str | None], str]]) -> RunConfig:
    """The config the policies are compared on (with ``--set``; ``parsed``: the entries of ``--policies``,
    :func:`_parsed_entries`). A config whose own policy does not fit in the GPU's memory still serves as the base:
    each compared variant is checked on its own."""
    sets = list(args.set or [])
    try:
        return _loaded(args.config, sets)
    except ConfigError as exc:
        if exc.field != "cache.organization":
            raise
        # the config's own policy manages per-layer slots only: the compared policies replace it anyway
        first = next((p for p, _ in _shared_only(parsed) if POLICIES.get(p).supports_shared), None)
        if first is None:
            raise
        return _loaded(args.config, sets + [f"policy.name={first}", "policy.params={}"])


def _loaded(config: str, sets: list[str]) -> RunConfig:
    """The run config with ``sets``, whether or not it fits in the GPU's memory."""
    try:
        return load_run_config(config, sets, POLICIES.names(), PREDICTORS.names())
    except DoesNotFit as exc:
        return exc.config


def _check_variants(base: RunConfig, entries: list[tuple[str, str | None]]) -> list[Variant]:
    """The variants, each built once (:func:`load_variant`): every one a valid config, and no two running the same
    policy with the same predictor (``lru`` and ``lru@oracle`` where the config's predictor is oracle), before
    anything runs or is written."""
    seen: dict[tuple[str, str], str] = {}
    loaded: list[Variant] = []
    for policy, predictor in entries:
        cfg, misfit = load_variant(base, policy, predictor)
        loaded.append((policy, cfg, misfit))
        key = (policy, cfg.predictor.name)
        given = policy if predictor is None else f"{policy}@{predictor}"
        if key in seen:
            raise ConfigError(
                "--policies",
                f"{seen[key]} and {given} run the same policy with the same predictor ({cfg.predictor.name})",
            )
        seen[key] = given
    return loaded
