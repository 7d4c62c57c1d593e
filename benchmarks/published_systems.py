"""The simulator against published measurements of real offloading systems: fit each system's software constant on
the rows whose role is ``fit`` (and only on those), predict every row, print simulated against published tokens/s
with the error per row, fitted rows marked, and the median and max |error| over the predicted rows.

    python benchmarks/published_systems.py [--rows ROWS.csv] [--json OUT.json]

The rows file's columns, the systems and what each fits: ``sim/fit_system.py``; the results and what they assume:
``docs/published_systems.md``. ``--json`` writes ``{"rows": [{"row", "role", "predicted_tok_s", "published_tok_s",
...}], "fits": {...}, "predicted": {...}}``. A bad rows file exits 2 naming the file, the row and the problem.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.fit_system import fit_and_predict, format_fits, format_table, read_rows, summary_of  # noqa: E402
from traces.cli import OneLineParser, run_main  # noqa: E402
from traces.io import atomic_write_bytes, check_output_file  # noqa: E402
from traces.outputs import check_not_input  # noqa: E402

#: The published rows shipped with the project (their sources: benchmarks/published/README.md).
DEFAULT_ROWS = Path(__file__).resolve().parent / "published" / "rows.csv"


def report(rows_path: str, json_out: str | None) -> int:
    if json_out is not None:
        check_output_file(json_out, "results file (--json)")
        check_not_input(json_out, [rows_path], "--json")
    rows = read_rows(rows_path)
    fits, results = fit_and_predict(rows)
    print(format_table(results))
    print()
    print("Fitted constants:")
    print(format_fits(fits))
    s = summary_of(results, "predict")
    if s["rows"]:
        print(
            f"\npredicted rows with a published value: {s['rows']}; median |error| "
            f"{100 * s['median_abs_error']:.1f}%, max |error| {100 * s['max_abs_error']:.1f}%"
        )
    if json_out is not None:
        out = {
            "rows": [
                {
                    k: r[k]
                    for k in (
                        "row",
                        "role",
                        "system",
                        "hardware",
                        "predicted_tok_s",
                        "published_tok_s",
                        "error",
                        "constants",
                        "problem",
                    )
                }
                for r in results
            ],
            "fits": {
                name: {
                    "key": f.key,
                    "value": f.value,
                    "per_gpu": f.per_gpu,
                    "rows": list(f.rows),
                    "rows_by_gpu": {k: list(v) for k, v in f.rows_by_gpu.items()},
                }
                for name, f in fits.items()
            },
            "predicted": s,
        }
        atomic_write_bytes(json_out, (json.dumps(out, indent=1) + "\n").encode())
        print(f"wrote {json_out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="benchmarks/published_systems.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows",
        default=str(DEFAULT_ROWS),
        help="the rows file (CSV; default: benchmarks/published/rows.csv, the published rows with their sources)",
    )
    parser.add_argument("--json", help="also write the results as JSON here")
    parser.set_defaults(func=lambda a: report(a.rows, a.json))
    return run_main(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
