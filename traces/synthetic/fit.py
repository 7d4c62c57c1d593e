"""Fitting the synthetic generator (``traces.synthetic.generator``) to a real trace, and checking the fit on held-out
requests.

The fitted model, per MoE layer (see :class:`traces.synthetic.generator.SynthKnobs`):

- **popularity**: the layer's empirical selection shares (every expert's share of the layer's selections),
  corrected for the generator's own distortion (a token's k experts are distinct, which flattens the law drawn
  from) so that the synthetic layer's shares match;
- **stickiness** (temporal): P(a slot re-uses the previous token's expert), matched to the layer's overlap with
  the previous token;
- **request concentration**: how strongly a request keeps to its own experts (each request draws its own
  popularity, Dirichlet around the layer's), matched to the layer's step-wise LRU hit rate at 2k and 4k slots
  (reuse beyond the previous token);
- **prefix**: the opening positions of a request whose routing is shared across requests (a chat template's fixed
  first tokens): each such position gets its own per-layer popularity. A position belongs to the prefix while its
  routing differs from the layer's overall routing (total variation, averaged over layers) by more than
  ``PREFIX_NOISE_FACTOR`` times what as many randomly chosen rows of the same requests differ by;

and, over all layers, the **cross-layer pull**: the empirical lift of each layer's experts given one expert of
the previous layer (``layer_transition``: P(b | a) / P(b) over pairs of the two top-k sets), averaged over the
token's previous-layer experts and raised to the power ``transition_power``, tilts every fresh draw, balanced
(``transition_balance``: the pulled laws of a layer are rescaled per expert so that the experts' shares of the
drawn sets stay the unpulled ones, and a token's experts are drawn without replacement). The power is raised
towards the layer-to-layer transition accuracy (:func:`traces.analysis.stats.transition_accuracy`) as long as
the figures above still calibrate about as well as they did without the pull (each within its tolerance of
where phase 1 left it; see :func:`fit_knobs`): they come first.

Fitting is calibration by simulation: generate a synthetic trace with the real trace's request lengths (cycled
up to ``min_tokens``, or an evenly spread subset of about ``max_tokens``), measure, correct every knob towards
its target, repeat. The seed is fixed across rounds, so the same input and seed give the same knobs.

Held-out check (:func:`held_out_check`): fit on the even-numbered requests, generate with the odd-numbered
requests' lengths, and compare on those odd requests: overlap with the previous token, step-wise LRU hit rate at
k, 2k and 4k slots per layer, distinct experts per layer and step at batch 1-64, plus popularity skew and
transition accuracy. Distinct experts are counts; their tolerance is judged on the count divided by the number
of experts (the share of a layer's experts a step needs).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from moebase.errors import InputError
from traces.analysis import stats
from traces.format import Trace
from traces.synthetic.generator import SynthKnobs, generate, knobs_like

HELD_OUT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
TOLERANCE = 0.03
PREFIX_NOISE_FACTOR = 2.0
PREFIX_MAX = 64
PREFIX_MIN_REQUESTS = 8
MAX_POWER = 16.0
FLOOR = 1e-6  # weight of an expert the real trace never selects in a layer (relative to the layer's total)


# ------------------------------------------------------------------------------------------------- pieces


def subset(trace: Trace, requests) -> Trace:
    """The trace of some of its requests (in the given order), metadata unchanged."""
    requests = np.asarray(requests, dtype=np.int64)
    off = trace.request_offsets
    rows = np.concatenate([np.arange(off[r], off[r + 1]) for r in requests]) if requests.size else np.zeros(0, int)
    lengths = (off[1:] - off[:-1])[requests]
    meta = trace.meta
    if meta.request_ids is not None:
        meta = dataclasses.replace(meta, request_ids=tuple(meta.request_ids[r] for r in requests))
    return Trace(
        trace.experts[rows],
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        trace.prefill_lengths[requests].astype(np.int64),
        meta,
        None if trace.weights is None else trace.weights[rows],
    )


def layer_shares(trace: Trace) -> np.ndarray:
    """float [layers, experts]: each expert's share of the layer's selections (0 where a layer routes nothing)."""
    e = trace.num_experts
    out = np.zeros((trace.num_layers, e))
    for layer in range(trace.num_layers):
        ids = trace.experts[:, layer, :].ravel()
        counts = np.bincount(ids[ids >= 0], minlength=e).astype(float)
        out[layer] = counts / counts.sum() if counts.sum() else 0.0
    return out


def layer_positions(trace: Trace, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows a layer routes, their requests, and their positions among the request's rows in that layer."""
    rows = np.flatnonzero((trace.experts[:, layer, :] >= 0).any(1))
    req = trace.request_index()[rows]
    return rows, req, np.arange(rows.size) - np.searchsorted(req, req, side="left")


