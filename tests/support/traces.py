"""Small hand-made traces: a valid trace around an expert array, uniformly random routing (decoder-only or
encoder-decoder), a tiny model profile, and a zip with its central directory edited (for the reader's bad-file
tests)."""

from __future__ import annotations

import struct

import numpy as np

from traces.format import LayerInfo, ModelInfo, Provenance, Trace, TraceMeta

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


def enc_dec_trace(rng: np.random.Generator, tokens=40, experts=6, k=2, requests=4) -> Trace:
    """Random routing over two encoder layers (prompt rows, the first three of each request) and two decoder
    layers (generated rows)."""
    t = random_trace(rng, tokens=tokens, layers=4, experts=experts, k=k, requests=requests)
    e = t.experts.copy()
    prefill = np.minimum(t.request_lengths, 3)
    decode = t.position_in_request() >= np.repeat(prefill, t.request_lengths)
    e[decode, :2] = -1
    e[~decode, 2:] = -1
    return make_trace(e, t.request_lengths, prefill, experts, ["encoder", "encoder", "decoder", "decoder"])


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
