"""`python -m traces synth`: its arguments, and a synthetic trace made from knobs, or fitted to a real trace
(``--fit``) or from a stored fit (``--from-fit``): the generator is :mod:`traces.synthetic.generator`, the fit
:mod:`traces.synthetic.fit`, the reshaping to another model :mod:`traces.synthetic.reshape`."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

import numpy as np

from moebase.errors import InputError, brief
from traces.format import MAX_REQUESTS, Trace, TraceMeta
from traces.io import MAX_ARRAY_BYTES
from traces.synthetic.generator import FITTED_KNOBS, SynthKnobs, check_table_cells, generate, knobs_like

_FLAGS = {
    "num_experts": "--experts",
    "top_k": "--top-k",
    "prompt_len": "--prompt-len",
    "decode_len": "--decode-len",
    "skew": "--skew",
    "stickiness": "--stickiness",
    "correlation": "--correlation",
}


def register(sub) -> None:
    p = sub.add_parser("synth", help="write a synthetic trace (knobs, or --fit to a real trace)")
    p.add_argument("--out", "-o", required=True, help="trace file to write (.npz)")
    p.add_argument("--seed", type=_seed, default=0, help="random seed, 0..2^63-1 (same seed, same trace)")
    p.add_argument("--model", default=None, help="model name in the trace")
    p.add_argument("--experts", type=int, default=None, help="experts per MoE layer (default 8)")
    p.add_argument("--top-k", type=int, default=None, help="experts per token (default 2)")
    p.add_argument("--layers", type=int, default=None, help="MoE layers of a decoder-only model (default 32)")
    p.add_argument("--encoder-layers", type=int, default=None, help="encoder MoE layers (encoder-decoder model)")
    p.add_argument("--decoder-layers", type=int, default=None, help="decoder MoE layers (encoder-decoder model)")
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help="requests (default 64; with --fit: REAL's count, lengths cycling through REAL's)",
    )
    p.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="with --fit: at least this many tokens (REAL's request lengths cycled), instead of --requests",
    )
    p.add_argument("--prompt-len", default=None, help="MIN,MAX prompt tokens per request (default 16,64)")
    p.add_argument("--decode-len", default=None, help="MIN,MAX generated tokens per request (default 64,256)")
    p.add_argument("--skew", type=float, default=None, help="Zipf exponent of expert popularity (default 0.5)")
    p.add_argument("--stickiness", type=float, default=None, help="P(re-use the previous token's expert)")
    p.add_argument("--correlation", type=float, default=None, help="P(follow the previous layer's expert)")
    p.add_argument(
        "--fit",
        metavar="REAL_TRACE",
        default=None,
        help="fit per-layer popularity, stickiness, request concentration, opening positions and "
        "cross-layer pull to a real trace (shape and lengths from it; see traces/synthetic/fit.py), and "
        "print the fit checked on held-out requests; --encoder-layers/--decoder-layers (or "
        "--layers) stretch the fitted layers over a deeper model of the same family",
    )
    p.add_argument(
        "--from-fit",
        metavar="FITTED_TRACE",
        default=None,
        help="generate from the fitted knobs a trace written by --fit holds, for another model shape: "
        "--experts/--top-k (traces/synthetic/reshape.py: popularity's Lorenz curve resampled, lifts mapped), "
        "--layers or --encoder-layers/--decoder-layers (stretched), --requests, --prompt-len, "
        "--decode-len (default: the fitted trace's)",
    )
    p.add_argument(
        "--no-holdout",
        action="store_true",
        help="with --fit: skip the held-out check (fit on half, compare on the other half)",
    )
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


def _seed(text: str) -> int:
    """A seed as the trace's metadata keeps it: an integer 0..2^63-1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text[:40]!r}") from None
    if not 0 <= value < 1 << 63:
        raise argparse.ArgumentTypeError(f"must be 0..2^63-1, got {text[:40]}")
    return value


