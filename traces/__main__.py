"""``python -m traces``: the trace tools' command line, handed the simulator's run-config maker (the one place the
trace tools meet the simulator: they import nothing of it)."""

import sys

from sim.config.trace_run import default_run_config
from traces.cli import main

sys.exit(main(make_run_config=default_run_config))
