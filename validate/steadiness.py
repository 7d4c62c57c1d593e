"""How steady the machine stayed while a measurement ran: its calibration passes set side by side.

A measurement (``validate cpu|gpu``) takes several calibration passes: a full one before each round and after the
last, a light one after every configuration run (``--calibrate-between``). Every pass, full or light, measures the
same kernel tables at the same points (``copy``, ``d2d``, ``expert``, ``dense``, ``lm_head``, ``cpu_expert``,
``dequant_<format>``: ``validate.microbench``), and the simulator is calibrated with their median
(``validate.microbench.combine``). On a machine whose speed holds the passes agree; on a loaded or drifting one
they do not, and part of every error ``validate compare`` reports is then the machine's, not the simulator's.

**The drift of a table** is the largest ``|total / median - 1|`` over the passes that measured it, where a pass's
total is the sum of the table's seconds over its points (what timing each point once took: dominated by the
largest points, which weigh most in a run, and less noisy than any one point), and the median is the median of
the passes' totals (the calibration is the median of the passes). Only the passes that measured the table at the
first pass's points count, as in ``combine``. With 3 passes of 3.24, 2.64 and 4.17 ms the median is 3.24 ms and
the drift 28.7% (the 4.17 ms pass).

**The machine was steady** when every table's drift is within ``TOLERANCE``, 25%. On the 12 archived H200
measurements (``docs/validation/``: 3 full passes each, 5 tables, 60 drifts) 53 drifts are at most 23.3% (the
ordinary pass-to-pass noise of a VM: memory-bound work moves by about ±15% there) and the other 7 are 27.7-105%,
in 4 measurements where one pass ran dense work or expert FFNs at another speed. 25% sits in that gap: a table
beyond it ran, for part of the measurement, at a speed more than a quarter away from the calibration, more than
the median errors of the 8 steady ones (0.3-13.4%), so an error of that size can no longer be told from the
machine's drift. With 2 passes the median is their mean, and 25% means one is more than 5/3 times the other.

The scalars of full passes (hand-off, copy gap, host costs, interference factors) are not compared: there are
only 1 to 3 full passes in a measurement, and the host's microsecond costs differ between the passes of one
archived H200 measurement by up to 1.7 times (``handoff_us``) and 2.9 times (``copy_gap_us``), in steady
measurements as in unsteady ones.

``validate measure`` takes a pass again (up to ``--remeasure`` times) when it is the one that makes steady passes
unsteady (:func:`remeasured`: a moment's load passes), keeps the last attempt, records the attempts set aside, and
writes the verdict into the manifest (``steadiness``: :meth:`Verdict.record`). ``validate compare`` computes the
verdict again from ``calibration-passes.json`` (measurements from before this record have the passes but no
flag; folders that kept no passes say "not recorded"), warns on stderr for each table beyond the tolerance, and
states it in ``compare.md`` (``## Machine steadiness``).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moebase.checks import kind_of, show
from moebase.errors import ConfigError
from validate.archive import find_file, read_inside

#: The largest drift (|a pass's table total / the median of the passes' totals - 1|) of a steady machine.
TOLERANCE = 0.25
#: Times ``validate measure`` takes a pass again by default when it makes steady passes unsteady.
REMEASURE = 2
#: The file of a measurement that holds every calibration pass (``validate.measure``).
PASSES_FILE = "calibration-passes.json"
#: The most passes and points per table read from a measurement (an untrusted file).
MAX_PASSES = 10_000
MAX_POINTS = 10_000
#: Passes listed value by value in a line; more are summarized as a range.
MAX_LISTED = 6
#: What each table times, for the report (a table this version does not know is shown by its name alone).
QUANTITIES = {
    "copy": "host-to-device copies",
    "d2d": "device-to-device copies",
    "expert": "expert FFNs",
    "dense": "dense work",
    "lm_head": "LM head",
    "cpu_expert": "experts on the host CPU",
    "dequant_int8": "int8 de-quantization",
    "dequant_int4": "int4 de-quantization",
}
_TABLE_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")


@dataclass(frozen=True)
class Drift:
    """One table over the passes: each pass's total (seconds, in the order the passes were taken)."""

    table: str
    totals: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.totals)

    @property
    def deviation(self) -> float:
        """The largest |total / median - 1| (0 for a table whose median is 0: nothing to compare)."""
        m = self.median
        return max(abs(t / m - 1) for t in self.totals) if m > 0 else 0.0

    def describe(self, tolerance: float) -> str:
        """One bounded line: the table, the passes' totals, the drift and the tolerance."""
        what = QUANTITIES.get(self.table)
        name = f"{self.table} ({what})" if what else self.table
        if len(self.totals) <= MAX_LISTED:
            values = f"passes {', '.join(_ms(t) for t in self.totals)} ms"
        else:
            values = f"{len(self.totals)} passes from {_ms(min(self.totals))} to {_ms(max(self.totals))} ms"
        return (
            f"{name}: {values}, {100 * self.deviation:.1f}% from their median {_ms(self.median)} ms "
            f"(tolerance {100 * tolerance:g}%)"
        )


