"""The simulator against published measurements of real offloading systems (``benchmarks/published/rows.csv``, the
columns of ``benchmarks/published/SCHEMA.md``): every column of a row is read and becomes a setting of its run config
(``sim/row_settings.py``), or the capability the simulator lacks, by name; such a row is a miss, never
approximated. Each system's software constant is fitted on the expressible ``fit`` rows only, every expressible row
predicted blind. Prints the per-row table, the fitted constants, predict rows predicted / total, decode median and
90th percentile |error|, prefill median |error|, and the misses grouped by capability.

    python benchmarks/published_systems.py [--rows ROWS.csv] [--json OUT.json]

The results and what they assume: ``docs/published_systems.md``. ``--json`` writes ``{"rows": [{"row", "role",
"predicted_tok_s", "published_tok_s", "error", "missing", ...}], "fits": {...}, "summary": {...}}``. A bad rows
file exits 2 naming the file, the row and the problem.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moebase.outputs import check_not_input  # noqa: E402
from sim.published import evaluate, format_report, read_published  # noqa: E402
from traces.cli import OneLineParser, run_main  # noqa: E402
from traces.io import atomic_write_bytes, check_output_file  # noqa: E402

#: The published rows shipped with the project (their sources: benchmarks/published/README.md).
DEFAULT_ROWS = Path(__file__).resolve().parent / "published" / "rows.csv"


def report(rows_path: str, json_out: str | None) -> int:
    if json_out is not None:
        check_output_file(json_out, "results file (--json)")
        check_not_input(json_out, [rows_path], "--json")
    ev = evaluate(read_published(rows_path))
    print(format_report(ev))
    if json_out is not None:
        out = {
            "rows": ev["rows"],
            "fits": {
                name: {
                    "key": f.key,
                    "value": f.value,
                    "per_gpu": f.per_gpu,
                    "rows": list(f.rows),
                    "rows_by_gpu": {k: list(v) for k, v in f.rows_by_gpu.items()},
                    "extra": {k: {"value": v, "rows": list(f.extra_rows[k])} for k, v in f.extra.items()},
                }
                for name, f in ev["fits"].items()
            },
            "summary": ev["summary"],
        }
        atomic_write_bytes(json_out, (json.dumps(out, indent=1) + "\n").encode())
        print(f"wrote {json_out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="benchmarks/published_systems.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows",
        default=str(DEFAULT_ROWS),
        help="the rows file (CSV, schema v2; default: benchmarks/published/rows.csv, the published rows with sources)",
    )
    parser.add_argument("--json", help="also write the results as JSON here")
    parser.set_defaults(func=lambda a: report(a.rows, a.json))
    return run_main(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
