"""Published rows in the v2 columns (sim/published.py, sim/row_settings.py): every column value becomes a
setting or a missing capability by name, a row with a missing capability is a miss (never simulated), the fit reads
only the fit rows (predict rows' published values blanked or garbled give identical output), and a bad file is
refused naming the file, the row and the problem. A stand-in simulation keeps these fast."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from moebase.errors import ConfigError
from sim.fit_system import SYSTEMS
from sim.published import COLUMNS_V2, evaluate, read_published
from sim.row_settings import OPTIONS, plan_of
from tests.support.paths import ROOT
from tests.support.rows import row_v2, write_rows

PUBLISHED = ROOT / "benchmarks" / "published" / "rows.csv"
SCHEMA = ROOT / "benchmarks" / "published" / "SCHEMA.md"


def fake_sim(r, constants):
    """A stand-in simulation monotone in each fitted constant, differing by row (its batch and GPU slots)."""
    base = 3.0 + 0.1 * (r.gpu_experts_per_layer or 0) + r.batch
    if "layer_overhead_us" in constants:
        return base / (1.0 + constants["layer_overhead_us"] / 1e4)
    return base * constants.get("host_bw_fraction", 1.0)


def test_the_shipped_rows_are_read_in_every_column_and_each_miss_names_its_capability():
    rows = read_published(PUBLISHED)
    assert len(rows) == 33 and sum(p.cells["role"] == "fit" for p in rows) == 11
    header = PUBLISHED.read_text().splitlines()[0].split(",")
    assert tuple(header) == COLUMNS_V2
    for p in rows:
        assert (p.row is None) == bool(p.plan.missing), p.id
        assert all(m and m.strip() == m for m in p.plan.missing)
    by_id = {p.id: p for p in rows}
    assert by_id["kt-sosp-ds3-int4-8+0"].plan.system == "ktransformers-sosp25"  # its build's own profile
    assert by_id["lcpp-ik357-q30b-pp-kv0"].plan.measure == "prefill"
    assert by_id["mo-hqq-2bit-t4-16gb-full"].row.variant == "full"
    assert by_id["mo-hqq-2bit-t4-16gb-none"].row.variant == "none"
    assert by_id["mo-hqq-2bit-rtx3060-12gb-lru"].row.gpu_experts_per_layer == 2


def test_every_option_key_and_placement_of_the_schema_has_a_rule():
    text = SCHEMA.read_text()
    section = text[text.index("## options keys") : text.index("## Reading the token columns")]
    keys = re.findall(r"^\| `([a-z_]+)` \|", section, re.M)
    assert len(keys) > 20 and set(keys) <= set(OPTIONS), set(keys) - set(OPTIONS)


@pytest.mark.parametrize(
    "change, capability",
    [
        ({"metric": "mixed"}, "mixed metric"),
        ({"options": "kernel=amx;dynamic_sched=off"}, "dynamic_sched=off"),
        ({"options": "foo=bar"}, "option foo"),
        ({"options": "cuda_graph=off"}, "cuda_graph=off"),
        ({"options": "mla=2"}, "mla=2"),
        ({"system": "other"}, "system other has no profile"),
        ({"model": "gpt-5"}, "model gpt-5 has no profile"),
        ({"gpu": "rtx4090-24gb", "cpu": "epyc-9999"}, "hardware part: cpu 'epyc-9999' has no part"),
        ({"gpu_count": "2"}, "gpu_count=2 (several GPUs)"),
        ({"expert_format": "iq9_zz", "expert_bpw": ""}, "expert_format iq9_zz (bits unknown)"),
        ({"expert_format": "int4", "expert_bpw": "5.5"}, "expert_format int4 at expert_bpw 5.5"),
        ({"placement": "gpu_experts=all"}, "placement gpu_experts"),
    ],
)
def test_a_row_the_simulator_cannot_express_is_a_miss_naming_the_capability(tmp_path, change, capability):
    path = write_rows(tmp_path / "rows.csv", [row_v2("ok"), row_v2("x", role="predict", **change)], COLUMNS_V2)
    rows = read_published(path)
    assert rows[0].row is not None and rows[1].row is None
    assert any(m.startswith(capability) for m in rows[1].plan.missing), rows[1].plan.missing
    ev = evaluate(rows, simulate=fake_sim)
    miss = ev["rows"][1]
    assert miss["predicted_tok_s"] is None and miss["error"] is None
    assert ev["summary"]["predicted"] == 0 and ev["summary"]["predict_rows"] == 1
    assert any(c.startswith(capability) for c in ev["summary"]["misses"])


def test_the_columns_that_landed_map_to_their_settings():
    """Prompt processing, KV depth, -ot ranges and --n-cpu-moe (blocks -> MoE layers: DeepSeek-V3's first 3 blocks
    are dense), -nkvo, micro-batch, fewer experts per token, the prefill upload."""
    cells = {c: "" for c in COLUMNS_V2} | row_v2("a")
    ds3 = cells | {"system": "llama.cpp", "model": "deepseek-v3", "options": ""}

    def overlay(**change):
        plan = plan_of(ds3 | change, set(SYSTEMS))
        assert not plan.missing, plan.missing
        return plan, plan.overlay({"system": {}, "workload": {}, "cache": {"hpc_slots": 0}})

    plan, d = overlay(metric="prefill", prompt_tokens="512", context_tokens="4096", options="ubatch=256;nkvo=on")
    assert plan.measure == "prefill" and d["workload"] == {"context_tokens": 4096}
    assert d["system"] == {"ubatch": 256, "kv_on_host": True}
    plan, _ = overlay(expert_format="iq4_nl", dense_format="iq4_nl", expert_bpw="4.5")
    assert (plan.expert_format, plan.dense_format) == ("4.5bpw", "4.5bpw")  # the same unknown format: the same bits
    assert plan_of(ds3 | {"dense_format": "iq4_nl"}, set(SYSTEMS)).missing == ["dense_format iq4_nl (bits unknown)"]
    _, d = overlay(placement="experts_on_gpu_layers=0-33,40-45")
    assert d["system"]["placement"] == {"experts_on_gpu_layers": "0-30,37-42"} and "cache" not in d
    _, d = overlay(options="rtr=on;fmoe=off;cuda_graph=on;dynamic_sched=on")
    assert d["system"] == {"rtr": True, "fmoe": False}
    _, d = overlay(placement="n_cpu_moe=10", options="experts_per_token=6;experts_upload_for_prefill=on;deferral=6")
    assert d["system"] == {
        "placement": {"n_cpu_moe": 7},
        "experts_per_token": 6,
        "prefill_upload": True,
        "deferral": 6,
    }


def test_a_build_runs_on_its_own_profile_or_is_a_miss_naming_it():
    cells = {c: "" for c in COLUMNS_V2} | row_v2("a") | {"system": "ktransformers", "system_version": "sosp25-ae"}
    assert plan_of(cells, {"ktransformers", "ktransformers-sosp25"}).system == "ktransformers-sosp25"
    assert plan_of(cells, {"ktransformers"}).missing == [
        "system ktransformers sosp25-ae (ktransformers-sosp25) has no profile"
    ]
    assert plan_of(cells | {"system_version": "v0.2.1"}, {"ktransformers"}).system == "ktransformers"


def test_options_map_to_settings():
    cells = {c: "" for c in COLUMNS_V2} | row_v2("a")
    plan = plan_of(cells | {"system": "ktransformers", "options": "numa=replicate;cpu_infer=65"}, set(SYSTEMS))
    d = plan.overlay({"system": {"base": "ktransformers"}, "cache": {"lpc_buffers": 1}})
    assert d["system"] == {"base": "ktransformers", "numa": "replicated", "host_threads": 65}
    plan = plan_of(cells | {"options": "expert_cache=lru;speculative_prefetch=on;offload_buffers=3"}, set(SYSTEMS))
    assert plan.variant == "full" and plan.overlay({"cache": {"lpc_buffers": 4}})["cache"] == {"lpc_buffers": 3}


def test_predict_rows_published_values_cannot_reach_the_fit(tmp_path):
    """Blanking or garbling every predict row's published value leaves the fits and every prediction identical."""
    base = [
        row_v2("fit-a100", published="2.0"),
        row_v2("fit-t4", gpu="t4-16gb", cpu="unspecified-cloud-vm", pcie="gen3", published="1.0"),
        row_v2("p1", role="predict", published="2.5", placement="gpu_experts_per_layer=4", options="expert_cache=lru"),
        row_v2("p2", role="predict", published="9.9", gpu="t4-16gb", cpu="unspecified-cloud-vm", batch="2"),
    ]
    outs = []
    for value in (None, "", "0.001", "12345"):
        rows = [dict(r, published_tok_s=value) if value is not None and r["role"] == "predict" else r for r in base]
        ev = evaluate(read_published(write_rows(tmp_path / f"{value}.csv", rows, COLUMNS_V2)), simulate=fake_sim)
        outs.append((ev["fits"], [(r["row"], r["predicted_tok_s"], r["constants"]) for r in ev["rows"]]))
    assert all(o == outs[0] for o in outs[1:])
    assert outs[0][0]["mixtral-offloading"].per_gpu["a100-sxm4-80gb"] > 0


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"batch": "two"}, "batch must be a whole number"),
        ({"role": "train"}, "role must be fit or predict"),
        ({"published_tok_s": ""}, "published_tok_s is blank but the row is a fit row"),
        ({"options": "threads"}, "is not key=value"),
        ({"placement": "cpu experts"}, "placement must be machine-readable"),
    ],
)
def test_a_bad_row_names_the_file_the_row_and_the_problem(tmp_path, change, problem):
    path = write_rows(tmp_path / "rows.csv", [row_v2("ok"), row_v2("bad", **change)], COLUMNS_V2)
    with pytest.raises(ConfigError) as exc:
        read_published(path)
    assert str(path) in str(exc.value) and "row 3 (bad)" in str(exc.value) and problem in str(exc.value)


