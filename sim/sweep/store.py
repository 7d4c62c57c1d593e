"""Where a sweep's results live: one Parquet row per point, ``OUT/rows/POINT.parquet``, written atomically as soon
as the point finishes, so an interrupted sweep keeps every finished row.

A row holds the point id, its status ("ok", "does not fit" or "failed"), the error of a failed point (or, for one
that does not fit in the GPU's memory, ``does not fit (X GB > Y GB): `` and the memory table), the wall time, the
number of attempts (times the point was started: more than 1 when a worker died under it), the swept fields and the
metrics (none for a point not run). "ok" and "does not fit" rows count as done (``sim.sweep.worker.DONE``):
``--resume`` runs the missing and the failed points again, and a point that runs again replaces its row.
"""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from moebase.errors import ConfigError
from sim.sweep.worker import DONE, METRIC_COLUMNS
from traces.io import atomic_write_bytes

if TYPE_CHECKING:
    from sim.sweep.spec import Point, Sweep

ROWS = "rows"
#: the temporary files that ``atomic_write_bytes`` leaves behind when killed mid-write, per folder
ORPHANS = {ROWS: (".*.parquet.*.tmp",), ".": (".results.parquet.*.tmp", ".report.md.*.tmp", ".*.png.*.tmp")}
MAX_ROW_BYTES = 16 << 20  # a row is a few KB: a bigger file in rows/ was not written by a sweep


def row_of(
    sweep: Sweep, point: Point, status: str, metrics: dict | None, error: str | None, wall: float, attempts: int = 1
) -> dict:
    """The stored row of one finished (or given-up) point."""
    row = {"point": point.id, "status": status, "error": error, "wall_s": wall, "attempts": int(attempts)}
    row.update({k: _scalar(v) for k, v in point.fields.items()})
    row.update(metrics or {k: None for k in METRIC_COLUMNS})
    return row


def _scalar(v):
    return v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)


def row_file(out: Path, point: str) -> Path:
    """``OUT/rows/POINT.parquet``; the point id (a hash) is a plain name, so the file stays in the rows folder."""
    from sim.sweep.spec import is_safe_name

    if not is_safe_name(point):
        raise ValueError(f"a sweep point id must be a plain name, got {str(point)[:80]!r}")
    return Path(out) / ROWS / f"{point}.parquet"


def write_row(out: Path, row: dict) -> None:
    """One point's row as ``OUT/rows/POINT.parquet``, atomically (replacing an earlier row of that point), at once:
    a sweep that fails later keeps its finished rows for ``--resume``."""
    import pandas as pd

    path = row_file(out, row["point"])
    buf = io.BytesIO()
    pd.DataFrame([row]).to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue(), at_once=True)


def has_rows(out: Path) -> bool:
    """Whether ``OUT`` holds rows of an earlier sweep."""
    return any((Path(out) / ROWS).glob("*.parquet"))


def row_files(out: Path) -> list[Path]:
    """The row files in ``OUT/rows``: each a regular file of bounded size (a link, a folder, a FIFO or a device
    named like a row, or a huge file, is refused with a ConfigError: the sweep never wrote it)."""
    files = []
    for f in sorted((Path(out) / ROWS).glob("*.parquet")):
        try:
            st = os.lstat(f)
        except OSError:
            continue  # gone meanwhile
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(
                str(f),
                "is not a row file written by a sweep (a link, a folder, a FIFO or a device): "
                "remove it, or use another --out",
            )
        if st.st_size > MAX_ROW_BYTES:
            raise ConfigError(
                str(f),
                f"is larger than {MAX_ROW_BYTES >> 20} MB: not a row written by a sweep; "
                f"remove it, or use another --out",
            )
        files.append(f)
    return files


def _read_row(path: Path):
    import pandas as pd

    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged or foreign file
        raise ConfigError(
            str(path), f"cannot be read as a sweep row ({type(exc).__name__}): remove it and run again with --resume"
        ) from None
    if "point" not in df or "status" not in df:
        raise ConfigError(str(path), "is not a sweep row (no point or status column): remove it, or use another --out")
    return df


def read_rows(out: Path):
    """Every stored row (a pandas DataFrame; empty when none). A file in the rows folder that is not a row the
    sweep wrote is a ConfigError naming it."""
    import pandas as pd

    files = row_files(out)
    if not files:
        return pd.DataFrame()
    return pd.concat([_read_row(f) for f in files], ignore_index=True)


def check_rows(out: Path) -> None:
    """Before a sweep starts: no file in the rows folder that the sweep could not have written (see
    :func:`row_files`); ``--resume`` then reads each row, and a damaged one is refused before anything runs."""
    if (Path(out) / ROWS).is_dir():
        row_files(out)


def done_points(out: Path) -> tuple[set[str], set[str]]:
    """(ids of the points done, ids of the points that failed) among the stored rows."""
    df = read_rows(out)
    if not len(df):
        return set(), set()
    ok = df["status"].isin(DONE)
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
