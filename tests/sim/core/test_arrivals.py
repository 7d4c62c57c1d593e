"""Arrival processes (sim/core/arrivals.py) against their laws: Poisson gaps of the asked rate and coefficient of
variation 1, exponentially distributed; gamma gaps of the asked rate and CV; times non-decreasing, reproducible by
seed. Tolerances come from the sample size (a few standard errors), never from a run's output."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.core.arrivals import arrival_times, gaps

N = 40_000  # gaps per sample: a standard error of about 0.5% on the mean
Z = 5.0  # standard errors a sample figure may stray (a false alarm about once in 3.5 million)


def _cv(x: np.ndarray) -> float:
    return float(x.std(ddof=1) / x.mean())


@pytest.mark.parametrize(("rate", "seed"), [(0.5, 0), (3.0, 1), (250.0, 7), (1e4, 12345)])
def test_poisson_gaps_have_the_rate_cv_1_and_the_exponential_law(rate, seed):
    g = gaps("poisson", N, rate, seed)
    mean = 1.0 / rate
    assert abs(g.mean() - mean) <= Z * mean / math.sqrt(N)  # the exponential's sd is its mean
    # the sample sd of an exponential (kurtosis 9) has a relative standard error of sqrt(2 / N)
    assert abs(_cv(g) - 1.0) <= Z * math.sqrt(2.0 / N)
    # the law itself: P(gap <= t) = 1 - exp(-rate t) at a few quantiles, each a binomial share
    for q in (0.1, 0.5, 0.9):
        t = -math.log(1 - q) / rate
        share = float((g <= t).mean())
        assert abs(share - q) <= Z * math.sqrt(q * (1 - q) / N)


@pytest.mark.parametrize(("rate", "cv", "seed"), [(2.0, 0.5, 0), (10.0, 2.0, 3), (1.0, 4.0, 9)])
def test_gamma_gaps_have_the_rate_and_the_cv(rate, cv, seed):
    g = gaps("gamma", N * 4, rate, seed, cv)
    n = g.size
    mean = 1.0 / rate
    assert abs(g.mean() - mean) <= Z * cv * mean / math.sqrt(n)
    shape = 1.0 / cv**2  # the sample sd's relative standard error: sqrt((2 + 6 / shape) / (4 n)) (excess kurtosis 6/k)
    assert abs(_cv(g) - cv) <= Z * cv * math.sqrt((2 + 6 / shape) / (4 * n)) + Z * cv / math.sqrt(n)


def test_a_cv_of_1_is_poissons_law_and_a_bigger_one_bursts():
    smooth, poisson, bursty = (_cv(gaps("gamma", N, 5.0, 4, cv)) for cv in (0.25, 1.0, 3.0))
    assert smooth < 0.5 < poisson < 1.5 < bursty


def test_times_are_the_cumulative_gaps_non_decreasing_and_reproducible():
    t = arrival_times("poisson", 1000, 4.0, seed=5)
    assert len(t) == 1000 and t[0] > 0
    assert all(b >= a for a, b in zip(t, t[1:]))
    assert np.allclose(np.diff([0.0, *t]), gaps("poisson", 1000, 4.0, 5))
    assert t == arrival_times("poisson", 1000, 4.0, seed=5)
    assert t != arrival_times("poisson", 1000, 4.0, seed=6)
    # the rate: n arrivals span about n / rate seconds
    assert abs(t[-1] - 1000 / 4.0) <= Z * math.sqrt(1000) / 4.0


def test_a_trace_gives_its_first_n_times_and_refuses_too_few():
    assert arrival_times("trace", 2, times=[0.0, 1.5, 2.0]) == [0.0, 1.5]
    with pytest.raises(ValueError, match="fewer than the 4 requests"):
        arrival_times("trace", 4, times=[0.0, 1.0])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("poisson", 3, 0.0, 0), "rate_per_s"),
        (("gamma", 3, 1.0, 0, None), "cv"),
        (("uniform", 3, 1.0, 0), "unknown arrival process"),
        (("poisson", -1, 1.0, 0), "n must be"),
    ],
)
def test_bad_arguments_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        gaps(*args)