def prefix_laws(trace: Trace, seed: int = 0) -> np.ndarray:
    """float [P, layers, experts]: per-position popularity of the prefix (see the module docstring); P may be 0.

    Position t joins while every layer has at least PREFIX_MIN_REQUESTS requests reaching it and the mean over
    layers of TV(position t's shares, the layer's shares) exceeds PREFIX_NOISE_FACTOR times the mean TV of as many
    rows drawn at random, one from each of those requests (four draws averaged)."""
    shares = layer_shares(trace)
    rng = np.random.default_rng(seed)
    e, n_layers = trace.num_experts, trace.num_layers
    per_layer = [layer_positions(trace, layer) for layer in range(n_layers)]
    laws: list[np.ndarray] = []
    for t in range(PREFIX_MAX):
        law, tv, noise = np.zeros((n_layers, e)), [], []
        for layer, (rows, req, pos) in enumerate(per_layer):
            at = pos == t
            if at.sum() < PREFIX_MIN_REQUESTS:
                return np.array(laws).reshape(len(laws), n_layers, e)
            law[layer] = _shares_of(trace.experts[rows[at], layer], e)
            tv.append(_tv(law[layer], shares[layer]))
            noise.append(
                np.mean(
                    [
                        _tv(_shares_of(trace.experts[_one_row_each(rows, req, req[at], rng), layer], e), shares[layer])
                        for _ in range(4)
                    ]
                )
            )
        if np.mean(tv) <= PREFIX_NOISE_FACTOR * np.mean(noise):
            break
        laws.append(law)
    return np.array(laws).reshape(len(laws), n_layers, e)


def _tv(p: np.ndarray, q: np.ndarray) -> float:
    """Total-variation distance of two laws."""
    return float(0.5 * np.abs(p - q).sum())


def _shares_of(ids: np.ndarray, e: int) -> np.ndarray:
    ids = ids.ravel()
    counts = np.bincount(ids[ids >= 0], minlength=e).astype(float)
    return counts / max(counts.sum(), 1.0)


def _one_row_each(rows: np.ndarray, req: np.ndarray, requests: np.ndarray, rng) -> np.ndarray:
    """One random row (of ``rows``, grouped by ``req``) of each of ``requests``."""
    lo = np.searchsorted(req, requests, side="left")
    hi = np.searchsorted(req, requests, side="right")
    return rows[lo + (rng.random(requests.size) * (hi - lo)).astype(np.int64)]


# ------------------------------------------------------------------------------------------------- targets


def lru_capacities(trace: Trace) -> tuple[int, int, int]:
    """The held-out LRU capacities: k, 2k and 4k slots per layer."""
    k = trace.top_k
    return k, 2 * k, 4 * k


