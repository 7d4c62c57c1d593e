"""`sim advise`: the best setting it reports is the fastest of the candidates it ran, every candidate fits in the
GPU's memory, and `sim run` with the best setting's overrides prints exactly its tokens/s.

The config: the real switch-base-128 routing (fp32 experts, 29 GB of them) on a 24 GB RTX 4090, 8 requests, so that
gpu-only does not fit and the tiers are bounded by memory; a run takes a few hundredths of a second.
"""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.advise import Candidate, Knobs, refine
from sim.config.run_config import apply_override, cached_layer_count, dense_bytes_of, load_run_config
from sim.policies import POLICIES
from tests.support.cli import run_module
from tests.support.fuzz import fuzz_settings
from traces.summary import read_trace_summary

CONFIG = "configs/switch_base_real.yaml"
BASE = ("--set", "hardware=rtx4090", "--requests", "8")
POLICY_LIST = "gpu-only,on-demand,lru,diffmoe,fiddler"


def advise(tmp_path, *args) -> tuple[dict, str]:
    out = tmp_path / "advice.json"
    res = run_module("sim", "advise", CONFIG, *BASE, *args, "--json", out)
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text()), res.stdout


@pytest.fixture(scope="module")
def advice(tmp_path_factory) -> tuple[dict, str]:
    return advise(tmp_path_factory.mktemp("advise"), "--policies", POLICY_LIST)


def sets_of(doc: dict, settings_: dict) -> list[str]:
    """The overrides a candidate stands for, written as JSON values (YAML reads them alike)."""
    return list(doc["set"]) + [f"{k}={json.dumps(v)}" for k, v in settings_.items()]


def gpu_bytes_needed(cfg) -> int:
    """What the run keeps on the GPU, added up here from the profiles: dense weights, the KV cache of the batch's
    longest requests, the reserve, and the experts (every one for an all-resident policy, else the tiers)."""
    m, w = cfg.model, cfg.workload
    tokens = read_trace_summary(w.trace).max_request_tokens(w.max_decode_tokens)
    if POLICIES.get(cfg.policy.name).all_resident:
        experts = m.moe_layers * m.num_experts
    else:
        experts = cfg.cache.total_slots(cached_layer_count(m, cfg.cache.layers)) + cfg.cache.lpc_buffers
    return (
        dense_bytes_of(m, cfg.system)
        + w.batch_size * tokens * m.kv_bytes_per_token
        + cfg.hardware.reserved_bytes
        + experts * m.expert_bytes
    )


def test_the_best_is_the_fastest_candidate_and_the_json_has_its_schema(advice):
    doc, out = advice
    assert {"best", "candidates", "left_out", "config", "set", "searched"} <= set(doc)
    best, cands = doc["best"], doc["candidates"]
    assert set(best) >= {"settings", "tok_s", "command"} and isinstance(best["settings"], dict)
    assert len(cands) == doc["searched"] > 5
    assert best["tok_s"] == max(c["tok_s"] for c in cands)
    assert best["settings"] in [c["settings"] for c in cands]
    assert [c["tok_s"] for c in cands] == sorted((c["tok_s"] for c in cands), reverse=True)
    for c in cands + doc["left_out"]:
        for key in c["settings"]:
            apply_override({}, f"{key}=1" if key != "policy.params" else f"{key}={{}}")  # a config field
    assert {"settings": {}} in [{"settings": c["settings"]} for c in cands]  # the config as given is one
    assert f"{best['tok_s']:,.1f} tokens/s" in out and "reproduce: python -m sim run" in out


def test_every_candidate_fits_and_the_ones_that_do_not_are_left_out(advice):
    doc, _ = advice
    policies = set()
    for c in doc["candidates"]:
        cfg = load_run_config(CONFIG, sets_of(doc, c["settings"]))  # loads: nothing raises
        assert gpu_bytes_needed(cfg) <= cfg.hardware.gpu_memory_bytes, c
        policies.add(cfg.policy.name)
    assert policies == set(POLICY_LIST.split(",")) - {"gpu-only"}
    gpu_only = [c for c in doc["left_out"] if c["settings"].get("policy.name") == "gpu-only"]
    assert gpu_only and all("does not fit" in c["reason"] for c in gpu_only)
    offloaded = {**gpu_only[0]["settings"], "policy.name": "on-demand"}  # the same run, experts off the GPU
    cfg = load_run_config(CONFIG, sets_of(doc, offloaded))
    m = cfg.model
    resident = gpu_bytes_needed(cfg) + (m.moe_layers * m.num_experts - cfg.cache.lpc_buffers) * m.expert_bytes
    assert resident > cfg.hardware.gpu_memory_bytes


