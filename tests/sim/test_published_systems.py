"""Serving-system profiles against published rows: the rows file is read and checked, the constants are fitted on the
fit rows only, every row is predicted, fit-system writes a profile from two measured rows, and bad files exit 2
naming the file, the row and the problem. Fiddler's global placement and llama.cpp's --n-cpu-moe placement."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.config.system import load_system
from sim.fit_system import COLUMNS, fit_and_predict, fit_rows, hardware_of, read_rows, run_config
from sim.published import COLUMNS_V2, read_published
from tests.support.paths import ROOT
from tests.support.rows import row, row_v2, write_rows

PUBLISHED = ROOT / "benchmarks" / "published" / "rows.csv"
SYSTEM_FILES = ("mixtral-offloading", "fiddler", "ktransformers", "llama-cpp", "deepspeed")


def fake_sim(r, constants):
    """A stand-in simulation, monotone in each fitted constant: tokens/s = 3 / (1 + overhead/1e4) (or x bw share)."""
    if "layer_overhead_us" in constants:
        return 3.0 / (1.0 + constants["layer_overhead_us"] / 1e4)
    return 10.0 * constants.get("host_bw_fraction", 1.0)


# --------------------------------------------------------------------------------------------- profiles
@pytest.mark.parametrize("name", SYSTEM_FILES)
def test_every_system_profile_loads_and_names_its_sources(name):
    s = load_system(name)
    text = (ROOT / "configs" / "systems" / f"{name}.yaml").read_text()
    assert s.source.endswith(f"{name}.yaml")
    for line in text.splitlines():  # every constant set carries a source, a fit or an assumption nearby
        if line and not line.startswith("#") and not line.startswith(("base:", "source:")):
            key = line.split(":")[0]
            at = text.index(line)
            context = text[max(0, at - 600) : at + len(line)].lower()
            assert any(w in context for w in ("sourced", "fitted", "assumption", "src/", "doc/")), (name, key)


# --------------------------------------------------------------------------------------------- reading rows
def test_hardware_of_maps_gpus_and_hosts():
    assert hardware_of("a100-sxm4-80gb", "server (unspecified)") == "a100-sxm4-80gb"
    assert hardware_of("rtx4090d-24gb", "1x Xeon Gold 6454S, 8 channels DDR5-4800") == "rtx4090d-1x6454s"
    assert hardware_of("rtx4090-24gb", "2x Xeon Gold 6454S, 8 channels DDR5-4800 each") == "rtx4090-2x6454s"
    assert hardware_of("rtx4090-24gb", "2x AMD EPYC 9654, 12 channels DDR5-4800 each", "gen4") == (
        "rtx4090-24gb+2x-epyc-9654+12xddr5-4800+gen4"
    )  # no bundled machine of these parts: composed from them, not the rtx4090 profile's Ryzen
    for gpu, host, closest in (("no-such-gpu", "", "e.g."), ("rtx4091", "1x Xeon Gold 6454S", "rtx4090-24gb")):
        with pytest.raises(ConfigError, match=closest):
            hardware_of(gpu, host)
    with pytest.raises(ConfigError, match=r"cpu 'epyc-9754' has no part .*closest: epyc-9755"):
        hardware_of("rtx4090-24gb", "2x AMD EPYC 9754")


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"system": "vllm"}, "system must be one of"),
        ({"model": "gpt-5"}, "model must be a profile of configs/models/"),
        ({"expert_format": "hqq-9bit"}, "expert_format must be a weight format"),
        ({"gpu": "rtx9090"}, "has no bundled machine of its own"),
        ({"gpu": "rtx9090", "host": "1x Xeon Gold 6454S"}, "gpu 'rtx9090' has no part in configs/parts/gpus/"),
        ({"batch": "two"}, "batch must be an integer"),
        ({"measured_tok_s": "-3"}, "measured_tok_s must be a number > 0"),
        ({"measured_tok_s": ""}, "measured_tok_s is blank but the row is a fit row"),
        ({"role": "train"}, "role must be fit or predict"),
        ({"gpu_experts_per_layer": "1.5"}, "gpu_experts_per_layer must be an integer"),
    ],
)
def test_a_bad_row_names_the_file_the_row_and_the_problem(tmp_path, change, problem):
    path = write_rows(tmp_path / "rows.csv", [row("ok"), row("bad", **change)])
    with pytest.raises(ConfigError) as exc:
        read_rows(path)
    msg = str(exc.value)
    assert str(path) in msg and "row 3 (bad)" in msg and problem in msg


def test_a_file_without_a_column_or_with_a_repeated_row_is_refused(tmp_path):
    path = write_rows(tmp_path / "rows.csv", [row("a")], [c for c in COLUMNS if c != "role"])
    with pytest.raises(ConfigError, match="lacks the columns role"):
        read_rows(path)
    path = write_rows(tmp_path / "rows2.csv", [row("a"), row("a")])
    with pytest.raises(ConfigError, match=r"row 3 \(a\): row id repeats"):
        read_rows(path)


def test_unseen_rows_of_the_same_kinds_are_accepted(tmp_path):
    rows = [
        row(
            "mo-3bit-t4",
            role="predict",
            published="",
            gpu="t4-16gb",
            fmt=("hqq-3bit", "hqq-4bit"),
            variant="lru",
            slots="2",
        ),
        row(
            "kt-6",
            role="predict",
            published="",
            system="ktransformers",
            variant="v0.3",
            model="deepseek-v3",
            gpu="rtx4090-24gb",
            host="1x Xeon Gold 6454S",
            fmt=("q4_k_m", "q4_k_m"),
        ),
        row(
            "llama",
            role="predict",
            published="",
            system="llama.cpp",
            variant="n-cpu-moe=56",
            model="deepseek-v3",
            gpu="rtx4090-24gb",
            host="2x Xeon Gold 6454S",
            fmt=("q4_k_m", "q4_k_m"),
        ),
        row("ds", role="predict", published="", system="deepspeed", variant="", gpu="l4-24gb", fmt=("bf16", "bf16")),
    ]
    parsed = read_rows(write_rows(tmp_path / "rows.csv", rows))
    assert [r.hardware for r in parsed] == ["t4-16gb", "rtx4090-1x6454s", "rtx4090-2x6454s", "l4-24gb"]
    assert run_config(parsed[2], {})["system"]["placement"] == {"n_cpu_moe": 56}  # cpu_layers follow from it
    naive = read_rows(write_rows(tmp_path / "naive.csv", [row("n", variant="naive", role="predict")]))[0]
    cfg = run_config(naive, {"layer_overhead_us": 5.0})
    assert cfg["system"]["base"] == "deepspeed" and cfg["system"]["layer_overhead_us"] == 5.0
    assert cfg["policy"] == "on-demand"
    fits, results = fit_and_predict(parsed, simulate=fake_sim)
    assert fits == {} and all(r["predicted_tok_s"] > 0 and r["error"] is None for r in results)


# --------------------------------------------------------------------------------------------- fitting
def test_fitting_reads_only_the_fit_rows(tmp_path):
    """Predict rows with blank or other published values leave every fitted constant as it was."""
    base = [
        row("fit-a100", published="2.0"),
        row("fit-t4", gpu="t4-16gb", published="1.0"),
        row("p1", role="predict", published="2.5", variant="lru", slots="4"),
        row("p2", role="predict", published="9.9", gpu="t4-16gb"),
    ]
    seen = []

    def spy(r, c):
        seen.append((r.row, r.measured_tok_s))
        return fake_sim(r, c)

    fits1, res1 = fit_and_predict(read_rows(write_rows(tmp_path / "a.csv", base)), simulate=spy)
    assert all(rid.startswith("fit") or pub is None for rid, pub in seen)  # predict rows reach the sim blind
    changed = [dict(r, measured_tok_s="" if r["role"] == "predict" else r["measured_tok_s"]) for r in base]
    changed[2]["measured_tok_s"] = "0.001"
    fits2, res2 = fit_and_predict(read_rows(write_rows(tmp_path / "b.csv", changed)), simulate=fake_sim)
    assert fits1 == fits2
    f = fits1["mixtral-offloading"]
    assert f.per_gpu["a100-sxm4-80gb"] == pytest.approx(5000, rel=1e-3)  # 3 / (1 + x/1e4) = 2
    assert f.per_gpu["t4-16gb"] == pytest.approx(20000, rel=1e-3)
    assert [r["role"] for r in res1] == ["fit", "fit", "predict", "predict"]
    with pytest.raises(ValueError):
        fit_rows([r for r in read_rows(tmp_path / "a.csv") if r.role == "predict"], simulate=fake_sim)


# --------------------------------------------------------------------------------------------- fit-system CLI
def test_fit_system_on_two_measured_rows_writes_a_profile_and_predicts(tmp_path):
    measured = write_rows(
        tmp_path / "my.csv",
        [
            row("mine-none", role="", published="2.0", gpu="anything", host=""),
            row("mine-lru", role="predict", published="", gpu="anything", host="", variant="lru", slots="4", system=""),
        ],
    )
    out = tmp_path / "my-system.yaml"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "fit-system",
            "--measured",
            str(measured),
            "--system",
            "mixtral-offloading",
            "--hardware",
            "a100-sxm4-80gb",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    assert "mine-none" in res.stdout and "mine-lru" in res.stdout and "fitted" in res.stdout
    profile = yaml.safe_load(out.read_text())
    assert profile["base"] == "mixtral-offloading" and profile["layer_overhead_us"] > 0
    s = load_system(str(out))
    assert s.layer_overhead_s == pytest.approx(profile["layer_overhead_us"] / 1e6)


def test_fit_system_and_the_benchmark_exit_2_on_a_bad_file(tmp_path):
    bad = write_rows(tmp_path / "bad.csv", [row("x", batch="0")])
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "fit-system",
            "--measured",
            str(bad),
            "--system",
            "mixtral-offloading",
            "--hardware",
            "a100-sxm4-80gb",
            "--out",
            str(tmp_path / "o.yaml"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and str(bad) in res.stderr and "row 2 (x)" in res.stderr and "batch" in res.stderr
    assert not (tmp_path / "o.yaml").exists()
    bad_v2 = write_rows(tmp_path / "bad_v2.csv", [row_v2("x", batch="0x")], COLUMNS_V2)
    res = subprocess.run(
        [sys.executable, "benchmarks/published_systems.py", "--rows", str(bad_v2)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "row 2 (x)" in res.stderr and "batch" in res.stderr
    res = subprocess.run(
        [sys.executable, "benchmarks/published_systems.py", "--rows", str(tmp_path / "none.csv")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "none.csv" in res.stderr


# --------------------------------------------------------------------------------------------- placement
def _ctx(hpc, mpc, layers=4, experts=8, organization="per-layer", shared_slots=None, trace=None):
    from sim.policies.base import PolicyContext

    ranking = tuple(tuple(range(experts)) for _ in range(layers))
    return PolicyContext(
        num_layers=layers,
        num_experts=experts,
        layer_roles=("decoder",) * layers,
        cached_layers=frozenset(range(layers)),
        hpc_slots=hpc,
        mpc_slots=mpc,
        hot_ranking=ranking,
        trace=trace,
        organization=organization,
        shared_slots=shared_slots,
    )


def test_global_placement_puts_the_model_s_most_popular_experts_on_the_gpu():
    import numpy as np

    from sim.policies.fiddler import global_placement

    class T:  # selection counts: layer 0's experts 0 and 1 ten times each, layer 1's five, layers 2-3 none
        experts = np.array([[[0, 1], [0, 1], [-1, -1], [-1, -1]]] * 5 + [[[0, 1], [-1, -1], [-1, -1], [-1, -1]]] * 5)

    placed = global_placement(_ctx(1, 0, trace=T()), 3)
    assert placed == {0: [0, 1], 1: [0], 2: [], 3: []}  # not one per layer: the model's three most used


def test_ktransformers_cpu_layers_keeps_the_first_layers_on_the_host():
    from sim.policies.ktransformers import KTransformers

    pol = KTransformers({"cpu_layers": 2}, _ctx(0, 0, organization="shared", shared_slots=16))
    assert [len(pol.cache.hpc[layer]) for layer in range(4)] == [0, 0, 8, 8]
    with pytest.raises(ConfigError, match="cpu_layers"):
        KTransformers({"cpu_layers": 1}, _ctx(0, 0, organization="shared", shared_slots=16))
    with pytest.raises(ConfigError, match="cpu_layers"):
        KTransformers({"cpu_layers": -2}, _ctx(1, 0))
    default = KTransformers({}, _ctx(1, 1))
    assert [sorted(default.cache.hpc[layer]) for layer in range(4)] == [[0, 1]] * 4


# --------------------------------------------------------------------------------------------- the published rows
#: Shipped rows the end-to-end run takes: both fitted constants of llama.cpp (decode and prompt processing), the
#: mixtral-offloading rows of one GPU and Fiddler's (fit and predict). The whole file is the benchmark's
#: (``benchmarks/published_systems.py``, ~2 min), not the suite's.
END_TO_END_ROWS = ("mo-hqq-2bit-t4", "fiddler-", "lcpp-ik357-q30b-tg-kv0", "lcpp-ik357-q30b-pp-kv0")


@pytest.mark.slow
def test_published_rows_run_end_to_end(tmp_path):
    """Shipped rows, and one that lacks a capability (MLA mode 2), through the whole harness: every row is predicted
    or a miss naming its capabilities, and the summary counts them."""
    with PUBLISHED.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["row"].startswith(END_TO_END_ROWS)]
    miss = {**next(r for r in rows if r["row"] == "fiddler-l4"), "row": "fiddler-l4-mla2"}
    miss["options"] = ";".join(filter(None, [miss["options"], "mla=2"]))
    subset = tmp_path / "rows.csv"
    with subset.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows([*rows, miss])
    out = tmp_path / "pub.json"
    res = subprocess.run(
        [sys.executable, "benchmarks/published_systems.py", "--rows", str(subset), "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert len(data["rows"]) == len(read_published(subset)) == len(rows) + 1
    for r in data["rows"]:
        assert (r["predicted_tok_s"] is None) == bool(r["missing"]), r["row"]
    assert [r["row"] for r in data["rows"] if r["missing"]] == ["fiddler-l4-mla2"]
    s = data["summary"]
    assert s["predicted"] == sum(r["role"] == "predict" and r["error"] is not None for r in data["rows"])
    assert "predict rows predicted:" in res.stdout and "mla=2 (MLA mode)" in res.stdout


def full_bisection(rows, spec, sim, iterations=24):
    """The fit's bisection restated without stopping early: ``iterations`` halvings, the midpoint rounded."""
    import math

    from sim.fit_system import _round

    def err(x):
        return sum(math.log(sim(r, {spec.key: x}) / r.measured_tok_s) for r in rows) / len(rows)

    to, back = (math.log, math.exp) if spec.log_scale else (float, float)
    a, b = to(spec.low), to(spec.high)
    sign = 1.0 if spec.increasing else -1.0
    for _ in range(iterations):
        m = 0.5 * (a + b)
        if sign * err(back(m)) < 0:
            a = m
        else:
            b = m
    return _round(back(0.5 * (a + b)))


