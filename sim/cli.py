"""`python -m sim run CONFIG [--set key.path=value ...] [--out DIR] [--timeline] [--json]` and
`python -m sim compare CONFIG --policies a,b,c [--baseline NAME]` (see ``sim/compare.py``) and
`python -m sim fit-system --measured CSV --system NAME --hardware HW --out FILE.yaml` (see ``sim/fit_system.py``),
`python -m sim sweep SWEEP.yaml` (see ``sim/sweep/cli.py``; the sweep file: docs/sweeps.md),
`python -m sim advise CONFIG` (the best policy, cache split and batch for a machine: ``sim/advise.py``),
`python -m sim capacity CONFIG` (the request rate served within an SLO: ``sim/capacity.py``; docs/serving.md),
`python -m sim bench CONFIG -p 512 -n 128 -d 0,32768` (pp and tg tokens/s at KV depths, as llama-bench prints them:
``sim/bench.py``; docs/phases.md),
`python -m sim policies [--json]`, the registered policies and predictors (see ``sim/listing.py``), and
`python -m sim hardware list|show NAME`, the bundled machines and parts (see ``sim/hardware_cli.py``).

Exit status 0 on success, 2 on bad input (config, trace, arguments) with one line naming the field or file,
1 on an internal error. Nothing is written to ``--out`` unless the config is valid, and ``--out`` (with each file
the run writes there) is checked first: a FIFO, a device or a regular file where the folder goes is refused.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from sim.listing import SEE_POLICIES
from traces.cli import OneLineParser, run_main
from traces.io import check_output_file, check_output_folder


def _progress_printer():
    """Progress on stderr for long runs when it is a terminal."""
    if not sys.stderr.isatty():
        return None
    state = {"last": 0}

    def show(done: int, total: int) -> None:
        pct = done * 100 // total
        if pct != state["last"] or done == total:
            state["last"] = pct
            print(
                f"\r  simulating: {done}/{total} iterations ({pct}%)",
                end="" if done < total else "\n",
                file=sys.stderr,
                flush=True,
            )

    return show


def cmd_run(args) -> int:
    from sim.config.run_config import load_run_config
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS
    from sim.results import format_summary, write_outputs
    from sim.run import simulate

    if args.out is not None:
        check_output_folder(args.out, "results folder (--out)")
    cfg = load_run_config(args.config, args.set or [], POLICIES.names(), PREDICTORS.names())
    out = Path(args.out) if args.out is not None else default_out(args.config)
    check_outputs(out, args.timeline, [args.config], requests=cfg.workload.arrivals is not None)
    result = simulate(cfg, timeline=args.timeline, progress=None if args.json else _progress_printer())
    res = result.engine
    written = write_outputs(out, result.resolved, result.summary, res.iterations, res.timeline, res.requests)
    if args.json:
        print(json.dumps(result.summary, indent=1))
    else:
        print(format_summary(result.summary, cfg))
        print(f"  results           {out}/ ({', '.join(p.name for p in written)})")
    return 0


def default_out(config: str) -> Path:
    """``runs/CONFIG-TIMESTAMP``, CONFIG the config file's name made plain, so the folder stays inside ``runs/``
    whatever the file is called."""
    from sim.sweep.spec import safe_name

    return Path("runs") / f"{safe_name(Path(str(config)).stem, 'run')[:80]}-{dt.datetime.now():%Y%m%d-%H%M%S}"


def check_outputs(out: Path, timeline: bool, inputs: Iterable[str] = (), requests: bool = False) -> None:
    """The results folder and each file a run writes there, checked before the run: a FIFO, a device, a file
    where the folder goes or a folder where a file goes, or a file the run reads (its config, a profile, the
    trace), is refused (exit 2), and nothing is written."""
    from moebase.outputs import check_not_input
    from sim.results import output_files

    check_output_folder(out, "results folder (--out)")
    for name in output_files(timeline, requests):
        check_output_file(out / name, "run result")
        check_not_input(out / name, inputs)


EPILOG = """See python -m sim policies for every registered policy and predictor (name, origin, default
predictor, what it does): the names policy.name, predictor.name and sim compare --policies take.
The sweep file's keys: docs/sweeps.md (or python -m sim sweep --help).
COMMAND --help says more. Exit status: 0 ok, 2 bad input (one line naming the field or file), 1 internal error."""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m sim",
        description="Simulator of offloaded MoE inference.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "run",
        help="simulate one run config",
        epilog=SEE_POLICIES,
        description="Simulate one run config: a table on the terminal (or --json) and the result files in --out.",
    )
    p.add_argument("config", help="run config (YAML), e.g. configs/switch_xxl.yaml")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY.PATH=VALUE",
        help="override a config field (repeatable), e.g. policy.name=lru",
    )
    p.add_argument("--out", help="results folder (default: runs/CONFIG-TIMESTAMP)")
    p.add_argument("--timeline", action="store_true", help="also write timeline.json (Chrome trace, opens in Perfetto)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of the table")
    p.set_defaults(func=cmd_run)
    from sim import advise, bench, capacity, compare, fit_system, hardware_cli, listing
    from sim.sweep import cli as sweep

    compare.register(sub)
    _point_to_policies(sub.choices["compare"])
    sweep.register(sub)
    fit_system.register(sub)
    advise.register(sub)
    capacity.register(sub)
    bench.register(sub)
    listing.register(sub)
    hardware_cli.register(sub)
    return parser


def _point_to_policies(parser: argparse.ArgumentParser) -> None:
    """Add the pointer to ``python -m sim policies`` to a sub-command's epilog (``sim compare`` is registered by
    its own module), unless its epilog already names the listing."""
    if "sim policies" not in (parser.epilog or ""):
        parser.epilog = f"{parser.epilog}\n\n{SEE_POLICIES}" if parser.epilog else SEE_POLICIES


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv)
