"""Experts on the host CPU against experts cached on the GPU: tokens/s against batch size for Mixtral-8x7B,
gpt-oss-120b, DeepSeek-V3 and Qwen3.5-35B-A3B (real routing), on an H200 server and on a 24 GB consumer GPU (RTX
4090) where the model fits; writes `docs/hybrid_study.md` (tables, the commands, crossover points) and one log-log
plot per model x hardware under `docs/hybrid_study/`.

    python benchmarks/hybrid_study.py [--jobs 8] [--out runs/hybrid_study] [--doc docs/hybrid_study.md]
                                      [--setups KEY,KEY] [--batches 1,2,4] [--hybrid NAME] [--quick]
                                      [--no-extend]

Policies: the GPU-cache ones (on-demand, lru, diffmoe, and belady as the offline reference), then the CPU-using
ones (fiddler, ktransformers and this project's hybrid); each only if registered in ``sim.policies.POLICIES``
(missing ones are printed and named in the document). The hybrid is found as the registered policy of origin
``ours`` that is neither an older GPU-cache policy nor fiddler/ktransformers (``--hybrid NAME`` names it instead).
Each (model x hardware, batch) cell is one ``sim compare`` run (``sim.compare.compare``) in a worker process.
Batches 512-4096 extend the study past 256 (re-used requests) to reach the crossovers; ``--no-extend`` leaves
them out. ``--quick``: batches 1 and 4, a few requests of 4 decode tokens (a smoke run; the figures are not the
study's).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_BATCHES = (1, 4)
#: beyond the study's 256, to find crossovers the cost model puts at larger batches (requests re-used: see the doc)
EXTENDED = (512, 1024, 2048, 4096)
GPU_POLICIES = ("on-demand", "lru", "diffmoe", "belady")  # belady: the offline reference, not a contender
ONLINE_GPU = ("on-demand", "lru", "diffmoe")  # "best GPU-cache policy" is the best of these
CPU_POLICIES = ("fiddler", "ktransformers")
#: policies registered before the CPU-using ones (none of them computes on the CPU): not candidates for "our hybrid"
OLDER = {
    "arc",
    "belady",
    "diffmoe",
    "diffmoe-arc",
    "gpu-only",
    "learned-rf",
    "least-stale",
    "lfu",
    "lru",
    "moe-infinity",
    "next-use-odds",
    "on-demand",
    "prefetch-all",
    "pregated",
    "reuse-distance",
    "s3fifo",
}
SHRINK = (64, 32, 16, 8)  # decode tokens per request tried for an extended batch whose KV cache does not fit
KV_RE = re.compile(r"([\d.]+ GB of KV cache)")
MIN_REQUESTS = 32  # requests served at small batches (more steps to average over)


class Setup:
    """One model on one hardware profile: a run config and what its workload is."""

    def __init__(self, key, model, hardware, config, trace_requests, what, sets=()):
        self.key, self.model, self.hardware, self.config = key, model, hardware, config
        self.trace_requests, self.what = trace_requests, what
        self.sets = list(sets)  # overrides of every cell of this setup (before the batch's own)

    @property
    def title(self) -> str:
        return f"{self.model} on {self.hardware}"


SETUPS = [
    Setup(
        "mixtral_h200",
        "Mixtral-8x7B",
        "H200",
        "configs/mixtral.yaml",
        128,
        "the bundled trace fitted to real Mixtral-8x7B-Instruct routing (128 requests, up to 128 decode tokens "
        "each); 1 + 2 of 8 experts per layer cached (configs/mixtral.yaml)",
    ),
    Setup(
        "mixtral_rtx4090",
        "Mixtral-8x7B",
        "RTX 4090",
        "configs/mixtral_rtx4090.yaml",
        128,
        "the same trace; 1 of 8 experts per layer cached (all that fits 24 GB: configs/mixtral_rtx4090.yaml)",
    ),
    Setup(
        "gpt_oss_120b_h200",
        "gpt-oss-120b",
        "H200",
        "configs/gpt_oss_120b.yaml",
        256,
        "the bundled synthetic trace (256 requests x 32 decode tokens, fitted to the real Qwen3.5-35B-A3B "
        "routing and reshaped to 128 experts, top-4: traces/data/README.md); 4 + 28 of 128 experts per layer "
        "cached (an offloading choice: the whole model would fit)",
    ),
    Setup(
        "gpt_oss_120b_rtx4090",
        "gpt-oss-120b",
        "RTX 4090",
        "configs/gpt_oss_120b_rtx4090.yaml",
        256,
        "the same trace; 4 + 28 of 128 experts per layer cached (what fits 24 GB)",
    ),
    Setup(
        "deepseek_v3_h200",
        "DeepSeek-V3",
        "H200",
        "configs/deepseek_v3.yaml",
        256,
        "the bundled synthetic trace (256 requests x 12 decode tokens, fitted to the real Qwen3.5-35B-A3B "
        "routing, same 256 experts and top-8, layers stretched 40 to 58: traces/data/README.md); 4 + 28 of 256 "
        "experts per layer cached (what fits beside 44 GB of dense weights)",
    ),
    Setup(
        "qwen3_5_35b_a3b_h200",
        "Qwen3.5-35B-A3B",
        "H200",
        "configs/qwen3_5_35b_a3b.yaml",
        12,
        "the real routing of 12 requests (traces/data/qwen3_5_35b_a3b.npz, logged at batch 1), their prompts "
        "prefilled (24-145 tokens) and at most 32 decode tokens each (`workload.max_decode_tokens=32`, for the "
        "study's run time, like the other setups' 12-32); 4 + 60 of 256 experts per layer cached "
        "(configs/qwen3_5_35b_a3b.yaml: an offloading choice, the whole model would fit)",
        sets=["workload.max_decode_tokens=32"],
    ),
    Setup(
        "qwen3_5_35b_a3b_rtx4090",
        "Qwen3.5-35B-A3B",
        "RTX 4090",
        "configs/qwen3_5_35b_a3b_rtx4090.yaml",
        12,
        "the same requests; 4 + 52 of 256 experts per layer cached (what fits 24 GB beside the KV cache: "
        "configs/qwen3_5_35b_a3b_rtx4090.yaml)",
        sets=["workload.max_decode_tokens=32"],
    ),
]

NOT_FITTING = (
    "DeepSeek-V3 is not studied on the RTX 4090: its dense part alone (attention, 3 dense FFN blocks, "
    "the shared experts and embeddings) is 44.1 GB at bf16, and still 22.1 GB with FP8 dense weights "
    "(`--set model.dtype_bytes=1`), against 22 GB usable (24 GB less 2 GB reserved). The same holds for "
    "Kimi K2 (27.7 GB at bf16)."
)


def find_policies(hybrid: str | None) -> tuple[list[str], list[str], list[str]]:
    """(GPU-cache policies, CPU-using policies, missing names), in the study's order, registered ones only."""
    from sim.compare import origin_of
    from sim.policies import POLICIES

    names = set(POLICIES.names())
    if hybrid is None:
        new = sorted(names - OLDER - set(CPU_POLICIES))
        hybrid_names = [n for n in new if origin_of(n) == "ours"] or [
            n for n in new if origin_of(n) not in ("ceiling", "bound", "baseline")
        ]
    else:
        hybrid_names = [hybrid]
    wanted_cpu = list(CPU_POLICIES) + (hybrid_names or ["<our hybrid>"])
    gpu = [p for p in GPU_POLICIES if p in names]
    cpu = [p for p in wanted_cpu if p in names]
    missing = [p for p in list(GPU_POLICIES) + wanted_cpu if p not in names]
    return gpu, cpu, missing


