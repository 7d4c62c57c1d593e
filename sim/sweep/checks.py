"""A sweep's invariant checks: each takes the ok rows and the swept axes, and returns the violations found
(an empty list: passed; None: not applicable to this sweep). A broken check makes the sweep exit 3.

Rows are compared within groups of equal "other fields": every swept axis but the ones a check varies. Values of
any kind group (strings such as ``cache.organization``, missing values, mixed types), in the order they come.
"""

from __future__ import annotations

from sim.policies import is_ceiling

#: Swept fields that set how many experts the cache holds: lru's hit rate may only grow along them. Any other
#: cache field (``cache.organization``, ``cache.layers``, ``cache.lpc_buffers``...) is another field to group by.
SIZE_AXES = (
    "cache.hpc_slots",
    "cache.mpc_slots",
    "cache.shared_slots",
    "cache.gpu_memory_gb",
    "cache.split.hpc",
    "cache.split.mpc",
    "cache.split.lpc",
)


def _groups(df, others: list[str]):
    """(key, rows) for each combination of the ``others`` columns: every value a group of its own (None and NaN
    too), whatever its type."""
    if not others:
        return [((), df)]
    rows: dict[tuple, list[int]] = {}
    for i, key in enumerate(df[others].astype(str).itertuples(index=False, name=None)):
        rows.setdefault(key, []).append(i)
    return [(tuple(df[others].iloc[at[0]]), df.iloc[at]) for at in rows.values()]


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def size_axes(df, axes) -> list[str]:
    """The swept cache-size fields (``SIZE_AXES``) whose values in ``df`` are all numbers."""
    return [a for a in axes if a in SIZE_AXES and a in df and df[a].map(_is_number).all()]


def _check_gpu_only_ceiling(df, axes):
    """gpu-only's throughput >= every policy's at the same other fields."""
    if "policy.name" not in df or not any(is_ceiling(n) for n in set(df["policy.name"])):
        return None
    others = [a for a in axes if a not in ("policy.name", "predictor.name") and a in df]
    bad = []
    for key, g in _groups(df, others):
        ceiling = g.loc[g["policy.name"].map(is_ceiling).astype(bool), "throughput_tok_s"]
        if ceiling.empty:
            continue
        worse = g[g["throughput_tok_s"] > ceiling.max() * (1 + 1e-9)]
        bad += [f"{r['policy.name']} at {key}" for _, r in worse.iterrows()]
    return bad


def _check_belady_bound(df, axes):
    """belady's cache hit rate (HPC + MPC) >= every policy's at the same other fields."""
    if "policy.name" not in df or "belady" not in set(df["policy.name"]):
        return None
    df = df.assign(cache_hits=df["hit_rate_hpc"] + df["hit_rate_mpc"])
    others = [a for a in axes if a not in ("policy.name", "predictor.name") and a in df]
    bad = []
    for key, g in _groups(df, others):
        bound = g.loc[g["policy.name"] == "belady", "cache_hits"]
        if bound.empty:
            continue
        above = g[~g["policy.name"].map(is_ceiling).astype(bool) & (g["cache_hits"] > bound.max() + 1e-12)]
        bad += [f"{r['policy.name']} at {key}" for _, r in above.iterrows()]
    return bad


def _check_lru_monotone(df, axes):
    """lru's cache hit rate never falls as its cache grows (every other field fixed, ``cache.organization``
    included); not applicable when no cache size (``SIZE_AXES``, numeric) is swept."""
    if "policy.name" not in df or "lru" not in set(df["policy.name"]):
        return None
    lru = df[df["policy.name"] == "lru"].assign(cache_hits=lambda x: x["hit_rate_hpc"] + x["hit_rate_mpc"])
    sizes = size_axes(lru, axes)
    if not sizes:
        return None
    others = [a for a in axes if a not in sizes and a != "policy.name" and a in lru]
    bad = []
    for key, g in _groups(lru, others):
        g = g.sort_values("cache_slots")
        hits = g["cache_hits"].tolist()
        if any(b < a - 1e-12 for a, b in zip(hits, hits[1:])):
            bad.append(f"lru at {key}: {[round(h, 4) for h in hits]}")
    return bad


CHECKS = {
    "gpu_only_ceiling": _check_gpu_only_ceiling,
    "belady_bound": _check_belady_bound,
    "lru_monotone_in_cache": _check_lru_monotone,
}


def run_checks(df, sweep) -> dict[str, list[str] | None]:
    """The sweep's checks on its ok rows: check name -> violations (None: not applicable)."""
    ok = df[df["status"] == "ok"] if len(df) else df
    return {name: CHECKS[name](ok, sweep.axes) for name in sweep.checks}