@dataclass
class Measure:
    """What calibration compares, per layer: selection shares, overlap with the previous token, step-wise LRU hit
    rates at ``caps`` (the capacities below the expert count among 2k and 4k); and the transition accuracy."""

    shares: np.ndarray
    overlap: np.ndarray
    lru: np.ndarray  # [layers, len(caps)]
    transition: float | None

    @classmethod
    def of(cls, trace: Trace, caps: list[int]) -> Measure:
        _, ov = stats.overlap_prev(trace)
        lru = np.zeros((trace.num_layers, len(caps)))
        if caps:
            _, per_layer = stats.step_lru_hit_rates(trace, caps)
            lru = np.array([[d[c] for c in caps] for d in per_layer], dtype=float)
        return cls(
            layer_shares(trace),
            np.nan_to_num(np.array(ov, dtype=float), nan=0.0),
            np.nan_to_num(lru, nan=0.0),
            stats.transition_accuracy(trace)[0],
        )


# ----------------------------------------------------------------------------------------------------- fit


@dataclass
class FitResult:
    """Fitted knobs (with the real trace's shape and lengths) and how close the calibration trace came."""

    knobs: SynthKnobs
    rounds: int
    residual: dict[str, float]
    prefix_positions: int
    unpulled_residual: dict[str, float] = dataclasses.field(default_factory=dict)  # at the end of phase 1


def fit_knobs(real: Trace, seed: int = 0, min_tokens: int = 20000, max_tokens: int = 30000, log=None) -> FitResult:
    """Calibrate every knob of the fitted model to ``real`` (see the module docstring). Deterministic in seed.

    Phase 1 calibrates popularity, stickiness and request concentration without cross-layer pull. Phase 2 raises
    the pull's power towards the transition accuracy, re-calibrating the others after each raise, and keeps the
    largest power at which they still calibrate about as well as phase 1 left them (each within its tolerance of
    its phase-1 miss): overlap, LRU and popularity come first, the transition accuracy is matched only as far as
    they allow."""
    if real.num_tokens == 0:
        raise InputError("cannot fit to a trace without tokens")
    caps = [c for c in lru_capacities(real)[1:] if c < real.num_experts]
    target = Measure.of(real, caps)
    lengths, n_req = _calibration_lengths(real, min_tokens, max_tokens)
    base, _ = knobs_like(real, requests=n_req)
    model = _Calibration(real, target, caps, base, lengths, seed, log)
    model.settle(PHASE1_ROUNDS)
    unpulled = dict(model.residual)
    if target.transition is not None and model.transition is not None:
        model.raise_power()
    final, _ = knobs_like(real)
    return FitResult(model.knobs(final), model.rounds, model.residual, int(model.prefix.shape[0]), unpulled)


PHASE1_ROUNDS = 6
PHASE2_ROUNDS = 5
PHASE2_STEPS = 8
PHASE2_MAX_STEP = 2.0  # the most the power rises in one step
PRIMARY_TOLERANCE = {"popularity_tv": 0.03, "overlap": 0.01, "lru": 0.02}


