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
special tokens); the tiny models use the byte mapping of :func:`traces.record.tiny_models.encode_bytes`.

Model name and simulation files
-------------------------------
The trace's model name is ``--name`` (checked like an import's ``--model``), by default the checkpoint folder's
last part made a plain name (``ORG/NAME`` for a Hugging Face cache snapshot) or ``tiny-ARCH``, never a path; the
provenance keeps the folder. Beside the trace the command writes a run config and, for a model without a bundled
profile, a model profile derived from the checkpoint's config (:mod:`traces.run_setup`,
:mod:`traces.profile_from_config`), so that ``python -m sim run OUT.run.yaml`` simulates it.

Modules
-------
This module holds the entry points (:func:`record_routing`, :func:`record_trace`, :func:`teacher_forced_routing`)
and re-exports the names of the others: :mod:`traces.record.routers` finds the routers and captures their outputs
with hooks, :mod:`traces.record.decode` runs the decoding loops and lays rows out as trace arrays, and
:mod:`traces.record.cli` is the `traces record` command (arguments, prompts files, local checkpoints).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moebase.errors import InputError, brief
from traces.format import LayerInfo, ModelInfo, Provenance, Trace, TraceMeta, today
from traces.importers.common import check_model_name, plain_model_name
from traces.record.decode import (
    RequestRows,
    assemble,
    decode_decoder_only,
    decode_encoder_decoder,
    decoder_start_id,
    eos_token_ids,
    is_encoder_decoder,
    resolve_pad_id,
)
from traces.record.routers import MoELayer, RoutingCapture, find_moe_layers

__all__ = [
    "DECODE_ROW_CONVENTION",
    "MoELayer",
    "Recording",
    "RoutingCapture",
    "find_moe_layers",
    "is_encoder_decoder",
    "record_routing",
    "record_trace",
    "teacher_forced_routing",
]

DECODE_ROW_CONVENTION = {
    "decoder-only": "decode row of generated token g_i = routing of the forward step whose input is g_i "
    "(the last generated token is fed through one extra forward pass)",
    "encoder-decoder": "decode row of generated token g_i = decoder routing of the step that produces g_i "
    "(input: previous token, decoder start token for g_0)",
}


@dataclass
class Recording:
    """A recorded trace plus the token ids it was recorded on (prompt and generated, per request)."""

    trace: Trace
    prompt_ids: list[list[int]]
    generated_ids: list[list[int]]


def record_routing(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int = 32,
    *,
    batch_size: int = 1,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    request_ids: Sequence[str] | None = None,
    model_name: str | None = None,
    dataset: str = "prompts",
    seed: int | None = None,
    extra: dict | None = None,
    tool: str | None = None,
    source_model: str | None = None,
) -> Recording:
    """Greedy-decode ``prompts`` (token id lists) with ``model`` and record its routing: see the module doc for
    the hooks and the row conventions. Returns the trace and the prompt and generated token ids.

    ``model_name`` is the trace's model name (checked like an import's ``--model``); by default the model's
    ``name_or_path`` made a plain name (its last path part), never a path. ``source_model`` (default: the name)
    is the provenance's model, e.g. the checkpoint folder."""
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
    if model_name is None:
        model_name = plain_model_name(str(getattr(model, "name_or_path", None) or ""), type(model).__name__)
    name = check_model_name(model_name, "model_name")
    for what, value in (("dataset", dataset), ("source_model", source_model)):
        if value is not None and (not isinstance(value, str) or not value.strip() or not value.isprintable()):
            raise InputError(f"{what}: {brief(value)} is not one printable line (the trace's provenance keeps it)")
    layers = find_moe_layers(model)
    if not layers:
        raise InputError(f"no MoE router modules found in {name}")
    enc_dec = is_encoder_decoder(model)
    eos = eos_token_ids(model, eos_token_id)
    pad_id = resolve_pad_id(model, pad_token_id, eos)
    device = next(model.parameters()).device
    decode = decode_encoder_decoder if enc_dec else decode_decoder_only
    reqs: list[RequestRows] = []
    was_training = model.training
    model.eval()
    try:
        with RoutingCapture(model, layers) as cap, torch.no_grad():
            for start in range(0, len(prompts), batch_size):
                reqs += decode(model, cap, prompts[start : start + batch_size], max_new_tokens, eos, pad_id, device)
    finally:
        model.train(was_training)
    experts, weights, offsets = assemble(reqs, layers)
    num_experts = max([x.num_experts for x in layers if x.num_experts] or [int(experts.max()) + 1])
    info = ModelInfo(name, num_experts, int(experts.shape[2]), tuple(LayerInfo(x.block, x.role) for x in layers))
    notes = {
        "max_new_tokens": int(max_new_tokens),
        "batch_size": int(batch_size),
        "eos_token_ids": sorted(eos),
        "pad_token_id": pad_id,
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
    meta = TraceMeta(
        info,
        Provenance("recorded", tool or f"traces record {_version()}", source_model or name, dataset, today()),
        seed,
        ids,
        notes,
    )
    trace = Trace(experts, offsets, np.array([len(q.prompt) for q in reqs], dtype=np.int64), meta, weights)
    trace.validate()
    return Recording(trace, [q.prompt for q in reqs], [q.generated for q in reqs])


def record_trace(model, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32, **kwargs) -> Trace:
    """:func:`record_routing` without the token ids: the recorded :class:`~traces.format.Trace`."""
    return record_routing(model, prompts, max_new_tokens, **kwargs).trace


def teacher_forced_routing(
    model, prompt: Sequence[int], generated: Sequence[int], layers: Sequence[MoELayer] | None = None
):
    """Routing of one request from ONE teacher-forced forward pass, in the layout of its trace rows:
    (ids int16 [P + n, L, k], weights float32 [P + n, L, k] | None).

    Decoder-only: the pass runs over ``prompt + generated``; row t is the routing of input position t.
    Encoder-decoder: the encoder runs over ``prompt`` (rows 0..P-1, encoder layers) and the decoder over
    ``[decoder start] + generated[:-1]`` (rows P.., decoder layers)."""
    import torch

    layers = list(layers) if layers is not None else find_moe_layers(model)
    device = next(model.parameters()).device
    prompt, generated = [int(t) for t in prompt], [int(t) for t in generated]
    req = RequestRows(prompt, generated)
    with RoutingCapture(model, layers) as cap, torch.no_grad():
        if is_encoder_decoder(model):
            enc_in = torch.tensor([prompt], dtype=torch.long, device=device)
            shapes = {"encoder": (1, len(prompt))}
            kw = {}
            if generated:
                start = decoder_start_id(model, resolve_pad_id(model, None, eos_token_ids(model, None)))
                shapes["decoder"] = (1, len(generated))
                kw["decoder_input_ids"] = torch.tensor([[start] + generated[:-1]], dtype=torch.long, device=device)
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
    experts, weights, _ = assemble([req], layers)
    return experts, (None if weights is None else weights.astype(np.float32))


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("moe-offload-sim")
    except Exception:
        return "0.1"
