"""Microbenchmarks that turn a machine into a calibration profile the simulator reads (``hardware:`` accepts it).

Measured with torch on the chosen device (CUDA events on a GPU, ``time.perf_counter`` on the CPU), each point the
median of ``repeat`` runs after a warm-up:

- ``copy``: host -> device copy time against size (from pinned host memory on a dedicated stream on a GPU; on the
  CPU, a copy between two preallocated buffers, which is what the CPU mode's copy thread does);
- ``d2d``: device -> device copy time against size;
- ``expert``: one expert FFN of the model's shape and dtype against tokens routed to it;
- ``dense``: the dense work the simulator attaches to one MoE layer (attention projections, attention over a KV
  cache, and the dense FFN blocks in between), against batch tokens and context length.

The output is ``{base: HARDWARE, source: MACHINE, tables: {model, copy, d2d, expert, dense}}`` in YAML.
"""

from __future__ import annotations

import dataclasses
import platform
import statistics
import time
from pathlib import Path

import yaml

from sim.specs import ModelSpec
from traces.io import atomic_write_bytes

DTYPES = {2: "bfloat16", 4: "float32"}


class Timer:
    """Times a callable on a device: CUDA events on a GPU, perf_counter on the CPU (median of ``repeat``)."""

    def __init__(self, torch, device: str, repeat: int = 5):
        self.torch, self.device, self.repeat = torch, device, repeat

    def __call__(self, fn) -> float:
        torch = self.torch
        fn()  # warm-up
        times = []
        for _ in range(self.repeat):
            if self.device.startswith("cuda"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def machine_description(torch, device: str) -> str:
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(device)
        return f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}, host {platform.node()}"
    return f"CPU {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads), torch " \
           f"{torch.__version__}, host {platform.node()}"


def measure_copies(torch, timer: Timer, device: str, sizes: list[int]) -> tuple[list, list]:
    """(bytes, seconds) for host->device and device->device copies of each size."""
    on_gpu = device.startswith("cuda")
    h2d, d2d = [], []
    stream = torch.cuda.Stream(device) if on_gpu else None
    for n in sizes:
        src = torch.empty(n, dtype=torch.uint8, pin_memory=on_gpu)
        dst = torch.empty(n, dtype=torch.uint8, device=device)
        dst2 = torch.empty(n, dtype=torch.uint8, device=device)
        if on_gpu:
            def h2d_copy():
                with torch.cuda.stream(stream):
                    dst.copy_(src, non_blocking=True)
                stream.synchronize()
        else:
            def h2d_copy():
                dst.copy_(src)
        h2d.append([n, timer(h2d_copy)])
        d2d.append([n, timer(lambda: dst2.copy_(dst))])
    return h2d, d2d


def _expert_weights(torch, model: ModelSpec, device: str, dtype):
    shapes = [(model.d_model, model.d_ff)] * (model.expert_matrices - 1) + [(model.d_ff, model.d_model)]
    return [torch.randn(*s, device=device, dtype=dtype) * 0.02 for s in shapes]


def expert_forward(torch, weights, x, gated: bool):
    """One expert FFN: x @ w_in (gated: act(x @ w1) * (x @ w3)) @ w_out."""
    if gated:
        h = torch.nn.functional.gelu(x @ weights[0]) * (x @ weights[1])
    else:
        h = torch.relu(x @ weights[0])
    return h @ weights[-1]


def measure_expert(torch, timer: Timer, model: ModelSpec, device: str, tokens: list[int]) -> list:
    dtype = getattr(torch, DTYPES[model.dtype_bytes])
    weights = _expert_weights(torch, model, device, dtype)
    out = []
    for t in tokens:
        x = torch.randn(t, model.d_model, device=device, dtype=dtype)
        out.append([t, timer(lambda: expert_forward(torch, weights, x, model.expert_matrices == 3))])
    return out


def measure_dense(torch, timer: Timer, model: ModelSpec, device: str, tokens: list[int], contexts: list[int],
                  role: str = "decoder") -> list:
    """(tokens, context, seconds) of the dense work per MoE layer: ``blocks / moe layers`` attention blocks
    (q/k/v/o projections and attention of each token over ``context`` cached keys) plus the dense FFN blocks
    between MoE layers."""
    dtype = getattr(torch, DTYPES[model.dtype_bytes])
    d, h, hd, kv = model.d_model, model.n_heads, model.head_dim, model.n_kv_heads
    blocks = model.blocks(role) / max(model.moe_layers_of(role), 1)
    n_attn = max(1, round(blocks))
    n_ffn = max(0, round(blocks) - 1) if model.dense_d_ff else 0
    wq = torch.randn(d, h * hd, device=device, dtype=dtype) * 0.02
    wkv = torch.randn(d, 2 * kv * hd, device=device, dtype=dtype) * 0.02
    wo = torch.randn(h * hd, d, device=device, dtype=dtype) * 0.02
    ffn = None
    if n_ffn:
        dense = dataclasses.replace(model, d_ff=model.dense_d_ff, expert_matrices=model.dense_ffn_matrices)
        ffn = _expert_weights(torch, dense, device, dtype)
    out = []
    for t in tokens:
        x = torch.randn(t, d, device=device, dtype=dtype)
        for c in contexts:
            k = torch.randn(kv, c, hd, device=device, dtype=dtype)
            v = torch.randn(kv, c, hd, device=device, dtype=dtype)

            def work():
                y = x
                for _ in range(n_attn):
                    q = (y @ wq).view(t, h, hd).transpose(0, 1)             # [h, t, hd]
                    _ = y @ wkv                                             # the new tokens' keys and values
                    kk = k.repeat_interleave(h // kv, dim=0) if h != kv else k
                    vv = v.repeat_interleave(h // kv, dim=0) if h != kv else v
                    att = torch.softmax(q @ kk.transpose(1, 2) / hd ** 0.5, dim=-1) @ vv  # [h, t, hd]
                    y = att.transpose(0, 1).reshape(t, h * hd) @ wo
                for _ in range(n_ffn):
                    y = expert_forward(torch, ffn, y, model.dense_ffn_matrices == 3)
                return y
            out.append([t, c, timer(work)])
    return out


def calibrate(model: ModelSpec, base: str, device: str = "cpu", quick: bool = False, repeat: int = 5) -> dict:
    """Run every microbenchmark; returns the calibration mapping."""
    import torch

    timer = Timer(torch, device, repeat)
    eb = model.expert_bytes
    sizes = sorted({max(1, eb // 64), max(1, eb // 8), eb, 2 * eb} if quick else
                   {max(1, eb // 256), max(1, eb // 64), max(1, eb // 16), max(1, eb // 4), eb, 2 * eb})
    tokens = [1, 4, 16, 64] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256]
    dense_tokens = [1, 8, 64] if quick else [1, 4, 16, 64, 256]
    contexts = [32, 256] if quick else [32, 128, 512, 2048]
    h2d, d2d = measure_copies(torch, timer, device, sizes)
    return {
        "base": base,
        "source": f"calibrated with python -m validate microbench on {machine_description(torch, device)}",
        "tables": {
            "model": model.name,
            "copy": h2d,
            "d2d": d2d,
            "expert": measure_expert(torch, timer, model, device, tokens),
            "dense": measure_dense(torch, timer, model, device, dense_tokens, contexts),
        },
    }


def write_calibration(path: str | Path, calibration: dict) -> Path:
    text = "# Calibration profile: measured tables that replace the roofline (seconds; sizes in bytes).\n"
    text += yaml.safe_dump(calibration, sort_keys=False, default_flow_style=None)
    atomic_write_bytes(path, text.encode())
    return Path(path)
