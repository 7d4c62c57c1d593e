"""The summary `python -m sim run` prints: its header names the hardware file when the profile is not a bundled
one (a calibration file above all), and every figure is in human units (no raw 10-digit counts)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from sim.results import format_summary, hardware_words
from tests.support.paths import ROOT

CALIBRATION = "docs/validation/cpu-vm-2026-11-30-f/calibration.yaml"  # a committed CPU calibration (base: h200)
LONG_INTEGER = re.compile(r"(?<![\d.,])\d{10,}(?![\d.])")


def _run(tmp_path, *sets):
    out = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "sim",
        "run",
        "configs/switch_base_real.yaml",
        "--set",
        "workload.requests=8",
        *[x for s in sets for x in ("--set", s)],
        "--out",
        str(out),
    ]
    res = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout, json.loads((out / "summary.json").read_text())


def test_a_calibrated_run_names_its_calibration_file(tmp_path):
    stdout, summary = _run(tmp_path, f"hardware={CALIBRATION}")
    header = stdout.splitlines()[0]
    assert f"| hardware {CALIBRATION}, based on h200 |" in header
    assert summary["hardware_source"] == CALIBRATION


def test_a_bundled_profile_is_named_alone():
    assert hardware_words({"hardware": "h200", "hardware_source": "configs/hardware/h200.yaml"}) == "h200"
    assert (
        hardware_words({"hardware": "h200", "hardware_source": "/x/configs/hardware/h200.yaml (modified inline)"})
        == "h200, modified inline"
    )
    assert hardware_words({"hardware": "mine", "hardware_source": "/x/mine.yaml"}) == "/x/mine.yaml"
    assert hardware_words({"hardware": "tiny", "hardware_source": "inline"}) == "tiny"
    assert hardware_words({"hardware": "h200"}) == "h200"  # a summary written before the source was kept


def test_the_summary_has_no_raw_long_integers(tmp_path):
    stdout, summary = _run(tmp_path)
    assert summary["pcie_bytes"] >= 1e10  # the raw figure has 11 digits; the summary shows GB
    assert not [line for line in stdout.splitlines() if LONG_INTEGER.search(line)]
    big = dict(
        summary,
        accesses=12_345_678_901,
        copies=9_876_543_210,
        decode_tokens=5_000_000_000,
        events=3_000_000_000,
        pcie_bytes=18_778_521_340_800,
        stall_ms=12_345_678.9,
        prefill_ms=dict(summary["prefill_ms"], total=45_678_901_234.5),
        prefetch=dict(summary["prefetch"], issued=1_234_567_890, unused=2_345_678_901, wasted_bytes=18_778_521_340_800),
    )
    text = format_summary(big)
    assert not [line for line in text.splitlines() if LONG_INTEGER.search(line)], text
    assert "18,778.52 GB in 9,876,543,210 copies" in text and "of 12,345,678,901 accesses" in text
    assert "stall 12,345.68 s" in text and "prefill total 45,678,901.23 s" in text
