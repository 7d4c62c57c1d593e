"""`sim compare` names the hardware as `sim run` does: a profile of one's own (or a calibration file) by its path and
the profile it is based on, a bundled profile by its name."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT


def _title(tmp_path, *sets: str) -> str:
    out = tmp_path / "cmp"
    args = ["compare", "configs/switch_xxl.yaml", "--policies", "on-demand", "--out", str(out)]
    for s in ("workload.requests=2", "workload.max_decode_tokens=2", *sets):
        args += ["--set", s]
    res = subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return (out / "compare.md").read_text().splitlines()[0]


def test_a_hardware_file_of_ones_own_is_named_with_its_base(tmp_path):
    hw = tmp_path / "slow_link.yaml"
    hw.write_text("base: h200\npcie_bw_gb_s: 25\n")
    title = _title(tmp_path, f"hardware={hw}")
    assert f" on {hw}, based on h200," in title


def test_a_bundled_profile_is_named_by_its_name(tmp_path):
    assert " on h200, batch " in _title(tmp_path)
