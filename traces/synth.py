"""`python -m traces synth`: synthetic routing with knobs for skew, temporal stickiness and cross-layer correlation.

The generative model, per request, token (in time order), MoE layer and top-k slot j:

1. with probability ``stickiness`` the slot re-uses the expert the previous token of the same request chose in
   slot j of this layer (temporal locality);
2. otherwise, with probability ``correlation``, it takes ``map_l(expert of slot j in the previous MoE layer)``,
   a fixed per-layer bijection that sends the layer-(l-1) expert of popularity rank r to the layer-l expert of
   rank r (cross-layer correlation that keeps each layer's popularity);
3. otherwise it draws from the layer's popularity: a Zipf law with exponent ``skew`` over a random per-layer
   ordering of the experts (global, per-layer hot experts).

A slot that repeats an expert already in the token's top-k is re-drawn from the popularity. Prompt tokens are
routed in encoder layers and generated tokens in decoder layers when the model has both; a decoder-only model
routes every token in every layer. ``--fit REAL`` searches skew, stickiness and correlation so that the
synthetic trace's popularity skew, ``overlap_prev``, LRU hit rate and transition accuracy match REAL, with
REAL's model shape and request lengths.

The same knobs and seed give a byte-identical file (the trace's date is left empty unless ``--date`` is given).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import numpy as np

from traces.errors import InputError
from traces.format import LayerInfo, ModelInfo, Provenance, Trace, TraceMeta

TOOL = "traces synth"


@dataclass(frozen=True)
class SynthKnobs:
    """Everything a synthetic trace is a function of (with the seed)."""

    model: str = "synthetic"
    num_experts: int = 8
    top_k: int = 2
    encoder_layers: int = 0
    decoder_layers: int = 32
    requests: int = 64
    prompt_len: tuple[int, int] = (16, 64)
    decode_len: tuple[int, int] = (64, 256)
    skew: float = 0.5
    stickiness: float = 0.2
    correlation: float = 0.2

    def check(self) -> None:
        """Raise InputError naming the first impossible knob."""
        if self.num_experts < 1 or self.num_experts > np.iinfo(np.int16).max:
            raise InputError(f"--experts must be 1..{np.iinfo(np.int16).max}, got {self.num_experts}")
        if not 1 <= self.top_k <= self.num_experts:
            raise InputError(f"--top-k must be 1..{self.num_experts} (the expert count), got {self.top_k}")
        if self.encoder_layers < 0 or self.decoder_layers < 0 or self.encoder_layers + self.decoder_layers < 1:
            raise InputError("--encoder-layers and --decoder-layers must be >= 0 with at least one layer in all")
        if self.requests < 1:
            raise InputError(f"--requests must be >= 1, got {self.requests}")
        for name, (lo, hi) in (("--prompt-len", self.prompt_len), ("--decode-len", self.decode_len)):
            if lo < 0 or hi < lo:
                raise InputError(f"{name} must be MIN,MAX with 0 <= MIN <= MAX, got {lo},{hi}")
        if self.encoder_layers and self.prompt_len[0] < 1:
            raise InputError("--prompt-len must be >= 1 when the model has encoder layers")
        if self.prompt_len[1] + self.decode_len[1] < 1:
            raise InputError("--prompt-len and --decode-len leave every request empty")
        if self.skew < 0:
            raise InputError(f"--skew must be >= 0, got {self.skew}")
        for name, v in (("--stickiness", self.stickiness), ("--correlation", self.correlation)):
            if not 0.0 <= v <= 1.0:
                raise InputError(f"{name} must lie in [0, 1], got {v}")

    def layers(self) -> tuple[LayerInfo, ...]:
        enc = [LayerInfo(i, "encoder") for i in range(self.encoder_layers)]
        dec = [LayerInfo(i, "decoder") for i in range(self.decoder_layers)]
        return tuple(enc + dec)


def generate(knobs: SynthKnobs, seed: int = 0, lengths: tuple[np.ndarray, np.ndarray] | None = None,
             date: str | None = None, extra: dict | None = None) -> Trace:
    """A synthetic trace. ``lengths`` = (prompt lengths, decode lengths) per request overrides the drawn ones."""
    knobs.check()
    rng = np.random.default_rng(seed)
    e, k = knobs.num_experts, knobs.top_k
    layers = knobs.layers()
    n_layers = len(layers)
    if lengths is None:
        prompt = rng.integers(knobs.prompt_len[0], knobs.prompt_len[1] + 1, knobs.requests)
        decode = rng.integers(knobs.decode_len[0], knobs.decode_len[1] + 1, knobs.requests)
        empty = prompt + decode == 0
        decode[empty] = 1
    else:
        prompt, decode = (np.asarray(x, dtype=np.int64) for x in lengths)
    total = prompt + decode
    offsets = np.concatenate([[0], np.cumsum(total)]).astype(np.int64)

    # Per-layer popularity: Zipf over a random ordering; rank_to_expert[l, r] is layer l's rank-r expert.
    ranks = np.arange(e)
    pop = (ranks + 1.0) ** -knobs.skew
    pop /= pop.sum()
    cdf = np.cumsum(pop)
    rank_to_expert = np.stack([rng.permutation(e) for _ in range(n_layers)])
    expert_to_rank = np.argsort(rank_to_expert, axis=1)

    def draw(n: int, layer: int) -> np.ndarray:
        r = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), e - 1)
        return rank_to_expert[layer, r]

    is_encoder = np.array([x.role == "encoder" for x in layers])
    both_roles = bool(is_encoder.any()) and bool((~is_encoder).any())
    n_tok = int(offsets[-1])
    position = np.arange(n_tok) - np.repeat(offsets[:-1], total)
    in_prompt = position < np.repeat(prompt, total)
    first_of_request = position == 0
    if both_roles:  # a request's first generated token starts the decoder layers' sequence
        first_of_request = first_of_request | (position == np.repeat(prompt, total))
    experts = np.full((n_tok, n_layers, k), -1, dtype=np.int16)
    for layer in range(n_layers):
        rows = np.flatnonzero((in_prompt if is_encoder[layer] else ~in_prompt) if both_roles
                              else np.ones(n_tok, dtype=bool))
        if rows.size == 0:
            continue
        n = rows.size
        base = draw(n * k, layer).reshape(n, k)
        if layer > 0 and knobs.correlation > 0:
            src = experts[rows, layer - 1].astype(np.int64)
            mapped = rank_to_expert[layer, expert_to_rank[layer - 1, np.maximum(src, 0)]]
            use = (rng.random((n, k)) < knobs.correlation) & (src >= 0)
            base = np.where(use, mapped, base)
        sticky = (rng.random((n, k)) < knobs.stickiness) & ~first_of_request[rows][:, None]
        experts[rows, layer] = _sticky_dedupe(base, sticky, lambda m: draw(m, layer), rank_to_expert[layer])
    meta = TraceMeta(
        model=ModelInfo(knobs.model, e, k, layers),
        provenance=Provenance("synthetic", TOOL, knobs.model, "synthetic", date),
        seed=int(seed),
        extra={"knobs": _knobs_dict(knobs), **(extra or {})},
    )
    return Trace(experts, offsets, prompt.astype(np.int64), meta)


def _forward_fill(base: np.ndarray, sticky: np.ndarray) -> np.ndarray:
    """choice[t] = choice[t-1] where sticky[t], else base[t]; per column, vectorised over t."""
    n = base.shape[0]
    idx = np.where(sticky, 0, np.arange(n)[:, None])
    np.maximum.accumulate(idx, axis=0, out=idx)
    return np.take_along_axis(base, idx, axis=0)


def _sticky_dedupe(base: np.ndarray, sticky: np.ndarray, draw, by_rank: np.ndarray) -> np.ndarray:
    """Resolve stickiness along time, then re-draw any slot that repeats an expert of its own token (such a
    slot stops being sticky); repeated until no token holds an expert twice."""
    k = base.shape[1]
    choice = _forward_fill(base, sticky)
    for attempt in range(1000):
        dup = np.zeros(choice.shape, dtype=bool)
        for j in range(1, k):
            dup[:, j] = (choice[:, j:j + 1] == choice[:, :j]).any(1)
        if not dup.any():
            return choice
        rows, cols = np.nonzero(dup)
        if attempt < 8:
            base[rows, cols] = draw(rows.size)
        else:  # rare: the most popular expert that no other slot of the token holds
            for i, j in zip(rows, cols):
                taken = set(choice[i, :j].tolist()) | set(choice[i, j + 1:].tolist())
                base[i, j] = next(int(x) for x in by_rank if int(x) not in taken)
        sticky[rows, cols] = False
        choice = _forward_fill(base, sticky)
    raise RuntimeError("synth: could not make each token's experts distinct")


def _knobs_dict(knobs: SynthKnobs) -> dict:
    d = dataclasses.asdict(knobs)
    d["prompt_len"], d["decode_len"] = list(knobs.prompt_len), list(knobs.decode_len)
    return d


# ------------------------------------------------------------------------------------------------------ fit

FIT_TARGETS = ("popularity_skew", "overlap_prev", "lru_hit_rate", "transition_accuracy")


def fit_capacity(num_experts: int) -> int:
    """The LRU capacity whose hit rate the fit matches: 4, or less for models with very few experts."""
    return max(1, min(4, num_experts - 1))


def locality(trace: Trace, capacity: int) -> dict[str, float]:
    """The figures the fit matches (a subset of traces.stats, without the costlier ones)."""
    from traces import stats

    hists = stats.reuse_profile(trace)
    lru, _ = stats.lru_hit_rates(hists, [capacity])
    trans = stats.transition_accuracy(trace)[0]
    return {"popularity_skew": stats.popularity_skew(trace)[0], "overlap_prev": stats.overlap_prev(trace)[0],
            "lru_hit_rate": lru[capacity], "transition_accuracy": trans if trans is not None else 0.0}


def knobs_like(real: Trace, requests: int | None = None, **overrides) -> tuple[SynthKnobs, tuple[np.ndarray, np.ndarray]]:
    """Knobs with REAL's model shape, and request lengths that cycle through REAL's requests."""
    m = real.meta.model
    enc = sum(1 for x in m.layers if x.role == "encoder")
    n = requests or real.num_requests
    pick = np.arange(n) % real.num_requests
    prompt = real.prefill_lengths[pick]
    decode = (real.request_lengths - real.prefill_lengths)[pick]
    knobs = SynthKnobs(model=m.name, num_experts=m.num_experts, top_k=m.top_k, encoder_layers=enc,
                       decoder_layers=len(m.layers) - enc, requests=n,
                       prompt_len=(int(prompt.min()), int(prompt.max())),
                       decode_len=(int(decode.min()), int(decode.max())), **overrides)
    return knobs, (prompt, decode)


def fit(real: Trace, seed: int = 0, min_tokens: int = 16000, max_evals: int = 60, log=None) -> tuple[SynthKnobs, dict]:
    """Search skew, stickiness and correlation so the synthetic locality figures match REAL's.

    Every candidate is scored on a trace with REAL's shape and at least ``min_tokens`` tokens (REAL's requests
    cycled), generated from the same seed so that the search compares knobs, not noise. Returns the best
    knobs (with REAL's shape) and {"target": ..., "fitted": ..., "evaluations": n}.
    """
    cap = fit_capacity(real.num_experts)
    target = locality(real, cap)
    reps = max(1, -(-min_tokens // max(real.num_tokens, 1)))
    base, lengths = knobs_like(real, requests=real.num_requests * reps)
    weights = {"popularity_skew": 1.0, "overlap_prev": 2.0, "lru_hit_rate": 2.0, "transition_accuracy": 1.0}
    cache: dict[tuple, tuple[float, dict]] = {}

    def score(x: tuple[float, float, float]) -> tuple[float, dict]:
        key = tuple(round(v, 4) for v in x)
        if key not in cache:
            kn = dataclasses.replace(base, skew=key[0], stickiness=key[1], correlation=key[2])
            got = locality(generate(kn, seed, lengths), cap)
            err = sum(w * (got[n] - target[n]) ** 2 for n, w in weights.items())
            cache[key] = (err, got)
        return cache[key]

    bounds = np.array([(0.0, 4.0), (0.0, 0.95), (0.0, 0.95)])
    x = _nelder_mead(lambda v: score(tuple(v))[0], np.array([0.5, 0.2, 0.2]), np.array([0.4, 0.15, 0.15]),
                     bounds, max_evals=max_evals, log=log)
    fitted = score(tuple(x))[1]
    knobs, _ = knobs_like(real, skew=round(x[0], 4), stickiness=round(x[1], 4), correlation=round(x[2], 4))
    return knobs, {"target": target, "fitted": fitted, "evaluations": len(cache), "capacity": cap}


def _nelder_mead(f, x0: np.ndarray, step: np.ndarray, bounds: np.ndarray, max_evals: int, log=None,
                 tol: float = 1e-6) -> np.ndarray:
    """Minimise f over a box by the Nelder-Mead simplex method (points clipped into the box)."""
    clip = lambda v: np.clip(v, bounds[:, 0], bounds[:, 1])  # noqa: E731
    pts = [clip(x0)] + [clip(x0 + np.eye(len(x0))[i] * step[i]) for i in range(len(x0))]
    vals = [f(p) for p in pts]
    evals = len(pts)
    best_logged = None
    while evals < max_evals:
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if log and (best_logged is None or vals[0] < best_logged):
            best_logged = vals[0]
            b = pts[0]
            log(f"fit: skew {b[0]:.3f} stickiness {b[1]:.3f} correlation {b[2]:.3f} error {vals[0]:.6f}")
        if vals[-1] - vals[0] < tol:
            break
        centre = np.mean(pts[:-1], axis=0)
        xr = clip(centre + (centre - pts[-1]))
        fr = f(xr)
        evals += 1
        if fr < vals[0]:
            xe = clip(centre + 2 * (centre - pts[-1]))
            fe = f(xe)
            evals += 1
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = clip(centre + 0.5 * (pts[-1] - centre))
            fc = f(xc)
            evals += 1
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:  # shrink towards the best point
                pts = [pts[0]] + [clip(pts[0] + 0.5 * (p - pts[0])) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
                evals += len(pts) - 1
    return pts[int(np.argmin(vals))]


def side_by_side(real: dict, synth: dict, capacity: int) -> str:
    """A table of real against synthetic figures."""
    lines = [f"{'figure':<24} {'real':>8} {'synthetic':>10} {'diff':>8}"]
    for name in FIT_TARGETS:
        label = f"lru_hit_rate@{capacity}" if name == "lru_hit_rate" else name
        lines.append(f"{label:<24} {real[name]:>8.3f} {synth[name]:>10.3f} {synth[name] - real[name]:>+8.3f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ cli

def register(sub) -> None:
    p = sub.add_parser("synth", help="write a synthetic trace (knobs, or --fit to a real trace)")
    p.add_argument("--out", "-o", required=True, help="trace file to write (.npz)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="model name in the trace")
    p.add_argument("--experts", type=int, default=None, help="experts per MoE layer (default 8)")
    p.add_argument("--top-k", type=int, default=None, help="experts per token (default 2)")
    p.add_argument("--layers", type=int, default=None, help="MoE layers of a decoder-only model (default 32)")
    p.add_argument("--encoder-layers", type=int, default=None, help="encoder MoE layers (encoder-decoder model)")
    p.add_argument("--decoder-layers", type=int, default=None, help="decoder MoE layers (encoder-decoder model)")
    p.add_argument("--requests", type=int, default=None, help="requests (default 64; with --fit: REAL's count)")
    p.add_argument("--prompt-len", default=None, help="MIN,MAX prompt tokens per request (default 16,64)")
    p.add_argument("--decode-len", default=None, help="MIN,MAX generated tokens per request (default 64,256)")
    p.add_argument("--skew", type=float, default=None, help="Zipf exponent of expert popularity (default 0.5)")
    p.add_argument("--stickiness", type=float, default=None, help="P(re-use the previous token's expert)")
    p.add_argument("--correlation", type=float, default=None, help="P(follow the previous layer's expert)")
    p.add_argument("--fit", metavar="REAL_TRACE", default=None,
                   help="fit skew, stickiness and correlation to a real trace (shape and lengths from it)")
    p.add_argument("--date", default=None, help="provenance date to stamp (default: none, for reproducibility)")
    p.set_defaults(func=run)


def _pair(text: str | None, name: str) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise InputError(f"{name} must be MIN,MAX (two integers), got {text!r}") from None
    return lo, hi


def run(args) -> int:
    from traces.io import load_trace, save_trace

    given = {"model": args.model, "num_experts": args.experts, "top_k": args.top_k,
             "requests": args.requests, "prompt_len": _pair(args.prompt_len, "--prompt-len"),
             "decode_len": _pair(args.decode_len, "--decode-len"), "skew": args.skew,
             "stickiness": args.stickiness, "correlation": args.correlation}
    if args.layers is not None and (args.encoder_layers is not None or args.decoder_layers is not None):
        raise InputError("give either --layers or --encoder-layers/--decoder-layers, not both")
    if args.layers is not None:
        given.update(encoder_layers=0, decoder_layers=args.layers)
    else:
        given.update(encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers)
    given = {k: v for k, v in given.items() if v is not None}
    extra = {}
    if args.fit:
        real = load_trace(args.fit)
        shape_fields = {"num_experts", "top_k", "encoder_layers", "decoder_layers", "prompt_len", "decode_len"}
        clash = sorted(shape_fields & given.keys())
        if clash:
            raise InputError(f"--fit takes the model shape and lengths from {args.fit}; drop --{clash[0].replace('_', '-')}")
        print(f"fitting to {args.fit} ...", file=sys.stderr)
        knobs, report = fit(real, seed=args.seed, log=lambda m: print(m, file=sys.stderr))
        knobs, lengths = knobs_like(real, requests=given.get("requests"), skew=knobs.skew,
                                    stickiness=knobs.stickiness, correlation=knobs.correlation)
        if "model" in given:
            knobs = dataclasses.replace(knobs, model=given["model"])
        extra = {"fitted_to": {"model": real.meta.model.name, "provenance": real.meta.provenance.to_dict(),
                               "target": {k: round(v, 6) for k, v in report["target"].items()}}}
        trace = generate(knobs, args.seed, lengths, args.date, extra)
        cap = report["capacity"]
        print(side_by_side(report["target"], locality(trace, cap), cap))
    else:
        trace = generate(SynthKnobs(**given), args.seed, date=args.date)
    save_trace(trace, args.out)
    k = trace.meta.extra["knobs"]
    print(f"wrote {args.out}: {trace.num_tokens} tokens in {trace.num_requests} requests, "
          f"{trace.num_layers} layers, {trace.num_experts} experts top-{trace.top_k}; skew {k['skew']}, "
          f"stickiness {k['stickiness']}, correlation {k['correlation']}, seed {args.seed}")
    return 0
