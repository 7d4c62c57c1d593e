"""Sweeps never report a throughput that cannot happen: a point whose parts do not fit in the GPU's memory is a
row with status "does not fit" (its error ``does not fit (X GB > Y GB): `` and the memory table), shown so in
report.md, kept by ``--resume`` and no failure; the ceiling check compares the policies that serve their experts
from the GPU only (host-compute rows are left out, saying so), and each violation names its fields and values."""

from __future__ import annotations

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from sim.sweep.checks import CHECKS, check_state, run_checks
from sim.sweep.worker import DOES_NOT_FIT
from tests.support.cli import run_module
from tests.support.fuzz import fuzz_settings
from tests.support.paths import ROOT

MIXTRAL = ROOT / "configs" / "mixtral.yaml"


def _sweep_file(tmp_path, body: str):
    path = tmp_path / "s.yaml"
    path.write_text(f"base: {MIXTRAL}\nname: fit\nset: {{workload.requests: 2, workload.max_decode_tokens: 3}}\n{body}")
    return path


def test_a_point_that_does_not_fit_is_a_row_not_a_failure_and_resume_keeps_it(tmp_path):
    """Mixtral's 90 GB of experts fit an H200 (141 GB) but not an A100 (80 GB): gpu-only on the A100 is a "does not
    fit" row with no figure; the sweep exits 0, the other points run, and --resume runs nothing again."""
    sweep = _sweep_file(
        tmp_path,
        "grid:\n  policy.name: [gpu-only, lru, fiddler]\n  hardware: [h200, a100-pcie]\nchecks: [gpu_only_ceiling]\n",
    )
    out = tmp_path / "out"
    res = run_module("sim", "sweep", sweep, "--out", out, "--workers", "2", "--quiet")
    assert res.returncode == 0, res.stderr + res.stdout
    assert "6 points (0 failed, 1 does not fit in the GPU's memory)" in res.stdout
    df = pd.read_parquet(out / "results.parquet")
    misfit = df[df["status"] == DOES_NOT_FIT]
    assert misfit[["policy.name", "hardware"]].values.tolist() == [["gpu-only", "a100-pcie"]]
    row = misfit.iloc[0]
    assert pd.isna(row["throughput_tok_s"]) and pd.isna(row["hit_rate"])
    words, table = row["error"].split("): ", 1)
    assert words.startswith("does not fit (") and words.endswith(" GB > 80.0 GB")
    assert table.startswith("policy.name: gpu-only keeps every expert on the GPU") and table.endswith(
        "hardware.gpu_memory_gb is 80 (a policy that offloads experts fits in less)"
    )
    assert (df.loc[df["status"] != DOES_NOT_FIT, "status"] == "ok").all()
    report = (out / "report.md").read_text()
    assert f"| gpu-only | a100-pcie | does not fit | {words}) |" in report
    assert "0 failed, 1 does not fit in the GPU's memory" in report and "## Failed points" not in report
    again = run_module("sim", "sweep", sweep, "--out", out, "--resume", "--quiet")
    assert again.returncode == 0, again.stderr
    assert "6 already done, 0 to run" in again.stderr


def test_the_ceiling_check_leaves_out_host_compute_rows_and_says_so_and_misfits_too(tmp_path):
    """fiddler beats gpu-only when the host computes beside the GPU: that is no violation (the check names the
    rows it leaves out and why); gpu-only that does not fit at a point has no ceiling there, said too."""
    rows = pd.DataFrame(
        [
            {"policy.name": "gpu-only", "b": 1, "status": "ok", "throughput_tok_s": 100.0, "cpu_expert_frac": 0.0},
            {"policy.name": "lru", "b": 1, "status": "ok", "throughput_tok_s": 50.0, "cpu_expert_frac": 0.0},
            {"policy.name": "fiddler", "b": 1, "status": "ok", "throughput_tok_s": 150.0, "cpu_expert_frac": 0.4},
            {"policy.name": "gpu-only", "b": 2, "status": DOES_NOT_FIT, "throughput_tok_s": None},
            {"policy.name": "lru", "b": 2, "status": "ok", "throughput_tok_s": 60.0, "cpu_expert_frac": 0.0},
        ]
    )
    sweep = type("S", (), {"axes": ["policy.name", "b"], "checks": ["gpu_only_ceiling"]})()
    bad = run_checks(rows, sweep)["gpu_only_ceiling"]
    assert bad == [] and bad.applicable
    state = check_state(bad)
    assert state.startswith("passed (GPU caches only: fiddler computed experts on the host CPU at 1 point(s)")
    assert "gpu-only does not fit in the GPU's memory at 1 of its 2 point(s): those are not compared" in state
    none_fit = rows[~((rows["policy.name"] == "gpu-only") & (rows["b"] == 1))]
    bad = run_checks(none_fit, sweep)["gpu_only_ceiling"]
    assert not bad.applicable and check_state(bad).startswith("not applicable (gpu-only does not fit")


@fuzz_settings(80)
@given(
    tputs=st.lists(st.floats(1, 1000), min_size=2, max_size=4),
    ceiling=st.floats(1, 1000),
    host=st.lists(st.booleans(), min_size=4, max_size=4),
    batch=st.sampled_from([1, 4, 16]),
)
def test_ceiling_violations_are_exactly_the_gpu_served_rows_above_it_labelled_by_field(tputs, ceiling, host, batch):
    policies = ["lru", "lfu", "diffmoe", "arc"][: len(tputs)]
    rows = [{"policy.name": "gpu-only", "workload.batch_size": batch, "throughput_tok_s": ceiling}]
    for p, t, h in zip(policies, tputs, host):
        rows.append({"policy.name": p, "workload.batch_size": batch, "throughput_tok_s": t, "cpu_expert_frac": 0.3 * h})
    bad = CHECKS["gpu_only_ceiling"](pd.DataFrame(rows), ["policy.name", "workload.batch_size"])
    want = [
        f"{p} at workload.batch_size={batch}"
        for p, t, h in zip(policies, tputs, host)
        if not h and t > ceiling * (1 + 1e-9)
    ]
    assert list(bad) == want
    assert (bad.note is not None) == any(host[: len(tputs)])
    if bad:
        assert check_state(bad).startswith(f"FAILED: {want[0]}")


def test_every_check_labels_its_groups_by_field_and_value():
    lru = pd.DataFrame(
        [
            {"policy.name": "lru", "cache.organization": "shared", "cache.mpc_slots": m, "cache_slots": m,
             "hit_rate_hpc": 0.0, "hit_rate_mpc": h}
            for m, h in ((2, 0.5), (4, 0.3))
        ]
    )  # fmt: skip
    bad = CHECKS["lru_monotone_in_cache"](lru, ["policy.name", "cache.organization", "cache.mpc_slots"])
    assert bad == ["lru at cache.organization=shared: [0.5, 0.3]"]
    both = pd.DataFrame(
        [
            {"policy.name": "belady", "workload.batch_size": 8, "hit_rate_hpc": 0.0, "hit_rate_mpc": 0.5},
            {"policy.name": "lru", "workload.batch_size": 8, "hit_rate_hpc": 0.0, "hit_rate_mpc": 0.6},
        ]
    )
    assert CHECKS["belady_bound"](both, ["policy.name", "workload.batch_size"]) == ["lru at workload.batch_size=8"]