class _Calibration:
    """The knobs under calibration and the loop that corrects them (see :func:`fit_knobs`)."""

    def __init__(self, real: Trace, target: Measure, caps: list[int], base: SynthKnobs, lengths, seed: int, log):
        self.target, self.caps, self.base, self.lengths, self.seed, self.log = target, caps, base, lengths, seed, log
        self.prefix = prefix_laws(real, seed)
        self.transition = transition_laws(real) if real.num_layers > 1 else None
        w = np.maximum(target.shares, FLOOR)
        self.weights = w / w.sum(1, keepdims=True)
        self.stick = np.clip(target.overlap, 0.0, 0.95) * 0.7
        self.conc = _Bracket(
            np.full(real.num_layers, math.log(30.0)), math.log(0.05), math.log(1e5), slope=-0.03, max_step=1.5
        )
        self.power = 0.0
        self.limits = dict(PRIMARY_TOLERANCE)  # the most each primary figure may miss by (phase 2: see raise_power)
        self.rounds = 0
        self.residual: dict[str, float] = {}
        self.got: Measure | None = None

    def knobs(self, base: SynthKnobs | None = None) -> SynthKnobs:
        return _knobs(
            base or self.base,
            self.weights,
            self.stick,
            self.conc.x if self.caps else None,
            self.power if self.transition is not None else 0.0,
            self.prefix,
            self.transition,
        )

    def measure(self) -> Measure:
        self.rounds += 1
        self.got = Measure.of(generate(self.knobs(), self.seed, self.lengths), self.caps)
        self.residual = _residuals(self.target, self.got)
        if self.log:
            self.log(
                f"fit round {self.rounds} (power {self.power:.2f}): "
                + "  ".join(f"{k} {v:.4f}" for k, v in self.residual.items())
            )
        return self.got

    def primary_ok(self) -> bool:
        return all(self.residual.get(k, 0.0) <= limit for k, limit in self.limits.items())

    def correct(self, gain: float) -> None:
        got, target = self.got, self.target
        assert got is not None, "measure() comes first"
        self.weights = _update_weights(self.weights, target.shares, got.shares, gain)
        self.stick = _update_stickiness(self.stick, target.overlap, got.overlap)
        if self.caps:
            self.conc.update(target.lru.mean(1) - got.lru.mean(1))

    def settle(self, rounds: int, gain: float = 0.8) -> bool:
        """Measure and correct up to ``rounds`` times; True once the primary figures are within tolerance (the
        knobs are then those just measured)."""
        for _ in range(rounds):
            self.measure()
            if self.primary_ok():
                return True
            self.correct(gain)
        self.measure()
        return self.primary_ok()

    def raise_power(self) -> None:
        """Phase 2: secant steps of the power towards the transition accuracy, each followed by settling; a power
        is kept while every primary figure misses by at most its tolerance more than at the end of phase 1 (or by
        at most its tolerance): the pull must not cost more than a tolerance of what phase 1 reached."""
        self.limits = {k: max(tol, self.residual.get(k, 0.0) + tol) for k, tol in PRIMARY_TOLERANCE.items()}
        saved = self._save()
        points = [(0.0, self._got_transition())]
        goal = self.target.transition
        assert goal is not None, "fit_knobs raises the power only towards a measured transition accuracy"
        for _ in range(PHASE2_STEPS):
            miss = goal - points[-1][1]
            if miss <= 0.005:
                return
            if len(points) > 1 and points[-1][1] - points[-2][1] > 1e-3:
                slope = (points[-1][1] - points[-2][1]) / (points[-1][0] - points[-2][0])
            else:
                slope = 0.1
            step = float(np.clip(miss / slope, 0.25, PHASE2_MAX_STEP))
            self.power = float(min(MAX_POWER, points[-1][0] + step))
            self.conc.forget()  # the concentration's bracket was found under the previous pull
            if not self.settle(PHASE2_ROUNDS, gain=0.5):
                self._restore(saved)
                return
            saved = self._save()
            points.append((self.power, self._got_transition()))
            if self.power >= MAX_POWER:
                return

    def _got_transition(self) -> float:
        """The transition accuracy of the last round measured (phase 2 only: the calibration trace has layer
        pairs)."""
        got = self.got
        assert got is not None and got.transition is not None, "phase 2 measures a transition accuracy"
        return got.transition

    def _save(self):
        return (self.weights.copy(), self.stick.copy(), self.conc.x.copy(), self.power, self.residual, self.got)

    def _restore(self, saved) -> None:
        self.weights, self.stick, self.conc.x, self.power, self.residual, self.got = saved


