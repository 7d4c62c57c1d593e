"""Greedy decoding with a KV cache that drives a model while :class:`~traces.record.routers.RoutingCapture`
records, and the layout of the recorded rows as trace arrays (see "Decoding and the trace layout" in
:mod:`traces.record.recording`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from traces.record.routers import MoELayer


@dataclass
class RequestRows:
    """The routing rows of one request, as (first row, layer position, ids [n, k], weights [n, k] | None)."""

    prompt: list[int]
    generated: list[int] = field(default_factory=list)
    segments: list = field(default_factory=list)
    decoded: int = 0

    def add(self, row: int, routed: dict, sel) -> None:
        for j, (ids, w) in routed.items():
            self.segments.append((row, j, ids[sel], None if w is None else w[sel]))


def _forward_kwargs(model) -> tuple[str, bool]:
    params = inspect.signature(model.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), ("logits_to_keep" in params)


def _cache_of(out):
    c = getattr(out, "cache", None)
    return c if c is not None else getattr(out, "past_key_values", None)


def decode_decoder_only(model, cap, prompts, max_new, eos, pad_id, device) -> list[RequestRows]:
    """Greedy-decode one batch of a decoder-only model (prompts left-padded); the rows of each request."""
    import torch

    cache_kw, has_keep = _forward_kwargs(model)
    keep = {"logits_to_keep": 1} if has_keep else {}
    b, lens = len(prompts), [len(p) for p in prompts]
    width = max(lens)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[r, width - len(p) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ids, mask, pos = ids.to(device), mask.to(device), pos.to(device)
    reqs = [RequestRows(list(p)) for p in prompts]

    cap.begin({"decoder": (b, width)})
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **keep)
    routed = cap.end()
    for r, req in enumerate(reqs):
        req.add(0, routed, (r, slice(width - lens[r], width)))
    nxt = out.logits[:, -1].argmax(-1).tolist()
    cache = _cache_of(out)
    for r, req in enumerate(reqs):
        if max_new > 0:
            req.generated.append(int(nxt[r]))
    last = pos[:, -1:]
    while any(req.decoded < len(req.generated) for req in reqs):
        active = [req.decoded < len(req.generated) for req in reqs]
        step = torch.tensor(
            [[req.generated[-1] if a else pad_id] for req, a in zip(reqs, active)], dtype=torch.long, device=device
        )
        mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=device)], dim=1)
        last = last + 1
        cap.begin({"decoder": (b, 1)})
        out = model(input_ids=step, attention_mask=mask, position_ids=last, use_cache=True, **{cache_kw: cache}, **keep)
        routed = cap.end()
        cache = _cache_of(out)
        nxt = out.logits[:, -1].argmax(-1).tolist()
        for r, (req, a) in enumerate(zip(reqs, active)):
            if not a:
                continue
            req.add(len(req.prompt) + req.decoded, routed, (r, slice(0, 1)))
            req.decoded += 1
            if len(req.generated) < max_new and req.generated[-1] not in eos:
                req.generated.append(int(nxt[r]))
    return reqs


def decoder_start_id(model, pad_id) -> int:
    """The token an encoder-decoder model's decoder starts from."""
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None)
    return pad_id if start is None else int(start)


def decode_encoder_decoder(model, cap, prompts, max_new, eos, pad_id, device) -> list[RequestRows]:
    """Greedy-decode one batch of an encoder-decoder model (prompts right-padded); the rows of each request."""
    import torch

    cache_kw, _ = _forward_kwargs(model)
    b, lens = len(prompts), [len(p) for p in prompts]
    width = max(lens)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, : len(p)] = torch.tensor(p, dtype=torch.long)
        mask[r, : len(p)] = 1
    ids, mask = ids.to(device), mask.to(device)
    reqs = [RequestRows(list(p)) for p in prompts]

    cap.begin({"encoder": (b, width)})
    enc = model.get_encoder()(input_ids=ids, attention_mask=mask, return_dict=True)
    routed = cap.end()
    for r, req in enumerate(reqs):
        req.add(0, routed, (r, slice(0, lens[r])))
    step = torch.full((b, 1), decoder_start_id(model, pad_id), dtype=torch.long, device=device)
    done = [max_new <= 0] * b
    cache = None
    while not all(done):
        cap.begin({"decoder": (b, 1)})
        kw: dict[str, Any] = {} if cache is None else {cache_kw: cache}
        out = model(encoder_outputs=enc, attention_mask=mask, decoder_input_ids=step, use_cache=True, **kw)
        routed = cap.end()
        cache = _cache_of(out)
        nxt = out.logits[:, -1].argmax(-1).tolist()
        for r, req in enumerate(reqs):
            if done[r]:
                continue
            req.add(len(req.prompt) + len(req.generated), routed, (r, slice(0, 1)))
            req.generated.append(int(nxt[r]))
            req.decoded += 1
            done[r] = len(req.generated) >= max_new or req.generated[-1] in eos
        step = torch.tensor([[pad_id if d else t] for d, t in zip(done, nxt)], dtype=torch.long, device=device)
    return reqs


def is_encoder_decoder(model) -> bool:
    """True for an encoder-decoder model (Switch Transformers)."""
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def eos_token_ids(model, eos_token_id) -> set[int]:
    """The token ids that end a request: the given ones, else the model's generation or model config's."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(model.config, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return {int(x) for x in eos_token_id}


def resolve_pad_id(model, pad_token_id, eos: set[int]) -> int:
    """The padding token id: the given one, else the model config's, else the smallest EOS id (else 0)."""
    if pad_token_id is None:
        pad_token_id = getattr(model.config, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = min(eos) if eos else 0
    return int(pad_token_id)


def assemble(reqs: list[RequestRows], layers: list[MoELayer]):
    """The trace arrays of recorded requests, in order: (experts int16 [T, L, k], weights float16 [T, L, k] or None
    when a layer's router gave none, request offsets int64 [R + 1])."""
    total = sum(len(q.prompt) + len(q.generated) for q in reqs)
    k = max((seg[2].shape[1] for q in reqs for seg in q.segments), default=1)
    experts = np.full((total, len(layers), k), -1, dtype=np.int64)
    weights = np.zeros((total, len(layers), k), dtype=np.float32)
    have_w = [False] * len(layers)
    no_w = [False] * len(layers)
    offsets = np.zeros(len(reqs) + 1, dtype=np.int64)
    for r, q in enumerate(reqs):
        base = int(offsets[r])
        offsets[r + 1] = base + len(q.prompt) + len(q.generated)
        for row, j, ids, w in q.segments:
            n, kk = ids.shape
            experts[base + row : base + row + n, j, :kk] = ids
            if w is None:
                no_w[j] = True
            else:
                have_w[j] = True
                weights[base + row : base + row + n, j, :kk] = w
    with_weights = any(have_w) and not any(no_w)
    weights[experts < 0] = 0.0
    return experts.astype(np.int16), (weights.astype(np.float16) if with_weights else None), offsets