@dataclass(frozen=True)
class Verdict:
    """The machine's steadiness over a measurement's calibration passes.

    ``passes``: passes recorded (0: none, the measurement kept none); ``drifts``: one per table measured by 2
    passes or more; ``retaken``: the passes ``validate measure`` took again (each ``{"pass", "when",
    "set_aside_ms"}``); ``flag``: what ``validate measure`` recorded in the manifest (None before it did)."""

    passes: int
    tolerance: float
    drifts: tuple[Drift, ...] = ()
    retaken: tuple[dict, ...] = ()
    flag: dict | None = field(default=None, compare=False)

    @property
    def beyond(self) -> list[Drift]:
        """The tables whose drift is beyond the tolerance."""
        return [d for d in self.drifts if d.deviation > self.tolerance]

    @property
    def steady(self) -> bool | None:
        """True or False; None when there is nothing to compare (fewer than 2 passes)."""
        return None if not self.drifts else not self.beyond

    def warnings(self) -> list[str]:
        """One line per table beyond the tolerance (none when steady or unknown)."""
        return [f"warning: machine unsteady during the measurement: {d.describe(self.tolerance)}" for d in self.beyond]

    def summary(self) -> str:
        """One line: the verdict."""
        if not self.passes:
            return "machine steadiness: not recorded (this measurement kept no calibration passes)"
        if self.steady is None:
            return (
                f"machine steadiness: not measured ({self.passes} calibration pass(es), no table measured twice; "
                "measure with --rounds 2 or --calibrate-between)"
            )
        worst = max(self.drifts, key=lambda d: d.deviation)
        verdict = (
            f"steady: every table within {100 * self.tolerance:g}% of its median"
            if self.steady
            else f"UNSTEADY: {len(self.beyond)} table(s) beyond {100 * self.tolerance:g}% of their median"
        )
        again = f"; {len(self.retaken)} pass(es) taken again" if self.retaken else ""
        return (
            f"machine steadiness over {self.passes} calibration passes: {verdict} (largest: {worst.table} "
            f"{100 * worst.deviation:.1f}%){again}"
        )

    def record(self) -> dict:
        """The verdict as ``validate measure`` writes it into the manifest (``steadiness``)."""
        return {
            "tolerance_pct": round(100 * self.tolerance, 3),
            "passes": self.passes,
            "steady": self.steady,
            "deviation_pct": {d.table: round(100 * d.deviation, 2) for d in self.drifts},
            "unsteady_ms": {d.table: [round(1e3 * t, 6) for t in d.totals] for d in self.beyond},
            "retaken": list(self.retaken),
        }


def _ms(seconds: float) -> str:
    ms = 1e3 * seconds
    return f"{ms:,.0f}" if ms >= 1000 else f"{ms:.3g}"


def totals(calibration: dict) -> dict[str, float]:
    """A pass's table totals: per table, its points' seconds summed (the last value of each point)."""
    return {
        name: math.fsum(p[-1] for p in points)
        for name, points in (calibration.get("tables") or {}).items()
        if name != "model" and isinstance(points, list)
    }


def drifts(passes: Sequence[dict]) -> list[Drift]:
    """One Drift per table of the first pass that 2 passes or more measured at its points."""
    if not passes:
        return []
    out = []
    for name, points in (passes[0].get("tables") or {}).items():
        if name == "model" or not isinstance(points, list):
            continue
        same = [p["tables"][name] for p in passes if len(p.get("tables", {}).get(name) or ()) == len(points)]
        if len(same) >= 2:
            out.append(Drift(name, tuple(math.fsum(pt[-1] for pt in t) for t in same)))
    return out