def test_sim_run_with_the_best_settings_prints_the_same_tokens_per_second(advice, tmp_path):
    doc, _ = advice
    words = shlex.split(doc["best"]["command"])
    assert words[:4] == ["python", "-m", "sim", "run"]
    res = run_module(*words[2:], "--json", "--out", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["throughput_tok_s"] == doc["best"]["tok_s"]


def test_batch_sizes_are_searched_when_asked_and_the_same_inputs_give_the_same_advice(tmp_path):
    first, _ = advise(tmp_path, "--policies", "lru", "--quick", "--batch-sizes", "4,8")
    second, _ = advise(tmp_path, "--policies", "lru", "--quick", "--batch-sizes", "4,8")
    assert first == second
    batches = {c["settings"].get("workload.batch_size") for c in first["candidates"]}
    assert batches == {None, 4, 8}  # None: the config as given (batch 8)
    assert first["best"]["tok_s"] == max(c["tok_s"] for c in first["candidates"])


def test_a_config_sized_from_memory_gets_slot_counts_that_replace_its_split(tmp_path):
    split = [
        "--set",
        "cache={gpu_memory_gb: 4, split: {hpc: 0.2, mpc: 0.6, lpc: 0.2}, layers: decoder}",
        "--policies",
        "lru",
        "--quick",
    ]
    doc, _ = advise(tmp_path, *split)
    best = doc["best"]["settings"]
    assert best["cache.gpu_memory_gb"] is None and best["cache.split"] is None and best["cache.mpc_slots"] > 0
    res = run_module(*shlex.split(doc["best"]["command"])[2:], "--json", "--out", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["throughput_tok_s"] == doc["best"]["tok_s"]


def host_layers(cands: list[dict]) -> dict[int, float | None]:
    """MoE layers on the host (llama.cpp's ``system.placement.n_cpu_moe``) -> tokens/s (None: left out), of the
    candidates that set it."""
    return {
        c["settings"]["system.placement.n_cpu_moe"]: c.get("tok_s")
        for c in cands
        if "system.placement.n_cpu_moe" in c["settings"]
    }


def test_llama_cpp_searches_the_host_layers_down_to_the_fewest_that_fit(tmp_path):
    """llama.cpp's Q4_K_M experts of all 12 MoE layers on a GPU of 4.5 GB (2 GB of it reserved): only some layers'
    experts fit. The search finds the fewest layers on the host that fit (one fewer does not), the fastest of
    them, and runs no other policy than llama.cpp's."""
    sets = ("--set", "system=llama-cpp", "--set", "cache.layers=all", "--set", "hardware.gpu_memory_gb=4.5")
    doc, _ = advise(tmp_path, *sets)
    ran, left = host_layers(doc["candidates"]), host_layers(doc["left_out"])
    fewest = min(ran)
    assert 0 < fewest < 12 and fewest - 1 in left  # the next one down does not fit
    assert ran[fewest] == max(ran.values()) <= doc["best"]["tok_s"]
    assert len(ran) + len(left) < 12  # coarse, then refined: not every count
    policies = {c["settings"].get("policy.name") for c in doc["candidates"] if c["settings"]}
    assert policies == {"ktransformers"}


def test_bad_input_is_one_line_and_exit_2_and_nothing_is_written(tmp_path):
    out = tmp_path / "advice.json"
    for args, word in (
        (("--set", "cache.no_such_key=1"), "cache.no_such_key"),
        (("--set", "workload.batch_size=0"), "workload.batch_size"),
        (("--batch-sizes", "4,x"), "--batch-sizes"),
        (("--policies", "lru,clairvoyant"), "clairvoyant"),
        (("--max-candidates", "0"), "--max-candidates"),
    ):
        res = run_module("sim", "advise", CONFIG, *args, "--json", out)
        assert res.returncode == 2 and word in res.stderr and res.stderr.count("\n") == 1, (args, res.stderr)
        assert not out.exists()


# ------------------------------------------------------------------------------------------------ the 1-D search
@fuzz_settings(50)
@given(
    layers=st.integers(1, 64),
    data=st.data(),
)
def test_refine_finds_the_fewest_host_layers_that_fit_when_fewer_is_faster(layers, data):
    """Host layers as ``refine`` sees them: below some count nothing fits (left out), above it each layer more on
    the host is slower. It finds that count, evaluating far fewer than every count when there are many."""
    fits_from = data.draw(st.integers(0, layers))
    seen: list[int] = []

    def evaluate(n: int) -> Candidate:
        seen.append(n)
        c = Candidate(Knobs(), {})
        if n < fits_from:
            c.reason = "does not fit"
        else:
            c.tok_s = 1000.0 - n
        return c

    refine(evaluate, 0, layers, lambda: False)
    assert fits_from in seen and len(seen) == len(set(seen))
    assert len(seen) <= 5 + 3 * 8


def test_refine_stops_when_asked():
    seen: list[int] = []
    refine(lambda n: seen.append(n) or None, 0, 40, lambda: len(seen) >= 2)
    assert len(seen) == 2


def test_a_config_placed_by_layer_searches_only_its_placement_and_reproduces(tmp_path):
    """A config that already places experts by layer (system.placement.n_cpu_moe 9): the policy and tiers follow from
    the placement, so each candidate changes that one field, and the best reproduces."""
    placed = ("--set", "system=llama-cpp", "--set", "system.placement.n_cpu_moe=9", "--set", "cache=null")
    sets = (
        *placed,
        "--set",
        "policy=ktransformers",
        "--set",
        "cache.layers=all",
        "--set",
        "hardware.gpu_memory_gb=4.5",
    )
    doc, _ = advise(tmp_path, *sets)
    assert all(set(c["settings"]) <= {"system.placement.n_cpu_moe"} for c in doc["candidates"] + doc["left_out"])
    ran = host_layers(doc["candidates"])
    assert doc["best"]["settings"] == {"system.placement.n_cpu_moe": min(ran)} and min(ran) < 9
    res = run_module(*shlex.split(doc["best"]["command"])[2:], "--json", "--out", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["throughput_tok_s"] == doc["best"]["tok_s"]


def test_a_config_that_does_not_fit_is_left_out_and_the_search_still_runs(tmp_path):
    """Every expert of all 12 layers in the tiers (29 GB on a 24 GB GPU): the config as given is left out as not
    fitting, and each candidate names its policy and tiers in full, so that its command runs."""
    doc, out = advise(
        tmp_path, "--set", "cache.layers=all", "--set", "cache.mpc_slots=124", "--policies", "lru", "--quick"
    )
    given = [c for c in doc["left_out"] if not c["settings"]]
    assert given and "does not fit" in given[0]["reason"] and doc["config_tok_s"] is None
    assert "the config as given: " in out
    for c in doc["candidates"]:
        assert {"policy.name", "cache.hpc_slots", "cache.mpc_slots", "cache.lpc_buffers"} <= set(c["settings"])
        cfg = load_run_config(CONFIG, sets_of(doc, c["settings"]))
        assert gpu_bytes_needed(cfg) <= cfg.hardware.gpu_memory_bytes
    res = run_module(*shlex.split(doc["best"]["command"])[2:], "--json", "--out", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["throughput_tok_s"] == doc["best"]["tok_s"]


def test_max_candidates_bounds_the_simulated_runs_and_says_so(tmp_path):
    doc, out = advise(tmp_path, "--max-candidates", "3")
    assert doc["searched"] == len(doc["candidates"]) == 3 and doc["stopped_at_max_candidates"] is True
    assert "simulated 3 candidates (stopped at --max-candidates)" in out