@settings(max_examples=60, deadline=None)
@given(
    published=st.floats(0.02, 0.98),
    log_scale=st.booleans(),
    increasing=st.booleans(),
    high=st.sampled_from([10.0, 1e3, 1e5]),
)
def test_the_bisection_stops_once_its_answer_is_known_and_gives_the_full_ones(published, log_scale, increasing, high):
    """Stopping when both ends of the bracket round alike gives the answer of all 24 halvings, in fewer
    simulations (a stand-in simulation, monotone in the constant)."""
    from types import SimpleNamespace

    from sim.fit_system import Fitted, _fit_one

    spec = Fitted("k", high / 1e4 if log_scale else 0.0, high, False, increasing, log_scale)
    low = spec.low

    def sim(r, c):
        x = (c["k"] - low) / (high - low)  # 0..1 over the range
        return 0.01 + (x if increasing else 1.0 - x)

    rows = [SimpleNamespace(measured_tok_s=published)]
    calls = []

    def counted(r, c):
        calls.append(c)
        return sim(r, c)

    value, at_bound = _fit_one(rows, spec, counted, 24)
    assert not at_bound
    assert value == full_bisection(rows, spec, sim)
    assert len(calls) <= 2 + 24  # never more than the full halvings (an answer near a rounding edge needs them all)


def test_the_bisection_stops_early_when_its_answer_rounds_alike_soon():
    """A target far from a rounding edge: the bracket's ends round alike long before 24 halvings."""
    from types import SimpleNamespace

    from sim.fit_system import Fitted, _fit_one

    spec = Fitted("k", 0.0, 10.0, False, True, False)
    calls = []

    def sim(r, c):
        calls.append(c)
        return 0.01 + c["k"] / 10.0

    value, _ = _fit_one([SimpleNamespace(measured_tok_s=0.51)], spec, sim, 24)
    assert value == 5.0
    assert len(calls) < 2 + 24