def cell_sets(setup: Setup, batch: int, quick: bool) -> tuple[list[str], int, int]:
    """The ``--set`` overrides of one cell, the requests it serves and how many of them are distinct."""
    requests = max(4 if quick else MIN_REQUESTS, batch)
    sets = ["predictor.name=none", *setup.sets, f"workload.batch_size={batch}", f"workload.requests={requests}"]
    if quick:
        sets.append("workload.max_decode_tokens=4")
    return sets, requests, min(requests, setup.trace_requests)


def run_cell(
    config: str, sets: list[str], entries: list[tuple[str, str | None]], shrink: bool = False
) -> tuple[list[dict], float, str, int | None]:
    """``sim compare CONFIG --policies ... --set ...`` in this process: its rows, wall seconds, why there are
    none (a config the GPU-memory check refuses: an extended batch whose KV cache does not fit), and, with
    ``shrink``, the ``workload.max_decode_tokens`` (64, 32, 16 or 8) it took to fit such a batch (None: as given)."""
    from moebase.errors import ConfigError
    from sim.compare import compare
    from sim.config.run_config import load_run_config
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS

    t0 = time.perf_counter()
    tokens = None
    try:
        base = load_run_config(ROOT / config, sets, POLICIES.names(), PREDICTORS.names())
    except ConfigError as exc:
        base = None
        caps = [int(x.split("=", 1)[1]) for x in sets if x.startswith("workload.max_decode_tokens=")]
        for tokens in [n for n in SHRINK if not caps or n < caps[-1]] if shrink and "KV cache" in str(exc) else ():
            try:
                base = load_run_config(
                    ROOT / config, sets + [f"workload.max_decode_tokens={tokens}"], POLICIES.names(), PREDICTORS.names()
                )
                break
            except ConfigError:
                continue
        if base is None:
            return [], time.perf_counter() - t0, str(exc), None
    return compare(base, entries), time.perf_counter() - t0, "", tokens