def assess(passes: Sequence[dict], tolerance: float = TOLERANCE, retaken: Sequence[dict] = ()) -> Verdict:
    """The verdict over ``passes`` (calibration mappings, in the order they were taken)."""
    return Verdict(len(passes), tolerance, tuple(drifts(passes)), tuple(retaken))


def remeasured(
    take: Callable[[], dict],
    earlier: Sequence[dict],
    tolerance: float = TOLERANCE,
    retries: int = REMEASURE,
    on_retake: Callable[[int, list[Drift]], Any] | None = None,
) -> tuple[dict, list[dict]]:
    """A new pass from ``take()``, taken again up to ``retries`` times while it is what makes the passes unsteady:
    ``earlier`` within ``tolerance`` and ``earlier`` with it not. Returns the pass kept (the last taken: the machine
    as it is now, before the next run) and the attempts set aside, oldest first. After passes that are unsteady
    already the new one is kept as it comes: taking it again cannot undo what they saw, and the measurement is
    flagged anyway. ``on_retake(attempt, drifts)`` is told of each attempt set aside and the tables beyond."""
    new = take()
    aside: list[dict] = []
    if len(earlier) == 0 or assess(earlier, tolerance).beyond:
        return new, aside
    while len(aside) < retries:
        beyond = assess([*earlier, new], tolerance).beyond
        if not beyond:
            break
        aside.append(new)
        if on_retake is not None:
            on_retake(len(aside), beyond)
        new = take()
    return new, aside


def set_aside_record(number: int, when: str, aside: Sequence[dict]) -> dict:
    """What the manifest keeps of a pass taken again: its number (from 1), when it was due, and the totals (ms) of
    each attempt set aside."""
    return {
        "pass": number,
        "when": when,
        "set_aside_ms": [{k: round(1e3 * v, 6) for k, v in totals(a).items()} for a in aside],
    }


# ------------------------------------------------------------------------------------------------ reading
def check_passes(value: Any, where: str) -> list[dict]:
    """``value``, a measurement's calibration passes, checked as untrusted input: a list of mappings whose
    ``tables`` map table names (letters, digits, ``_``) to lists of points, each a list ending in a number of
    seconds >= 0 (``model`` aside). Else a ConfigError naming the file and the field."""
    if not isinstance(value, list):
        raise ConfigError(where, f"must hold a list of calibration passes, got {kind_of(value)}")
    if len(value) > MAX_PASSES:
        raise ConfigError(where, f"holds {len(value)} passes, more than {MAX_PASSES}")
    for i, cal in enumerate(value):
        tables = cal.get("tables") if isinstance(cal, dict) else None
        if not isinstance(tables, dict):
            raise ConfigError(f"{where}: [{i}].tables", f"must be a mapping of tables, got {show(tables)}")
        for name, points in tables.items():
            if name != "model":
                _check_table(name, points, f"{where}: [{i}].tables")
    return value


def _check_table(name: Any, points: Any, where: str) -> None:
    if not isinstance(name, str) or not _TABLE_NAME.fullmatch(name):
        raise ConfigError(where, f"a table name must be 1 to 64 letters, digits or _, got {show(name)}")
    if not isinstance(points, list) or len(points) > MAX_POINTS:
        raise ConfigError(f"{where}.{name}", f"must be a list of at most {MAX_POINTS} points, got {show(points)}")
    for j, p in enumerate(points):
        last = p[-1] if isinstance(p, list) and p else None
        if not _finite_nonneg(last):
            raise ConfigError(f"{where}.{name}[{j}]", f"must be a point ending in seconds >= 0, got {show(p)}")


