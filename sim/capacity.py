"""`python -m sim capacity CONFIG [--set KEY=VALUE ...] --slo ttft=X,tpot=Y [--attainment 0.9] [--requests N]
[--seeds 0,1,2] --json OUT [--plot PNG]`: the highest arrival rate a configuration serves within an SLO.

A rate *meets* the SLO when, in the run of every seed, the share of requests meeting it (``slo_attainment``,
``sim/request_results.py``) is at least ``--attainment`` (every seed rather than their mean: near the capacity a
run's attainment varies much with its arrivals, and the answer is meant to hold for seeds the search never saw).
Each evaluation of a rate runs the config once per seed with
``workload.arrivals: {process: poisson, rate_per_s: RATE, seed: SEED}`` (``--cv X``: a gamma process of that
coefficient of variation instead), replacing the config's own, ``workload.batching: continuous``,
``workload.slo`` from ``--slo`` and ``workload.requests`` from ``--requests``: every figure is over that stated
number of requests, the queue starting empty.

The search:

1. a probe with every request arriving at once (rate ``MAX_RATE``) gives the rate the machine completes requests
   at when it is never idle (``saturation_req_s``); if even that meets the SLO, every rate does with so few requests
   (the answer is ``MAX_RATE``, ``bounded`` false: serve more requests to find the limit). An answer more than
   ``SATURATION_MARGIN`` above that rate is flagged (``above_saturation``): the queue then grows through the run,
   and only the run's end keeps the requests within the SLO;
2. bracketing from that rate: halve while the rate fails (down to ``MIN_RATE``: no rate meets, the answer 0), or
   double while it meets, until one rate meets and the next fails;
3. bisection between them until they are within ``--tolerance`` (relative) of each other; the answer is the highest
   rate that met.

Then the check the answer is meant to pass: one run at 0.9x and one at 1.25x of it with a seed the search did not
use (``check``: the first should meet, the second not). ``OUT`` (JSON, written atomically) holds ``max_rate_per_s``,
every evaluated point (rate, attainment per seed and mean, p99 TTFT and TPOT, goodput) and the check; the plot
(``sim/capacity_plot.py``, beside OUT as ``.png`` unless ``--plot``) shows attainment and p99 TTFT/TPOT against the
rate. Attainment is assumed non-increasing in the rate (on average: a single seed's need not be), which the
bisection relies on. With too few requests the queue never grows long enough for the rate to matter (the answer
then lies above the saturation rate and the check may fail): hundreds of requests per run make the answer hold.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from moebase.errors import ConfigError
from sim.config.serving import MAX_CV, MAX_RATE

DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_ATTAINMENT = 0.9
DEFAULT_TOLERANCE = 0.02
MAX_SEEDS = 16
MAX_SEED = 2**32 - 2  # the check's seed is one more than the largest
MAX_SLO_S = 1e6  # the longest SLO time a search takes (seconds)
MIN_RATE = 1e-4  # requests per second: below it, no rate meets the SLO
MAX_STEPS = 60  # rates a search evaluates at most (bracketing and bisection together)
#: An answer this much above the saturation rate is flagged: the probe's own figure is a little low (its last
#: requests finish in a batch that is no longer full), a queue that grows through the run is not
SATURATION_MARGIN = 1.1
BELOW, ABOVE = 0.9, 1.25  # the check: a rate this much below the answer meets the SLO, one this much above does not

__all__ = ["Point", "find_capacity", "parse_seeds", "parse_slo", "register"]


@dataclass
class Point:
    """One evaluated rate: the attainment of each seed's run and their mean, the seeds' mean p99 TTFT and TPOT (s),
    goodput and completed requests per second, whether the rate meets the SLO (every seed's run does), and the
    seeds' mean busy shares of the link and the compute stream and hit rate (where the time goes)."""

    rate_per_s: float
    attainments: list[float]
    attainment: float
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    goodput_req_s: float | None
    throughput_req_s: float | None
    meets: bool
    link_busy_frac: float | None = None  # the PCIe link's busy share of the run (mean over seeds)
    compute_busy_frac: float | None = None  # the compute stream's
    hit_rate: float | None = None  # experts served without a copy, of all accesses


# --------------------------------------------------------------------------------------------- arguments
def _seconds(text: str, where: str) -> float:
    """``0.5``, ``0.5s`` or ``500ms`` as seconds (> 0)."""
    t = text.strip().lower()
    scale = 1.0
    if t.endswith("ms"):
        t, scale = t[:-2], 1e-3
    elif t.endswith("s"):
        t = t[:-1]
    try:
        v = float(t) * scale
    except ValueError:
        raise ConfigError(where, f"must be a time in seconds (0.5, 0.5s or 500ms), got {text!r}") from None
    if not (math.isfinite(v) and 0 < v <= MAX_SLO_S):
        raise ConfigError(where, f"must be a time > 0 and at most 1e6 s, got {text!r}")
    return v


def parse_slo(text: str) -> dict:
    """``ttft=X,tpot=Y`` (either may be left out; seconds, or with ``ms``) as ``{ttft_s, tpot_s}``."""
    out: dict = {"ttft_s": None, "tpot_s": None}
    if not isinstance(text, str) or len(text) > 200 or not text.strip():
        raise ConfigError("--slo", "give ttft=SECONDS,tpot=SECONDS (either or both)")
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("ttft", "tpot"):
            raise ConfigError("--slo", f"expected ttft=SECONDS or tpot=SECONDS, got {part.strip()!r}")
        if out[f"{key}_s"] is not None:
            raise ConfigError("--slo", f"{key} is given twice")
        out[f"{key}_s"] = _seconds(value, f"--slo {key}")
    return out


def parse_seeds(text: str | None) -> list[int]:
    """``0,1,2``: distinct seeds (at most ``MAX_SEEDS``)."""
    if text is None:
        return list(DEFAULT_SEEDS)
    seeds = []
    for part in str(text)[:1000].split(","):
        p = part.strip()
        if not p.isascii() or not p.isdigit() or len(p) > 10 or int(p) > MAX_SEED:
            raise ConfigError("--seeds", f"must be integers 0..{MAX_SEED}, separated by commas, got {part!r}")
        seeds.append(int(p))
    if len(set(seeds)) != len(seeds):
        raise ConfigError("--seeds", "lists a seed twice")
    if len(seeds) > MAX_SEEDS:
        raise ConfigError("--seeds", f"at most {MAX_SEEDS} seeds, got {len(seeds)}")
    return seeds


# --------------------------------------------------------------------------------------------- the runs
class Evaluator:
    """Runs the config at a rate, once per seed (each rate evaluated once)."""

    def __init__(
        self,
        config: str | dict,
        sets: list[str],
        slo: dict,
        target: float,
        requests: int | None,
        cv: float | None = None,
        source: str = "capacity",
    ):
        from traces.io import load_trace

        self.config, self.target, self.cv = config, target, cv
        self.process = "poisson" if cv is None else "gamma"
        slo_text = "{" + ", ".join(f"{k}: {v!r}" for k, v in slo.items() if v is not None) + "}"
        self.sets = ["workload.batching=continuous", *sets, f"workload.slo={slo_text}"]
        if requests is not None:
            self.sets.append(f"workload.requests={requests}")
        from sim.config.run_config import resolve_config  # a path or a mapping (a sweep point's resolved config on Ray)

        self._load = lambda extra: resolve_config(config, (*self.sets, *extra), source)
        self.base = self._load([self._arrivals(MAX_RATE, 0, cv)])  # bad input ends here, before any run
        self.trace = load_trace(self.base.workload.trace)
        self.points: dict[float, Point] = {}

    def _arrivals(self, rate: float, seed: int, cv: float | None) -> str:
        process = "gamma" if cv is not None else "poisson"
        extra = f", cv: {cv!r}" if cv is not None else ""
        return f"workload.arrivals={{process: {process}, rate_per_s: {rate!r}, seed: {seed}{extra}}}"

    def run(self, rate: float, seed: int) -> dict:
        """One run's summary at ``rate`` with ``seed``."""
        from sim.run import simulate

        cfg = self._load([self._arrivals(rate, seed, self.cv)])
        return simulate(cfg, trace=self.trace).summary

    def point(self, rate: float, seeds: list[int]) -> Point:
        """The rate evaluated over ``seeds`` (once)."""
        if rate in self.points:
            return self.points[rate]
        runs = [self.run(rate, s) for s in seeds]
        att = [float(r["slo_attainment"] or 0.0) for r in runs]
        p = Point(
            rate,
            att,
            sum(att) / len(att),
            _mean([r["ttft_s"]["p99"] for r in runs]),
            _mean([r["tpot_s"]["p99"] for r in runs]),
            _mean([r["goodput_req_s"] for r in runs]),
            _mean([r["throughput_req_s"] for r in runs]),
            min(att) >= self.target,  # every seed's run meets the target
            _mean([r["link_busy_frac"] for r in runs]),
            _mean([r["compute_busy_frac"] for r in runs]),
            _mean([r["hit_rate"]["overall"] for r in runs]),
        )
        self.points[rate] = p
        return p


def _mean(values: list) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


# --------------------------------------------------------------------------------------------- the search
def search(evaluate: Callable[[float], Point], start: float, tolerance: float) -> tuple[float, bool]:
    """The highest rate that meets (``evaluate(rate).meets``), by bracketing from ``start`` and bisection to
    ``tolerance``; and whether a failing rate bounds it (False: every rate up to ``MAX_RATE`` meets)."""
    steps = 0
    rate = min(max(start, MIN_RATE), MAX_RATE)
    meets = evaluate(rate).meets
    lo, hi = rate, rate  # lo meets and hi fails, once bracketed
    while steps < MAX_STEPS:  # bracketing: double while the rate meets, halve while it fails
        nxt = min(rate * 2, MAX_RATE) if meets else rate / 2
        if meets and nxt == rate:
            return rate, False
        if not meets and nxt < MIN_RATE:
            return 0.0, True
        steps += 1
        if evaluate(nxt).meets != meets:
            lo, hi = (rate, nxt) if meets else (nxt, rate)
            break
        rate = nxt
    else:
        return (rate, False) if meets else (0.0, True)
    while hi - lo > tolerance * lo and steps < MAX_STEPS:  # bisection
        steps += 1
        mid = (lo + hi) / 2
        if evaluate(mid).meets:
            lo = mid
        else:
            hi = mid
    return lo, True


def find_capacity(
    config: str | dict,
    sets: list[str],
    slo: dict,
    target: float = DEFAULT_ATTAINMENT,
    requests: int | None = None,
    seeds: list[int] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    say: Callable[[str], None] | None = None,
    cv: float | None = None,
    source: str = "capacity",
) -> dict:
    """The capacity document (see the module docstring) of ``config`` (a run config's path, or a mapping of its
    fields, named ``source`` in messages and in the document) with ``sets`` under ``slo``."""
    seeds = list(DEFAULT_SEEDS) if seeds is None else seeds
    say = say or (lambda text: None)
    ev = Evaluator(config, sets, slo, target, requests, cv, source)

    def evaluate(rate: float) -> Point:
        known = rate in ev.points
        p = ev.point(rate, seeds)
        if not known:
            say(f"  {rate:12,.4f} requests/s: attainment {p.attainment:.3f} ({'meets' if p.meets else 'fails'})")
        return p

    probe = ev.run(MAX_RATE, seeds[0])
    saturation = probe["throughput_req_s"] or MIN_RATE
    if probe["slo_attainment"] is not None and probe["slo_attainment"] >= target:
        rate, bounded = MAX_RATE, False
    else:
        rate, bounded = search(evaluate, saturation, tolerance)
    check = _check(ev, rate, max(seeds) + 1) if bounded and rate > 0 else None
    cfg = ev.base
    points = sorted(ev.points.values(), key=lambda p: p.rate_per_s)
    return {
        "max_rate_per_s": rate,
        "bounded": bounded,
        "config": config if isinstance(config, str) else source,
        "set": list(sets),
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "policy": cfg.policy.name,
        "predictor": cfg.predictor.name,
        "batch_size": cfg.workload.batch_size,
        "max_batch_tokens": cfg.workload.max_batch_tokens,
        "process": ev.process,
        "cv": ev.cv,
        "slo": slo,
        "attainment": target,
        "requests": probe["requests_served"],
        "seeds": seeds,
        "tolerance": tolerance,
        "saturation_req_s": saturation,
        "above_saturation": bounded and rate > SATURATION_MARGIN * saturation,
        "points": [asdict(p) for p in points],
        "check": check,
    }


def _check(ev: Evaluator, rate: float, seed: int) -> dict:
    """The answer's check: ``BELOW`` x it meets the SLO with ``seed``, ``ABOVE`` x it does not."""
    out: dict = {"seed": seed}
    for name, factor in (("below", BELOW), ("above", ABOVE)):
        r = min(rate * factor, MAX_RATE)
        s = ev.run(r, seed)
        att = float(s["slo_attainment"] or 0.0)
        out[name] = {"rate_per_s": r, "attainment": att, "meets": att >= ev.target}
    out["holds"] = out["below"]["meets"] and not out["above"]["meets"]
    return out


# --------------------------------------------------------------------------------------------- the command
def summary_text(doc: dict) -> str:
    """What the command prints at the end."""
    slo = ", ".join(f"{k.removesuffix('_s')} <= {v * 1e3:,.1f} ms" for k, v in doc["slo"].items() if v is not None)
    head = (
        f"capacity of {doc['policy']} on {doc['model']}, {doc['hardware']} (batch {doc['batch_size']}, "
        f"{doc['requests']:,} requests, seeds {','.join(map(str, doc['seeds']))}): "
    )
    rate = doc["max_rate_per_s"]
    if not doc["bounded"]:
        body = (
            f"every rate up to {rate:g} requests/s meets {slo} for {doc['attainment']:.0%} of requests: with so few "
            "requests the queue never grows enough (serve more: --requests)"
        )
    elif rate == 0:
        body = f"no rate down to {MIN_RATE:g} requests/s meets {slo} for {doc['attainment']:.0%} of requests"
    else:
        body = f"{rate:,.3f} requests/s meet {slo} for {doc['attainment']:.0%} of requests"
    lines = [head + body]
    if doc["above_saturation"]:
        lines.append(
            f"note: that is well above the {doc['saturation_req_s']:,.3f} requests/s the machine completes with every "
            "request at once: the queue grows through the run and the SLO's bound hides it; more requests "
            "(--requests) find the rate it sustains"
        )
    c = doc["check"]
    if c is not None:
        b, a = c["below"], c["above"]
        lines.append(
            f"check (seed {c['seed']}): {b['rate_per_s']:,.3f}/s attainment {b['attainment']:.3f} "
            f"({'meets' if b['meets'] else 'fails'}), {a['rate_per_s']:,.3f}/s attainment {a['attainment']:.3f} "
            f"({'meets' if a['meets'] else 'fails'}): {'holds' if c['holds'] else 'DOES NOT HOLD'}"
        )
    return "\n".join(lines)


def cmd_capacity(args) -> int:
    from moebase.outputs import check_not_input
    from sim.capacity_plot import capacity_png
    from traces.io import atomic_write_bytes, check_output_file

    slo = parse_slo(args.slo)
    seeds = parse_seeds(args.seeds)
    if not (0 < args.attainment <= 1):
        raise ConfigError("--attainment", f"must be in (0, 1], got {args.attainment}")
    if not (0 < args.tolerance < 1):
        raise ConfigError("--tolerance", f"must be in (0, 1), got {args.tolerance}")
    if args.requests is not None and not 1 <= args.requests <= 1 << 20:
        raise ConfigError("--requests", f"must be 1..{1 << 20}, got {args.requests}")
    out = Path(args.json)
    plot = Path(args.plot) if args.plot else out.with_suffix(".png")
    for path, what in ((out, "capacity (--json)"), (plot, "capacity plot (--plot)")):
        check_output_file(path, what)
        check_not_input(path, [args.config], what)
    if out.resolve() == plot.resolve():
        raise ConfigError("--plot", "must differ from --json")
    if args.cv is not None and not (0 < args.cv <= MAX_CV):
        raise ConfigError("--cv", f"must be in (0, {MAX_CV:g}], got {args.cv}")
    sets = list(args.set or [])
    doc = find_capacity(args.config, sets, slo, args.attainment, args.requests, seeds, args.tolerance, print, args.cv)
    atomic_write_bytes(out, (json.dumps(doc, indent=1) + "\n").encode())
    atomic_write_bytes(plot, capacity_png(doc))
    print(summary_text(doc))
    print(f"written: {out}, {plot}")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "capacity",
        help="the highest arrival rate a config serves within an SLO",
        description="Find the highest Poisson arrival rate (requests/s) at which the config's requests meet the SLO "
        "for at least --attainment of them in the run of every seed: a probe with every request at once, then "
        "bracketing and bisection on the rate (a rate meets when every seed's run does); then a check at 0.9x and "
        "1.25x with another seed. Writes the points "
        "(JSON) and a plot of attainment and p99 TTFT/TPOT against the rate. Runs use continuous batching "
        "(workload.batching=continuous); set workload.batch_size and workload.max_batch_tokens (chunked prefill) "
        "with --set.",
    )
    p.add_argument("config", help="run config (YAML), e.g. configs/gpt_oss_20b.yaml")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY.PATH=VALUE",
        help="override a config field (repeatable), e.g. policy.name=lru",
    )
    p.add_argument(
        "--slo", required=True, metavar="ttft=X,tpot=Y", help="the SLO in seconds (or ms): ttft=0.5,tpot=50ms"
    )
    p.add_argument(
        "--attainment",
        type=float,
        default=DEFAULT_ATTAINMENT,
        help=f"the share of requests that must meet the SLO (default {DEFAULT_ATTAINMENT})",
    )
    p.add_argument(
        "--requests", type=int, metavar="N", help="requests per run (workload.requests; default: the config's)"
    )
    p.add_argument(
        "--seeds",
        metavar="S,S,...",
        help=f"the arrival seeds each rate runs with (default {','.join(map(str, DEFAULT_SEEDS))})",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"stop bisecting when the rates that meet and fail are this close (relative; default {DEFAULT_TOLERANCE})",
    )
    p.add_argument(
        "--cv", type=float, metavar="X", help="gamma arrivals of this coefficient of variation (default: Poisson, 1)"
    )
    p.add_argument("--json", required=True, metavar="OUT", help="the points and the answer (JSON)")
    p.add_argument("--plot", metavar="PNG", help="the plot (default: OUT with .png)")
    p.set_defaults(func=cmd_capacity)
