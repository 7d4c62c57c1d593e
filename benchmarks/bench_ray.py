"""Benchmark: points per minute of the paper grid (configs/sweeps/diffmoe_paper.yaml) on a Ray cluster, at 1, 2
and all of the cluster's CPUs as workers, beside the local process pool at the same widths.

Without ``--address`` it starts a cluster on this machine for the run (``ray.cluster_utils.Cluster``: a head and
``--nodes - 1`` worker nodes of ``--cpus-per-node`` CPUs each) and stops it at the end. The connection, the code
upload and the workers' start-up are paid once, before the timed runs (a short warm-up run); each timed run
includes shipping its configs and trace references and storing its rows.

Run: .venv/bin/python benchmarks/bench_ray.py [--points 60] [--address HOST:PORT] [--nodes 2] [--cpus-per-node 1]
     (--points 0: the whole grid, 300 points)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.sweep.cli import Progress, load_sweep, run_local  # noqa: E402
from sim.sweep.ray.executor import run_ray, start_ray  # noqa: E402

MB = 1024 * 1024


def subset(points: list, n: int) -> list:
    """``n`` points spread evenly over the grid (every k-th), or all of them when ``n`` is 0."""
    if not n or n >= len(points):
        return list(points)
    step = len(points) / n
    return [points[int(i * step)] for i in range(n)]


def timed(fn, points: list, out: Path) -> float:
    t0 = time.perf_counter()
    fn(points, out, Progress(len(points), quiet=True))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", default=str(ROOT / "configs" / "sweeps" / "diffmoe_paper.yaml"))
    ap.add_argument("--points", type=int, default=60, help="points of the grid to run (0: all)")
    ap.add_argument("--address", help="an existing cluster (default: start one here)")
    ap.add_argument("--nodes", type=int, default=2, help="nodes of the cluster started here (head included)")
    ap.add_argument("--cpus-per-node", type=int, default=1)
    ap.add_argument("--no-local", action="store_true", help="skip the local pool's runs")
    args = ap.parse_args()

    sweep = load_sweep(args.sweep)
    points = subset(sweep.points, args.points)
    cluster, address = None, args.address
    if address is None:
        from ray.cluster_utils import Cluster

        cluster = Cluster(
            initialize_head=True,
            connect=False,
            head_node_args={
                "num_cpus": args.cpus_per_node,
                "object_store_memory": 100 * MB,
                "include_dashboard": False,
            },
        )
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=args.cpus_per_node, object_store_memory=100 * MB)
        address = cluster.address
    rows, session = [], None
    try:
        with tempfile.TemporaryDirectory() as d:
            session = start_ray(address, None)
            print(session.cluster.describe(), file=sys.stderr)
            widths = sorted({1, 2, max(1, session.cluster.cpus)})
            warm = subset(points, min(len(points), 2 * max(widths)))
            run_ray(sweep, warm, Path(d) / "warm", max(widths), Progress(len(warm), quiet=True), session=session)
            for w in widths:
                wall = timed(
                    lambda p, o, pr, w=w: run_ray(sweep, p, o, w, pr, session=session), points, Path(d) / f"ray{w}"
                )
                rows.append((f"ray, {session.cluster.nodes} node(s)", w, len(points), wall))
            session.close()
            session = None
            for w in [] if args.no_local else widths:  # after Ray is gone: nothing else competes for the cores
                wall = timed(lambda p, o, pr, w=w: run_local(sweep, p, o, w, pr), points, Path(d) / f"local{w}")
                rows.append(("local pool", w, len(points), wall))
    finally:
        if session is not None:
            session.close()
        if cluster is not None:
            cluster.shutdown()
    print(f"\n{Path(args.sweep).name}: {len(points)} of {len(sweep.points)} points, on {os.cpu_count()} core(s)")
    print(f"| {'executor':<16} | workers | points | wall (s) | points/min |")
    print(f"|{'-' * 18}|---------|--------|----------|------------|")
    for name, w, n, wall in rows:
        print(f"| {name:<16} | {w:>7} | {n:>6} | {wall:>8.1f} | {n / wall * 60:>10.0f} |")


if __name__ == "__main__":
    main()
