"""`python -m validate microbench`: measure this machine and write a calibration profile for the simulator.

(The executor and the sim-vs-real comparison, `python -m validate gpu|cpu|compare`, are not built yet.)
"""

from __future__ import annotations

import argparse

from traces.cli import run_main


def cmd_microbench(args) -> int:
    from sim.errors import ConfigError
    from sim.specs import load_hardware, load_model
    from validate.microbench import calibrate, write_calibration

    model = load_model(args.model, "--model")
    load_hardware(args.hardware, "--hardware")  # the base must exist
    device = args.device
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device", "CUDA is not available on this machine (use --device cpu)")
    cal = calibrate(model, args.hardware, device, quick=args.quick, repeat=args.repeat)
    path = write_calibration(args.out, cal)
    t = cal["tables"]
    print(f"wrote {path}: {len(t['copy'])} copy, {len(t['d2d'])} d2d, {len(t['expert'])} expert and "
          f"{len(t['dense'])} dense points for {model.name} on {cal['source'].split(' on ', 1)[1]}")
    print(f"use it with: python -m sim run CONFIG --set hardware={path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m validate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("microbench", help="measure copies, expert FFNs and dense work; write a calibration file")
    p.add_argument("--model", required=True, help="model profile whose expert and dense shapes to measure")
    p.add_argument("--hardware", default="h200", help="hardware profile the calibration extends (default h200)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--out", required=True, help="calibration file to write (YAML)")
    p.add_argument("--quick", action="store_true", help="fewer points (for CI and smoke tests)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per point, median kept (default 5)")
    p.set_defaults(func=cmd_microbench)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv)
