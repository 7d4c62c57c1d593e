"""A sweep's ``capacity`` option: each point's row also carries the highest Poisson request rate its config serves
within an SLO, found by ``sim capacity``'s own search (:func:`sim.capacity.find_capacity`) inside the point's task
(a pool worker or a Ray task), so that policies and placements are compared by the load they hold.

The option, a mapping (each key as ``sim capacity``'s flag of that name):

- ``slo`` (required): ``{ttft_s: X, tpot_s: Y}``, either or both, seconds > 0 and at most 1e6;
- ``attainment``: the share of requests that must meet it, in (0, 1] (default 0.9);
- ``requests``: requests per run, 1 to 2**20 (default: the point's ``workload.requests``);
- ``seeds``: the arrival seeds each rate runs with, 1 to 16 distinct integers 0..2**32-2 (default [0, 1, 2]);
- ``tolerance``: the bisection's relative tolerance, in (0, 1) (default 0.02);
- ``cv``: gamma arrivals of that coefficient of variation instead of Poisson, in (0, 16].

Columns it adds to a row (:data:`COLUMNS`): ``capacity_req_s`` (``max_rate_per_s``), ``capacity_bounded``,
``capacity_saturation_req_s``, ``capacity_above_saturation`` and ``capacity_check_holds`` (the check at 0.9x and
1.25x with another seed; None when there was none).
"""

from __future__ import annotations

import math

from moebase.checks import show
from sim.capacity import (
    DEFAULT_ATTAINMENT,
    DEFAULT_SEEDS,
    DEFAULT_TOLERANCE,
    MAX_SEED,
    MAX_SEEDS,
    MAX_SLO_S,
    find_capacity,
)
from sim.config.serving import MAX_CV

KEYS = ("slo", "attainment", "requests", "seeds", "tolerance", "cv")
SLO_KEYS = ("ttft_s", "tpot_s")
MAX_REQUESTS = 1 << 20
#: row column -> key of the capacity document
COLUMNS = {
    "capacity_req_s": "max_rate_per_s",
    "capacity_bounded": "bounded",
    "capacity_saturation_req_s": "saturation_req_s",
    "capacity_above_saturation": "above_saturation",
    "capacity_check_holds": "check",
}


def _key(key) -> str:
    """A key as a message names it: itself when it is a plain word, else abbreviated."""
    return key if isinstance(key, str) and key.isidentifier() and len(key) <= 40 else show(key)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_capacity(raw, where) -> dict | None:
    """The sweep file's ``capacity`` (None when absent or null) as a plain mapping with every key, each checked
    (``where(key, problem)`` makes the ConfigError naming ``capacity.KEY``)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise where("capacity", f"must be a mapping with slo (and attainment, requests, seeds...), got {show(raw)}")
    for key in raw:
        if key not in KEYS:
            raise where(f"capacity.{_key(key)}", f"unknown key (known: {', '.join(KEYS)})")
    return {
        "slo": _slo(raw.get("slo"), where),
        "attainment": _in_range(raw, "attainment", DEFAULT_ATTAINMENT, where, 0, 1, "in (0, 1]", closed=True),
        "requests": _requests(raw.get("requests"), where),
        "seeds": _seeds(raw.get("seeds"), where),
        "tolerance": _in_range(raw, "tolerance", DEFAULT_TOLERANCE, where, 0, 1, "in (0, 1)"),
        "cv": _in_range(raw, "cv", None, where, 0, MAX_CV, f"in (0, {MAX_CV:g}]", closed=True),
    }


def _slo(raw, where) -> dict:
    if raw is None:
        raise where("capacity.slo", "missing: give {ttft_s: SECONDS, tpot_s: SECONDS} (either or both)")
    if not isinstance(raw, dict) or not raw:
        raise where("capacity.slo", f"must be a mapping {{ttft_s: SECONDS, tpot_s: SECONDS}}, got {show(raw)}")
    out: dict = {k: None for k in SLO_KEYS}
    for key, v in raw.items():
        if key not in SLO_KEYS:
            raise where(f"capacity.slo.{_key(key)}", f"unknown key (known: {', '.join(SLO_KEYS)})")
        if not _number(v) or not 0 < v <= MAX_SLO_S:
            raise where(f"capacity.slo.{key}", f"must be seconds > 0 and at most {MAX_SLO_S:g}, got {show(v)}")
        out[key] = float(v)
    if all(v is None for v in out.values()):
        raise where("capacity.slo", "give ttft_s or tpot_s (or both)")
    return out


def _in_range(raw: dict, key: str, default, where, lo: float, hi: float, words: str, closed: bool = False):
    v = raw.get(key)
    if v is None:
        return default
    if not _number(v) or not (lo < v <= hi if closed else lo < v < hi):
        raise where(f"capacity.{key}", f"must be a number {words}, got {show(v)}")
    return float(v)


def _requests(v, where) -> int | None:
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_REQUESTS:
        raise where("capacity.requests", f"must be an integer 1..{MAX_REQUESTS}, got {show(v)}")
    return v


def _seeds(v, where) -> list[int]:
    if v is None:
        return list(DEFAULT_SEEDS)
    if not isinstance(v, list) or not v or len(v) > MAX_SEEDS:
        raise where("capacity.seeds", f"must be a list of 1 to {MAX_SEEDS} seeds, got {show(v)}")
    for s in v:
        if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s <= MAX_SEED:
            raise where("capacity.seeds", f"must hold integers 0..{MAX_SEED}, got {show(s)}")
    if len(set(v)) != len(v):
        raise where("capacity.seeds", "lists a seed twice")
    return list(v)


def capacity_metrics(base, overrides: tuple[str, ...], source: str, spec: dict) -> dict:
    """The capacity columns of a point (its config: ``base`` with ``overrides``), by ``sim capacity``'s search."""
    doc = find_capacity(
        base,
        list(overrides),
        spec["slo"],
        spec["attainment"],
        spec["requests"],
        spec["seeds"],
        spec["tolerance"],
        None,
        spec["cv"],
        source,
    )
    out = {col: doc[key] for col, key in COLUMNS.items()}
    out["capacity_check_holds"] = None if doc["check"] is None else bool(doc["check"]["holds"])
    return out


__all__ = ["COLUMNS", "KEYS", "capacity_metrics", "parse_capacity"]
