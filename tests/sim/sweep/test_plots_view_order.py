"""The sweep report's throughput plots hold each other axis at its first value in the sweep file's order, whatever
the order of the rows (which follows the points' ids, and those depend on the folder the sweep ran in)."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.sweep.report import plot_view
from sim.sweep.spec import load_sweep
from tests.support.paths import ROOT

SWEEP = load_sweep(ROOT / "configs" / "sweeps" / "ci.yaml")


def _rows(order: list[int]) -> pd.DataFrame:
    rows = []
    for i in order:
        p = SWEEP.points[i]
        rows.append({**p.fields, "point": p.id, "throughput_tok_s": 1.0 + i})
    df = pd.DataFrame(rows)
    df["cache_slots"] = df["cache.hpc_slots"] + df["cache.mpc_slots"]
    return df


@settings(max_examples=25, deadline=None)
@given(st.permutations(range(len(SWEEP.points))))
def test_the_held_value_is_the_files_first_whatever_the_row_order(order):
    view = plot_view(SWEEP, _rows(list(order)), "cache_slots", "policy.name")
    first_batch = SWEEP.points[0].fields["workload.batch_size"]
    assert view.title.split("; ")[0] == f"batch {first_batch}", view.title
    assert set(view.rows["workload.batch_size"]) == {first_batch}
