"""``validate.steadiness``: the calibration passes of a measurement set side by side.

- the verdict over synthetic passes: a table is flagged iff some pass's total is more than the tolerance from the
  median of the passes' totals; the warning line names the table, the passes' values and the tolerance;
- the re-measure loop (``remeasured``) with a fake measuring function: a moment's outlier is taken again and set
  aside, a lasting change is taken again ``retries`` times and kept, passes unsteady already are not retaken;
- ``validate measure`` with scripted passes records the verdict and the passes taken again in the manifest, and
  ``validate compare`` warns on stderr, writes the ``## Machine steadiness`` section, exits 0, or 3 with
  ``--strict``; a folder without passes says "not recorded"; malformed passes exit 2 naming the field.
"""

from __future__ import annotations

import copy
import json
import re
import statistics
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import validate.measure as measure_mod
import validate.microbench as microbench
from moebase.errors import ConfigError
from tests.support.fuzz import fuzz_settings
from tests.support.paths import ROOT
from tests.support.validate import tiny_suite
from validate import cli
from validate.compare import markdown
from validate.steadiness import (
    PASSES_FILE,
    TOLERANCE,
    Drift,
    assess,
    check_passes,
    markdown_section,
    remeasured,
    totals,
)


def cal(dense_s: float, copy_s: float = 1e-3, light: bool = True) -> dict:
    """A calibration pass whose ``dense`` table totals ``dense_s`` seconds over two points (``copy`` steady)."""
    out = {
        "base": "h200",
        "source": "test",
        "tables": {
            "model": "m",
            "copy": [[1 << 20, copy_s / 4], [1 << 22, 3 * copy_s / 4]],
            "dense": [[1, 32, 0.25 * dense_s], [1, 256, 0.75 * dense_s]],
        },
    }
    if not light:
        out["handoff_us"] = 100.0
    return out


# ------------------------------------------------------------------------------------------------ the verdict
tolerances = st.sampled_from([0.05, 0.1, 0.25, 0.5])
ms = st.floats(0.01, 1000.0, allow_nan=False)


@fuzz_settings(200)
@given(st.data(), tolerances, ms, st.integers(0, 4))
def test_a_table_is_flagged_iff_a_pass_is_beyond_the_tolerance_from_the_median(data, tol, median_ms, k):
    """2k+1 passes built around a known median (k at or below it, k at or above): steady iff every pass is within
    the tolerance of that median; the warning names the table and the tolerance, and lists the passes."""
    lows = data.draw(st.lists(st.floats(0.01, 1.0), min_size=k, max_size=k))
    highs = data.draw(st.lists(st.floats(1.0, 3.0), min_size=k, max_size=k))
    values = [median_ms * f for f in [1.0, *lows, *highs]]
    values = data.draw(st.permutations(values))
    verdict = assess([cal(v / 1e3) for v in values], tol)
    assert statistics.median(values) == pytest.approx(median_ms)
    dense = next(d for d in verdict.drifts if d.table == "dense") if len(values) > 1 else None
    if dense is not None:  # the drift is measured from that median, by the largest pass either side of it
        assert dense.median == pytest.approx(median_ms / 1e3)
        assert dense.deviation == pytest.approx(max(abs(v / median_ms - 1) for v in values))
    expected = any(abs(v / median_ms - 1) > tol * (1 + 1e-9) for v in values)
    borderline = any(abs(abs(v / median_ms - 1) - tol) < 1e-9 for v in values)
    if not borderline:
        assert [d.table for d in verdict.beyond] == (["dense"] if expected else [])
        assert verdict.steady is (None if len(values) == 1 else not expected)
        assert len(verdict.warnings()) == int(expected)
    if verdict.warnings():
        line = verdict.warnings()[0]
        assert "dense (dense work)" in line and f"tolerance {100 * tol:g}%" in line
        assert f"{len(values)} passes" in line or line.count(",") >= len(values) - 1
        assert "\n" not in line and len(line) < 300


@fuzz_settings(100)
@given(st.lists(ms, min_size=2, max_size=9), st.floats(0.001, 1000.0), tolerances)
def test_the_verdict_depends_on_ratios_only_and_not_on_the_passes_order(values, scale, tol):
    base = assess([cal(v / 1e3) for v in values], tol)
    scaled = assess([cal(scale * v / 1e3) for v in values], tol)
    turned = assess([cal(v / 1e3) for v in reversed(values)], tol)
    dense = next(d for d in base.drifts if d.table == "dense")
    assert next(d for d in scaled.drifts if d.table == "dense").deviation == pytest.approx(dense.deviation)
    assert next(d for d in turned.drifts if d.table == "dense").deviation == pytest.approx(dense.deviation)
    assert dense.deviation >= 0 and (dense.deviation == 0) == (len(set(values)) == 1)