def transition_laws(trace: Trace, prior: float = 1.0) -> np.ndarray:
    """float [layers - 1, experts, experts]: entry [a][b] of table l - 1 is the lift of layer l's expert b on
    tokens whose layer l - 1 chose a: P(b | a) / P(b), over all pairs of the two top-k sets, with ``prior``
    tokens' worth of no-lift mixed in (so an expert a seldom or never seen has lifts near 1)."""
    e, k = trace.num_experts, trace.top_k
    shares = layer_shares(trace)
    out = np.ones((max(trace.num_layers - 1, 0), e, e))
    for layer in range(1, trace.num_layers):
        a, b = trace.experts[:, layer - 1, :], trace.experts[:, layer, :]
        pairs = (a[:, :, None] >= 0) & (b[:, None, :] >= 0)
        codes = (a[:, :, None].astype(np.int64) * e + b[:, None, :])[pairs]
        counts = np.bincount(codes, minlength=e * e).reshape(e, e).astype(float)
        cond = (counts + prior * k * shares[layer][None, :]) / (counts.sum(1, keepdims=True) + prior * k)
        out[layer - 1] = np.where(shares[layer][None, :] > 0, cond / np.maximum(shares[layer][None, :], 1e-300), 1.0)
    return out


def _calibration_lengths(real: Trace, min_tokens: int, max_tokens: int):
    """(prompt, decode) lengths of the calibration trace: REAL's requests cycled up to ``min_tokens``, or an evenly
    spread subset of them when REAL has more than ``max_tokens``."""
    lengths = real.request_lengths
    total = int(lengths.sum())
    if total > max_tokens:
        n = max(1, int(real.num_requests * max_tokens / total))
        pick = np.unique(np.linspace(0, real.num_requests - 1, n).round().astype(np.int64))
    else:
        reps = max(1, -(-min_tokens // max(total, 1)))
        pick = np.tile(np.arange(real.num_requests), reps)
    prompt = real.prefill_lengths[pick]
    return (prompt, lengths[pick] - prompt), int(pick.size)


def _knobs(base: SynthKnobs, weights, stick, log_conc, power, prefix, transition) -> SynthKnobs:
    """The knobs of one calibration round (rounded as they are stored)."""
    # numpy's stubs type np.round of an untyped argument as a scalar; here it is always an array
    r = lambda a: tuple(float(x) for x in np.round(a, 6))  # type: ignore[attr-defined]  # noqa: E731
    table = lambda t: tuple(tuple(r(row) for row in x) for x in t)  # noqa: E731
    return dataclasses.replace(
        base,
        correlation=0.0,
        transition_power=None if transition is None else round(float(power), 6),
        transition_balance=True,
        layer_popularity=tuple(r(w) for w in weights),
        layer_stickiness=r(stick),
        request_concentration=None if log_conc is None else r(np.exp(log_conc)),
        prefix_popularity=table(prefix) if prefix.shape[0] else None,
        layer_transition=None if transition is None else table(transition),
    )


def _residuals(target: Measure, got: Measure) -> dict[str, float]:
    """Largest absolute misses of the calibration figures (popularity: largest total-variation distance)."""
    out = {
        "popularity_tv": float((0.5 * np.abs(target.shares - got.shares).sum(1)).max()),
        "overlap": float(np.abs(target.overlap - got.overlap).max()),
    }
    if target.lru.size:
        out["lru"] = float(np.abs(target.lru - got.lru).mean(1).max())
    if target.transition is not None and got.transition is not None:
        out["transition"] = abs(target.transition - got.transition)
    return out


def _update_weights(weights: np.ndarray, target: np.ndarray, got: np.ndarray, gain: float = 0.8) -> np.ndarray:
    """Scale each expert's draw weight by how far its synthetic share falls short of its real one."""
    ratio = np.where(target > 0, (target + FLOOR) / (got + FLOOR), 1.0)
    w = weights * np.clip(ratio, 0.25, 4.0) ** gain
    w = np.where(target > 0, w, FLOOR * w.sum(1, keepdims=True))
    return w / w.sum(1, keepdims=True)


def _update_stickiness(stick: np.ndarray, target: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Newton step on overlap = s + (1 - s) q, q being the overlap of a fresh (non-sticky) slot."""
    q = np.clip((got - stick) / np.maximum(1 - stick, 1e-6), 0.0, 0.99)
    return np.clip((target - q) / np.maximum(1 - q, 1e-6), 0.0, 0.99)


class _Bracket:
    """Root finding, element-wise, for knobs without a closed-form update (log concentration per layer, the
    correlation): the figure is monotone in the knob with the sign of ``slope``; each update takes the
    miss = target - got at the current ``x``, keeps the nearest points on either side of the root, and steps by
    regula falsi between them once both are known, otherwise by ``miss / slope`` (at most ``max_step``)."""

    def __init__(self, x0: np.ndarray, lo: float, hi: float, slope: float, max_step: float):
        self.x = np.asarray(x0, dtype=float).copy()
        self.lo, self.hi, self.slope, self.max_step = lo, hi, slope, max_step
        n = self.x.size
        self.below = np.full(n, np.nan), np.full(n, np.nan)  # (x, miss) where the knob must grow
        self.above = np.full(n, np.nan), np.full(n, np.nan)  # (x, miss) where it must shrink

    def forget(self) -> None:
        """Drop the points kept so far (the figure's dependence on the knob has changed: another cross-layer pull)."""
        for side in (self.below, self.above):
            side[0][:], side[1][:] = np.nan, np.nan

    def update(self, miss: np.ndarray) -> None:
        grow = miss / self.slope > 0
        for side, mask in ((self.below, grow), (self.above, ~grow)):
            side[0][mask], side[1][mask] = self.x[mask], miss[mask]
        step = np.clip(miss / self.slope, -self.max_step, self.max_step)
        new = self.x + step
        both = ~np.isnan(self.below[0]) & ~np.isnan(self.above[0])
        (xb, mb), (xa, ma) = self.below, self.above
        with np.errstate(invalid="ignore", divide="ignore"):
            falsi = xb + (xa - xb) * mb / (mb - ma)
        new = np.where(both & np.isfinite(falsi), falsi, new)
        self.x = np.clip(new, self.lo, self.hi)


# ------------------------------------------------------------------------------------------------ held out


def figures(trace: Trace, samples: int = 16, seed: int = 0) -> dict[str, float]:
    """The held-out figures of a trace (name -> value; distinct experts as counts)."""
    caps = lru_capacities(trace)
    lru, _ = stats.step_lru_hit_rates(trace, caps)
    distinct, _, _ = stats.distinct_experts_vs_batch(trace, HELD_OUT_BATCHES, samples, seed=seed)
    out = {"overlap_prev": stats.overlap_prev(trace)[0]}
    out.update({f"lru_hit_rate@{c}": lru[c] for c in caps})
    out.update({f"distinct_experts@batch{b}": v for b, v in distinct.items()})
    out["popularity_skew"] = stats.popularity_skew(trace)[0]
    trans = stats.transition_accuracy(trace)[0]
    out["transition_accuracy"] = float("nan") if trans is None else trans
    return out


def split_halves(trace: Trace) -> tuple[Trace, Trace]:
    """(even-numbered requests, odd-numbered requests): the fit half and the held-out half."""
    if trace.num_requests < 2:
        raise InputError("a held-out check needs at least 2 requests in the real trace")
    r = np.arange(trace.num_requests)
    return subset(trace, r[0::2]), subset(trace, r[1::2])


def held_out_check(real: Trace, seed: int = 0, min_tokens: int = 20000, log=None) -> tuple[list[dict], FitResult]:
    """Fit on half of REAL's requests, compare on the other half: (table rows, the fit on the first half).

    The synthetic side is generated with exactly the held-out requests' lengths, as many times as it takes to
    reach ``min_tokens`` (seeds seed+1, seed+2, ...), its figures averaged over those copies."""
    fit_half, held = split_halves(real)
    result = fit_knobs(fit_half, seed=seed, min_tokens=min_tokens, log=log)
    real_fig = figures(held, seed=seed)
    prompt = held.prefill_lengths
    lengths = (prompt, held.request_lengths - prompt)
    copies = int(min(16, max(1, -(-min_tokens // max(held.num_tokens, 1)))))
    knobs = dataclasses.replace(result.knobs, requests=held.num_requests)
    synth = [figures(generate(knobs, seed + 1 + i, lengths), seed=seed) for i in range(copies)]
    rows = []
    for name, value in real_fig.items():
        values = [c[name] for c in synth if not math.isnan(c[name])]
        got = float(np.mean(values)) if values else math.nan
        scale = real.num_experts if name.startswith("distinct") else 1
        diff = got - value
        rows.append(
            {
                "figure": name,
                "real": value,
                "synthetic": got,
                "diff": diff,
                "judged": diff / scale,
                "within": None if math.isnan(diff) else bool(abs(diff / scale) <= TOLERANCE),
                "target": not name.startswith(("popularity", "transition")),
            }
        )
    return rows, result


def format_table(rows: list[dict], num_experts: int) -> str:
    """The held-out side-by-side table, with a note on how each figure is judged."""
    lines = [f"{'figure (held-out requests)':<28} {'real':>8} {'synthetic':>10} {'diff':>8}  within {TOLERANCE}"]
    for r in rows:
        mark = "-" if r["within"] is None else ("yes" if r["within"] else "NO")
        note = f"  ({r['judged']:+.3f} of {num_experts} experts)" if r["figure"].startswith("distinct") else ""
        note += "" if r["target"] else "  (extra figure)"
        lines.append(
            f"{r['figure']:<28} {_f(r['real']):>8} {_f(r['synthetic']):>10} {_f(r['diff'], '+'):>8}  {mark}{note}"
        )
    lines.append(
        f"(distinct experts per layer and step are counts, judged as a share of the {num_experts} experts; "
        "extra figures: popularity skew, and the transition accuracy the cross-layer pull is fitted to as "
        "far as the other figures allow)"
    )
    return "\n".join(lines)


def _f(x: float, sign: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:{sign}.3f}"


def stretch_layers(knobs: SynthKnobs, encoder_layers: int, decoder_layers: int) -> tuple[SynthKnobs, list[int]]:
    """Fitted knobs for a deeper (or shallower) model of the same family: layer i of a role takes the knobs of the
    fitted layer of that role at the same relative depth (``floor(i * fitted / wanted)``). Between two new layers
    that take the same fitted layer there is no cross-layer pull (all lifts 1: nothing was measured between them);
    between layers that take consecutive fitted layers, the fitted pull. Returns the knobs and, per new layer, the
    fitted layer it came from. The opening positions' popularity follows the same map."""
    old_enc, old_dec = knobs.encoder_layers, knobs.decoder_layers
    if (encoder_layers > 0) != (old_enc > 0) or (decoder_layers > 0) != (old_dec > 0):
        raise InputError(
            f"--encoder-layers/--decoder-layers: the fitted trace has {old_enc} encoder and {old_dec} "
            f"decoder MoE layers; a stretched model must keep the same roles"
        )
    source = [int(i * old_enc // encoder_layers) for i in range(encoder_layers)]
    source += [old_enc + int(i * old_dec // decoder_layers) for i in range(decoder_layers)]

    def per_layer(values):
        return None if values is None else tuple(values[j] for j in source)

    transition = None
    if knobs.layer_transition is not None:
        e = knobs.num_experts
        ones = tuple(tuple(1.0 for _ in range(e)) for _ in range(e))
        table = []
        for a, b in zip(source, source[1:]):
            table.append(knobs.layer_transition[a] if b == a + 1 else ones)
        transition = tuple(table) if table else None  # one layer: no pair of layers to pull between
    prefix = None
    if knobs.prefix_popularity is not None:
        prefix = tuple(tuple(pos[j] for j in source) for pos in knobs.prefix_popularity)
    stretched = dataclasses.replace(
        knobs,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        layer_popularity=per_layer(knobs.layer_popularity),
        layer_stickiness=per_layer(knobs.layer_stickiness),
        request_concentration=per_layer(knobs.request_concentration),
        prefix_popularity=prefix,
        layer_transition=transition,
    )
    stretched.check()
    return stretched, source