def entries_for(policies: list[str]) -> list[tuple[str, str | None]]:
    """Each policy with its default predictor (the others with the study's ``predictor.name=none``)."""
    from sim.compare import default_predictor

    return [(p, default_predictor(p)) for p in policies]


def command(config: str, policies: list[str], sets: list[str]) -> str:
    return " ".join(["python -m sim compare", config, "--policies", ",".join(policies)] + [f"--set {s}" for s in sets])


def fmt(v, spec=".3f") -> str:
    return "-" if v in (None, "") else format(float(v), spec)


# ------------------------------------------------------------------------------------------------ analysis
def best_gpu(rows: list[dict]) -> dict | None:
    online = [r for r in rows if r["policy"] in ONLINE_GPU]
    return max(online, key=lambda r: r["throughput_tok_s"]) if online else None


def crossover(batches: list[int], ratio: dict[int, float]) -> str:
    """Where a CPU-using policy stops beating the best GPU-cache policy (``ratio`` = its tokens/s over the best
    one's, per batch): the first batch at which it no longer beats it, with the crossing interpolated in log-log
    between that batch and the one before."""
    bs = [b for b in batches if b in ratio and ratio[b] and ratio[b] > 0]
    if not bs:
        return "no data"
    wins = [ratio[b] > 1.0 for b in bs]
    if all(wins):
        return f"beats it at every batch measured (up to {bs[-1]}; x{ratio[bs[-1]]:.2f} there)"
    if not any(wins):
        return f"never beats it (x{max(ratio[b] for b in bs):.2f} at best)"
    first_loss = next(i for i, w in enumerate(wins) if not w)
    if first_loss == 0:
        later = [b for b, w in zip(bs, wins) if w]
        return f"loses at batch {bs[0]} already, beats it at batch {', '.join(map(str, later))}"
    lo, hi = bs[first_loss - 1], bs[first_loss]
    a, b = math.log(ratio[lo]), math.log(ratio[hi])
    at = math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * a / (a - b)) if a != b else hi
    text = f"beats it up to batch {lo}, not from batch {hi} on (crossing near batch {at:.0f})"
    again = [b2 for b2, w in zip(bs[first_loss:], wins[first_loss:]) if w]
    if again:
        text += f"; beats it again at batch {', '.join(map(str, again))}"
    return text


