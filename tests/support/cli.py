"""Commands run in-process (with a watchdog) or as ``python -m`` subprocesses from the repository root."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
import warnings

from sim.config.trace_run import default_run_config
from tests.support.paths import ROOT
from traces.cli import main


def traces_main(argv: list[str] | None = None) -> int:
    """``python -m traces ARGV`` in-process, as its entry point runs it (with the simulator's run-config maker)."""
    return main(argv, make_run_config=default_run_config)


def run_traces(*argv, timeout: float = 60.0) -> tuple[int, str, str, list]:
    """``python -m traces ARGV`` in-process: (exit status, stdout, stderr, warnings raised). Run in a thread, so
    that a hang fails the test instead of blocking it."""
    result: dict = {}

    def target():
        out, err = io.StringIO(), io.StringIO()
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            try:
                code = traces_main([str(a) for a in argv])
            except SystemExit as exc:  # argparse
                code = exc.code
        result.update(
            code=code,
            out=out.getvalue(),
            err=err.getvalue(),
            warnings=[f"{w.category.__name__}: {w.message}" for w in caught],
        )

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"traces {' '.join(map(str, argv))[:200]} hangs"
    assert "code" in result, "the command raised (see the thread's traceback above)"
    return result["code"], result["out"], result["err"], result["warnings"]


def run_module(module: str, *args, cwd=ROOT, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in a subprocess from the repository root, output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def sweep_process(*args, delay: float = 0) -> subprocess.Popen:
    """``python -m sim sweep ARGS --quiet`` started in the background (stderr piped, as text), without the test
    hooks of the calling environment; ``delay`` makes each point sit that many seconds (``SIM_SWEEP_TEST_DELAY``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIM_SWEEP_TEST_")}
    if delay:
        env["SIM_SWEEP_TEST_DELAY"] = str(delay)
    return subprocess.Popen(
        [sys.executable, "-m", "sim", "sweep", *map(str, args), "--quiet"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