def run(args) -> int:
    from traces.importers.common import check_model_fit, check_model_name, check_out
    from traces.io import save_trace

    check_out(args.out, [x for x in (args.fit, args.from_fit) if x])
    if args.model is not None:
        check_model_name(args.model)
    given = {
        "model": args.model,
        "num_experts": args.experts,
        "top_k": args.top_k,
        "requests": args.requests,
        "prompt_len": _pair(args.prompt_len, "--prompt-len"),
        "decode_len": _pair(args.decode_len, "--decode-len"),
        "skew": args.skew,
        "stickiness": args.stickiness,
        "correlation": args.correlation,
    }
    if args.layers is not None and (args.encoder_layers is not None or args.decoder_layers is not None):
        raise InputError("give either --layers or --encoder-layers/--decoder-layers, not both")
    if args.layers is not None:
        given.update(encoder_layers=0, decoder_layers=args.layers)
    else:
        given.update(encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers)
    given = {k: v for k, v in given.items() if v is not None}
    for name, value in (("--requests", args.requests), ("--tokens", args.tokens)):
        if value is not None and value < 1:
            raise InputError(f"{name} must be >= 1, got {value}")
    if args.fit and args.from_fit:
        raise InputError("give either --fit (fit to a real trace) or --from-fit (use a fit), not both")
    if args.fit:
        trace = _run_fit(args, given)
    elif args.from_fit:
        trace = _run_from_fit(args, given)
    else:
        if args.tokens is not None or args.no_holdout:
            raise InputError(f"{'--tokens' if args.tokens is not None else '--no-holdout'} goes with --fit")
        trace = generate(SynthKnobs(**given), args.seed, date=args.date)
    check_model_fit(trace, "synth", hint="give that model's --experts, --top-k and layers, or another --model")
    save_trace(trace, args.out)
    k = trace.meta.extra["knobs"]
    pre = k.get("prefix_popularity") or []
    what = (
        "fitted: per-layer popularity, stickiness and request concentration, "
        f"{pre['shape'][0] if isinstance(pre, dict) else len(pre)} opening positions, cross-layer power "
        f"{k.get('transition_power')}"
        if "layer_popularity" in k
        else f"skew {k['skew']}, stickiness {k['stickiness']}, correlation {k['correlation']}"
    )
    print(
        f"wrote {args.out}: {trace.num_tokens} tokens in {trace.num_requests} requests, "
        f"{trace.num_layers} layers, {trace.num_experts} experts top-{trace.top_k}; {what}; seed {args.seed}"
    )
    return 0


def _check_fit_size(real: Trace, args) -> None:
    """``--requests`` / ``--tokens`` for a fitted trace bounded like generated ones, before the (long) fit runs:
    the requests cycle through REAL's, so the largest is REAL's longest."""
    per_token = real.num_layers * real.top_k * 2  # int16 expert ids
    longest = int(np.diff(real.request_offsets).max()) if real.num_requests else 0
    if args.requests is not None and not 1 <= args.requests <= MAX_REQUESTS:
        raise InputError(f"--requests must be 1..{MAX_REQUESTS}, got {args.requests}")
    tokens = args.tokens if args.tokens is not None else (args.requests or 0) * longest
    if tokens * per_token > MAX_ARRAY_BYTES:
        raise InputError(
            f"{'--tokens' if args.tokens is not None else '--requests'}: a trace of {tokens} tokens of "
            f"{real.num_layers} layers x top-{real.top_k} would pass the {MAX_ARRAY_BYTES >> 30} GiB a "
            f"trace may hold"
        )


