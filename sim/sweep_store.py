"""Where a sweep's results live: one Parquet row per point, ``OUT/rows/POINT.parquet``, written atomically as soon
as the point finishes, so an interrupted sweep keeps every finished row.

A row holds the point id, its status ("ok" or "failed"), the error of a failed point, the wall time, the number
of attempts (times the point was started: more than 1 when a worker died under it), the swept fields and the
metrics. Only "ok" rows count as done: ``--resume`` runs the missing and the failed points again, and a point
that runs again replaces its row.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

from sim.sweep_worker import METRIC_COLUMNS
from traces.io import atomic_write_bytes

if TYPE_CHECKING:
    from sim.sweep_spec import Point, Sweep

ROWS = "rows"
#: the temporary files that ``atomic_write_bytes`` leaves behind when killed mid-write, per folder
ORPHANS = {ROWS: (".*.parquet.*.tmp",),
           ".": (".results.parquet.*.tmp", ".report.md.*.tmp", ".*.png.*.tmp")}


def row_of(sweep: Sweep, point: Point, status: str, metrics: dict | None, error: str | None, wall: float,
           attempts: int = 1) -> dict:
    """The stored row of one finished (or given-up) point."""
    row = {"point": point.id, "status": status, "error": error, "wall_s": wall, "attempts": int(attempts)}
    row.update({k: _scalar(v) for k, v in point.fields.items()})
    row.update(metrics or {k: None for k in METRIC_COLUMNS})
    return row


def _scalar(v):
    return v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)


def write_row(out: Path, row: dict) -> None:
    """One point's row as ``OUT/rows/POINT.parquet``, atomically (replacing an earlier row of that point)."""
    import pandas as pd

    buf = io.BytesIO()
    pd.DataFrame([row]).to_parquet(buf, index=False)
    atomic_write_bytes(Path(out) / ROWS / f"{row['point']}.parquet", buf.getvalue())


def has_rows(out: Path) -> bool:
    """Whether ``OUT`` holds rows of an earlier sweep."""
    return any((Path(out) / ROWS).glob("*.parquet"))


def read_rows(out: Path):
    """Every stored row (a pandas DataFrame; empty when none)."""
    import pandas as pd

    files = sorted((Path(out) / ROWS).glob("*.parquet"))
    if not files:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def done_points(out: Path) -> tuple[set[str], set[str]]:
    """(ids of the points done, ids of the points that failed) among the stored rows."""
    df = read_rows(out)
    if not len(df):
        return set(), set()
    ok = df["status"] == "ok"
    return set(df.loc[ok, "point"]), set(df.loc[~ok, "point"])


def clean_orphans(out: Path) -> list[Path]:
    """Delete the temporary files of writes that a kill interrupted; returns them. (One sweep per folder at a
    time: a second sweep writing into ``OUT`` now would lose the write in progress.)"""
    removed = []
    for sub, patterns in ORPHANS.items():
        folder = Path(out) / sub
        for pattern in patterns:
            for f in folder.glob(pattern):
                if f.is_file():
                    f.unlink(missing_ok=True)
                    removed.append(f)
    return removed