def test_the_loaded_machine_of_three_passes_is_flagged_at_25_percent_not_at_30():
    passes = [cal(3.24e-3), cal(2.64e-3), cal(4.17e-3)]
    verdict = assess(passes)
    assert TOLERANCE == 0.25 and verdict.steady is False
    (line,) = verdict.warnings()
    assert line == (
        "warning: machine unsteady during the measurement: dense (dense work): passes 3.24, 2.64, 4.17 ms, "
        "28.7% from their median 3.24 ms (tolerance 25%)"
    )
    assert assess(passes, 0.30).steady is True and not assess(passes, 0.30).warnings()
    assert "UNSTEADY: 1 table(s) beyond 25%" in verdict.summary() and "dense 28.7%" in verdict.summary()


def test_a_table_counts_its_total_not_its_points():
    """Two passes whose points differ by 2x but whose totals agree are steady; the totals are the points' sums."""
    a, b = cal(1e-3), cal(1e-3)
    b["tables"]["dense"] = [[1, 32, 0.5e-3], [1, 256, 0.5e-3]]
    assert totals(b)["dense"] == pytest.approx(1e-3) and assess([a, b]).steady is True


def test_only_passes_at_the_first_passes_points_count_and_one_pass_is_not_measured():
    odd = cal(9e-3)
    odd["tables"]["dense"] = odd["tables"]["dense"][:1]  # another grid: left out, as combine leaves it out
    verdict = assess([cal(1e-3), odd, cal(1e-3)])
    assert verdict.steady is True and next(d for d in verdict.drifts if d.table == "dense").totals == (1e-3, 1e-3)
    one = assess([cal(1e-3)])
    assert one.steady is None and not one.warnings() and "not measured" in one.summary()
    assert "not recorded" in assess([]).summary()


def test_many_passes_are_shown_as_a_range():
    line = Drift("dense", tuple(v / 1e3 for v in (1, 1, 1, 1, 1, 1, 1, 3))).describe(0.25)
    assert "8 passes from 1 to 3 ms" in line and "200.0% from their median 1 ms" in line


# ------------------------------------------------------------------------------------------------ re-measuring
class Fake:
    """A measuring function returning scripted passes (dense totals in ms), counting its calls."""

    def __init__(self, *dense_ms: float):
        self.script, self.calls = list(dense_ms), 0

    def __call__(self) -> dict:
        self.calls += 1
        return cal(self.script.pop(0) / 1e3)


def dense_ms(p: dict) -> float:
    return round(1e3 * totals(p)["dense"], 6)


def test_a_moment_s_outlier_is_measured_again_and_set_aside():
    said = []
    take = Fake(9.0, 1.1)
    kept, aside = remeasured(take, [cal(1e-3), cal(1e-3)], 0.25, 2, lambda n, beyond: said.append((n, beyond)))
    assert dense_ms(kept) == 1.1 and [dense_ms(a) for a in aside] == [9.0] and take.calls == 2
    assert [(n, [d.table for d in b]) for n, b in said] == [(1, ["dense"])]


def test_a_lasting_change_is_measured_again_retries_times_then_kept():
    take = Fake(2.0, 2.1, 2.2, 5.0)
    kept, aside = remeasured(take, [cal(1e-3), cal(1e-3)], 0.25, 2)
    assert dense_ms(kept) == 2.2 and [dense_ms(a) for a in aside] == [2.0, 2.1] and take.calls == 3
    assert assess([cal(1e-3), cal(1e-3), kept]).steady is False


@pytest.mark.parametrize(
    "earlier,script,retries",
    [
        ([], (5.0,), 2),  # the first pass: nothing to compare it with
        ([1.0], (1.1,), 2),  # within the tolerance
        ([1.0, 3.0], (5.0,), 2),  # the earlier passes disagree already: the measurement is flagged anyway
        ([1.0, 1.0], (5.0,), 0),  # --remeasure 0
    ],
)
def test_a_pass_is_kept_as_it_comes_when_taking_it_again_cannot_help(earlier, script, retries):
    take = Fake(*script)
    kept, aside = remeasured(take, [cal(v / 1e3) for v in earlier], 0.25, retries)
    assert take.calls == 1 and not aside and dense_ms(kept) == script[0]


