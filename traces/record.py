"""`python -m traces record`: record expert routing of a Hugging Face MoE model with forward hooks on its routers.

What is recorded
----------------
Every MoE layer's router module gets a forward hook that reads the top-k expert ids *the router returned* (the
tensor the model then hands to its experts, whatever experts kernel runs them), never a top-k recomputed from
logits, plus the gate weights when the router returns them. The router outputs read, per architecture
(transformers 5.x):

- Mixtral, Qwen2-MoE, OLMoE (``*TopKRouter``) and DeepSeek-V3 (``DeepseekV3TopkRouter``) return
  ``(router_logits, weights [N, k], indices [N, k])`` for the N = batch * sequence tokens of the call: the hook
  reads ``indices`` and ``weights``. DeepSeek-V3's grouped top-k (``sorted=False``) returns its k ids in no
  particular order; like every router here they are stored sorted by gate weight, highest first (stable), which
  keeps the router's choice and its pairing with the weights.
- Switch Transformers (``SwitchTransformersTop1Router``) returns ``(expert_index, router_probs, router_logits)``
  where ``expert_index`` is a one-hot dispatch mask [batch, seq, experts] from which tokens over the expert
  capacity are already removed: the hook reads the hot expert (-1 for a dropped token, i.e. an all-zero row) and
  ``router_probs`` [batch, seq, 1] as its weight.
- Any router whose output holds no integer tensor (e.g. DBRX's ``DbrxRouter`` returns logits only and its MoE
  block computes the top-k itself): then no module *returns* the chosen ids, and the recorder reads them from the
  inputs ``(hidden_states, top_k_index, top_k_weights)`` of the block's ``experts`` module through a forward
  pre-hook, the smallest module that receives exactly the ids used. ``meta.extra["routers"]`` says which output
  was read for each layer.

Router modules are found by class name (``...Router``) or as a ``gate``/``router`` child of a module that also has
an ``experts`` child; dense layers (no router) are not in the trace. ``model.layers`` lists the MoE layers in
order, encoder layers first, each with its transformer block index (from the module path) and its role.

Decoding and the trace layout
-----------------------------
Greedy decoding with a KV cache, per batch of prompts, each request stopping at EOS or after ``max_new_tokens``
generated tokens; the EOS token counts as generated. Request r owns trace tokens
``request_offsets[r]:request_offsets[r+1]``: first its ``prefill_lengths[r]`` prompt tokens, then its generated
tokens, one decode iteration each. Rows of a request that finished early in a batch, and rows of padding, are
never recorded.

- Decoder-only models: prompts are left-padded (attention mask, position ids counted over real tokens). A prompt
  row holds the routing of that prompt token in the prefill pass, the last prompt token included. The decode row
  of generated token g_i is the routing of the forward step that *processes* g_i as its input (the step that
  computes g_{i+1}). So that the last generated token (EOS or the ``max_new_tokens``-th) has a row too, it is
  fed through one more forward pass whose logits are discarded; a serving system skips that pass (drop each
  request's last decode row to model that). A teacher-forced forward pass over prompt + generated tokens gives
  the same routing position by position (see :func:`teacher_forced_routing`).
- Encoder-decoder models (Switch Transformers): prompts are right-padded (Switch's expert capacity is counted in
  sequence order, so trailing pads never take a real token's slot). Prompt rows hold the encoder layers' routing
  (decoder layers -1). The decode row of generated token g_i holds the decoder layers' routing of the decoder
  step that *produces* g_i, whose input is the previous token (the decoder start token for g_0); encoder
  layers are -1. With n generated tokens there are exactly n decoder steps, one row each. A teacher-forced
  decoder pass over ``[start] + g_0 .. g_{n-2}`` gives the same rows, unless a longer decoder sequence overflows
  an expert's capacity that single-token steps never reach.

Tokens: a checkpoint directory uses its own tokenizer (``AutoTokenizer``, ``local_files_only=True``, default
special tokens); the tiny models use the byte mapping of :func:`traces.tiny_models.encode_bytes`.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from traces.errors import InputError
from traces.format import LayerInfo, ModelInfo, Provenance, Trace, TraceMeta, today

DTYPES = ("float32", "float16", "bfloat16", "auto")
DECODE_ROW_CONVENTION = {
    "decoder-only": "decode row of generated token g_i = routing of the forward step whose input is g_i "
                    "(the last generated token is fed through one extra forward pass)",
    "encoder-decoder": "decode row of generated token g_i = decoder routing of the step that produces g_i "
                       "(input: previous token, decoder start token for g_0)",
}


# --------------------------------------------------------------------------- finding the routers

@dataclass
class MoELayer:
    """One MoE layer of a model: its router module (hooked) and, if any, the sibling experts module."""

    name: str
    router: Any
    experts: Any
    role: str
    block: int
    num_experts: int | None
    top_k: int | None


_ROUTER_CLASS = re.compile(r"router$", re.IGNORECASE)


def _block_and_role(name: str) -> tuple[int, str]:
    parts = name.split(".")
    role = "decoder"
    for p in parts:
        low = p.lower()
        if low.endswith("encoder"):
            role = "encoder"
            break
        if low.endswith("decoder"):
            break
    block = next((int(p) for p in parts if p.isdigit()), 0)
    return block, role


def _int_attr(objs, names) -> int | None:
    for obj in objs:
        if obj is None:
            continue
        for n in names:
            v = getattr(obj, n, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def find_moe_layers(model) -> list[MoELayer]:
    """The MoE layers of ``model``, encoder ones first, each in transformer-block order."""
    import torch

    modules = dict(model.named_modules())
    candidates = []
    for name, mod in modules.items():
        if not name:
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = modules.get(parent_name)
        has_experts = parent is not None and "experts" in dict(parent.named_children())
        by_class = _ROUTER_CLASS.search(type(mod).__name__) and (
            has_experts or _int_attr([mod], ("num_experts", "n_routed_experts")) is not None)
        by_place = attr in ("gate", "router") and has_experts and not isinstance(mod, torch.nn.ModuleList)
        if by_class or by_place:
            candidates.append((name, mod, parent if has_experts else None))
    # keep the innermost router when routers nest (a wrapper around the real router)
    names = [c[0] for c in candidates]
    candidates = [c for c in candidates if not any(n.startswith(c[0] + ".") for n in names)]
    config = getattr(model, "config", None)
    layers = []
    for name, mod, parent in candidates:
        experts = getattr(parent, "experts", None) if parent is not None else None
        block, role = _block_and_role(name)
        num_experts = _int_attr([mod, experts], ("num_experts", "n_routed_experts", "num_local_experts"))
        if num_experts is None:
            num_experts = _int_attr([config], ("num_experts", "num_local_experts", "n_routed_experts"))
        top_k = _int_attr([mod, parent], ("top_k", "num_experts_per_tok", "moe_top_k"))
        layers.append(MoELayer(name, mod, experts, role, block, num_experts, top_k))
    layers.sort(key=lambda x: (x.role != "encoder", x.block, x.name))
    return layers


# --------------------------------------------------------------------------- reading router outputs

def _parse_routing(values, layer: MoELayer, label: str = "output", first: int = 0):
    """(ids [N, k] int64 with -1 for no expert, weights [N, k] float32 or None, description) from the tensors a
    router returned (or an experts module received); None when they hold no integer tensor."""
    import torch

    tensors = [(i, v) for i, v in enumerate(values) if torch.is_tensor(v)]
    ints = [(i, t) for i, t in tensors if not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)]
    if not ints:
        return None
    pos, raw = ints[0]
    raw = raw.detach()
    E = layer.num_experts
    one_hot = (E is not None and raw.dim() >= 2 and raw.shape[-1] == E and layer.top_k != E
               and (raw.numel() == 0 or int(raw.max()) <= 1))
    if one_hot:
        k = layer.top_k or 1
        flat = raw.reshape(-1, E)
        vals, order = torch.sort(flat, dim=-1, descending=True, stable=True)
        ids = order[:, :k].clone()
        ids[vals[:, :k] <= 0] = -1
        what = f"{label}[{pos + first}] (one-hot dispatch mask)"
    else:
        k = raw.shape[-1] if raw.dim() >= 1 else 1
        ids = raw.reshape(-1, k).long()
        what = f"{label}[{pos + first}] (top-k ids)"
    n = ids.shape[0]
    weights = None
    floats = [(i, t) for i, t in tensors if t.is_floating_point()]
    for i, t in floats:
        if t.numel() == n * k and t.shape[-1] == k:
            weights = t.detach().reshape(n, k).float()
            what += f", {label}[{i + first}] (weights)"
            break
    else:
        for i, t in floats:
            if i != 0 and E is not None and t.shape[-1] == E and t.numel() == n * E:
                weights = t.detach().reshape(n, E).float().gather(1, ids.clamp(min=0))
                what += f", {label}[{i + first}] (dense scores, gathered)"
                break
    ids = ids.cpu()
    if weights is not None:
        weights = weights.cpu().masked_fill(ids < 0, 0.0)
        # router order = highest gate weight first (stable; no-routing entries last)
        key = torch.where(ids < 0, torch.full_like(weights, float("inf")), -weights)
        order = torch.sort(key, dim=-1, stable=True).indices
        ids, weights = ids.gather(1, order), weights.gather(1, order)
    return ids, weights, what


class RoutingCapture:
    """Forward hooks on every MoE layer's router (and a pre-hook on its experts, used only when the router's
    output holds no ids). Use as a context manager; around each forward call, ``begin({role: (batch, seq)})``
    then ``end()`` gives ``{layer position: (ids [batch, seq, k] int64, weights [batch, seq, k] float32 | None)}``
    for the layers of the roles named."""

    def __init__(self, model, layers: Sequence[MoELayer]):
        self.model = model
        self.layers = list(layers)
        self.sources: dict[str, str] = {}
        self._handles = []
        self._router: dict[int, list] = {}
        self._experts: dict[int, list] = {}

    def __enter__(self) -> "RoutingCapture":
        for j, layer in enumerate(self.layers):
            self._handles.append(layer.router.register_forward_hook(functools.partial(self._on_router, j)))
            if layer.experts is not None:
                self._handles.append(layer.experts.register_forward_pre_hook(
                    functools.partial(self._on_experts, j), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _on_router(self, j, module, args, output):
        values = output if isinstance(output, (tuple, list)) else (output,)
        self._router.setdefault(j, []).append(_parse_routing(values, self.layers[j]))

    def _on_experts(self, j, module, args, kwargs):
        calls = self._router.get(j)
        if calls and calls[-1] is not None:
            return  # the router's own output already gave the ids
        values = list(args[1:])
        for key in ("top_k_index", "selected_experts", "top_k_weights", "routing_weights"):
            if key in kwargs:
                values.append(kwargs[key])
        self._experts.setdefault(j, []).append(_parse_routing(values, self.layers[j], "input", 1))

    def begin(self, shapes: dict[str, tuple[int, int]]) -> None:
        self._shapes = dict(shapes)
        self._router.clear()
        self._experts.clear()

    def end(self) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
        out = {}
        for j, layer in enumerate(self.layers):
            if layer.role not in self._shapes:
                continue
            b, s = self._shapes[layer.role]
            calls = self._router.get(j, [])
            if len(calls) != 1:
                raise RuntimeError(f"router {layer.name} ran {len(calls)} times in one forward pass, expected once "
                                   "(a fused MoE kernel may bypass it, or the model reuses the layer)")
            got = calls[0]
            if got is None:
                ex = self._experts.get(j, [])
                if len(ex) != 1 or ex[0] is None:
                    raise RuntimeError(f"router {layer.name} ({type(layer.router).__name__}) returns no expert ids "
                                       "and its MoE block has no experts module receiving them")
                ids, w, what = ex[0]
                experts_name = layer.name.rpartition(".")[0] + ".experts"
                what = f"{type(layer.router).__name__} returns no ids; read {experts_name} {what}"
            else:
                ids, w, what = got
                what = f"{type(layer.router).__name__} {what}"
            self.sources.setdefault(layer.name, what)
            if ids.shape[0] != b * s:
                raise RuntimeError(f"router {layer.name} routed {ids.shape[0]} tokens in a pass over "
                                   f"{b} x {s} tokens")
            k = ids.shape[1]
            out[j] = (ids.numpy().reshape(b, s, k),
                      None if w is None else w.numpy().reshape(b, s, k))
        return out


# --------------------------------------------------------------------------- generation loops

@dataclass
class _Rows:
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


def _run_decoder_only(model, cap, prompts, max_new, eos, pad_id, device) -> list[_Rows]:
    import torch

    cache_kw, has_keep = _forward_kwargs(model)
    keep = {"logits_to_keep": 1} if has_keep else {}
    b, lens = len(prompts), [len(p) for p in prompts]
    width = max(lens)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[r, width - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ids, mask, pos = ids.to(device), mask.to(device), pos.to(device)
    reqs = [_Rows(list(p)) for p in prompts]

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
        step = torch.tensor([[req.generated[-1] if a else pad_id] for req, a in zip(reqs, active)],
                            dtype=torch.long, device=device)
        mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=device)], dim=1)
        last = last + 1
        cap.begin({"decoder": (b, 1)})
        out = model(input_ids=step, attention_mask=mask, position_ids=last, use_cache=True,
                    **{cache_kw: cache}, **keep)
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


def _decoder_start(model, pad_id) -> int:
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None)
    return pad_id if start is None else int(start)


def _run_encoder_decoder(model, cap, prompts, max_new, eos, pad_id, device) -> list[_Rows]:
    import torch

    cache_kw, _ = _forward_kwargs(model)
    b, lens = len(prompts), [len(p) for p in prompts]
    width = max(lens)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, :len(p)] = torch.tensor(p, dtype=torch.long)
        mask[r, :len(p)] = 1
    ids, mask = ids.to(device), mask.to(device)
    reqs = [_Rows(list(p)) for p in prompts]

    cap.begin({"encoder": (b, width)})
    enc = model.get_encoder()(input_ids=ids, attention_mask=mask, return_dict=True)
    routed = cap.end()
    for r, req in enumerate(reqs):
        req.add(0, routed, (r, slice(0, lens[r])))
    step = torch.full((b, 1), _decoder_start(model, pad_id), dtype=torch.long, device=device)
    done = [max_new <= 0] * b
    cache = None
    while not all(done):
        cap.begin({"decoder": (b, 1)})
        kw = {} if cache is None else {cache_kw: cache}
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
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def _eos_set(model, eos_token_id) -> set[int]:
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(model.config, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return {int(x) for x in eos_token_id}


def _pad_id(model, pad_token_id, eos: set[int]) -> int:
    if pad_token_id is None:
        pad_token_id = getattr(model.config, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = min(eos) if eos else 0
    return int(pad_token_id)


# --------------------------------------------------------------------------- the API

@dataclass
class Recording:
    """A recorded trace plus the token ids it was recorded on (prompt and generated, per request)."""

    trace: Trace
    prompt_ids: list[list[int]]
    generated_ids: list[list[int]]


def _assemble(reqs: list[_Rows], layers: list[MoELayer]):
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
            experts[base + row: base + row + n, j, :kk] = ids
            if w is None:
                no_w[j] = True
            else:
                have_w[j] = True
                weights[base + row: base + row + n, j, :kk] = w
    with_weights = any(have_w) and not any(no_w)
    weights[experts < 0] = 0.0
    return experts.astype(np.int16), (weights.astype(np.float16) if with_weights else None), offsets


def record_routing(model, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32, *, batch_size: int = 1,
                   eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
                   request_ids: Sequence[str] | None = None, model_name: str | None = None,
                   dataset: str = "prompts", seed: int | None = None, extra: dict | None = None,
                   tool: str | None = None) -> Recording:
    """Greedy-decode ``prompts`` (token id lists) with ``model`` and record its routing: see the module doc for
    the hooks and the row conventions. Returns the trace and the prompt and generated token ids."""
    import torch

    prompts = [[int(t) for t in p] for p in prompts]
    if not prompts:
        raise InputError("no prompts to record")
    for i, p in enumerate(prompts):
        if not p:
            raise InputError(f"prompt {i} has no tokens")
    if max_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {max_new_tokens}")
    if batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch_size}")
    name = model_name or getattr(model, "name_or_path", None) or type(model).__name__
    layers = find_moe_layers(model)
    if not layers:
        raise InputError(f"no MoE router modules found in {name}")
    enc_dec = is_encoder_decoder(model)
    eos = _eos_set(model, eos_token_id)
    pad_id = _pad_id(model, pad_token_id, eos)
    device = next(model.parameters()).device
    run = _run_encoder_decoder if enc_dec else _run_decoder_only
    reqs: list[_Rows] = []
    was_training = model.training
    model.eval()
    try:
        with RoutingCapture(model, layers) as cap, torch.no_grad():
            for start in range(0, len(prompts), batch_size):
                reqs += run(model, cap, prompts[start:start + batch_size], max_new_tokens, eos, pad_id, device)
    finally:
        model.train(was_training)
    experts, weights, offsets = _assemble(reqs, layers)
    num_experts = max([x.num_experts for x in layers if x.num_experts] or [int(experts.max()) + 1])
    info = ModelInfo(name, num_experts, int(experts.shape[2]),
                     tuple(LayerInfo(x.block, x.role) for x in layers))
    notes = {
        "max_new_tokens": int(max_new_tokens), "batch_size": int(batch_size),
        "eos_token_ids": sorted(eos), "pad_token_id": pad_id,
        "padding_side": "right" if enc_dec else "left",
        "architecture": type(model).__name__,
        "decode_rows": DECODE_ROW_CONVENTION["encoder-decoder" if enc_dec else "decoder-only"],
        "routers": {x.name: cap.sources.get(x.name, type(x.router).__name__) for x in layers},
        "prompt_tokens": int(sum(len(q.prompt) for q in reqs)),
        "generated_tokens": int(sum(len(q.generated) for q in reqs)),
        "stopped_at_eos": int(sum(1 for q in reqs if q.generated and q.generated[-1] in eos)),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "weights": "router gate weights" if weights is not None else "not recorded (a router returns none)",
    }
    notes.update(extra or {})
    ids = tuple(request_ids) if request_ids is not None else tuple(str(i) for i in range(len(prompts)))
    if len(ids) != len(prompts):
        raise ValueError(f"{len(ids)} request ids for {len(prompts)} prompts")
    meta = TraceMeta(info, Provenance("recorded", tool or f"traces record {_version()}", name, dataset, today()),
                     seed, ids, notes)
    trace = Trace(experts, offsets, np.array([len(q.prompt) for q in reqs], dtype=np.int64), meta, weights)
    trace.validate()
    return Recording(trace, [q.prompt for q in reqs], [q.generated for q in reqs])


def record_trace(model, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32, **kwargs) -> Trace:
    """:func:`record_routing` without the token ids: the recorded :class:`~traces.format.Trace`."""
    return record_routing(model, prompts, max_new_tokens, **kwargs).trace


def teacher_forced_routing(model, prompt: Sequence[int], generated: Sequence[int],
                           layers: Sequence[MoELayer] | None = None):
    """Routing of one request from ONE teacher-forced forward pass, in the layout of its trace rows:
    (ids int16 [P + n, L, k], weights float32 [P + n, L, k] | None).

    Decoder-only: the pass runs over ``prompt + generated``; row t is the routing of input position t.
    Encoder-decoder: the encoder runs over ``prompt`` (rows 0..P-1, encoder layers) and the decoder over
    ``[decoder start] + generated[:-1]`` (rows P.., decoder layers)."""
    import torch

    layers = list(layers) if layers is not None else find_moe_layers(model)
    device = next(model.parameters()).device
    prompt, generated = [int(t) for t in prompt], [int(t) for t in generated]
    req = _Rows(prompt, generated)
    with RoutingCapture(model, layers) as cap, torch.no_grad():
        if is_encoder_decoder(model):
            enc_in = torch.tensor([prompt], dtype=torch.long, device=device)
            shapes = {"encoder": (1, len(prompt))}
            kw = {}
            if generated:
                start = _decoder_start(model, _pad_id(model, None, _eos_set(model, None)))
                dec = torch.tensor([[start] + generated[:-1]], dtype=torch.long, device=device)
                shapes["decoder"] = (1, len(generated))
                kw["decoder_input_ids"] = dec
            cap.begin(shapes)
            if generated:
                model(input_ids=enc_in, use_cache=False, **kw)
            else:
                model.get_encoder()(input_ids=enc_in)
            routed = cap.end()
            enc = {j: v for j, v in routed.items() if layers[j].role == "encoder"}
            dec = {j: v for j, v in routed.items() if layers[j].role == "decoder"}
            req.add(0, enc, (0, slice(None)))
            if generated:
                req.add(len(prompt), dec, (0, slice(None)))
        else:
            seq = prompt + generated
            cap.begin({"decoder": (1, len(seq))})
            model(input_ids=torch.tensor([seq], dtype=torch.long, device=device), use_cache=False)
            req.add(0, cap.end(), (0, slice(None)))
    experts, weights, _ = _assemble([req], layers)
    return experts, (None if weights is None else weights.astype(np.float32))


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("moe-offload-sim")
    except Exception:
        return "0.1"


# --------------------------------------------------------------------------- prompts and models

@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


def read_prompts(path: str | Path) -> list[Prompt]:
    """Prompts from a text file (one per non-blank line) or a ``.jsonl`` file (objects with a ``prompt`` string
    and optionally an ``id``). Raises InputError naming the file (and line) on bad input."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such prompts file")
    if path.is_dir():
        raise InputError(f"{path}: is a folder, not a prompts file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: prompts file is not UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    prompts = []
    jsonl = path.suffix.lower() == ".jsonl"
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(Prompt(str(len(prompts)), line))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or "prompt" not in obj:
            raise InputError(f"{path}:{lineno}: expected an object with a \"prompt\" field")
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise InputError(f"{path}:{lineno}: \"prompt\" must be a non-empty string")
        rid = obj.get("id", len(prompts))
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise InputError(f"{path}:{lineno}: \"id\" must be a string or an integer")
        prompts.append(Prompt(str(rid), obj["prompt"]))
    if not prompts:
        raise InputError(f"{path}: no prompts in file")
    return prompts


def _torch_dtype(name: str):
    import torch

    return None if name == "auto" else getattr(torch, name)


def load_checkpoint(path: str | Path, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer) from a local checkpoint folder, never touching the network."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"--model: {path} is not a checkpoint folder")
    import transformers as tf

    try:
        config = tf.AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise InputError(f"--model {path}: cannot read its config ({_first_line(exc)})") from None
    auto = tf.AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else tf.AutoModelForCausalLM
    if _has_no_router(auto, config):
        raise InputError(f"no MoE router modules found in {path}")
    try:
        kwargs = {"local_files_only": True}
        kwargs["dtype" if _accepts_dtype(tf) else "torch_dtype"] = "auto" if dtype == "auto" else _torch_dtype(dtype)
        model = auto.from_pretrained(path, **kwargs)
    except Exception as exc:
        raise InputError(f"--model {path}: cannot load the model ({_first_line(exc)})") from None
    if not find_moe_layers(model):
        raise InputError(f"no MoE router modules found in {path}")
    try:
        tokenizer = tf.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise InputError(f"--model {path}: cannot load its tokenizer ({_first_line(exc)})") from None
    model.to(device)
    model.eval()
    return model, tokenizer


def _has_no_router(auto, config) -> bool:
    """True when the model built from ``config`` (weightless, on the meta device) has no MoE router: a dense
    checkpoint is then refused before its weights are read. False when that cannot be told this way."""
    import torch

    try:
        with torch.device("meta"):
            skeleton = auto.from_config(config)
    except Exception:
        return False
    return not find_moe_layers(skeleton)


def _accepts_dtype(tf) -> bool:
    return int(tf.__version__.split(".")[0]) >= 5


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# --------------------------------------------------------------------------- the command

def register(sub) -> None:
    p = sub.add_parser("record", help="record expert routing of a Hugging Face MoE model on prompts",
                       description="Greedy-decode prompts with a local MoE checkpoint or a tiny random model and "
                                   "record the experts its routers pick, with forward hooks, into a trace file.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="DIR", help="local checkpoint folder (loaded with local_files_only=True)")
    src.add_argument("--tiny", metavar="ARCH",
                     help="tiny random model: mixtral, qwen2-moe, olmoe, deepseek-v3 or switch "
                          "(byte-level token ids, no tokenizer)")
    p.add_argument("--prompts", metavar="FILE", required=True,
                   help="one prompt per line, or .jsonl with a \"prompt\" field (and optional \"id\")")
    p.add_argument("--out", metavar="FILE", required=True, help="trace file to write (.npz)")
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="generated tokens per request (32)")
    p.add_argument("--batch-size", type=int, default=1, metavar="N", help="prompts per padded batch (1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the tiny model's weights and torch (0)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="model dtype (float32; auto = the checkpoint's)")
    p.add_argument("--device", default="auto", help="torch device (auto: cuda if available, else cpu)")
    p.add_argument("--dataset", metavar="NAME", help="provenance.dataset (default: the prompts file name)")
    p.set_defaults(func=run)


def run(args) -> int:
    from traces.io import save_trace
    from traces.tiny_models import TINY_ARCHS

    if args.tiny is not None and args.tiny not in TINY_ARCHS:
        raise InputError(f"--tiny: unknown architecture {args.tiny!r} (choose from {', '.join(TINY_ARCHS)})")
    if args.max_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.seed < 0:
        raise InputError(f"--seed must be >= 0, got {args.seed}")
    if args.tiny is not None and args.dtype == "auto":
        raise InputError("--dtype auto needs --model (a tiny model has no checkpoint dtype)")
    out = Path(args.out)
    if out.is_dir():
        raise InputError(f"--out {out}: is a folder")
    prompts = read_prompts(args.prompts)

    import torch

    from traces.tiny_models import build_tiny_model, encode_bytes

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise InputError(f"--device: unknown device {device!r}") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: CUDA is not available here")
    torch.manual_seed(args.seed)
    if args.tiny is not None:
        if device == "cpu":
            torch.set_num_threads(1)  # tiny matrices: extra threads only add synchronisation (much slower on 2 CPUs)
        model = build_tiny_model(args.tiny, args.seed, _torch_dtype(args.dtype)).to(device)
        name, tokenizer = f"tiny-{args.tiny}", "bytes (utf-8 byte b -> id b + 3)"
        token_ids = [encode_bytes(p.text) for p in prompts]
    else:
        model, tok = load_checkpoint(args.model, args.dtype, device)
        name, tokenizer = str(args.model), "checkpoint tokenizer"
        token_ids = [list(tok(p.text)["input_ids"]) for p in prompts]
    for p, ids in zip(prompts, token_ids):
        if not ids:
            raise InputError(f"{args.prompts}: prompt {p.id} has no tokens")
    rec = record_routing(model, token_ids, args.max_new_tokens, batch_size=args.batch_size,
                         request_ids=[p.id for p in prompts], model_name=name,
                         dataset=args.dataset or Path(args.prompts).name, seed=args.seed,
                         extra={"tokenizer": tokenizer, "device": str(device), "prompts_file": str(args.prompts)})
    save_trace(rec.trace, out)
    t = rec.trace
    print(f"{out}: recorded {t.num_tokens} tokens ({int(t.prefill_lengths.sum())} prompt, "
          f"{int(t.decode_mask().sum())} generated), {t.num_requests} requests, {t.num_layers} MoE layers, "
          f"model {name}")
    return 0
