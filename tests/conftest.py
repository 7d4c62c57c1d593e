"""Shared fixtures: small hand-made traces, and the real Mixtral routing from ../shared (skipped when absent)."""

from __future__ import annotations

import contextlib
import io
import os
import struct
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from traces.cli import main as traces_main
from traces.format import LayerInfo, ModelInfo, Provenance, Trace, TraceMeta

# CI explores the same examples on every run (a new random counterexample is found by developers, not by CI)
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


ROOT = Path(__file__).resolve().parent.parent
SHARED_MIXTRAL = ROOT.parent / "shared" / "traces" / "mixtral-8x7b-instruct"
MIXTRAL_FILES = {name: SHARED_MIXTRAL / f"{name}_2_routing.jsonl" for name in ("humaneval", "gsm8k")}


#: A tiny model profile (the shapes of a decoder-only MoE, small enough for the CPU in milliseconds).
TINY_MODEL = {
    "name": "tiny-moe",
    "d_model": 128,
    "d_ff": 256,
    "expert_matrices": 2,
    "num_experts": 8,
    "top_k": 2,
    "encoder_blocks": 0,
    "decoder_blocks": 2,
    "encoder_moe_layers": 0,
    "decoder_moe_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 32,
    "dense_d_ff": 0,
    "dense_ffn_matrices": 2,
    "shared_expert_d_ff": 0,
    "dtype_bytes": 4,
    "vocab_size": 1000,
}


def make_trace(
    experts, lengths=None, prefill=None, num_experts=None, roles=None, weights=None, kind="synthetic"
) -> Trace:
    """A valid trace around an expert array [T, L, k] (lists accepted)."""
    e = np.asarray(experts, dtype=np.int16)
    if e.ndim == 2:
        e = e[:, :, None]
    t, n_layers, k = e.shape
    lengths = [t] if lengths is None else list(lengths)
    prefill = [0] * len(lengths) if prefill is None else list(prefill)
    num_experts = int(max(e.max() + 1, k)) if num_experts is None else num_experts
    roles = roles or ["decoder"] * n_layers
    meta = TraceMeta(
        ModelInfo("test-model", num_experts, k, tuple(LayerInfo(i, r) for i, r in enumerate(roles))),
        Provenance(kind, "tests", "test-model", "handmade", None if kind == "synthetic" else "2026-01-01"),
        seed=0,
    )
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Trace(e, offsets, np.asarray(prefill, dtype=np.int64), meta, weights)


def random_trace(rng: np.random.Generator, tokens=200, layers=3, experts=8, k=2, requests=3) -> Trace:
    """Uniformly random routing (distinct experts per token), split into ``requests`` requests."""
    e = np.argsort(rng.random((tokens, layers, experts)), axis=2)[:, :, :k].astype(np.int16)
    cuts = np.sort(rng.choice(np.arange(1, tokens), size=requests - 1, replace=False)) if requests > 1 else []
    lengths = np.diff(np.concatenate([[0], cuts, [tokens]]))
    return make_trace(e, lengths, num_experts=experts)


@pytest.fixture(scope="session")
def mixtral_real_paths():
    missing = [str(p) for p in MIXTRAL_FILES.values() if not p.is_file()]
    if missing:
        pytest.skip(f"real Mixtral traces not found ({missing[0]}): ../shared is absent in this checkout")
    return MIXTRAL_FILES


@pytest.fixture(scope="session")
def mixtral_real(mixtral_real_paths, tmp_path_factory):
    """The two real Mixtral routing files imported (each alone, and both together), as trace paths."""
    from traces.importers.cli import import_mixtral_jsonl
    from traces.io import save_trace

    d = tmp_path_factory.mktemp("mixtral")
    out = {}
    for name, path in mixtral_real_paths.items():
        trace, _ = import_mixtral_jsonl([path])
        out[name] = save_trace(trace, d / f"{name}.npz")
    trace, _ = import_mixtral_jsonl(list(mixtral_real_paths.values()))
    out["both"] = save_trace(trace, d / "both.npz")
    return out


def plain_lru(steps, cap):
    """A plain re-statement of per-layer LRU on one layer's steps ``(step, active experts)``: hits are the step's
    experts already cached; hits become most recent; then the misses enter in id order, each evicting the least
    recent expert the step does not use. Returns the hits."""
    cache, hits = [], 0  # least recent first
    for _, act in steps:
        hits += sum(1 for e in act if e in cache)
        for e in sorted(act):
            if e in cache:
                cache.remove(e)
                cache.append(e)
        for e in sorted(act):
            if e in cache:
                continue
            if len(cache) >= cap:
                victims = [v for v in cache if v not in act]
                if not victims:
                    continue
                cache.remove(victims[0])
            cache.append(e)
    return hits


def patch_central(data: bytes, name: str, **fields) -> bytes:
    """``data`` (a zip) with fields of ``name``'s central directory record overwritten: flags, method,
    compress_size, file_size (what zipfile trusts when it reads the entry)."""
    offsets = {"flags": (8, "<H"), "method": (10, "<H"), "compress_size": (20, "<I"), "file_size": (24, "<I")}
    out = bytearray(data)
    pos = out.find(b"PK\x01\x02")
    while pos >= 0:
        n = struct.unpack_from("<H", out, pos + 28)[0]
        if out[pos + 46 : pos + 46 + n] == name.encode():
            for key, value in fields.items():
                off, fmt = offsets[key]
                struct.pack_into(fmt, out, pos + off, value)
        pos = out.find(b"PK\x01\x02", pos + 4)
    return bytes(out)


def run_traces(*argv, timeout: float = 60.0) -> tuple[int, str, str, list]:
    """``python -m traces ARGV`` in-process: (exit status, stdout, stderr, warnings raised). Run in a thread, so
    that a hang fails the test instead of blocking it."""
    result: dict = {}

    def target():
        out, err = io.StringIO(), io.StringIO()
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            try:
                code = traces_main([str(a) for a in argv])
            except SystemExit as exc:  # argparse
                code = exc.code
        result.update(
            code=code,
            out=out.getvalue(),
            err=err.getvalue(),
            warnings=[f"{w.category.__name__}: {w.message}" for w in caught],
        )

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"traces {' '.join(map(str, argv))[:200]} hangs"
    assert "code" in result, "the command raised (see the thread's traceback above)"
    return result["code"], result["out"], result["err"], result["warnings"]