# ------------------------------------------------------------------------------------------------ untrusted passes
@pytest.mark.parametrize(
    "value,field",
    [
        ({"tables": {}}, "must hold a list"),
        ([{"tables": []}], "[0].tables"),
        ([cal(1e-3), {"tables": {"dense": [[1, 32, "fast"]]}}], "[1].tables.dense[0]"),
        ([{"tables": {"dense": [[1, 32, -1.0]]}}], "[0].tables.dense[0]"),
        ([{"tables": {"dense": [[1, 32, float("nan")]]}}], "[0].tables.dense[0]"),
        ([{"tables": {"dense": [[]]}}], "[0].tables.dense[0]"),
        ([{"tables": {"dense": {"a": 1}}}], "[0].tables.dense"),
        ([{"tables": {"de\x1bnse": [[1, 1e-3]]}}], "a table name"),
    ],
)
def test_malformed_passes_are_refused_naming_the_field(value, field):
    with pytest.raises(ConfigError) as e:
        check_passes(value, "calibration-passes.json")
    assert field in str(e.value) and "\n" not in str(e.value) and "\x1b" not in str(e.value)


# ------------------------------------------------------------------------------------------------ the report
ROW = {
    "config": "lru-b2",
    "real_mean_ms": 10.0,
    "sim_mean_ms": 12.0,
    "err_mean_pct": 20.0,
    "real_p50_ms": 10.0,
    "sim_p50_ms": 12.0,
    "err_p50_pct": 20.0,
    "real_tok_s": 100.0,
    "sim_tok_s": 83.3,
    "err_tok_s_pct": -16.7,
    "decisions_identical": True,
}


def test_the_report_states_the_verdict_in_its_own_section():
    unsteady = markdown([ROW], {"suite": "cpu"}, assess([cal(3.24e-3), cal(2.64e-3), cal(4.17e-3)]))
    section = unsteady.split("## Machine steadiness", 1)[1]
    assert "**unsteady**, 1 table(s) beyond 25% of their median (dense)" in section
    assert "| dense | dense work | 3 | 3.24 | 2.64 | 4.17 | 28.7% | beyond |" in section
    assert "| copy | host-to-device copies | 3 | 1 | 1 | 1 | 0.0% | ok |" in section
    steady = markdown([ROW], {"suite": "cpu"}, assess([cal(1e-3), cal(1.1e-3)]))
    assert "**steady**, every table within 25% of its median" in steady
    assert "Machine steadiness" not in markdown([ROW], {"suite": "cpu"})  # no verdict given: no section
    assert any(line.startswith("Not recorded") for line in markdown_section(assess([])))


# ------------------------------------------------------------------------------------------------ measure + compare
@pytest.fixture
def scripted(tiny, monkeypatch):
    """``validate measure`` over two tiny configurations whose calibration passes are one real pass with every
    table scaled by the next factor of a script (``scripted.script``); ``scripted.calls`` counts the passes."""
    monkeypatch.setattr(
        measure_mod,
        "SUITES",
        {"cpu": tiny_suite(tiny, (("lru-b2", "lru", "none", 2, 0, 2), ("gpu-only-b2", "gpu-only", "none", 2, 0, 0)))},
    )
    real, template = microbench.calibrate, {}

    def fake(*args, light=False, **kw):
        if not template:
            template.update(real(*args, light=False, **kw))
        fake.calls += 1
        out = copy.deepcopy(template)
        if light:
            out = {k: v for k, v in out.items() if k in ("base", "source", "cpu_cores", "tables")}
        f = fake.script.pop(0)
        for name, points in out["tables"].items():
            if name != "model":
                out["tables"][name] = [[*p[:-1], f * p[-1]] for p in points]
        return out

    fake.calls, fake.script = 0, []
    monkeypatch.setattr(microbench, "calibrate", fake)
    return fake


def _measure(out, **kw):
    said: list[str] = []
    folder = measure_mod.measure(
        "cpu", out, "cpu", repeat=1, host_threads=1, rounds=1, calibrate_between=True, log=said.append, **kw
    )
    return folder, said


def test_measure_takes_an_outlier_pass_again_and_records_a_steady_machine(scripted, tmp_path, capsys):
    scripted.script = [1.0, 1.0, 3.0, 1.1]  # the full pass, a light one, an outlier light one, its retake
    folder, said = _measure(tmp_path / "m")
    assert scripted.calls == 4 and not scripted.script
    passes = json.loads((folder / "calibration-passes.json").read_text())
    assert len(passes) == 3  # the outlier set aside, not kept
    rec = json.loads((folder / "manifest.json").read_text())["steadiness"]
    assert rec["steady"] is True and rec["passes"] == 3 and rec["tolerance_pct"] == 25
    (retaken,) = rec["retaken"]
    assert retaken["pass"] == 3 and retaken["when"] == "after gpu-only-b2" and len(retaken["set_aside_ms"]) == 1
    assert any("pass 3 set aside" in line and "measuring it again (1/2)" in line for line in said)
    assert "steady: every table within 25%" in said[-2] and said[-1].startswith("measured 2 configuration(s)")
    capsys.readouterr()
    assert cli.main(["compare", str(folder), "--strict"]) == 0
    err = capsys.readouterr().err
    assert "warning" not in err
    md = (folder / "compare" / "compare.md").read_text()
    assert "**steady**" in md and "recorded it steady (tolerance 25%) and took 1 pass(es) again" in md


