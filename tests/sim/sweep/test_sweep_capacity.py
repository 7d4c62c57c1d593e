"""A sweep's ``capacity`` option (sim/sweep/capacity.py): each row's ``capacity_req_s`` is what ``sim capacity``
answers for that point's config and settings (the same search, run in the point's task: a pool worker here, and a
Ray task's entry point on the point's resolved config), the report's table and a capacity plot show it, the point's
id covers the option, and a bad field of it is one line naming the field (exit 2)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from moebase.errors import ConfigError
from sim.cli import main
from sim.sweep.spec import load_sweep
from tests.support.configs import serving_config

SLO = "ttft=0.012"
ARRIVALS = {"process": "poisson", "rate_per_s": 50, "seed": 0}  # the points' own runs (the search sets its own)
CAPACITY = {"slo": {"ttft_s": 0.012}, "attainment": 0.9, "requests": 24, "seeds": [0], "tolerance": 0.1}


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> str:
    """A small fast config, as tests/sim/test_capacity.py's (tests.support.configs.serving_config)."""
    return serving_config(tmp_path_factory.mktemp("sweep-capacity"))


def _sweep_file(folder, config: str, capacity=CAPACITY, name: str = "s.yaml"):
    doc = {
        "name": "cap",
        "base": config,
        "set": {"workload.arrivals": ARRIVALS},
        "grid": {"workload.batch_size": [2, 4]},
        "capacity": capacity,
    }
    path = folder / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _sim_capacity(tmp_path, config: str, sets: list[str]) -> dict:
    out = tmp_path / f"cap-{len(list(tmp_path.glob('cap-*.json')))}.json"
    args = ["capacity", config, "--slo", SLO, "--attainment", "0.9", "--requests", "24", "--seeds", "0"]
    args += ["--tolerance", "0.1", "--json", str(out)]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return json.loads(out.read_text())


def test_each_rows_capacity_is_sim_capacitys_answer_and_is_tabled_and_plotted(tmp_path, config):
    sweep = _sweep_file(tmp_path, config)
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "2", "--quiet"]) == 0
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 2 and (df["status"] == "ok").all()
    for batch in (2, 4):
        row = df[df["workload.batch_size"] == batch].iloc[0]
        sets = [f"workload.arrivals={json.dumps(ARRIVALS)}", f"workload.batch_size={batch}"]
        doc = _sim_capacity(tmp_path, config, sets)
        assert row["capacity_req_s"] == doc["max_rate_per_s"] > 0
        assert row["capacity_saturation_req_s"] == doc["saturation_req_s"]
        assert bool(row["capacity_above_saturation"]) == doc["above_saturation"]
        assert bool(row["capacity_bounded"]) == doc["bounded"]
    # a larger batch holds more load here: the figure tells the points apart
    assert df["capacity_req_s"].nunique() > 1
    report = (out / "report.md").read_text()
    assert "| capacity_req_s | capacity_above_saturation |" in report
    assert "`capacity_vs_workload_batch_size.png`: capacity (the highest request rate" in report, report
    assert (out / "capacity_vs_workload_batch_size.png").stat().st_size > 1000
    assert (out / "throughput_vs_workload_batch_size.png").stat().st_size > 1000
    # --resume keeps the rows, their capacity with them, and runs nothing again
    assert main(["sweep", str(sweep), "--out", str(out), "--resume", "--workers", "1", "--quiet"]) == 0
    again = pd.read_parquet(out / "results.parquet").set_index("point")
    assert again["capacity_req_s"].to_dict() == df.set_index("point")["capacity_req_s"].to_dict()
    assert again["wall_s"].to_dict() == df.set_index("point")["wall_s"].to_dict()


def test_a_ray_task_finds_the_same_capacity_from_the_resolved_config(tmp_path, config):
    from sim.config.run_config import resolve_config
    from sim.sweep.ray.task import run_shipped
    from sim.sweep.worker import attempt, task_options

    sw = load_sweep(_sweep_file(tmp_path, config))
    point = sw.points[0]
    resolved = resolve_config(sw.base, point.overrides, sw.source).resolved
    shipped = run_shipped(resolved, [], {}, sw.source, point.overrides, task_options(sw))
    local = attempt(sw.base, point.overrides, sw.source, options=task_options(sw))
    assert shipped[0] == local[0] == "ok"
    assert shipped[1]["capacity_req_s"] == local[1]["capacity_req_s"] > 0


def test_the_option_is_part_of_a_points_id(tmp_path, config):
    a = load_sweep(_sweep_file(tmp_path, config, name="a.yaml"))
    b = load_sweep(_sweep_file(tmp_path, config, {**CAPACITY, "attainment": 0.8}, name="b.yaml"))
    c = load_sweep(_sweep_file(tmp_path, config, None, name="c.yaml"))
    ids = [{p.id for p in s.points} for s in (a, b, c)]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and c.capacity is None
    assert a.capacity == {**CAPACITY, "slo": {"ttft_s": 0.012, "tpot_s": None}, "cv": None}
    from sim.sweep.plots import slo_words  # what the capacity plot's title says the figure is found for

    assert slo_words(a.capacity) == "capacity: TTFT <= 0.012 s for 90% of 24 requests" and slo_words(None) == ""


@pytest.mark.parametrize(
    ("capacity", "field"),
    [
        ({"attainment": 0.9}, "capacity.slo"),
        ({"slo": {"ttft_s": -1}}, "capacity.slo.ttft_s"),
        ({"slo": {"ttft": 1}}, "capacity.slo.ttft"),
        ({"slo": {}}, "capacity.slo"),
        ({"slo": {"tpot_s": 0.1}, "attainment": 1.5}, "capacity.attainment"),
        ({"slo": {"tpot_s": 0.1}, "requests": 0}, "capacity.requests"),
        ({"slo": {"tpot_s": 0.1}, "requests": True}, "capacity.requests"),
        ({"slo": {"tpot_s": 0.1}, "seeds": [1, 1]}, "capacity.seeds"),
        ({"slo": {"tpot_s": 0.1}, "seeds": [-1]}, "capacity.seeds"),
        ({"slo": {"tpot_s": 0.1}, "tolerance": 1}, "capacity.tolerance"),
        ({"slo": {"tpot_s": 0.1}, "cv": 0}, "capacity.cv"),
        ({"slo": {"tpot_s": 0.1}, "rate": 3}, "capacity.rate"),
        ("fast", "capacity"),
    ],
)
def test_a_bad_field_is_refused_naming_it(tmp_path, config, capacity, field):
    path = _sweep_file(tmp_path, config, capacity)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert str(err.value).startswith(f"{path}: sweep.{field}: ") and "\n" not in str(err.value)


def test_a_bad_field_exits_2_with_one_line(tmp_path, config, capsys):
    path = _sweep_file(tmp_path, config, {"slo": {"ttft_s": "fast"}})
    assert main(["sweep", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "sweep.capacity.slo.ttft_s: must be seconds > 0" in err and "\n" not in err