def _run_fit(args, given: dict) -> Trace:
    """``--fit``: the held-out check (printed), then the fit on all of REAL, and the synthetic trace."""
    from traces.io import load_trace
    from traces.synthetic import fit as fitting

    real = load_trace(args.fit)
    depth = {k: given.pop(k) for k in ("encoder_layers", "decoder_layers") if k in given}
    clash = [f for f in _FLAGS if f in given]
    if clash:
        raise InputError(f"--fit takes the model shape, lengths and knobs from {args.fit}; drop {_FLAGS[clash[0]]}")
    if args.requests is not None and args.tokens is not None:
        raise InputError("give either --requests or --tokens, not both")
    _check_fit_size(real, args)
    check_source_names(args.fit, real.meta)
    if depth:
        shape = knobs_like(real, requests=1)[0]
        enc, dec = depth.get("encoder_layers", shape.encoder_layers), depth.get("decoder_layers", shape.decoder_layers)
        _check_target(shape, enc, dec, shape.num_experts, shape.top_k)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    held = None
    if not args.no_holdout:
        if real.num_requests < 2:
            raise InputError(f"{args.fit}: the held-out check needs at least 2 requests; use --no-holdout")
        print(f"fitting to half of {args.fit} (held-out check) ...", file=sys.stderr)
        rows, _ = fitting.held_out_check(real, seed=args.seed, log=log)
        print(
            f"held-out check: fit on the {(real.num_requests + 1) // 2} even-numbered requests of {args.fit}, "
            f"compared on the {real.num_requests // 2} odd-numbered ones"
        )
        print(fitting.format_table(rows, real.num_experts))
        held = [
            {
                k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else (None if isinstance(v, float) else v))
                for k, v in r.items()
            }
            for r in rows
        ]
    print(f"fitting to all of {args.fit} ...", file=sys.stderr)
    result = fitting.fit_knobs(real, seed=args.seed, log=log)
    knobs, lengths = knobs_like(real, requests=args.requests, tokens=args.tokens)
    fitted = {n: getattr(result.knobs, n) for n in FITTED_KNOBS}
    knobs = dataclasses.replace(knobs, model=given.get("model", knobs.model), correlation=0.0, **fitted)
    stretched = None
    if depth:
        enc = depth.get("encoder_layers", knobs.encoder_layers)
        dec = depth.get("decoder_layers", knobs.decoder_layers)
        if (enc, dec) != (knobs.encoder_layers, knobs.decoder_layers):
            knobs, stretched = fitting.stretch_layers(knobs, enc, dec)
    extra = {
        "fitted_to": {
            "file": os.path.basename(str(args.fit)),
            "model": real.meta.model.name,
            "provenance": real.meta.provenance.to_dict(),
            "requests": real.num_requests,
            "tokens": real.num_tokens,
            "method": "traces.synthetic.fit: per-layer empirical popularity, stickiness, request concentration, "
            "opening positions and cross-layer pull, calibrated by simulation",
            "calibration": {"rounds": result.rounds, "residual": {k: round(v, 6) for k, v in result.residual.items()}},
            "held_out": held,
        }
    }
    if stretched is not None:
        extra["fitted_to"]["layers_from"] = stretched
        extra["fitted_to"]["stretched"] = (
            f"{len(stretched)} MoE layers from the fitted {real.num_layers}: each "
            "takes the fitted layer of its role at the same relative depth; no "
            "cross-layer pull between two layers from the same fitted one"
        )
    return generate(
        knobs,
        args.seed,
        lengths,
        args.date,
        extra,
        dataset=f"fitted to {real.meta.model.name} ({real.meta.provenance.dataset})",
    )


# ------------------------------------------------------------------------------------------------- from fit

#: knobs a --from-fit trace names by digest instead of storing: 256-384 expert transition tables are tens of MB,
#: and even the popularity table ([layers][experts]) would take Kimi-K2's bundled trace past 2 MB
DIGESTED = ("layer_popularity", "prefix_popularity", "layer_transition")


def fitted_knobs(path: str) -> tuple[SynthKnobs, TraceMeta]:
    """The fitted knobs a trace written by ``synth --fit`` holds (``extra.knobs``), and its metadata. Raises
    InputError naming the file when it holds none (or only their digests)."""
    from traces.io import load_trace_header

    meta = load_trace_header(path)[0]
    d = meta.extra.get("knobs") if isinstance(meta.extra, dict) else None
    digested = [n for n in FITTED_KNOBS if isinstance(d, dict) and isinstance(d.get(n), dict)]
    if digested:
        raise InputError(
            f"{path}: its knobs.{digested[0]} is stored as a digest (a --from-fit trace); give the "
            "trace `traces synth --fit` wrote"
        )
    if not isinstance(d, dict) or not isinstance(d.get("layer_popularity"), list):
        raise InputError(
            f"{path}: holds no fitted knobs (extra.knobs.layer_popularity); give a trace written by "
            "`traces synth --fit`"
        )
    try:
        knobs = SynthKnobs.from_dict(d)
        knobs.check(knob_names=True)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{path}: extra.knobs are not the generator's knobs ({exc})") from None
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    check_source_names(path, meta, knobs.model)
    return knobs, meta


def check_source_names(path, meta: TraceMeta, model: str | None = None) -> None:
    """The names a trace made from the trace at ``path`` copies from it: its model name (and ``model``, the knobs'
    model) by the model-name rule, its data set one printable line."""
    from traces.importers.common import check_model_name

    check_model_name(meta.model.name, f"{path}: model.name")
    if model is not None:
        check_model_name(model, f"{path}: knobs.model")
    if not meta.provenance.dataset.isprintable():
        raise InputError(f"{path}: provenance.dataset {brief(meta.provenance.dataset)} is not one printable line")