def break_even(config: str) -> tuple[int | None, float | None]:
    """From the cost model alone (``sim.costs.costs.CostModel``): the fewest tokens n for which computing an expert on
    the host CPU (``cpu_expert_s(n)`` + its activations both ways) is no faster than copying it and computing it on the
    GPU (``copy_s(expert_bytes) + expert_s(n)``): Fiddler's own rule. And the batch at which an average expert of
    a layer gets n tokens, when every expert is active: n * experts / top_k. (None, None) when the host stays
    faster up to 2^20 tokens."""
    from sim.config.run_config import load_run_config
    from sim.costs.costs import CostModel

    cfg = load_run_config(ROOT / config)
    c = CostModel(cfg.model, cfg.hardware)
    copy = c.copy_s(c.expert_bytes)

    def host_faster(n: int) -> bool:
        host = c.cpu_expert_s(n) + c.activation_copy_s(n, "d2h") + c.activation_copy_s(n, "h2d")
        return host < copy + c.expert_s(n)

    if not host_faster(1):
        return 1, cfg.model.num_experts / cfg.model.top_k
    lo, hi = 1, 2
    while host_faster(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 20:
            return None, None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if host_faster(mid) else (lo, mid)
    return hi, hi * cfg.model.num_experts / cfg.model.top_k


def table(rows_by_batch: dict[int, list[dict]], policies: list[str], extended=(), shrunk=None) -> str:
    head = ["batch"] + policies + ["best GPU-cache"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b, rows in rows_by_batch.items():
        by = {r["policy"]: r for r in rows}
        best = best_gpu(rows)
        cells = []
        for p in policies:
            r = by.get(p)
            cells.append("-" if r is None else fmt(r["throughput_tok_s"], ",.2f"))
        label = str(b) + ("*" if b in extended else "") + ("+" if shrunk and b in shrunk else "")
        lines.append("| " + " | ".join([label] + cells + [best["policy"] if best else "-"]) + " |")
    return "\n".join(lines)


def detail_table(rows: list[dict]) -> str:
    cpu_col = any("cpu_expert_frac" in r for r in rows)
    head = ["policy", "predictor", "origin", "tokens/s", "x on-demand", "cache hits", "PCIe GB", "link busy"] + (
        ["CPU experts"] if cpu_col else []
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r["policy"],
            r["predictor"],
            r["origin"] or "-",
            fmt(r["throughput_tok_s"], ",.2f"),
            fmt(r["ratio_vs_baseline"], ".2f"),
            fmt(r["cache_hit_rate"]),
            fmt(r["pcie_gb"], ",.1f"),
            fmt(r["link_busy_frac"], ".2f"),
        ]
        if cpu_col:
            cells.append(fmt(r.get("cpu_expert_frac")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ output
def atomic_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def plot(setup: Setup, rows_by_batch: dict[int, list[dict]], policies: list[str], path: Path, extended=()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    batches = list(rows_by_batch)
    markers = dict(zip(policies, "os^vDxP*h"))
    for p in policies:
        pts = [
            (b, r["throughput_tok_s"])
            for b in batches
            for r in rows_by_batch[b]
            if r["policy"] == p and r["throughput_tok_s"]
        ]
        if not pts:
            continue
        style = "--" if p == "belady" else ("-" if p in ONLINE_GPU else "-.")
        lw = 2.5 if p not in GPU_POLICIES and p not in CPU_POLICIES else 1.4
        ax.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            style,
            marker=markers.get(p, "o"),
            ms=4,
            mfc="none" if p == "fiddler" else None,
            lw=lw,
            label=p + (" (CPU)" if p not in GPU_POLICIES else ""),
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ext = [b for b in batches if b in extended]
    if ext and len(ext) < len(batches):
        edge = math.sqrt(max(b for b in batches if b not in extended) * min(ext))
        ax.axvline(edge, color="grey", lw=0.8, ls=":")
        ax.text(edge, 0.02, " extension ->", transform=ax.get_xaxis_transform(), fontsize=7, color="grey")
    ax.set_xticks(batches)
    ax.set_xticklabels([str(b) for b in batches])
    ax.minorticks_off()
    ax.set_xlabel("batch size (requests decoding together)")
    ax.set_ylabel("tokens / s (simulated)")
    ax.set_title(f"{setup.title}: tokens/s against batch size")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def write_csv(path: Path, cells: list[tuple[str, int, list[dict]]]) -> None:
    cols: list[str] = ["setup", "batch"]
    for _, _, rows in cells:
        for r in rows:
            cols += [k for k in r if k not in cols]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=cols, lineterminator="\n")
        wr.writeheader()
        for key, b, rows in cells:
            for r in rows:
                wr.writerow({"setup": key, "batch": b, **r})
    tmp.replace(path)


def rel(p: Path) -> str:
    p = p.resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "hybrid_study")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "hybrid_study.md")
    p.add_argument("--jobs", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 1)))
    p.add_argument(
        "--setups", default=None, help="comma-separated setup keys (default: all): " + ", ".join(s.key for s in SETUPS)
    )
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (default: 1,2,4,...,256)")
    p.add_argument("--hybrid", default=None, help="name of our hybrid policy (default: found in the registry)")
    p.add_argument("--quick", action="store_true", help="a smoke run: batches 1 and 4, 4 decode tokens")
    p.add_argument(
        "--no-extend",
        action="store_true",
        help=f"leave out the batches beyond 256 ({', '.join(map(str, EXTENDED))}; not with --quick or --batches)",
    )
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    setups = SETUPS
    if args.setups:
        keys = [k.strip() for k in args.setups.split(",") if k.strip()]
        unknown = [k for k in keys if k not in {s.key for s in SETUPS}]
        if unknown:
            p.error(f"unknown setup(s) {', '.join(unknown)} (known: {', '.join(s.key for s in SETUPS)})")
        setups = [s for s in SETUPS if s.key in keys]
    batches = (
        [int(x) for x in args.batches.split(",")] if args.batches else list(QUICK_BATCHES if args.quick else BATCHES)
    )
    batches += [] if args.batches or args.quick or args.no_extend else list(EXTENDED)
    extended = [b for b in batches if b > max(BATCHES)]
    gpu, cpu, missing = find_policies(args.hybrid)
    policies = gpu + cpu
    print(f"policies: {', '.join(policies)}", file=sys.stderr)
    if missing:
        print(f"not registered (left out): {', '.join(missing)}", file=sys.stderr)
    entries = entries_for(policies)
    jobs = []
    for s in setups:
        for b in batches:
            sets, requests, distinct = cell_sets(s, b, args.quick)
            jobs.append((s, b, sets, requests, distinct))
    results: dict[tuple[str, int], tuple[list[dict], float, str, int | None]] = {}
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {
            pool.submit(run_cell, s.config, sets, entries, b in extended): (s.key, b) for s, b, sets, _, _ in jobs
        }
        for i, fut in enumerate(as_completed(futures), 1):
            results[futures[fut]] = fut.result()
            rows, wall, why, shrunk = results[futures[fut]]
            best = best_gpu(rows)
            print(
                f"[{i}/{len(jobs)}] {futures[fut][0]} batch {futures[fut][1]}: {wall:.0f} s"
                + (f", not run: {why}" if why else "")
                + (f", at max_decode_tokens={shrunk} to fit" if shrunk else "")
                + (f", best GPU-cache {best['policy']} {best['throughput_tok_s']:,.1f} tok/s" if best else "")
                + f" ({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    write_csv(args.out / "hybrid_study.csv", [(s.key, b, results[(s.key, b)][0]) for s, b, *_ in jobs])
    fig_dir = args.doc.parent / "hybrid_study"
    parts = [header(policies, missing, args.quick)]
    summary = []
    for s in setups:
        rows_by_batch = {b: results[(s.key, b)][0] for b in batches if results[(s.key, b)][0]}
        refused = {b: results[(s.key, b)][2] for b in batches if not results[(s.key, b)][0]}
        png = fig_dir / f"{s.key}.png"
        plot(s, rows_by_batch, policies, png, extended)
        parts.append(f"## {s.title}\n\nWorkload: {s.what}.\n")
        parts.append(f"![{s.title}](hybrid_study/{png.name})\n")
        parts.append(
            "Tokens/s (simulated) per batch size; the last column names the best online GPU-cache policy "
            "(of " + ", ".join(p for p in ONLINE_GPU if p in gpu) + "):\n"
        )
        shrunk = {b: results[(s.key, b)][3] for b in rows_by_batch if results[(s.key, b)][3]}
        parts.append(table(rows_by_batch, policies, extended, shrunk) + "\n")
        if shrunk:
            parts.append(
                "Batches marked + serve shorter requests so that their KV cache fits the GPU: "
                + ", ".join(f"batch {b} at `workload.max_decode_tokens={n}`" for b, n in shrunk.items())
                + " (attention over shorter contexts; the experts' work per step is as before).\n"
            )
        if refused:
            parts.append(
                "Not run: "
                + ", ".join(
                    f"batch {b}" + (f" ({m.group(1)})" if (m := KV_RE.search(why)) else "")
                    for b, why in refused.items()
                )
                + ": the config's GPU-memory check refuses the batch (`sim run` says why).\n"
            )
        notes = [b for b in rows_by_batch if b > s.trace_requests]
        if notes:
            parts.append(
                f"The trace holds {s.trace_requests} distinct requests: batch{'es' if len(notes) > 1 else ''} "
                f"{', '.join(map(str, notes))} re-use{'' if len(notes) > 1 else 's'} them (copies of a "
                f"request route alike, which understates the experts a step needs).\n"
            )
        n_even, b_even = break_even(s.config)
        even = "host faster up to 2^20 tokens" if n_even is None else f"{n_even:,} tokens (batch ~{b_even:,.0f})"
        cross = []
        for c in cpu:
            ratio = {}
            for b in rows_by_batch:
                by = {r["policy"]: r for r in rows_by_batch[b]}
                best = best_gpu(rows_by_batch[b])
                if c in by and best and best["throughput_tok_s"]:
                    ratio[b] = by[c]["throughput_tok_s"] / best["throughput_tok_s"]
            text = crossover(list(rows_by_batch), ratio)
            cross.append(
                f"- **{c}** against the best GPU-cache policy: {text}; ratio per batch "
                + ", ".join(f"{b}: x{ratio[b]:.2f}" for b in rows_by_batch if b in ratio)
                + "."
            )
            summary.append(f"| {s.title} | {c} | {text} | {even} |")
        if cross:
            parts.append("Crossover (computed from the table above):\n\n" + "\n".join(cross) + "\n")
        else:
            parts.append("No CPU-using policy is registered: no crossover to compute.\n")
        shown = ["predictor.name=none", *s.sets, "workload.batch_size=B", "workload.requests=R"] + (
            ["workload.max_decode_tokens=4"] if args.quick else []
        )
        parts.append(
            f"Command per batch B (requests R = max({4 if args.quick else MIN_REQUESTS}, B)):\n\n"
            f"```sh\n{command(s.config, policies, shown)}\n```\n"
        )
        mid = [b for b in (1, 16, 256) if b in rows_by_batch]
        for b in mid:
            parts.append(
                f"<details><summary>Every column at batch {b}</summary>\n\n"
                f"{detail_table(rows_by_batch[b])}\n\n</details>\n"
            )
    parts.insert(1, headline(setups, results, batches, cpu))
    parts.insert(
        2,
        "## Crossover points\n\nThe batch size at which each CPU-using policy stops beating the best "
        "online GPU-cache policy (" + ", ".join(p for p in ONLINE_GPU if p in gpu) + "), from the "
        "tables below. The last column is where the cost model alone puts the break-even of one expert "
        "(Fiddler's "
        "rule: computing it on the host CPU, its activations crossing both ways, against copying it and "
        "computing it on the GPU): the tokens routed to it, and the batch at which an average expert of "
        "a layer gets that many (tokens x experts / top-k, every expert active): an estimate from the "
        "cost model, not a run. Batches above 256 (marked *) extend the study to reach the crossovers: "
        "their requests are re-used (copies of a request route alike), which leaves the active experts "
        "of a step as they are once every expert is active (Mixtral from batch ~64 on) and understates "
        "them otherwise; those marked + also serve shorter requests, so that the batch's KV cache fits "
        "the GPU (each section says how short).\n\n"
        "| model on hardware | policy | crossover (measured) | one expert's break-even (cost model) |\n"
        "|---|---|---|---|\n"
        + ("\n".join(summary) if summary else "| - | - | no CPU-using policy registered | - |")
        + "\n\n"
        + NOT_FITTING
        + "\n",
    )
    parts.insert(3, MOVED)
    parts.append(ASSUMPTIONS)
    parts.append(
        f"\nGenerated by `python benchmarks/hybrid_study.py{' --quick' if args.quick else ''}` in "
        f"{time.perf_counter() - t0:.0f} s ({args.jobs} processes); every row is in "
        f"`{rel(args.out)}/hybrid_study.csv`.\n"
    )
    atomic_text(args.doc, "\n".join(parts))
    print(f"wrote {args.doc} and {fig_dir}/*.png", file=sys.stderr)
    return 0


def headline(setups, results, batches, cpu) -> str:
    """Tokens/s of the best online GPU-cache policy and of each CPU-using policy at batch 1, 16 and 256."""
    at = [b for b in (1, 16, 256) if b in batches]
    head = ["model on hardware", "batch", "best GPU-cache"] + cpu
    lines = [
        "## Headline\n",
        "Tokens/s (simulated); in brackets, times the best online GPU-cache policy.\n",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for s in setups:
        for b in at:
            rows = results[(s.key, b)][0]
            best = best_gpu(rows)
            if not best:
                continue
            by = {r["policy"]: r for r in rows}
            ref = best["throughput_tok_s"]
            cells = [
                f"{by[c]['throughput_tok_s']:,.1f} (x{by[c]['throughput_tok_s'] / ref:.2f})" if c in by else "-"
                for c in cpu
            ]
            lines.append("| " + " | ".join([s.title, str(b), f"{best['policy']} {ref:,.1f}"] + cells) + " |")
    same = []
    if "fiddler" in cpu and "ktransformers" in cpu:
        for s in setups:
            both = [b for b in batches if results[(s.key, b)][0]]
            eq = [
                b
                for b in both
                if _tps(results[(s.key, b)][0], "fiddler")
                and abs(_tps(results[(s.key, b)][0], "fiddler") / _tps(results[(s.key, b)][0], "ktransformers") - 1)
                < 0.005
            ]
            same.append(f"{s.title} {len(eq)} of {len(both)}")
        lines.append(
            "\nFiddler and KTransformers give the same tokens/s (within 0.5%) at most batches ("
            + "; ".join(same)
            + "): below the break-even of the crossover table, Fiddler's rule sends every "
            "expert it does not pin to the host, which is KTransformers' placement."
        )
    return "\n".join(lines) + "\n"


def _tps(rows, policy):
    return next((r["throughput_tok_s"] for r in rows if r["policy"] == policy), None)


def header(policies: list[str], missing: list[str], quick: bool) -> str:
    text = """# Hybrid study: experts on the host CPU against experts cached on the GPU

Tokens/s against batch size for Mixtral-8x7B, gpt-oss-120b, DeepSeek-V3 and Qwen3.5-35B-A3B (real routing), on an
H200 server (two Sapphire Rapids
sockets: `configs/hardware/h200.yaml`) and on a 24 GB consumer GPU (RTX 4090 with a Ryzen 9 7950X:
`configs/hardware/rtx4090.yaml`) where the model fits. Regenerate with `python benchmarks/hybrid_study.py`.

Policies:
- GPU-cache: `on-demand` (caches nothing beyond the working buffers), `lru`, `diffmoe` (Diff-MoE's tiers with the
  oracle pre-gate: a perfect prefetcher no deployed system has), and `belady` (the offline optimal cache: a
  reference, not a contender). Every active expert is computed on the GPU; a missing one crosses PCIe first.
- CPU-using: `fiddler` (per expert, computes it on the host CPU or copies it, whichever the cost model says is
  faster; popular experts pinned on the GPU), `ktransformers` (static placement: hot experts on the GPU, the rest
  always on the CPU) and this project's hybrid. Only the activations cross the link for an expert computed on the
  CPU. Every policy gets the same GPU room: the config's HPC + MPC slots per layer (Fiddler and KTransformers pin
  that many hottest experts, ranked on the run's own trace: `cache.hot_profile: trace`, a profile that knows the
  workload it serves) and its working buffers.
- The crossover of a CPU-using policy is the batch at which it stops beating the best of on-demand, lru and
  diffmoe; the crossing is interpolated in log-log between the two batches around it.
"""
    text += f"\nPolicies in this run: {', '.join(f'`{p}`' for p in policies)}."
    if missing:
        text += (
            f" Not registered when it ran, so left out: {', '.join(f'`{p}`' for p in missing)} (rerun the "
            f"script once they are)."
        )
    if quick:
        text += "\n\n**Quick run** (`--quick`): a few requests of 4 decode tokens; the figures are not the study's."
    return text + "\n"


#: measured: the previous run (synthetic traces with assumed knobs) against the run with the traces fitted to real
#: Qwen3.5-35B-A3B routing; rewrite it when a rerun moves these figures
MOVED = """## What moved with the real fine-grained routing

The gpt-oss-120b and DeepSeek-V3 traces were synthetic with assumed Zipf knobs matched to gpt-oss-20b (32
experts); they are now fitted to the real Qwen3.5-35B-A3B routing (256 experts, top-8) and moved to each model's
shape (`traces/data/README.md`: popularity skew 0.29 -> 0.33, overlap with the previous token 0.43 -> 0.35-0.37,
step-wise LRU at 4k slots 0.49-0.51 -> 0.55-0.57, a batch of 64 needing 0.69 instead of 0.79 of a layer's
experts). The two Qwen3.5-35B-A3B setups replay real routing. Mixtral's rows are unchanged (same trace). Against
the previous run of this study:

- **Crossovers: none moved.** On gpt-oss-120b (H200 up to batch 4096, RTX 4090 up to 2048) and DeepSeek-V3 (H200
  up to 4096) every CPU-using policy still beats the best GPU cache at every batch. The margin at the largest
  batch shrank on the H200 (gpt-oss-120b: fiddler x3.53 -> x3.45, hybrid-cache x4.38 -> x4.29; DeepSeek-V3:
  fiddler x5.45 -> x5.00, hybrid-cache x6.23 -> x5.81) and grew slightly on the RTX 4090 (fiddler x2.12 -> x2.27,
  hybrid-cache x2.13 -> x2.15; ktransformers x1.15 -> x1.13).
- **GPU caches gain most where requests keep to their own experts.** At batch 1 the best GPU cache (lru) rose
  27% on gpt-oss-120b (H200 58.3 -> 74.2 tokens/s, RTX 4090 28.0 -> 35.5) and 17% on DeepSeek-V3 (4.7 -> 5.5), and
  the offline bound (belady) 50% and 45% (110.6 -> 166.2; 10.4 -> 15.0), while fiddler rose 8% (208.3 -> 225.0).
  So the CPU's lead at batch 1 narrowed: x3.57 -> x3.03 (gpt-oss-120b, H200), x1.70 -> x1.52 (RTX 4090), x4.93 ->
  x4.48 (DeepSeek-V3). At batch 16, where fewer distinct experts per step now help the CPU-using policies too, it
  widened: x7.03 -> x7.44 and x2.32 -> x2.48 (fiddler), x7.53 -> x8.06 and x3.13 -> x3.35 (hybrid-cache).
- **Rankings.** The best online GPU cache turns from lru to diffmoe at a smaller batch: 16 instead of 32 on
  gpt-oss-120b (both hardware), 8 instead of 16 on DeepSeek-V3. Among CPU-using policies hybrid-cache leads on
  both models from batch 8 on, as before, with one change: on gpt-oss-120b on the RTX 4090 at batch 2048 fiddler
  now leads (2,868 against 2,720 tokens/s; before they were level, 2,322 and 2,338).
- **Real Qwen3.5-35B-A3B gives the first crossover among today's models**: ktransformers (all non-pinned experts on
  the host) stops beating the best GPU cache near batch 1,859 on the H200 and near batch 251 on the RTX 4090, where
  the cost model puts one expert's break-even at batch ~12,000 and ~2,848; fiddler and hybrid-cache beat it at
  every batch measured (H200 up to 4096: x1.29 and x1.48; RTX 4090 up to 512: x1.57 and x2.16). At batch 1 the
  CPU's lead is x3.29 (H200) and x1.68 (RTX 4090), hybrid-cache's x3.47 and x2.31. The config caches a quarter
  of the experts (64 of 256; DeepSeek-V3's 32 of 256). Caveat: its 12 requests are re-used above batch 12 (copies
  route alike), which understates the experts a step needs and flatters the GPU caches at large batches.
- The fitted traces carry no cross-layer structure (the fit's pull ends at power 0); no policy here uses it
  (predictor none; diffmoe's pre-gate is the oracle), so this does not bias these rows.
"""

ASSUMPTIONS = """
## Costs and what they rest on

Why the host wins at small batches: a decode step is memory-bound, and the host reads an expert's weights from its
own memory faster than the link can copy them to the GPU: on the H200 server 460 GB/s (assumed, below) against
52 GB/s of PCIe Gen5, ~9x; on the desktop 62 GB/s against 25 GB/s of PCIe Gen4, ~2.5x. The host loses once an
expert's tokens make it compute-bound on the CPU for longer than the copy takes: the break-even column above.

The costs come from the hardware profiles (`sim/costs/costs.py`: `cpu_expert_s`, `activation_copy_s`); no calibration
file is used. **Assumptions** (no measured source; the profiles' comments say so):

- H200 host (`h200.yaml`): usable memory bandwidth 460 GB/s = ~75% of the two sockets' DDR5-4800 peak (614 GB/s),
  and only with experts split across both sockets' memory (NUMA-aware, as kTransformers does); 40 TFLOPS bf16 =
  kTransformers' 21.3 TFLOPS per socket (their paper) times two sockets (the scaling is assumed); int8 at twice
  that (AMX's int8 rate doubles its bf16 rate; the same sustained fraction is assumed); 4-bit weights at the int8
  rate (widened in registers, assumed hidden); 5 us per expert call (thread-pool dispatch and join); activations
  cross the link at the same rate both ways (`d2h_bw_gb_s` = `pcie_bw_gb_s`).
- RTX 4090 desktop (`rtx4090.yaml`): usable memory bandwidth 62 GB/s = ~70% of dual-channel DDR5-5600 (89.6 GB/s);
  2.5 TFLOPS bf16 = half of Zen 4's AVX-512 peak; 5 TOPS int8/int4 (VNNI, 4-bit widened); 5 us per expert call;
  GPU tensor math at ~80% of the datasheet; 2 GB reserved (context, workspaces, display); PCIe Gen4 at 25 GB/s
  both ways.
- Workloads: the gpt-oss-120b and DeepSeek-V3 traces are synthetic, fitted to the real Qwen3.5-35B-A3B routing
  and moved to each model's layers, experts and top-k (`traces/data/README.md`: the granularity transfer it
  assumes; the fit has no cross-layer pull); they are decode rows only, so attention is over the decode tokens so
  far (no prompt). The Qwen3.5-35B-A3B rows replay its real routing (12 requests with their prompts, decode cut
  to 32 tokens). The Mixtral trace is fitted to real Mixtral-8x7B-Instruct routing.
- Model approximations (`configs/models/*.yaml`): DeepSeek-V3's dense part at bf16 and MLA as an equivalent
  GQA shape (attention weights ~10 GB too many); 8-bit (FP8) experts priced at the CPU's int8 rate.
"""


if __name__ == "__main__":
    sys.exit(main())
