"""The serving keys of a workload (sim/config/serving.py): arrivals, the token budget and the SLO are checked when
the config loads, each bad value one line naming its field; left out, the resolved config is what it was; a file of
arrivals is read bounded, in order, shifted to start at 0."""

from __future__ import annotations

import json

import pytest

from moebase.errors import ConfigError
from sim.config.run_config import load_run_config
from sim.config.serving import MAX_REQUESTS, read_arrival_times

CONFIG = "configs/gpt_oss_20b.yaml"
CONTINUOUS = ["workload.batching=continuous", "workload.batch_size=4"]
POISSON = "workload.arrivals={process: poisson, rate_per_s: 2.5, seed: 3}"


def test_without_the_keys_the_resolved_workload_is_as_before():
    cfg = load_run_config(CONFIG)
    assert (cfg.workload.arrivals, cfg.workload.max_batch_tokens, cfg.workload.slo) == (None, None, None)
    assert not {"arrivals", "max_batch_tokens", "slo"} & set(cfg.resolved["workload"])


def test_the_keys_load_and_show_in_the_resolved_config():
    cfg = load_run_config(
        CONFIG, [*CONTINUOUS, POISSON, "workload.max_batch_tokens=64", "workload.slo={ttft_s: 1, tpot_s: 0.05}"]
    )
    a = cfg.workload.arrivals
    assert (a.process, a.rate_per_s, a.seed, a.cv) == ("poisson", 2.5, 3, None)
    assert cfg.workload.max_batch_tokens == 64
    assert (cfg.workload.slo.ttft_s, cfg.workload.slo.tpot_s) == (1.0, 0.05)
    w = cfg.resolved["workload"]
    assert w["arrivals"]["rate_per_s"] == 2.5 and w["max_batch_tokens"] == 64 and w["slo"]["ttft_s"] == 1.0
    # a sweep axis sets one key of them
    cfg = load_run_config(CONFIG, [*CONTINUOUS, POISSON, "workload.arrivals.rate_per_s=7"])
    assert cfg.workload.arrivals.rate_per_s == 7.0


@pytest.mark.parametrize(
    ("sets", "field", "words"),
    [
        (["workload.arrivals={process: poisson}"], "workload.arrivals.rate_per_s", "missing"),
        (["workload.arrivals={process: gamma, rate_per_s: 1}"], "workload.arrivals.cv", "missing"),
        (["workload.arrivals={process: trace}"], "workload.arrivals.file", "missing"),
        (["workload.arrivals={process: uniform, rate_per_s: 1}"], "workload.arrivals.process", "must be one of"),
        (["workload.arrivals={process: poisson, rate_per_s: -1}"], "workload.arrivals.rate_per_s", "> 0"),
        (["workload.arrivals={process: poisson, rate_per_s: .nan}"], "workload.arrivals.rate_per_s", "number"),
        (["workload.arrivals={process: poisson, rate_per_s: 1, cv: 2}"], "workload.arrivals.cv", "does not apply"),
        (["workload.arrivals={process: poisson, rate_per_s: 1, rate: 2}"], "workload.arrivals.rate", "unknown key"),
        (["workload.arrivals=5"], "workload.arrivals", "mapping"),
        (["workload.slo={}"], "workload.slo", "give ttft_s"),
        (["workload.slo={ttft_s: 0}"], "workload.slo.ttft_s", "> 0"),
        (["workload.max_batch_tokens=2"], "workload.max_batch_tokens", "less than workload.batch_size 4"),
        (["policy.name=belady"], "workload.arrivals", "reads the workload's future"),
    ],
)
def test_a_bad_serving_key_is_one_line_naming_its_field(sets, field, words):
    with pytest.raises(ConfigError) as err:
        load_run_config(CONFIG, [*CONTINUOUS, POISSON, *sets])
    assert err.value.field == field
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["workload.max_batch_tokens=64"], "workload.max_batch_tokens"),
        (["workload.slo={ttft_s: 1}"], "workload.slo"),
        ([POISSON, "workload.batching=static"], "workload.batching"),
    ],
)
def test_the_keys_need_arrivals_and_arrivals_need_continuous_batching(sets, field):
    with pytest.raises(ConfigError) as err:
        load_run_config(CONFIG, sets)
    assert err.value.field == field


def test_a_csv_or_json_file_of_arrivals_is_read_in_order_from_0(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("id,ts\n1,100.5\n2,101\n3, 101\n4,103.25\n")
    assert read_arrival_times(f, "ts") == [0.0, 0.5, 0.5, 2.75]
    j = tmp_path / "a.json"
    j.write_text(json.dumps([5, 6.5, 9]))
    assert read_arrival_times(j, "unused") == [0.0, 1.5, 4.0]
    j.write_text(json.dumps({"ts": [1, 2]}))
    assert read_arrival_times(j, "ts") == [0.0, 1.0]
    cfg = load_run_config(CONFIG, [*CONTINUOUS, f"workload.arrivals={{process: trace, file: {f}, column: ts}}"])
    assert cfg.workload.arrivals.file == str(f.resolve())


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("a.csv", "ts\n2\n1\n", "before the one above it"),
        ("a.csv", "ts\n1\nnan\n", "not a finite number"),
        ("a.csv", "ts\n1\nabc\n", "not a finite number"),
        ("a.csv", "other\n1\n", "not a column"),
        ("a.csv", "", "is empty"),
        ("a.csv", "ts\n", "no timestamps"),
        ("a.csv", "ts\n0\n1e10\n", "span"),
        ("a.json", "{bad", "not valid JSON"),
        ("a.json", '"x"', "list of timestamps"),
        ("a.json", "[true]", "not a finite number"),
        ("a.csv", "ts\n\xff\n", "not UTF-8"),
    ],
)
def test_a_bad_file_of_arrivals_is_one_line(tmp_path, name, text, words):
    f = tmp_path / name
    f.write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError) as err:
        read_arrival_times(f, "ts")
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_file_of_arrivals_is_bounded(tmp_path, monkeypatch):
    import sim.config.serving as serving

    monkeypatch.setattr(serving, "MAX_REQUESTS", 3)
    f = tmp_path / "a.csv"
    f.write_text("ts\n1\n2\n3\n4\n")
    with pytest.raises(ConfigError, match="more than 3 timestamps"):
        read_arrival_times(f, "ts")
    monkeypatch.setattr(serving, "MAX_ARRIVAL_BYTES", 8)
    with pytest.raises(ConfigError, match="larger than"):
        read_arrival_times(f, "ts")
    assert MAX_REQUESTS == 1 << 20  # the bound a run serves at most, as workload.requests


@pytest.mark.parametrize(
    "arrivals",
    [POISSON, "workload.arrivals={process: gamma, rate_per_s: 1, cv: 3, seed: 9}"],
)
def test_a_resolved_config_with_the_keys_loads_back_equal(arrivals):
    """What sim compare and sweeps do: a run's resolved config (every key, unused ones at their defaults) loads back
    to the same config."""
    from sim.config.run_config import config_from_dict

    cfg = load_run_config(CONFIG, [*CONTINUOUS, arrivals, "workload.max_batch_tokens=32", "workload.slo={tpot_s: 1}"])
    again = config_from_dict(cfg.resolved)
    assert again.workload == cfg.workload and again.resolved == cfg.resolved