def test_an_unsteady_machine_is_flagged_by_measure_and_compare_warns_or_fails_when_strict(scripted, tmp_path, capsys):
    scripted.script = [1.0, 2.0, 2.0, 2.0]  # the machine halves its speed after the first pass, and stays so
    folder, said = _measure(tmp_path / "m", remeasure=1)
    assert scripted.calls == 4  # pass 2 taken again once; pass 3 follows passes that disagree already
    rec = json.loads((folder / "manifest.json").read_text())["steadiness"]
    assert rec["steady"] is False and set(rec["unsteady_ms"]) >= {"dense", "copy", "expert"}
    assert [r["pass"] for r in rec["retaken"]] == [2]
    assert any(line.startswith("warning: machine unsteady") and "dense (dense work)" in line for line in said)
    capsys.readouterr()
    assert cli.main(["compare", str(folder)]) == 0
    out = capsys.readouterr()
    warned = [line for line in out.err.splitlines() if line.startswith("warning: machine unsteady")]
    assert any("dense (dense work): passes" in line and "(tolerance 25%)" in line for line in warned)
    assert "UNSTEADY" in out.out and not any("warning" in line for line in out.out.splitlines())
    md = (folder / "compare" / "compare.md").read_text()
    assert "**unsteady**" in md and "recorded it unsteady (tolerance 25%) and took 1 pass(es) again" in md
    assert cli.main(["compare", str(folder), "--strict"]) == cli.UNSTEADY_EXIT == 3
    assert (
        cli.main(["compare", str(folder), "--strict", "--drift-tolerance", "60"]) == 0
    )  # 1, 2, 2: 50% from the median

    (folder / "calibration-passes.json").unlink()  # a folder that kept no passes
    capsys.readouterr()
    assert cli.main(["compare", str(folder), "--strict"]) == 0
    assert "not recorded" in capsys.readouterr().out
    assert (
        "Not recorded: this measurement kept no calibration passes" in (folder / "compare" / "compare.md").read_text()
    )

    (folder / "calibration-passes.json").write_text(json.dumps([{"tables": {"dense": [[1, 1, "x"]]}}]))
    assert cli.main(["compare", str(folder)]) == 2
    assert "calibration-passes.json: [0].tables.dense[0]" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ the archives
def _archived_passes(archive) -> list[dict]:
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if Path(m.name).parts[1:] == (PASSES_FILE,))
        return check_passes(json.loads(tar.extractfile(member).read()), str(archive))


def test_the_steadiness_table_of_docs_validation_is_what_the_archives_hold():
    """Every archived measurement's row of docs/validation/README.md ("Machine steadiness"): its passes, each
    table's drift and the verdict, recomputed from the archive's calibration passes; the sample warning is one
    archive's; the folders without an archive keep no passes."""
    top = ROOT / "docs" / "validation"
    text = (top / "README.md").read_text().split("## Machine steadiness", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(h200-[^`]+)` \| (.+) \|$", text, re.M))
    archives = sorted(top.rglob("gpu-check.tar.gz"))
    assert archives and sorted(rows) == sorted(str(a.parent.relative_to(top)) for a in archives)
    warnings = []
    for archive in archives:
        verdict = assess(_archived_passes(archive))
        drift = ", ".join(f"{d.table} {100 * d.deviation:.1f}%" for d in verdict.drifts)
        said = "steady" if verdict.steady else f"**unsteady** ({', '.join(d.table for d in verdict.beyond)})"
        assert rows[str(archive.parent.relative_to(top))] == f"{verdict.passes} | {drift} | {said}", archive
        warnings += verdict.warnings()
    shown = re.search(r"^warning: .*$", text, re.M)
    assert shown and shown.group(0) in warnings
    for folder in top.glob("cpu-vm-*"):
        assert not list(folder.rglob(PASSES_FILE)) and not list(folder.rglob("*.tar.gz")), folder
    assert f"`cpu-vm-*` ({len(list(top.glob('cpu-vm-*')))} folders) | - | - | not recorded" in text
