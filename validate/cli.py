"""`python -m validate`: measure a machine and check the simulator against it.

- ``microbench``: microbenchmarks only, into a calibration profile ``sim run`` reads (``hardware: FILE``);
- ``gpu`` / ``cpu``: microbenchmarks, then the executor (the simulator's policies run for real with torch) over a
  set of configurations, into a measurement folder;
- ``compare DIR``: calibrate the simulator from the folder's microbenchmarks, simulate the same configurations,
  and report the error per configuration (CSV, Markdown, PNG), and whether the machine stayed steady over the
  calibration passes (``validate.steadiness``).

``compare`` exits 0, or 1 when ``--max-median-error`` is exceeded or a decision differs, or 3 with ``--strict`` when
the machine was unsteady (and nothing else failed); bad input exits 2.
"""

from __future__ import annotations

import argparse
import sys

from traces.cli import OneLineParser, run_main
from validate.steadiness import REMEASURE, TOLERANCE


def cmd_microbench(args) -> int:
    from moebase.errors import ConfigError
    from moebase.model import load_model
    from sim.config.hardware import load_hardware
    from traces.io import check_output_file
    from validate.backends import make_backend
    from validate.kernels import check_runnable
    from validate.microbench import calibrate, write_calibration

    check_output_file(args.out, "calibration file (--out)")
    model = load_model(args.model, "--model")
    check_runnable(model, "--model")
    load_hardware(args.hardware, "--hardware")  # the base must exist
    try:
        backend = make_backend(args.device, args.threads)
    except ValueError as exc:
        raise ConfigError("--device", str(exc)) from None
    cal = calibrate(
        model, args.hardware, quick=args.quick, repeat=args.repeat, backend=backend, host_threads=args.host_threads
    )
    path = write_calibration(args.out, cal)
    t = cal["tables"]
    print(
        f"wrote {path}: {len(t['copy'])} copy, {len(t['d2d'])} d2d, {len(t['expert'])} expert, "
        f"{len(t['dense'])} dense, {len(t['lm_head'])} lm_head and {len(t['cpu_expert'])} cpu_expert "
        f"({cal['cpu_cores']} host thread(s)) points for {model.name} on {cal['source'].split(' on ', 1)[1]}"
    )
    print(f"use it with: python -m sim run CONFIG --set hardware={path}")
    return 0


def cmd_measure(args) -> int:
    from validate.measure import measure

    device = args.device or ("cuda" if args.command == "gpu" else "cpu")
    measure(
        args.command if not args.suite else args.suite,
        args.out,
        device,
        quick=args.quick,
        only=args.configs.split(",") if args.configs else None,
        repeat=args.repeat,
        threads=args.threads,
        resume=args.resume,
        host_pool_gb=args.host_pool_gb,
        rounds=args.rounds,
        calibrate_between=args.calibrate_between,
        host_threads=args.host_threads,
        drift_tolerance=args.drift_tolerance / 100,
        remeasure=args.remeasure,
    )
    return 0


#: ``validate compare --strict``'s exit status when the machine was unsteady (1: a check failed; 2: bad input).
UNSTEADY_EXIT = 3


def cmd_compare(args) -> int:
    from validate.compare import compare_measurement, median_abs

    rows, _, verdict = compare_measurement(args.folder, args.out, tolerance=args.drift_tolerance / 100)
    if args.max_median_error is not None:
        worst = median_abs(rows, "err_mean_pct")
        if worst > args.max_median_error:
            print(
                f"FAIL: median |error| of mean latency {worst:.1f}% is above --max-median-error "
                f"{args.max_median_error:g}%"
            )
            return 1
    if not all(r["decisions_identical"] for r in rows):
        print(
            "FAIL: the simulator and the executor made different decisions for: "
            + ", ".join(r["config"] for r in rows if not r["decisions_identical"])
        )
        return 1
    if args.strict and verdict.steady is False:
        print(
            f"FAIL (--strict): the machine was unsteady: {len(verdict.beyond)} calibration table(s) beyond "
            f"{args.drift_tolerance:g}% of their median"
        )
        return UNSTEADY_EXIT
    return 0