def test_the_benchmark_exits_2_on_a_file_of_the_old_columns(tmp_path):
    old = tmp_path / "old.csv"
    old.write_text("row,source,system,variant\nx,y,fiddler,\n")
    res = subprocess.run(
        [sys.executable, "benchmarks/published_systems.py", "--rows", str(old)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "old.csv" in res.stderr and "lacks the v2 columns" in res.stderr


def test_a_system_fits_its_decode_constant_on_decode_rows_and_its_prefill_one_on_prefill_rows(tmp_path):
    """llama.cpp: host_bw_fraction on its decode fit rows only, then pageable_fraction on its prefill fit rows only,
    with the decode constant fixed at its fitted value; predictions carry both; without a prefill fit row the
    profile keeps its own prefill constant."""
    import csv

    with open(PUBLISHED, newline="") as fh:
        shipped = {r["row"]: r for r in csv.DictReader(fh)}
    tg, pp = dict(shipped["lcpp-ik357-q30b-tg-kv0"]), dict(shipped["lcpp-ik357-q30b-pp-kv0"])
    pred = dict(pp, row="pp-predict", role="predict", published_tok_s="")
    calls = []

    def sim(r, c):  # decode moves with the bandwidth share only; prefill with both
        calls.append((r.measure, dict(c)))
        bw = c.get("host_bw_fraction", 0.5)
        return 100 * bw if r.measure == "decode" else 1000 * c.get("pageable_fraction", 0.5) * (0.5 + bw)

    rows = [dict(tg, published_tok_s="40"), dict(pp, published_tok_s="270"), pred]
    ev = evaluate(read_published(write_rows(tmp_path / "r.csv", rows, COLUMNS_V2)), simulate=sim)
    fit = ev["fits"]["llama.cpp"]
    assert fit.key == "host_bw_fraction" and fit.rows == ("lcpp-ik357-q30b-tg-kv0",)
    assert fit.value == pytest.approx(0.4, rel=1e-3)  # 100 x 0.4 = 40
    assert fit.extra_rows == {"pageable_fraction": ("lcpp-ik357-q30b-pp-kv0",)}
    assert fit.extra["pageable_fraction"] == pytest.approx(0.3, rel=1e-3)  # 1000 x 0.3 x 0.9 = 270
    fitting = calls[: next(i for i, (m, c) in enumerate(calls) if set(c) == {"host_bw_fraction", "pageable_fraction"})]
    assert {m for m, _ in fitting} == {"decode"}  # the decode constant saw no prefill row
    assert all(c["host_bw_fraction"] == fit.value for m, c in calls if m == "prefill")
    by_row = {r["row"]: r for r in ev["rows"]}
    assert by_row["pp-predict"]["constants"] == {"host_bw_fraction": fit.value, "pageable_fraction": 0.3}
    only_decode = evaluate(read_published(write_rows(tmp_path / "d.csv", rows[:1], COLUMNS_V2)), simulate=sim)
    assert only_decode["fits"]["llama.cpp"].extra == {}


def test_mla_off_runs_the_row_s_model_with_its_keys_and_values_decompressed():
    """``mla=off`` (ik_llama.cpp -mla 0) lays ``latent_cache: false`` over the row's model profile."""
    from moebase.model import load_model

    rows = {p.id: p for p in read_published(PUBLISHED)}
    p = rows["ik-ik232-dslite-iq4nl-tg-breakdown"]
    assert p.row is not None and p.plan.missing == []
    d = p.plan.overlay({"model": "deepseek-v2-lite", "system": {}})
    assert d["model"] == {"base": "deepseek-v2-lite", "latent_cache": False}
    assert load_model(d["model"]).kv_bytes_per_block_token > load_model("deepseek-v2-lite").kv_bytes_per_block_token
