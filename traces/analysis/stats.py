"""Locality figures of a trace: the numbers that decide how well caching and prefetching can work.

All figures count an *access* as one (token, layer, expert) selection; ids of -1 (no routing) are skipped.

- ``popularity_skew``: share of a layer's selections taken by its top 10% of experts (at least one expert).
- ``overlap_prev``: for each token and layer, the share of the token's experts that the previous token of the
  same request also used in that layer; averaged over all (token, layer) pairs that have a previous token.
- ``reuse_distance``: LRU stack distance of each access within its layer (how many *other* experts of the layer
  were accessed since this expert's last access); ``cold`` counts first accesses.
- ``lru_hit_rate``: capacity -> hit rate of the simulator's ``lru`` policy at batch 1 (``step-wise`` LRU): one
  cache of ``capacity`` experts per layer, requests replayed one after another in file order, the cache kept
  across requests; each token is one step in which the layer's experts are used together: hits become most
  recent, then misses enter, never evicting an expert of the same step (see :mod:`traces.analysis.step_lru`). With as
  many slots as top-k, the cache after a step holds exactly that step's experts, so the figure is the share of
  a token's experts that the previous token (in file order, across requests) used too.
- ``lru_hit_rate_sequential``: the same cache fed one access at a time, a token's k experts in router order
  (a token's experts may evict each other). An access hits exactly when its stack distance is below the
  capacity. Equal to ``lru_hit_rate`` at top-1; far lower at top-k > 1 when the capacity is near k.
- ``distinct_experts_vs_batch``: batch size -> mean number of distinct experts a layer needs in one decode
  step when that many requests decode together (requests sampled; re-used when the trace has too few).
- ``transition_accuracy``: how predictable layer l+1 is from layer l: a table of layer-l -> layer-l+1 expert
  co-occurrences learned on 4 of every 5 tokens predicts the top-k experts of layer l+1 for the 5th; accuracy is
  the share of the true experts predicted. ``transition_baseline_accuracy`` predicts layer l+1's most popular
  experts instead, for comparison.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np

from traces.analysis import step_lru
from traces.format import Trace

DEFAULT_CAPACITIES = (1, 2, 4, 6, 8, 16, 32, 64)
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
_CHUNK = 1 << 15
_STACK_CHUNK = 2048  # rows of the [chunk, experts] last-access table: small enough to stay in cache


# ------------------------------------------------------------------------------------------------ per figure


def popularity_skew(trace: Trace) -> tuple[float, list[float]]:
    """Share of selections taken by the top 10% of experts: (over all layers, per layer)."""
    e = trace.num_experts
    top_n = max(1, math.ceil(0.1 * e))
    tops, totals = [], []
    for layer in range(trace.num_layers):
        ids = trace.experts[:, layer, :].ravel()
        counts = np.bincount(ids[ids >= 0], minlength=e)
        tops.append(int(np.sort(counts)[::-1][:top_n].sum()))
        totals.append(int(counts.sum()))
    per_layer = [t / n if n else float("nan") for t, n in zip(tops, totals)]
    return (sum(tops) / sum(totals) if sum(totals) else float("nan")), per_layer


def overlap_prev(trace: Trace) -> tuple[float, list[float]]:
    """Mean share of a token's experts that the previous token of its request used too: (overall, per layer)."""
    num = np.zeros(trace.num_layers)
    den = np.zeros(trace.num_layers)
    req = trace.request_index()
    for s in range(1, trace.num_tokens, _CHUNK):
        t = slice(s, min(s + _CHUNK, trace.num_tokens))
        cur, prv = trace.experts[t], trace.experts[s - 1 : t.stop - 1]
        same_req = req[t] == req[s - 1 : t.stop - 1]
        shared = ((cur[..., :, None] == prv[..., None, :]) & (cur[..., None] >= 0)).any(-1).sum(-1)
        n_cur = (cur >= 0).sum(-1)
        valid = same_req[:, None] & (n_cur > 0) & (prv >= 0).any(-1)
        num += np.where(valid, shared / np.maximum(n_cur, 1), 0.0).sum(0)
        den += valid.sum(0)
    per_layer = [float(n / d) if d else float("nan") for n, d in zip(num, den)]
    return (float(num.sum() / den.sum()) if den.sum() else float("nan")), per_layer