def _count(text: str) -> int:
    """An integer >= 0."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text[:40]!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {v}")
    return v


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _percent(text: str) -> float:
    """A finite percentage >= 0 (NaN would make every comparison with it pass)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number (a percentage), got {text[:40]!r}") from None
    if not (0 <= v < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite percentage >= 0, got {text[:40]!r}")
    return v


DRIFT_HELP = (
    "a calibration table whose total in some pass is more than PCT%% from the median of the passes marks the "
    f'machine unsteady (default {100 * TOLERANCE:g}; docs/validation/README.md, "Machine steadiness")'
)

HOST_THREADS_HELP = (
    "worker threads computing experts on the host CPU (hybrid policies; the cpu_expert table): "
    "default the cores left beside the compute and copy threads"
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m validate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("microbench", help="measure copies, expert FFNs and dense work; write a calibration file")
    p.add_argument("--model", required=True, help="model profile whose expert and dense shapes to measure")
    p.add_argument("--hardware", default="h200", help="hardware profile the calibration extends (default h200)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--out", required=True, help="calibration file to write (YAML)")
    p.add_argument("--quick", action="store_true", help="fewer points (for CI and smoke tests)")
    p.add_argument("--repeat", type=_positive_int, default=5, help="timed runs per point, median kept (default 5)")
    p.add_argument("--threads", type=_positive_int, default=1, help="torch threads on the CPU (default 1)")
    p.add_argument("--host-threads", type=_positive_int, default=None, help=HOST_THREADS_HELP)
    p.set_defaults(func=cmd_microbench)
    for name, what in (
        ("gpu", "on a CUDA GPU: Switch-XXL experts over PCIe"),
        ("cpu", "with the CPU as the device (a copy thread moves experts)"),
    ):
        p = sub.add_parser(name, help=f"calibrate, then run the executor over a set of configurations {what}")
        p.add_argument("--out", required=True, help="measurement folder to write (compare reads it)")
        p.add_argument("--quick", action="store_true", help="6 configurations, 4 decode steps each")
        p.add_argument("--configs", help="comma-separated configuration names to measure (default: all)")
        p.add_argument("--device", help=f"device (default {'cuda' if name == 'gpu' else 'cpu'})")
        p.add_argument("--suite", choices=("cpu", "gpu"), help=f"configuration set (default {name})")
        p.add_argument("--repeat", type=_positive_int, default=5, help="microbenchmark runs per point (default 5)")
        p.add_argument(
            "--threads",
            type=_positive_int,
            default=1,
            help="torch compute threads in CPU mode (default 1; the copy thread takes another core)",
        )
        p.add_argument(
            "--host-pool-gb",
            type=float,
            default=None,
            help="host memory for expert weights (default 8 on a GPU, 2 on the CPU); experts beyond it "
            "share physical buffers. At most what the host can spare (3/4 of its memory, 8 GiB "
            "less than is free), counting pinned buffers at their power-of-two size",
        )
        p.add_argument(
            "--rounds",
            type=_positive_int,
            default=1 if name == "gpu" else 2,
            help=f"runs of every configuration, interleaved (default {1 if name == 'gpu' else 2})",
        )
        p.add_argument(
            "--calibrate-between",
            action=argparse.BooleanOptionalAction,
            default=name == "cpu",
            help="a light calibration pass (tables only) after every configuration run "
            f"(default {'on' if name == 'cpu' else 'off'})",
        )
        p.add_argument("--host-threads", type=_positive_int, default=None, help=HOST_THREADS_HELP)
        p.add_argument("--drift-tolerance", type=_percent, default=100 * TOLERANCE, metavar="PCT", help=DRIFT_HELP)
        p.add_argument(
            "--remeasure",
            type=_count,
            default=REMEASURE,
            metavar="N",
            help="take a calibration pass again up to N times when it alone puts the passes beyond "
            f"--drift-tolerance (default {REMEASURE}; 0: never); the verdict goes into manifest.json",
        )
        p.add_argument("--resume", action="store_true", help="keep finished rounds in --out")
        p.set_defaults(func=cmd_measure)
    p = sub.add_parser("compare", help="simulate the measured configurations and report the simulator's error")
    p.add_argument(
        "folder",
        help="measurement folder from validate gpu|cpu, or the archive run_gpu_check.sh packs "
        "(gpu-check.tar.gz: unpacked beside itself)",
    )
    p.add_argument("--out", help="where to write compare.{csv,md,png} (default FOLDER/compare)")
    p.add_argument(
        "--max-median-error",
        type=_percent,
        default=None,
        help="exit 1 when the median |error| of mean latency (%%) is above this",
    )
    p.add_argument("--drift-tolerance", type=_percent, default=100 * TOLERANCE, metavar="PCT", help=DRIFT_HELP)
    p.add_argument(
        "--strict",
        action="store_true",
        help=f"exit {UNSTEADY_EXIT} when the machine was unsteady (default: a warning on stderr, "
        "a section in compare.md, exit 0)",
    )
    p.set_defaults(func=cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    # progress must reach a pipe line by line: a run cut off by a time limit keeps what it printed
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    return run_main(build_parser(), argv)
