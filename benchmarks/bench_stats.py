"""Benchmark: how long `traces stats` takes on a 1-million-token, 24-layer trace (target: under 30 s on 2 cores).

Run: .venv/bin/python benchmarks/bench_stats.py [--tokens N] [--experts E] [--top-k K]
Prints the time to generate the synthetic trace, to save and load it, and to compute every stats figure.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from traces.analysis.stats import compute_stats
from traces.io import load_trace, save_trace
from traces.synthetic.generator import SynthKnobs, generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=1)
    ap.add_argument("--encoder-layers", type=int, default=12)
    ap.add_argument("--decoder-layers", type=int, default=12)
    args = ap.parse_args()
    per_request = 64 + 256
    knobs = SynthKnobs(
        model="bench",
        num_experts=args.experts,
        top_k=args.top_k,
        encoder_layers=args.encoder_layers,
        decoder_layers=args.decoder_layers,
        requests=max(1, args.tokens // per_request),
        prompt_len=(64, 64),
        decode_len=(256, 256),
        skew=1.0,
        stickiness=0.3,
        correlation=0.3,
    )
    t0 = time.perf_counter()
    trace = generate(knobs, seed=0)
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.npz")
        save_trace(trace, path)
        t2 = time.perf_counter()
        trace = load_trace(path)
        t3 = time.perf_counter()
        size = os.path.getsize(path)
    stats = compute_stats(trace)
    t4 = time.perf_counter()
    print(
        f"trace: {trace.num_tokens} tokens, {trace.num_layers} layers "
        f"({args.encoder_layers} encoder + {args.decoder_layers} decoder), {args.experts} experts top-{args.top_k}, "
        f"{stats['accesses']} accesses, file {size / 1e6:.1f} MB"
    )
    print(f"generate {t1 - t0:.2f} s   save {t2 - t1:.2f} s   load+validate {t3 - t2:.2f} s")
    print(f"stats (all figures) {t4 - t3:.2f} s   (target < 30 s)")


if __name__ == "__main__":
    main()
