"""The host as it behaves (sim/costs/host_costs.py): the figures docs/hardware.md quotes, printed as tables.

1. Effective host bandwidth of two-socket machines under each NUMA mode (and the expert copies each keeps).
2. Bandwidth and compute against threads (llama.cpp ``-t``, kTransformers ``cpu_infer``).
3. One DeepSeek-V3 expert on the host against its tokens, per kernel family: where it stops being bandwidth-bound.
4. Decode tokens/s at batch 1 and 4 of DeepSeek-V3 under kTransformers on one Xeon 6454S socket (the bundled trace),
   with the host's call cost once per expert (today) or once per MoE layer (a kernel family's ``calls: layer``).

Run: .venv/bin/python benchmarks/host_behaviour.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moebase.model import load_model  # noqa: E402
from sim.config.hardware import load_hardware  # noqa: E402
from sim.config.host_choice import host_copies  # noqa: E402
from sim.config.run_config import config_from_dict  # noqa: E402
from sim.config.system import NUMA_MODES, format_bits, load_system  # noqa: E402
from sim.costs.host_costs import HostCosts  # noqa: E402
from sim.run import simulate  # noqa: E402

THREADS = (1, 2, 4, 8, 16, 32, 48, 64)


def model_for(name: str, fmt: str):
    m = load_model(name)
    return dataclasses.replace(m, expert_bits=format_bits(fmt))


def numa_table() -> None:
    print("## 1. Host bandwidth by NUMA mode (GB/s, every core)\n")
    print("| machine | sockets | " + " | ".join(["null (today)", *NUMA_MODES]) + " |")
    print("| --- | --- |" + " --- |" * (1 + len(NUMA_MODES)))
    m = model_for("deepseek-v3", "q4_k_m")
    for hw_name in ("rtx4090d-2x6454s", "l40s-2x9654"):
        hw = load_hardware(hw_name)
        cells = []
        for mode in (None, *NUMA_MODES):
            sy = load_system({"base": "ideal", "numa": mode})
            h = HostCosts(m, hw, sy)
            cells.append(f"{h.bandwidth(h.threads()) / 1e9:.0f} (x{host_copies(sy, hw)})")
        print(f"| {hw_name} | {hw.host.sockets} | " + " | ".join(cells) + " |")
    print("\n(xN: copies of each expert the host holds)\n")


def threads_table() -> None:
    print("## 2. Bandwidth (GB/s) and compute (TOP/s) against threads\n")
    print("| machine, kernel family (format) | " + " | ".join(f"t={t}" for t in THREADS) + " |")
    print("| --- |" + " --- |" * len(THREADS))
    for hw_name, fam, fmt in (
        ("rtx4090", "llama-cpp", "q4_0"),
        ("rtx4090d-1x6454s", "kt-llamafile", "q4_0"),
        ("quadro-rtx6000-24gb", "fiddler", "bf16"),
    ):
        hw = load_hardware(hw_name)
        h = HostCosts(
            model_for("mixtral-8x7b", fmt), hw, load_system({"base": "ideal", "host_kernel": fam, "expert_format": fmt})
        )
        isa = h.path(1)
        cells = [
            f"{h.bandwidth(h.threads(t), isa) / 1e9:.0f} / {h.compute_rate(h.threads(t), isa) / 1e12:.2f}"
            for t in THREADS
        ]
        print(f"| {hw_name}, {fam} ({isa}, {fmt}) | " + " | ".join(cells) + " |")
    print()


def batch_table() -> None:
    print("## 3. One DeepSeek-V3 expert on one Xeon 6454S socket against its tokens (us per expert)\n")
    tokens = (1, 2, 4, 8, 16, 32, 64, 128, 512)
    print("| kernels (format) | " + " | ".join(f"n={n}" for n in tokens) + " | bandwidth-bound below |")
    print("| --- |" + " --- |" * (len(tokens) + 1))
    hw = load_hardware("rtx4090d-1x6454s")
    for label, system, fmt in (
        ("hardware rates (q4_k_m)", {"numa": "one_socket"}, "q4_k_m"),
        ("kt-llamafile (q4_k_m)", {"host_kernel": "kt-llamafile"}, "q4_k_m"),
        ("kt-amx (int4)", {"host_kernel": "kt-amx"}, "int4"),
        ("kt-amx (bf16)", {"host_kernel": "kt-amx"}, "bf16"),
    ):
        m = model_for("deepseek-v3", fmt)
        h = HostCosts(m, hw, load_system({"base": "ideal", "expert_format": fmt, **system}))
        cells = [f"{h.expert_s(n) * 1e6:.0f}" for n in tokens]
        print(f"| {label} | " + " | ".join(cells) + f" | {h.crossover_tokens():.0f} tokens |")
    print()


def run(batch: int, system: dict) -> float:
    d = {
        "model": "deepseek-v3",
        "hardware": "rtx4090d-1x6454s",
        "system": {"base": "ktransformers", **system},
        "workload": {
            "trace": "traces/data/synth_deepseek_v3.npz",
            "batch_size": batch,
            "batching": "static",
            "prefill": False,
            "max_decode_tokens": 8,
            "requests": 4 * batch,
        },
        "predictor": "none",
        "seed": 0,
        "cache": {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 1},
        "policy": {"name": "ktransformers", "params": {}},
    }
    return float(simulate(config_from_dict(d, source="host_behaviour")).summary["throughput_tok_s"])


def batch_runs() -> None:
    print("## 4. DeepSeek-V3, kTransformers, one Xeon 6454S socket: decode tok/s at batch 1 and 4\n")
    print("| host pricing | batch 1 | batch 4 | batch 4 / batch 1 |")
    print("| --- | --- | --- | --- |")
    for label, system in (
        ("as before (ktransformers profile)", {}),
        ("kt-llamafile, call once per layer (10 us)", {"host_kernel": "kt-llamafile"}),
        ("kt-llamafile, a 1000 us call per layer", {"host_kernel": "kt-llamafile", "host_call_us": 1000}),
    ):
        b1, b4 = run(1, system), run(4, system)
        print(f"| {label} | {b1:.2f} | {b4:.2f} | {b4 / b1:.2f} |")
    print()


def main() -> int:
    numa_table()
    threads_table()
    batch_table()
    batch_runs()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