def layer_accesses(trace: Trace, layer: int) -> np.ndarray:
    """The access sequence of one layer: expert ids in token order, then router order; -1 removed."""
    ids = trace.experts[:, layer, :].ravel()
    return ids[ids >= 0].astype(np.int64)


def stack_distances(accesses: np.ndarray, num_experts: int) -> np.ndarray:
    """LRU stack distance of each access (distinct other ids since its previous access), -1 for a first access.

    Vectorised over a [chunk, experts] table of each expert's last-access index: the distance of access i with
    previous access p is the number of experts whose last access (up to and including i) is after p, less one
    for the expert itself.
    """
    n = accesses.shape[0]
    out = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return out
    dt = np.int32 if n < np.iinfo(np.int32).max else np.int64
    order = np.argsort(accesses, kind="stable")
    same = accesses[order[1:]] == accesses[order[:-1]]
    prev = np.full(n, -1, dtype=dt)
    prev[order[1:][same]] = order[:-1][same]
    carry = np.full(num_experts, -1, dtype=dt)
    chunk = _STACK_CHUNK
    rows = np.arange(chunk)
    for s in range(0, n, chunk):
        a = accesses[s : s + chunk]
        b = a.shape[0]
        last = np.full((b, num_experts), -1, dtype=dt)
        last[rows[:b], a] = np.arange(s, s + b, dtype=dt)
        last[0] = np.maximum(last[0], carry)
        np.maximum.accumulate(last, axis=0, out=last)
        carry = last[-1].copy()
        p = prev[s : s + b]
        d = np.count_nonzero(last > p[:, None], axis=1) - 1
        out[s : s + b] = np.where(p >= 0, d, -1)
    return out


def reuse_profile(trace: Trace) -> list[np.ndarray]:
    """Per layer, the histogram of stack distances: index d < E counts distance d, index E counts cold misses."""
    e = trace.num_experts
    hists = []
    for layer in range(trace.num_layers):
        d = stack_distances(layer_accesses(trace, layer), e)
        hists.append(np.bincount(np.where(d < 0, e, d), minlength=e + 1))
    return hists


def lru_hit_rates(hists: list[np.ndarray], capacities) -> tuple[dict[int, float], list[dict[int, float]]]:
    """capacity -> LRU hit rate from stack-distance histograms: (over all layers, per layer)."""
    total = sum(int(h.sum()) for h in hists)
    overall: dict[int, float] = {}
    per_layer: list[dict[int, float]] = [{} for _ in hists]
    for c in capacities:
        hits = [int(h[:-1][:c].sum()) for h in hists]
        overall[c] = sum(hits) / total if total else float("nan")
        for i, (h, n) in enumerate(zip(hists, hits)):
            per_layer[i][c] = n / int(h.sum()) if h.sum() else float("nan")
    return overall, per_layer


def step_lru_hit_rates(
    trace: Trace, capacities, hists: list[np.ndarray] | None = None
) -> tuple[dict[int, float], list[dict[int, float]]]:
    """capacity -> step-wise LRU hit rate (the simulator's ``lru`` at batch 1): (over all layers, per layer).

    At top-1 a step is one access, so the figure equals the sequential one; it is then read from the stack
    distance histograms ``hists`` when given (cheaper). Beyond top-64 the figure is not computed (NaN)."""
    capacities = [int(c) for c in capacities]
    if trace.top_k == 1 and hists is not None:
        return lru_hit_rates(hists, capacities)
    if trace.top_k > step_lru.MAX_TOP_K:
        nan = {c: float("nan") for c in capacities}
        return dict(nan), [dict(nan) for _ in range(trace.num_layers)]
    hits, accesses = step_lru.layer_hits(trace.experts, trace.num_experts, capacities)
    total = int(accesses.sum())
    overall = {c: (int(hits[:, j].sum()) / total if total else float("nan")) for j, c in enumerate(capacities)}
    per_layer = [
        {c: (int(hits[i, j]) / int(n) if n else float("nan")) for j, c in enumerate(capacities)}
        for i, n in enumerate(accesses)
    ]
    return overall, per_layer


