"""When each request of a run arrives (``workload.arrivals``): the times of a Poisson or gamma process, or given
timestamps. Plain Python and numpy, no time of its own: the serving scheduler (``sim/core/serving.py``) reads the
times, the engine waits for them.

- ``poisson``: independent exponential gaps of mean ``1 / rate_per_s`` (coefficient of variation 1);
- ``gamma``: gamma gaps of the same mean and coefficient of variation ``cv`` (shape ``1 / cv^2``, scale
  ``cv^2 / rate_per_s``): ``cv`` > 1 gives bursts, < 1 a more regular stream, 1 is Poisson's law;
- ``trace``: the timestamps of a file (read by ``sim.config.serving.read_arrival_times``), the first at 0.

A process's first request arrives one gap after 0; the times are a cumulative sum of the gaps, drawn from
``numpy.random.default_rng(seed)``, so a seed gives the same times on every machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["arrival_times", "gaps"]


def gaps(process: str, n: int, rate_per_s: float, seed: int, cv: float | None = None) -> np.ndarray:
    """``n`` gaps (s) between arrivals of a ``poisson`` or ``gamma`` process."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    rng = np.random.default_rng(seed)
    if process == "poisson":
        return rng.exponential(1.0 / rate_per_s, n)
    if process == "gamma":
        if cv is None or not cv > 0:
            raise ValueError(f"a gamma process needs cv > 0, got {cv}")
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, 1.0 / (shape * rate_per_s), n)
    raise ValueError(f"unknown arrival process {process!r} (poisson, gamma)")


def arrival_times(
    process: str,
    n: int,
    rate_per_s: float | None = None,
    seed: int = 0,
    cv: float | None = None,
    times: Sequence[float] | None = None,
) -> list[float]:
    """The arrival times (s) of ``n`` requests, non-decreasing: a process's (``rate_per_s``, ``seed``, ``cv``), or
    the first ``n`` of ``times`` (``trace``; ValueError when it holds fewer)."""
    if process == "trace":
        if times is None or len(times) < n:
            have = 0 if times is None else len(times)
            raise ValueError(f"the arrivals file holds {have} timestamps, fewer than the {n} requests served")
        return [float(t) for t in times[:n]]
    assert rate_per_s is not None, "a process has a rate"
    return np.cumsum(gaps(process, n, rate_per_s, seed, cv)).tolist()
