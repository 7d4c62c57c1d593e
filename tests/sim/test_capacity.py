"""`sim capacity` (sim/capacity.py): the search finds the threshold of any monotone verdict within its tolerance;
on a small fast config the capacity it finds holds (a run at 0.9x that rate with another seed meets the SLO, one at
1.25x does not, each simulated here on its own); the command writes its JSON and plot together, and bad arguments
are one line and exit 2."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.capacity import MAX_RATE, MIN_RATE, Point, find_capacity, parse_seeds, parse_slo, search, summary_text
from sim.cli import main
from sim.config.run_config import load_run_config
from sim.run import simulate
from tests.support.configs import serving_config
from tests.support.fuzz import fuzz_settings

SLO = {"ttft_s": 0.012, "tpot_s": None}
TARGET = 0.9
REQUESTS = 300  # enough for the queue to build near the capacity (with fewer, a run's arrivals decide too much)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> str:
    """A small fast config (tests.support.configs.serving_config)."""
    return serving_config(tmp_path_factory.mktemp("capacity"))


def _attainment(config: str, rate: float, seed: int, requests: int) -> float:
    cfg = load_run_config(
        config,
        [
            f"workload.arrivals={{process: poisson, rate_per_s: {rate!r}, seed: {seed}}}",
            "workload.slo={ttft_s: 0.012}",
            f"workload.requests={requests}",
        ],
    )
    return simulate(cfg).summary["slo_attainment"]


def test_the_capacity_found_holds_at_0_9x_and_not_at_1_25x_with_another_seed(config):
    doc = find_capacity(config, [], SLO, TARGET, requests=REQUESTS, seeds=[0, 1])
    rate = doc["max_rate_per_s"]
    assert doc["bounded"] and 0 < rate <= 1.1 * doc["saturation_req_s"] and not doc["above_saturation"]
    assert doc["requests"] == REQUESTS and doc["seeds"] == [0, 1]
    for seed in (7, 8):  # seeds the search did not use
        assert _attainment(config, 0.9 * rate, seed, REQUESTS) >= TARGET
        assert _attainment(config, 1.25 * rate, seed, REQUESTS) < TARGET
    assert doc["check"]["holds"] and doc["check"]["seed"] == 2
    # the points: the answer met, the next rate above it failed, within the tolerance
    points = {p["rate_per_s"]: p for p in doc["points"]}
    assert points[rate]["meets"] and min(points[rate]["attainments"]) >= TARGET
    above = min(r for r, p in points.items() if r > rate)
    assert not points[above]["meets"] and above - rate <= doc["tolerance"] * rate
    assert all(p["meets"] == (min(p["attainments"]) >= TARGET) for p in doc["points"])


@fuzz_settings(80)
@given(
    threshold=st.floats(1e-3, 1e5),
    start=st.floats(1e-3, 1e5),
    tolerance=st.sampled_from([0.5, 0.1, 0.02, 0.001]),
)
def test_the_search_finds_a_monotone_threshold_within_the_tolerance(threshold, start, tolerance):
    asked = []

    def evaluate(rate):
        asked.append(rate)
        return Point(rate, [], 0.0, None, None, None, None, rate <= threshold)

    rate, bounded = search(evaluate, start, tolerance)
    assert bounded
    assert rate <= threshold < rate * (1 + tolerance) + 1e-12
    assert len(asked) <= 60


def test_the_search_says_when_every_rate_or_none_meets():
    always = lambda r: Point(r, [], 1.0, None, None, None, None, True)  # noqa: E731
    never = lambda r: Point(r, [], 0.0, None, None, None, None, False)  # noqa: E731
    assert search(always, 3.0, 0.02) == (MAX_RATE, False)
    assert search(never, 3.0, 0.02) == (0.0, True)
    assert MIN_RATE > 0


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("ttft=0.5,tpot=50ms", {"ttft_s": 0.5, "tpot_s": 0.05}),
        ("tpot=0.1s", {"ttft_s": None, "tpot_s": 0.1}),
        (" TTFT = 2 ", {"ttft_s": 2.0, "tpot_s": None}),
    ],
)
def test_slo_text(text, want):
    assert parse_slo(text) == want


@pytest.mark.parametrize("text", ["", "ttft", "ttft=0", "ttft=-1", "ttft=x", "ttft=1,ttft=2", "e2e=1", "ttft=inf"])
def test_bad_slo_text(text):
    with pytest.raises(ConfigError) as err:
        parse_slo(text)
    assert err.value.field.startswith("--slo")


def test_seeds_text():
    assert parse_seeds(None) == [0, 1, 2]
    assert parse_seeds("5, 9") == [5, 9]
    for bad in ("1,1", "-1", "a", ",".join(map(str, range(20))), "99999999999"):
        with pytest.raises(ConfigError):
            parse_seeds(bad)


def test_the_command_writes_the_json_and_the_plot(config, tmp_path, capsys):
    out = tmp_path / "cap.json"
    args = ["capacity", config, "--slo", "ttft=20ms", "--requests", "40", "--seeds", "0", "--tolerance", "0.1"]
    assert main([*args, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["max_rate_per_s"] > 0 and doc["points"]
    assert (tmp_path / "cap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "requests/s meet ttft <= 20.0 ms for 90% of requests" in printed


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--slo", "ttft=soon"], "--slo ttft"),
        (["--slo", "ttft=1", "--attainment", "1.5"], "--attainment"),
        (["--slo", "ttft=1", "--set", "workload.batch_size=0"], "workload.batch_size"),
        (["--slo", "ttft=1", "--set", "policy.name=belady"], "reads the workload's future"),
        (["--slo", "ttft=1", "--cv", "0"], "--cv"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(config, tmp_path, capsys, extra, words):
    out = tmp_path / "cap.json"
    assert main(["capacity", config, *extra, "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not out.exists() and not (tmp_path / "cap.png").exists()


def test_too_few_requests_are_said_so(config):
    """With so few requests that a queue cannot outgrow the TTFT bound, no rate fails (not bounded); with a few more,
    the answer lies far above the rate the machine completes requests at, and is flagged."""
    loose = {"ttft_s": 0.02, "tpot_s": None}
    few = find_capacity(config, [], loose, TARGET, requests=12, seeds=[0])
    assert not few["bounded"] and few["max_rate_per_s"] == MAX_RATE and few["check"] is None
    assert "every rate up to" in summary_text(few)
    some = find_capacity(config, [], loose, TARGET, requests=60, seeds=[0])
    assert some["bounded"] and some["above_saturation"]
    assert some["max_rate_per_s"] > 1.1 * some["saturation_req_s"]
    assert "note: that is well above" in summary_text(some)