def _finite_nonneg(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < 1e9


def measured_flag(manifest: dict, where: str) -> tuple[dict | None, tuple[dict, ...]]:
    """What ``validate measure`` recorded in the manifest (``steadiness``), checked: the record (None where there
    is none) and the passes it took again."""
    rec = manifest.get("steadiness")
    if rec is None:
        return None, ()
    if not isinstance(rec, dict):
        raise ConfigError(f"{where}: steadiness", f"must be a mapping, got {show(rec)}")
    steady, tol, retaken = rec.get("steady"), rec.get("tolerance_pct"), rec.get("retaken", [])
    if steady is not None and not isinstance(steady, bool):
        raise ConfigError(f"{where}: steadiness.steady", f"must be true, false or null, got {show(steady)}")
    if not _finite_nonneg(tol):
        raise ConfigError(f"{where}: steadiness.tolerance_pct", f"must be a percentage >= 0, got {show(tol)}")
    if not isinstance(retaken, list) or len(retaken) > MAX_PASSES:
        raise ConfigError(f"{where}: steadiness.retaken", f"must be a list of passes, got {show(retaken)}")
    for i, r in enumerate(retaken):
        number = r.get("pass") if isinstance(r, dict) else None
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= MAX_PASSES:
            raise ConfigError(f"{where}: steadiness.retaken[{i}].pass", f"must be a pass number, got {show(number)}")
    return {"steady": steady, "tolerance_pct": tol}, tuple({"pass": r["pass"]} for r in retaken)


def of_folder(folder: Path, manifest: dict, tolerance: float = TOLERANCE) -> Verdict:
    """The verdict of a measurement folder: computed from its calibration passes (``calibration-passes.json``,
    checked), with what ``validate measure`` recorded in ``manifest`` (checked; absent before this record); no
    passes: "not recorded"."""
    flag, retaken = measured_flag(manifest, str(folder / "manifest.json"))
    if find_file(folder, PASSES_FILE) is None:
        return Verdict(0, tolerance, (), retaken, flag)
    passes = check_passes(read_inside(folder, PASSES_FILE), str(folder / PASSES_FILE))
    return Verdict(len(passes), tolerance, tuple(drifts(passes)), retaken, flag)


# ------------------------------------------------------------------------------------------------ the report
def markdown_section(verdict: Verdict) -> list[str]:
    """The ``## Machine steadiness`` section of compare.md."""
    lines = ["## Machine steadiness", ""]
    if verdict.flag is not None:
        said = {True: "steady", False: "unsteady", None: "not measured"}[verdict.flag["steady"]]
        measured = (
            f"`validate measure` recorded it {said} (tolerance {verdict.flag['tolerance_pct']:g}%) and took "
            f"{len(verdict.retaken)} pass(es) again."
        )
    else:
        measured = "`validate measure` recorded no verdict (a measurement from before it did)."
    if not verdict.passes:
        return [*lines, "Not recorded: this measurement kept no calibration passes. " + measured, ""]
    if verdict.steady is None:
        return [
            *lines,
            f"Not measured: {verdict.passes} calibration pass(es), no table measured twice (measure with "
            f"`--rounds 2` or `--calibrate-between`). {measured}",
            "",
        ]
    over = f"Over {verdict.passes} calibration passes (`{PASSES_FILE}`; the calibration is their median): "
    if verdict.steady:
        lead = over + f"**steady**, every table within {100 * verdict.tolerance:g}% of its median."
    else:
        names = ", ".join(d.table for d in verdict.beyond)
        lead = (
            over + f"**unsteady**, {len(verdict.beyond)} table(s) beyond {100 * verdict.tolerance:g}% of their "
            f"median ({names}). The machine's speed moved during the measurement: part of the errors above may be "
            "its drift rather than the simulator's, in the configurations that spend their time on that work."
        )
    lines += [
        lead,
        "",
        "A table's total in a pass is the sum of its points' seconds; its drift, the largest |total / median - 1| "
        "over the passes. " + measured,
        "",
        "| table | what it times | passes | median ms | min ms | max ms | drift | |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    for d in verdict.drifts:
        lines.append(
            f"| {d.table} | {QUANTITIES.get(d.table, '-')} | {len(d.totals)} | {_ms(d.median)} | "
            f"{_ms(min(d.totals))} | {_ms(max(d.totals))} | {100 * d.deviation:.1f}% | "
            f"{'beyond' if d.deviation > verdict.tolerance else 'ok'} |"
        )
    return [*lines, ""]


__all__ = [
    "PASSES_FILE",
    "REMEASURE",
    "TOLERANCE",
    "Drift",
    "Verdict",
    "assess",
    "check_passes",
    "drifts",
    "markdown_section",
    "measured_flag",
    "of_folder",
    "remeasured",
    "set_aside_record",
    "totals",
]