def distinct_experts_vs_batch(
    trace: Trace, batch_sizes=DEFAULT_BATCH_SIZES, samples: int = 8, max_steps: int = 256, seed: int = 0
):
    """batch size -> mean distinct experts per layer and decode step: (overall, per layer, sizes that re-used
    requests). Decode tokens are used (a trace with none uses all tokens); a layer counts only in steps where it
    routes something, so encoder layers do not dilute the figure for decode steps."""
    rng = np.random.default_rng(seed)
    decode = trace.decode_mask()
    if not decode.any():
        decode = np.ones_like(decode)
    starts = trace.request_offsets[:-1] + np.where(decode.any(), trace.prefill_lengths, 0)
    lengths = trace.request_offsets[1:] - starts
    pool = np.flatnonzero(lengths > 0)
    e = trace.num_experts
    overall: dict[int, float] = {}
    per_layer: list[dict[int, float]] = [{} for _ in range(trace.num_layers)]
    reused: list[int] = []
    if pool.size == 0:
        return overall, per_layer, reused
    for b in batch_sizes:
        if pool.size < b:
            reused.append(b)
        sums = np.zeros(trace.num_layers)
        count = np.zeros(trace.num_layers)
        for _ in range(samples):
            chosen, shift = _sample_batch(rng, pool, lengths, b)
            m = int(min(lengths[chosen].min(), max_steps))
            steps = (shift[:, None] + np.arange(m)[None, :]) % lengths[chosen][:, None]
            idx = starts[chosen][:, None] + steps  # [b, m]
            ids = trace.experts[idx]  # [b, m, L, K]
            ids = np.where(ids < 0, e, ids).transpose(1, 2, 0, 3).reshape(m, trace.num_layers, -1)
            present = np.zeros((m, trace.num_layers, e + 1), dtype=bool)
            np.put_along_axis(present, ids, True, axis=2)
            distinct = present[:, :, :e].sum(2)  # [m, L]
            sums += distinct.sum(0)
            count += (distinct > 0).sum(0)  # steps in which the layer routes anything
        for layer in range(trace.num_layers):
            per_layer[layer][b] = float(sums[layer] / count[layer]) if count[layer] else float("nan")
        overall[b] = float(sums.sum() / count.sum()) if count.sum() else float("nan")
    return overall, per_layer, reused


def _sample_batch(rng, pool: np.ndarray, lengths: np.ndarray, b: int):
    """Choose b requests from pool: distinct while the pool allows; beyond that each request is re-used
    evenly, every extra copy starting its decode tokens at a random step (cyclically) so that copies do not
    march in lockstep. Returns (requests, starting step of each)."""
    copies, rest = divmod(b, pool.size)
    chosen = np.concatenate(
        [rng.permutation(pool) for _ in range(copies)] + [rng.choice(pool, size=rest, replace=False)]
    )
    shift = np.zeros(b, dtype=np.int64)
    first = np.zeros(b, dtype=bool)
    first[np.unique(chosen, return_index=True)[1]] = True
    shift[~first] = rng.integers(0, lengths[chosen[~first]])
    return chosen, shift


def _predict_from_table(table: np.ndarray, popular: np.ndarray, sources: np.ndarray, k: int) -> np.ndarray:
    """Top-k of the summed table rows of each source set (ids of -1 add nothing; popularity breaks ties).
    Computed once per distinct source set, since a trace repeats few of them."""
    e = table.shape[0]
    uniq, inverse = np.unique(sources, axis=0, return_inverse=True)
    table_pad = np.vstack([table, np.zeros(e)])
    scores = table_pad[np.where(uniq < 0, e, uniq)].sum(1) + popular * 1e-9
    pred = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return pred[inverse.reshape(-1)]


