"""``python -m traces``: the trace tools' command line, handed the simulator's run-config maker (the one place the
trace tools meet the simulator: they import nothing of it). The simulator is imported only when a command writes a
run config, so that the other commands start without it."""

import sys

from traces.cli import main


def default_run_config(*args) -> dict:
    """The simulator's run config for a trace (:func:`sim.config.trace_run.default_run_config`)."""
    from sim.config.trace_run import default_run_config as make

    return make(*args)


sys.exit(main(make_run_config=default_run_config))