def _check_target(knobs: SynthKnobs, encoder_layers: int, decoder_layers: int, experts: int, top_k: int) -> None:
    """The shape asked of fitted ``knobs`` checked as generated knobs are (experts, top-k, layers, requests, the
    trace's size) and the fitted tables it would build bounded (MAX_TABLE_CELLS, counting lifts between layers), before
    anything is fitted, stretched or reshaped."""
    shape = dataclasses.replace(
        knobs,
        num_experts=experts,
        top_k=top_k,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        layer_popularity=None,
        layer_stickiness=None,
        request_concentration=None,
        prefix_popularity=None,
        layer_transition=None,
        transition_power=None,
    )
    shape.check()
    positions = len(knobs.prefix_popularity or ())
    check_table_cells(encoder_layers + decoder_layers, experts, True, positions)


def _sha256(path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _run_from_fit(args, given: dict) -> Trace:
    """``--from-fit``: the fitted knobs, stretched over the wanted layers and reshaped to the wanted experts and
    top-k; opening positions kept only as far as every request's prompt reaches."""
    from traces.synthetic import fit as fitting
    from traces.synthetic import reshape

    for flag, value in (
        ("--skew", args.skew),
        ("--stickiness", args.stickiness),
        ("--correlation", args.correlation),
        ("--tokens", args.tokens),
    ):
        if value is not None:
            raise InputError(f"--from-fit takes the knobs from {args.from_fit}; drop {flag}")
    if args.no_holdout:
        raise InputError("--no-holdout goes with --fit")
    fitted, meta = fitted_knobs(args.from_fit)
    knobs = dataclasses.replace(
        fitted, **{k: given[k] for k in ("model", "requests", "prompt_len", "decode_len") if k in given}
    )
    enc = given.get("encoder_layers", fitted.encoder_layers)
    dec = given.get("decoder_layers", fitted.decoder_layers)
    experts, top_k = given.get("num_experts", fitted.num_experts), given.get("top_k", fitted.top_k)
    _check_target(knobs, enc, dec, experts, top_k)
    sha = _sha256(args.from_fit)
    layers_from = None
    if (enc, dec) != (fitted.encoder_layers, fitted.decoder_layers):
        knobs, layers_from = fitting.stretch_layers(knobs, enc, dec)
    shaped = reshape.reshape_experts(knobs, experts, top_k)
    knobs, prefix_note = _prefix_within_prompts(shaped.knobs)
    note = {
        "file": os.path.basename(str(args.from_fit)),
        "sha256": sha,
        "model": meta.model.name,
        "shape": f"{fitted.encoder_layers} encoder + {fitted.decoder_layers} decoder MoE layers, "
        f"{fitted.num_experts} experts, top-{fitted.top_k}",
        "layers": (
            "unchanged"
            if layers_from is None
            else {
                "from": layers_from,
                "mapping": "traces.synthetic.fit.stretch_layers: each layer takes the fitted layer "
                "of its role at the same relative depth; no cross-layer pull between two layers from the "
                "same fitted one",
            }
        ),
        "experts": (
            "unchanged"
            if shaped.sources is None
            else {"from": fitted.num_experts, "to": knobs.num_experts, "mapping": reshape.MAPPING}
        ),
        "top_k": {"from": fitted.top_k, "to": knobs.top_k},
        "assumptions": list(reshape.ASSUMPTIONS),
        "prefix": prefix_note,
        "digests": "knobs named by {shape, sha256} are tables too large to bundle; they are rebuilt by the "
        "same command from the same fitted trace (traces.synthetic.generator.knobs_sha256)",
    }
    extra = {"fitted_to": meta.extra.get("fitted_to"), "from_fit": note}
    dataset = f"{meta.provenance.dataset}, via synth --from-fit"
    return generate(knobs, args.seed, date=args.date, extra=extra, dataset=dataset, digest=DIGESTED)


def _prefix_within_prompts(knobs: SynthKnobs) -> tuple[SynthKnobs, str]:
    """The fitted opening positions are prompt tokens (a chat template's fixed start): keep as many as the
    shortest prompt holds, and say what was kept."""
    n = len(knobs.prefix_popularity or ())
    if n == 0:
        return knobs, "the fit found no opening positions"
    keep = min(n, knobs.prompt_len[0])
    if keep == n:
        return knobs, f"{n} fitted opening positions kept (every prompt holds them)"
    knobs = dataclasses.replace(knobs, prefix_popularity=(knobs.prefix_popularity or ())[:keep] if keep else None)
    if keep == 0:
        return knobs, (
            f"the {n} fitted opening positions (prompt tokens of the real requests) dropped: requests "
            "without prompt rows (--prompt-len MIN 0) would otherwise route their first decode tokens "
            "like a prompt's opening"
        )
    return knobs, f"{keep} of the {n} fitted opening positions kept (the shortest prompt holds {keep})"
