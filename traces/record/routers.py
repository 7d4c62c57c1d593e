"""Finding the MoE routers of a Hugging Face model and reading the expert ids they return, with forward hooks.

How routers are found and which of their outputs are read, per architecture: see :mod:`traces.record.recording`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


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
            has_experts or _int_attr([mod], ("num_experts", "n_routed_experts")) is not None
        )
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
    one_hot = (
        E is not None
        and raw.dim() >= 2
        and raw.shape[-1] == E
        and layer.top_k != E
        and (raw.numel() == 0 or int(raw.max()) <= 1)
    )
    if one_hot and E is not None:  # (one_hot implies E; said again for the type checker)
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
        self._handles: list[Any] = []
        self._router: dict[int, list] = {}
        self._experts: dict[int, list] = {}

    def __enter__(self) -> RoutingCapture:
        for j, layer in enumerate(self.layers):
            self._handles.append(layer.router.register_forward_hook(functools.partial(self._on_router, j)))
            if layer.experts is not None:
                self._handles.append(
                    layer.experts.register_forward_pre_hook(functools.partial(self._on_experts, j), with_kwargs=True)
                )
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
                raise RuntimeError(
                    f"router {layer.name} ran {len(calls)} times in one forward pass, expected once "
                    "(a fused MoE kernel may bypass it, or the model reuses the layer)"
                )
            got = calls[0]
            if got is None:
                ex = self._experts.get(j, [])
                if len(ex) != 1 or ex[0] is None:
                    raise RuntimeError(
                        f"router {layer.name} ({type(layer.router).__name__}) returns no expert ids "
                        "and its MoE block has no experts module receiving them"
                    )
                ids, w, what = ex[0]
                experts_name = layer.name.rpartition(".")[0] + ".experts"
                what = f"{type(layer.router).__name__} returns no ids; read {experts_name} {what}"
            else:
                ids, w, what = got
                what = f"{type(layer.router).__name__} {what}"
            self.sources.setdefault(layer.name, what)
            if ids.shape[0] != b * s:
                raise RuntimeError(f"router {layer.name} routed {ids.shape[0]} tokens in a pass over {b} x {s} tokens")
            k = ids.shape[1]
            out[j] = (ids.numpy().reshape(b, s, k), None if w is None else w.numpy().reshape(b, s, k))
        return out