def transition_accuracy(trace: Trace, holdout_every: int = 5):
    """Accuracy of a learned layer-l -> layer-l+1 table on held-out tokens: (overall, per pair, baseline overall).

    Per pair l -> l+1, only tokens routed in both layers count; a pair with no such tokens gives None.
    """
    e, k = trace.num_experts, trace.top_k
    test_mask = (np.arange(trace.num_tokens) % holdout_every) == holdout_every - 1
    hit_sum = base_sum = 0.0
    n_sum = 0
    per_pair: list[float | None] = []
    for layer in range(trace.num_layers - 1):
        a, b = trace.experts[:, layer, :], trace.experts[:, layer + 1, :]
        both = (a >= 0).any(1) & (b >= 0).any(1)
        train, test = both & ~test_mask, both & test_mask
        if not train.any() or not test.any():
            per_pair.append(None)
            continue
        ta, tb = a[train], b[train]
        pairs = (ta[:, :, None] >= 0) & (tb[:, None, :] >= 0)
        codes = (ta[:, :, None].astype(np.int64) * e + tb[:, None, :])[pairs]
        table = np.bincount(codes, minlength=e * e).reshape(e, e).astype(np.float64)
        popular = np.bincount(tb[tb >= 0], minlength=e)
        xa, xb = a[test], b[test]
        pred = _predict_from_table(table, popular, np.sort(xa, axis=1), k)
        base = np.argsort(-popular, kind="stable")[:k]
        n_true = (xb >= 0).sum(1)
        hits = ((pred[:, :, None] == xb[:, None, :]) & (xb[:, None, :] >= 0)).any(1).sum(1)
        base_hits = ((base[None, :, None] == xb[:, None, :]) & (xb[:, None, :] >= 0)).any(1).sum(1)
        per_pair.append(float(hits.sum() / n_true.sum()))
        hit_sum += hits.sum()
        base_sum += base_hits.sum()
        n_sum += n_true.sum()
    if n_sum == 0:
        return None, per_pair, None
    return float(hit_sum / n_sum), per_pair, float(base_sum / n_sum)


# -------------------------------------------------------------------------------------------------- together


def compute_stats(
    trace: Trace, capacities=DEFAULT_CAPACITIES, batch_sizes=DEFAULT_BATCH_SIZES, samples: int = 8, seed: int = 0
) -> dict:
    """Every figure above, for the whole trace at the top level and per layer under ``per_layer``."""
    skew, skew_l = popularity_skew(trace)
    overlap, overlap_l = overlap_prev(trace)
    hists = reuse_profile(trace)
    caps = [c for c in capacities if c >= 1]
    lru, lru_l = step_lru_hit_rates(trace, caps, hists)
    seq, seq_l = lru_hit_rates(hists, caps)
    distinct, distinct_l, reused = distinct_experts_vs_batch(trace, batch_sizes, samples, seed=seed)
    trans, trans_l, trans_base = transition_accuracy(trace)
    total_hist = np.sum(hists, axis=0)
    m = trace.meta.model
    per_layer = []
    for i, info in enumerate(m.layers):
        per_layer.append(
            {
                "index": info.index,
                "role": info.role,
                "popularity_skew": _num(skew_l[i]),
                "overlap_prev": _num(overlap_l[i]),
                "lru_hit_rate": {str(c): _num(v) for c, v in lru_l[i].items()},
                "lru_hit_rate_sequential": {str(c): _num(v) for c, v in seq_l[i].items()},
                "distinct_experts_vs_batch": {str(b): _num(v) for b, v in distinct_l[i].items()},
                "transition_accuracy_to_next": _num(trans_l[i]) if i < len(trans_l) else None,
                "accesses": int(hists[i].sum()),
            }
        )
    return {
        "trace": {
            "model": m.name,
            "tokens": trace.num_tokens,
            "requests": trace.num_requests,
            "layers": trace.num_layers,
            "experts": m.num_experts,
            "top_k": m.top_k,
            "decode_tokens": int(trace.decode_mask().sum()),
            "provenance": trace.meta.provenance.kind,
        },
        "accesses": int(total_hist.sum()),
        "popularity_skew": _num(skew),
        "overlap_prev": _num(overlap),
        "lru_hit_rate": {str(c): _num(v) for c, v in lru.items()},
        "lru_hit_rate_sequential": {str(c): _num(v) for c, v in seq.items()},
        "reuse_distance": {"cold": int(total_hist[-1]), "histogram": [int(x) for x in total_hist[:-1]]},
        "distinct_experts_vs_batch": {str(b): _num(v) for b, v in distinct.items()},
        "requests_reused_at_batch": reused,
        "transition_accuracy": _num(trans),
        "transition_baseline_accuracy": _num(trans_base),
        "per_layer": per_layer,
    }


