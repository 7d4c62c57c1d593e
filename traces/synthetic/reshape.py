"""Fitted generator knobs moved to a model with another expert count and top-k (the granularity transfer).

``traces synth --fit`` fits the generator (``traces.synthetic.fit``) to a real trace with the real model's shape;
``traces.synthetic.fit.stretch_layers`` maps its layers onto a deeper model of the same family. This module maps the
experts and the top-k, so that one fit to real fine-grained routing (e.g. Qwen3.5-35B-A3B, 256 experts, top-8)
can stand in for models whose routing is not at hand (DeepSeek-V3, Kimi-K2, Qwen3, gpt-oss-120b):

- **popularity** (per layer): the layer's weights sorted from the most to the least popular give a Lorenz curve,
  cumulative share C(x) against rank fraction x (C(0) = 0, C(1) = 1). The new layer's weights are that curve
  sampled at the new expert count by piecewise-linear interpolation, ``w'_r = C((r+1)/E') - C(r/E')``, so the
  share the top x of the experts hold is kept for every x (exactly where x is a multiple of 1/E or 1/E', linearly
  in between): the popularity skew is preserved. The new rank-r expert *stands for* the fitted expert at the same
  rank fraction, ``src(r) = fitted expert of rank floor((r + 1/2) E / E')`` (more new experts than fitted ones:
  each fitted expert is split into equal parts; fewer: a block of fitted experts is merged and its middle one
  speaks for it). Ranks are placed on expert ids by a fixed permutation per layer (seeded by the layer index,
  not by the trace's seed), so that no expert id is the hottest of every layer by construction.
- **cross-layer pull**: ``lift'[l][a][b] = lift[l][src_l(a)][src_{l+1}(b)]`` (the lift between two new experts
  is that between the fitted experts they stand for); the power is kept.
- **opening positions** (``prefix_popularity``): each fitted expert's share at a position is split over the
  new experts that stand for it in proportion to their layer weights (then each position's law is normalised).
- **stickiness** (per top-k slot) and **request concentration**: kept unchanged. Assumptions, stated in the
  trace: a slot re-uses the previous token's expert as often whatever the top-k, and a request keeps to its own
  experts as strongly. (A Dirichlet law's aggregation property makes the second one consistent: the new experts
  standing for one fitted expert, taken together, vary across requests exactly as that expert did.)

The same expert count and top-k return the knobs unchanged (no relabelling). The mapping is a function of the
fitted knobs and the new shape only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moebase.errors import InputError
from traces.synthetic.generator import KNOB_DECIMALS, SynthKnobs

RELABEL_SEED = 0x5EED  # the per-layer id permutations: np.random.default_rng([RELABEL_SEED, layer])

MAPPING = (
    "popularity: each layer's Lorenz curve (cumulative share against rank fraction) resampled at the new "
    "expert count by piecewise-linear interpolation; new rank r stands for the fitted expert at rank "
    "floor((r + 1/2) E / E'); ranks placed on ids by a fixed permutation per layer (seed [0x5EED, layer]); "
    "cross-layer lifts lift'[l][a][b] = lift[l][src_l(a)][src_l+1(b)], power kept; opening positions "
    "split over the new experts standing for each fitted one in proportion to their weights"
)
ASSUMPTIONS = (
    "the target model routes like the fitted one at the same rank fraction of its experts (granularity "
    "transfer: the share held by the top x% of experts, per layer, is the fitted model's)",
    "per-slot stickiness is kept whatever the top-k (a slot re-uses the previous token's expert as often)",
    "request concentration is kept (a request keeps to its own experts as strongly)",
    "the cross-layer lift between two experts is that between the fitted experts they stand for, with the fitted power",
)


def lorenz_resample(weights, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """(new weights in rank order [num_experts], summing to 1; for each new rank, the index into ``weights`` of
    the fitted expert it stands for). See the module docstring."""
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or w.size < 1 or not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0:
        raise InputError("lorenz_resample: weights must be a non-empty row of finite values >= 0 with a positive sum")
    if num_experts < 1:
        raise InputError(f"--experts must be >= 1, got {num_experts}")
    order = np.argsort(-w, kind="stable")
    e = w.size
    curve = np.concatenate([[0.0], np.cumsum(w[order] / w.sum())])
    curve[-1] = 1.0
    at = np.interp(np.arange(num_experts + 1) / num_experts, np.arange(e + 1) / e, curve)
    new = np.maximum(np.diff(at), 0.0)
    src_rank = np.minimum(((np.arange(num_experts) + 0.5) * e / num_experts).astype(np.int64), e - 1)
    return new, order[src_rank]


def top_share(weights, fraction: float) -> float:
    """The share of the weight held by the top ``fraction`` of the experts (the Lorenz curve at that fraction,
    interpolated linearly between whole experts)."""
    w = np.sort(np.asarray(weights, dtype=float))[::-1]
    curve = np.concatenate([[0.0], np.cumsum(w / w.sum())])
    return float(np.interp(fraction, np.arange(w.size + 1) / w.size, curve))


def relabel(layer: int, num_experts: int) -> np.ndarray:
    """perm[r]: the expert id of new rank r in a layer (fixed per layer index and expert count)."""
    return np.random.default_rng([RELABEL_SEED, int(layer)]).permutation(num_experts)


@dataclasses.dataclass(frozen=True)
class Reshaped:
    """Reshaped knobs, and per layer the fitted expert each new expert id stands for (None: unchanged ids)."""

    knobs: SynthKnobs
    sources: np.ndarray | None  # int [layers, new experts]


def reshape_experts(knobs: SynthKnobs, num_experts: int, top_k: int) -> Reshaped:
    """Fitted ``knobs`` for ``num_experts`` experts and top-``top_k`` (see the module docstring). The same shape
    returns the same knobs; the same expert count with another top-k keeps every table and only sets top_k."""
    if knobs.layer_popularity is None:
        raise InputError("reshape: the knobs hold no fitted popularity (knobs.layer_popularity); fit them first")
    if not 1 <= top_k <= num_experts:
        raise InputError(f"--top-k must be 1..{num_experts} (the expert count), got {top_k}")
    if num_experts == knobs.num_experts:
        out = knobs if top_k == knobs.top_k else dataclasses.replace(knobs, top_k=top_k)
        out.check()
        return Reshaped(out, None)
    old = np.asarray(knobs.layer_popularity, dtype=float)
    n_layers = old.shape[0]
    weights = np.zeros((n_layers, num_experts))
    sources = np.zeros((n_layers, num_experts), dtype=np.int64)
    for layer in range(n_layers):
        by_rank, src = lorenz_resample(old[layer], num_experts)
        perm = relabel(layer, num_experts)
        weights[layer, perm] = by_rank
        sources[layer, perm] = src
    weights = np.round(weights, KNOB_DECIMALS)
    transition = None
    if knobs.layer_transition is not None:
        table = np.asarray(knobs.layer_transition, dtype=float)
        transition = (
            np.stack([table[t][np.ix_(sources[t], sources[t + 1])] for t in range(n_layers - 1)])
            if n_layers > 1
            else np.zeros((0, num_experts, num_experts))
        )
    prefix = None
    if knobs.prefix_popularity is not None and len(knobs.prefix_popularity):
        prefix = _split_prefix(np.asarray(knobs.prefix_popularity, dtype=float), old, weights, sources)
    out = dataclasses.replace(
        knobs,
        num_experts=num_experts,
        top_k=top_k,
        layer_popularity=tuple(tuple(row) for row in weights.tolist()),
        prefix_popularity=prefix,
        layer_transition=transition,
    )
    out.check()
    return Reshaped(out, sources)


def _split_prefix(prefix: np.ndarray, old: np.ndarray, new: np.ndarray, sources: np.ndarray):
    """Each position's law over the new experts: a fitted expert's share split over the new experts standing for
    it, in proportion to their layer weights; rows normalised, rounded as stored."""
    layers = np.arange(old.shape[0])[:, None]
    old_norm = old / old.sum(1, keepdims=True)
    scale = new / np.maximum(old_norm[layers, sources], 1e-300)  # [layers, new]: a new expert's part of its source
    out = prefix[:, layers, sources] * scale[None]
    out /= np.maximum(out.sum(2, keepdims=True), 1e-300)
    out = np.round(out, KNOB_DECIMALS)
    bad = out.sum(2) <= 0  # all of a position's mass rounded away: fall back to the layer's law
    out[bad] = np.broadcast_to(new[None], out.shape)[bad]
    return tuple(tuple(tuple(row) for row in pos) for pos in out.tolist())
