"""Every policy side by side on the bundled real and fitted workloads (`sim compare`); writes
`docs/policy_study.md`.

    python benchmarks/policy_study.py [--out runs/policy_study] [--doc docs/policy_study.md]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("gpu-only,on-demand,prefetch-all,pregated@oracle,lru,lfu,moe-infinity@moe-infinity,diffmoe,diffmoe-arc,"
            "belady")
# (config, settings, what the workload is)
STUDIES = [
    ("configs/switch_base_real.yaml", ["workload.trace=traces/data/switch_base_128_real_b1.npz",
                                       "workload.batch_size=1"], "real routing (the Diff-MoE authors' log, batch 1)"),
    ("configs/switch_base_real.yaml", [], "real routing (the Diff-MoE authors' log, batch 8)"),
    ("configs/switch_base_real.yaml", ["workload.trace=traces/data/switch_base_128_real_b16.npz",
                                       "workload.batch_size=16"], "real routing (the Diff-MoE authors' log, batch 16)"),
    ("configs/gpt_oss_20b.yaml", ["workload.max_decode_tokens=128"], "real routing (85 requests, batch 1 as recorded)"),
    ("configs/gpt_oss_20b.yaml", ["workload.max_decode_tokens=128", "workload.batch_size=16"],
     "real routing (85 requests grouped into batches of 16)"),
    ("configs/switch_xxl.yaml", ["workload.batch_size=1", "workload.requests=32"],
     "fitted to the real switch-base-128 logs"),
    ("configs/switch_xxl.yaml", ["workload.batch_size=16", "workload.requests=64"],
     "fitted to the real switch-base-128 logs"),
    ("configs/switch_xxl.yaml", ["workload.batch_size=64", "workload.requests=128"],
     "fitted to the real switch-base-128 logs"),
    ("configs/mixtral.yaml", ["workload.batch_size=1", "workload.requests=32"],
     "fitted to the real Mixtral-8x7B-Instruct routing"),
    ("configs/mixtral.yaml", ["workload.batch_size=16", "workload.requests=64"],
     "fitted to the real Mixtral-8x7B-Instruct routing"),
]

HEADER = """# Policy study (measured with `sim compare`)

Every policy on the bundled workloads: real routing where it is at hand (the Diff-MoE authors' switch-base-128
logs, 85 gpt-oss-20b requests) and synthetic traces fitted to real routing (Switch-XXL, Mixtral); see
`traces/data/README.md`. Regenerate with `python benchmarks/policy_study.py` (about 4 minutes on 2 cores); each
section's command is given with it.

"hit rate" counts experts prefetched into a working buffer (LPC) as hits. "cache hits" is HPC + MPC: the figure
the Belady bound (an offline optimal cache with the same slots per layer) applies to, and "gap" is bound minus
cache hits. The ratio column is against on-demand. All figures are simulated on the H200 datasheet profile, with
no host costs. `lru` and `lfu` are plain (no pinned experts) over all HPC + MPC slots. `diffmoe` runs the artifact's
rules; on switch-base-128 its cache starts filled with expert 0, as the artifact ran the base model.

What the tables show:
- **On the real Switch logs the plain caches are near the bound.** LRU, LFU and MoE-Infinity come within 0.015 of
  the Belady bound in cache hits at batch 1, 8 and 16. Diff-MoE, started as its artifact ran (expert 0 in every
  slot, no floor on the scores), trails them by 0.17-0.20 in cache hits and by up to 1.8x in throughput.
  `diffmoe-arc` is within 0.012 of the bound.
- **At batch 1 on top-2/top-4 models the bound is far ahead.**
  - On real gpt-oss-20b routing it reaches 0.805 in cache hits, against 0.63-0.66 for every online policy, and
    4.45x on-demand's throughput against 2.06-2.74x.
  - On the Mixtral fit the bound is at 0.694 against 0.48-0.52.
  - MoE-Infinity is the only policy here that predicts with its own predictor rather than the oracle (precision
    0.30, recall 0.59 on gpt-oss). It is the slowest cache despite the most cache hits.
- **At batch 16 (gpt-oss, Mixtral) every cache is within 0.035 of the bound.** So many distinct experts per step
  leave a policy little to choose.
- **Pre-gated gains 1-19% over on-demand** without host costs (`docs/paper_reproduction.md` shows what a
  per-layer round trip adds).
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "policy_study")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "policy_study.md")
    args = p.parse_args(argv)
    parts = [HEADER]
    for i, (config, sets, what) in enumerate(STUDIES):
        out = args.out / f"{i:02d}"
        cmd = [sys.executable, "-m", "sim", "compare", config, "--policies", POLICIES, "--out", str(out)]
        for s in sets:
            cmd += ["--set", s]
        print(f"[{i + 1}/{len(STUDIES)}] {' '.join(cmd[3:5] + sets)}", file=sys.stderr, flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        table = (out / "compare.md").read_text().strip().split("\n")
        shown = " ".join(["python -m sim compare", config, "--policies $P"] + [f"--set {s}" for s in sets])
        parts.append(f"{table[0]}\n\nWorkload: {what}. `{shown}`\n\n" + "\n".join(table[1:]).strip() + "\n")
    parts[0] += f"\nWith `P={POLICIES}`.\n"
    text = "\n".join(parts)
    tmp = args.doc.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(args.doc)
    print(f"wrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