def _num(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return round(float(x), 6)


def format_stats(s: dict) -> str:
    """A short readable summary of :func:`compute_stats`' result."""
    t = s["trace"]
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    lines = [
        f"model {t['model']}: {t['tokens']} tokens ({t['decode_tokens']} decode) in {t['requests']} requests, "
        f"{t['layers']} MoE layers, {t['experts']} experts, top-{t['top_k']} ({t['provenance']})",
        f"popularity skew (top 10% share) {f(s['popularity_skew'])}   overlap with previous token "
        f"{f(s['overlap_prev'])}   transition accuracy {f(s['transition_accuracy'])} "
        f"(popular-experts baseline {f(s['transition_baseline_accuracy'])})",
        "LRU hit rate, step-wise (the simulator's lru, batch 1), slots per layer:  "
        + "  ".join(f"{c}: {f(v)}" for c, v in s["lru_hit_rate"].items()),
        "LRU hit rate, sequential (one access at a time, router order), slots per layer:  "
        + "  ".join(f"{c}: {f(v)}" for c, v in s["lru_hit_rate_sequential"].items()),
        "distinct experts per layer and step:  "
        + "  ".join(f"batch {b}: {f(v)}" for b, v in s["distinct_experts_vs_batch"].items()),
    ]
    if s["requests_reused_at_batch"]:
        lines.append(f"(requests re-used to fill batches of {', '.join(map(str, s['requests_reused_at_batch']))})")
    cap = "4" if "4" in s["lru_hit_rate"] else next(iter(s["lru_hit_rate"]), "4")
    lines.append(
        f"{'layer':>5} {'role':>7} {'skew':>6} {'overlap':>7} {'lru@' + cap:>7} {'seq@' + cap:>7} "
        f"{'next-acc':>8}   (lru: step-wise, seq: sequential)"
    )
    for p in s["per_layer"]:
        lines.append(
            f"{p['index']:>5} {p['role']:>7} {f(p['popularity_skew']):>6} {f(p['overlap_prev']):>7} "
            f"{f(p['lru_hit_rate'].get(cap)):>7} {f(p['lru_hit_rate_sequential'].get(cap)):>7} "
            f"{f(p['transition_accuracy_to_next']):>8}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------- cli


def register(sub) -> None:
    p = sub.add_parser("stats", help="locality figures of a trace (skew, overlap, reuse, LRU hit rates, ...)")
    p.add_argument("file", metavar="FILE", help="trace file (.npz) to describe")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument(
        "--capacities",
        default=",".join(map(str, DEFAULT_CAPACITIES)),
        help="LRU capacities per layer, comma-separated (default: %(default)s)",
    )
    p.add_argument(
        "--batch-sizes",
        default=",".join(map(str, DEFAULT_BATCH_SIZES)),
        help="batch sizes for distinct experts per step (default: %(default)s)",
    )
    p.add_argument("--samples", type=int, default=8, help="sampled batches per batch size (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling batches (default: %(default)s)")
    p.set_defaults(func=run)


def parse_int_list(text: str, name: str) -> list[int]:
    from moebase.errors import InputError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{name} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise InputError(f"{name} must list integers >= 1, got {text!r}")
    return values


def run(args) -> int:
    from traces.io import load_trace

    trace = load_trace(args.file)
    s = compute_stats(
        trace,
        parse_int_list(args.capacities, "--capacities"),
        parse_int_list(args.batch_sizes, "--batch-sizes"),
        args.samples,
        args.seed,
    )
    if args.json:
        json.dump(s, sys.stdout, indent=1)
        print()
    else:
        print(f"{args.file}")
        print(format_stats(s))
    return 0
