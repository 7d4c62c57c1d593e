"""The published rows with the systems' switches wired (issue 32 item 4): runs ``benchmarks/published_systems.py``'s
evaluation after laying over ``sim/config/row_settings.py`` the columns this item's settings express, so that the
profiles' constants are fitted on their ``fit`` rows before the table itself maps them:

- ``rtr=on|off`` -> ``system.rtr``; ``fmoe=on|off`` -> ``system.fmoe`` (sim/config/switches.py);
- ``deferral=N`` -> ``system.deferral`` (sim/timing/engine.py);
- ``dynamic_sched=on`` -> nothing (one host call per layer over all threads: the balance it aims at);
- ``cuda_graph=on`` -> nothing (the GPU's work is priced without launch costs, as one graph per step);
- ``system_version=sosp25-ae`` of ``ktransformers`` -> the ``ktransformers-sosp25`` profile, fitted on its own rows.

    python benchmarks/fit_systems_rows.py [--rows ROWS.csv]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sim.published as published  # noqa: E402
from sim.config import row_settings as rs  # noqa: E402

SWITCH = {"on": True, "off": False}


def wire() -> None:
    """Lay this item's settings over the rows table (in this process only)."""
    rs.OPTIONS["rtr"] = {v: rs.Setting(system={"rtr": b}) for v, b in SWITCH.items()}
    rs.OPTIONS["fmoe"] = {v: rs.Setting(system={"fmoe": b}) for v, b in SWITCH.items()}
    rs.OPTIONS["deferral"] = lambda v, c: rs.Setting(system={"deferral": rs._int(v)})
    rs.OPTIONS["cuda_graph"] = {"on": rs.NOTHING, "off": rs.missing("cuda_graph=off (kernel launch costs)")}
    # the host's experts are one call per layer over all its threads, the balance dynamic scheduling aims at
    rs.OPTIONS["dynamic_sched"] = {"on": rs.NOTHING, "off": rs.NOTHING}
    rs.VERSIONS.pop(("ktransformers", r"sosp25-ae"), None)
    plan_of = rs.plan_of

    def plan(cells, systems):
        p = plan_of(cells, systems)
        if cells["system"] == "ktransformers" and cells["system_version"] == "sosp25-ae":
            p.system = "ktransformers-sosp25"
        return p

    published.plan_of = plan


if __name__ == "__main__":
    wire()
    from benchmarks.published_systems import main

    sys.exit(main())
