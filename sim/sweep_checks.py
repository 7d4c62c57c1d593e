"""A sweep's invariant checks: each takes the ok rows and the swept axes, and returns the violations found
(an empty list: passed; None: not applicable to this sweep). A broken check makes the sweep exit 3."""

from __future__ import annotations

from sim.policies import is_ceiling


def _check_gpu_only_ceiling(df, axes):
    """gpu-only's throughput >= every policy's at the same other fields."""
    if "policy.name" not in df or not any(is_ceiling(n) for n in set(df["policy.name"])):
        return None
    others = [a for a in axes if a not in ("policy.name", "predictor.name") and a in df]
    bad = []
    for key, g in (df.groupby(others) if others else [((), df)]):
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
    for key, g in (df.groupby(others) if others else [((), df)]):
        bound = g.loc[g["policy.name"] == "belady", "cache_hits"]
        if bound.empty:
            continue
        above = g[~g["policy.name"].map(is_ceiling).astype(bool) & (g["cache_hits"] > bound.max() + 1e-12)]
        bad += [f"{r['policy.name']} at {key}" for _, r in above.iterrows()]
    return bad


def _check_lru_monotone(df, axes):
    """lru's cache hit rate never falls as its cache grows (other fields fixed)."""
    if "policy.name" not in df or "lru" not in set(df["policy.name"]):
        return None
    lru = df[df["policy.name"] == "lru"].assign(cache_hits=lambda x: x["hit_rate_hpc"] + x["hit_rate_mpc"])
    size_axes = [a for a in axes if a.startswith("cache.") and a in lru]
    others = [a for a in axes if a not in size_axes and a != "policy.name" and a in lru]
    bad = []
    for key, g in (lru.groupby(others) if others else [((), lru)]):
        g = g.sort_values("cache_slots")
        hits = g["cache_hits"].tolist()
        if any(b < a - 1e-12 for a, b in zip(hits, hits[1:])):
            bad.append(f"lru at {key}: {[round(h, 4) for h in hits]}")
    return bad


CHECKS = {"gpu_only_ceiling": _check_gpu_only_ceiling, "belady_bound": _check_belady_bound,
          "lru_monotone_in_cache": _check_lru_monotone}


def run_checks(df, sweep) -> dict[str, list[str] | None]:
    """The sweep's checks on its ok rows: check name -> violations (None: not applicable)."""
    ok = df[df["status"] == "ok"] if len(df) else df
    return {name: CHECKS[name](ok, sweep.axes) for name in sweep.checks}
