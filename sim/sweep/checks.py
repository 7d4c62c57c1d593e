"""A sweep's invariant checks: each takes the ok rows and the swept axes, and returns the violations found
(an empty list: passed; None: not applicable to this sweep), possibly as :class:`Findings` that also say what the
check left out and why. A broken check makes the sweep exit 3.

Rows are compared within groups of equal "other fields": every swept axis but the ones a check varies. Values of
any kind group (strings such as ``cache.organization``, missing values, mixed types), in the order they come. A
violation names its policy and its group's fields with their values (``lru at workload.batch_size=4,
cache.organization=shared``).

``gpu_only_ceiling`` compares the policies that serve every expert from the GPU with the all-resident ceiling:
a row whose policy computed experts on the host CPU (``cpu_expert_frac`` above 0: fiddler, ktransformers,
hybrid-cache) is left out, and the check says so, since the host computes beside the GPU and may rightly beat a
GPU that holds every expert. A point whose ceiling does not fit in the GPU's memory (status ``does not fit``) has
no ceiling to compare with; the check says that too.

``host_compute_bound`` gives every row, those that computed experts on the host included, a bound of its own that
holds by construction of the cost model (``sim/timing/bound.py``): a run takes at least, per iteration, its dense
work and LM head plus each layer's expert work split ideally between the GPU and the host running in parallel, so
its throughput is at most ``throughput_bound_tok_s`` (recorded by each point's run when the sweep asks for this
check).
"""

from __future__ import annotations

from sim.policies import is_ceiling
from sim.sweep.worker import BOUND_CHECK, BOUND_COLUMN, DOES_NOT_FIT


class Findings(list):
    """A check's violations (a list; empty: none), with ``note``: what the check left out and why (None:
    nothing), and ``applicable``: False when nothing was left to compare."""

    def __init__(self, items=(), note: str | None = None, applicable: bool = True):
        super().__init__(items)
        self.note = note
        self.applicable = applicable


def check_state(bad) -> str:
    """What report.md says of a check's outcome: ``passed``, ``FAILED: ...``, ``not applicable``, each with the
    note of what it left out when there is one."""
    note = getattr(bad, "note", None)
    tail = f" ({note})" if note else ""
    if bad is None or not getattr(bad, "applicable", True):
        return "not applicable" + tail
    return (f"FAILED: {'; '.join(bad)}" if bad else "passed") + tail


def where(others: list[str], key: tuple) -> str:
    """A group's fields with their values, ``workload.batch_size=4, cache.mpc_slots=20`` (``every point`` when
    no other field is swept)."""
    return ", ".join(f"{a}={v}" for a, v in zip(others, key)) or "every point"


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


def _on_host(df):
    """The rows whose policy computed experts on the host CPU (``cpu_expert_frac`` above 0)."""
    if "cpu_expert_frac" not in df:
        return df["policy.name"].map(lambda _: False).astype(bool)
    return df["cpu_expert_frac"].map(lambda v: _is_number(v) and v > 0).astype(bool)


def _check_gpu_only_ceiling(df, axes):
    """gpu-only's throughput >= that of every policy that serves its experts from the GPU, at the same other
    fields; the rows that computed experts on the host are left out (see the module docstring), said in the
    note."""
    if "policy.name" not in df or not any(is_ceiling(n) for n in set(df["policy.name"])):
        return None
    others = [a for a in axes if a not in ("policy.name", "predictor.name") and a in df]
    host = _on_host(df)
    bad = []
    for key, g in _groups(df[~host], others):
        ceiling = g.loc[g["policy.name"].map(is_ceiling).astype(bool), "throughput_tok_s"]
        if ceiling.empty:
            continue
        worse = g[g["throughput_tok_s"] > ceiling.max() * (1 + 1e-9)]
        bad += [f"{r['policy.name']} at {where(others, key)}" for _, r in worse.iterrows()]
    names = sorted(set(df.loc[host, "policy.name"]))
    note = (
        f"GPU caches only: {', '.join(names)} computed experts on the host CPU at {int(host.sum())} point(s), "
        f"which may rightly beat a GPU holding every expert, so they are not compared"
        if names
        else None
    )
    return Findings(bad, note)


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
        bad += [f"{r['policy.name']} at {where(others, key)}" for _, r in above.iterrows()]
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
            bad.append(f"lru at {where(others, key)}: {[round(h, 4) for h in hits]}")
    return bad


def _check_host_compute_bound(df, axes):
    """Every row's throughput <= its run's ``throughput_bound_tok_s`` (within a relative 1e-9); rows without the
    figure (stored by a run of the sweep that did not ask for this check) are left out, said in the note."""
    if not len(df) or "throughput_tok_s" not in df:
        return None
    if BOUND_COLUMN not in df:
        df = df.assign(**{BOUND_COLUMN: None})
    known = df[BOUND_COLUMN].map(_is_number).astype(bool) & df["throughput_tok_s"].map(_is_number).astype(bool)
    rows = df[known]
    others = [a for a in axes if a not in ("policy.name", "predictor.name") and a in df]
    bad = []
    for _, r in rows[rows["throughput_tok_s"] > rows[BOUND_COLUMN] * (1 + 1e-9)].iterrows():
        name = r["policy.name"] if "policy.name" in r else "a point"
        bad.append(
            f"{name} at {where(others, tuple(r[a] for a in others))}: {r['throughput_tok_s']:.6g} tok/s above "
            f"the bound {r[BOUND_COLUMN]:.6g}"
        )
    missing = int((~known).sum())
    host = int(_on_host(rows).sum())
    notes = [f"{host} of {len(rows)} row(s) computed experts on the host CPU"] if host else []
    if missing:
        notes.append(
            f"{missing} row(s) without {BOUND_COLUMN} (stored by a run that did not ask for this check: run them "
            f"again) are not compared"
        )
    return Findings(bad, "; ".join(notes) or None, applicable=bool(len(rows)))


CHECKS = {
    "gpu_only_ceiling": _check_gpu_only_ceiling,
    "belady_bound": _check_belady_bound,
    "lru_monotone_in_cache": _check_lru_monotone,
    BOUND_CHECK: _check_host_compute_bound,
}


def run_checks(df, sweep) -> dict[str, list[str] | None]:
    """The sweep's checks on its ok rows: check name -> violations (None: not applicable; :class:`Findings` with a
    note of what was left out). The ceiling's rows that do not fit in the GPU's memory are said in its note."""
    ok = df[df["status"] == "ok"] if len(df) else df
    out = {name: CHECKS[name](ok, sweep.axes) for name in sweep.checks}
    if "gpu_only_ceiling" in out:
        out["gpu_only_ceiling"] = _with_misfits(out["gpu_only_ceiling"], df)
    return out


def _with_misfits(bad, df):
    """The ceiling check's outcome, with a word on the ceiling's points that do not fit in the GPU's memory."""
    if not len(df) or "policy.name" not in df:
        return bad
    ceiling = df["policy.name"].map(is_ceiling).astype(bool)
    misfit = int((ceiling & (df["status"] == DOES_NOT_FIT)).sum())
    if not misfit:
        return bad
    names = ", ".join(sorted(set(df.loc[ceiling, "policy.name"])))
    words = f"{names} does not fit in the GPU's memory at {misfit} of its {int(ceiling.sum())} point(s)"
    if bad is None:
        return Findings([], f"{words}: no ceiling to compare with", applicable=False)
    note = "; ".join(n for n in (getattr(bad, "note", None), f"{words}: those are not compared") if n)
    return Findings(bad, note, applicable=getattr(bad, "applicable", True))
