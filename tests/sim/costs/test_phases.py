"""Both phases (sim/costs/phase_costs.py, docs/phases.md): prompt processing of host-held experts in micro-batches,
uploaded to the GPU at or above the threshold, and decode at a KV depth, with the KV on the GPU or on the host."""

from __future__ import annotations

import numpy as np
import pytest

from moebase.errors import ConfigError
from sim.bench import format_table
from sim.config.run_config import config_from_dict
from sim.core.prompt_rows import bench_trace
from sim.core.workload import build_iterations
from sim.costs.costs import CostModel
from sim.costs.phase_costs import PhaseCosts
from sim.run import simulate
from tests.support.engine import POLICY_NAMES, PREDICTOR_NAMES, tiny_model
from tests.support.traces import make_trace
from traces.io import save_trace

PROMPT, DECODE, LAYERS, EXPERTS, K = 256, 12, 3, 8, 2


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    e = np.argsort(rng.random((PROMPT + DECODE, LAYERS, EXPERTS)), axis=2)[:, :, :K].astype(np.int16)
    trace = make_trace(e, [PROMPT + DECODE], [PROMPT], num_experts=EXPERTS)
    path = save_trace(trace, tmp_path_factory.mktemp("phases") / "t.npz")
    return path, trace


def run(trace_file, system=None, **workload):
    """Every expert computed on the host (ktransformers with every layer's experts there)."""
    path, trace = trace_file
    cfg_dict_system = {"base": "ideal", **(system or {})}
    d = {
        "model": tiny_model(trace),
        "hardware": "h200",
        "system": cfg_dict_system,
        "workload": {"trace": str(path), "batch_size": 1, "max_decode_tokens": None, **workload},
        "cache": {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 1, "prefetch_reserve": 0},
        "policy": {"name": "ktransformers", "params": {"cpu_layers": LAYERS}},
        "predictor": "none",
    }
    cfg = config_from_dict(d, "test", POLICY_NAMES, PREDICTOR_NAMES)
    return cfg, simulate(cfg)


def prefill_s(out):
    return sum(r.end_s - r.start_s for r in out.engine.iterations if r.kind == "prefill")


def decode_s(out):
    return sum(r.end_s - r.start_s for r in out.engine.iterations if r.kind == "decode")


def test_defaults_change_nothing(trace_file):
    _, plain = run(trace_file)
    _, same = run(trace_file, {"upload_min_batch": 32, "upload_used_only": True})
    assert plain.summary["sim_time_s"] == same.summary["sim_time_s"]
    assert plain.engine.upload_bytes == 0


def test_micro_batches_split_the_prompt(trace_file):
    _, trace = trace_file
    its, _ = build_iterations(trace, 1, ubatch=100)
    pre = [it for it in its if it.kind == "prefill"]
    assert [int(it.rows.size) for it in pre] == [100, 100, 56]
    assert [it.emits for it in pre] == [0, 0, None]  # only the last pass runs the LM head
    assert pre[0].context < pre[1].context < pre[2].context
    deep, _ = build_iterations(trace, 1, ubatch=100, context_tokens=1000)
    assert [it.context - 1000 for it in deep[:3]] == [it.context for it in pre]


def test_upload_bytes_once_per_micro_batch_above_threshold(trace_file):
    cfg, out = run(trace_file, {"prefill_upload": True, "ubatch": 64, "upload_used_only": False})
    eb = cfg.model.expert_bytes
    assert out.engine.upload_bytes == (PROMPT // 64) * LAYERS * EXPERTS * eb  # the whole layer, once per pass
    _, below = run(trace_file, {"prefill_upload": True, "ubatch": 64, "upload_min_batch": 65})
    assert below.engine.upload_bytes == 0  # under the threshold: computed on the host
    scaled = {"prefill_upload": True, "ubatch": 64, "upload_moe_scaled": True}
    _, at = run(trace_file, {**scaled, "upload_min_batch": 16})  # ik_llama.cpp: 16 x 8 experts / top-2 = 64
    assert at.engine.upload_bytes > 0
    _, over = run(trace_file, {**scaled, "upload_min_batch": 17})  # 68 > 64 tokens a pass: on the host
    assert over.engine.upload_bytes == 0


def test_pp_rises_with_ubatch_to_the_link_bound(trace_file):
    rates = []
    for ub in (32, 64, 128, 256):
        _, out = run(trace_file, {"prefill_upload": True, "ubatch": ub})
        rates.append(PROMPT / prefill_s(out))
    assert rates == sorted(rates) and rates[-1] > rates[0]


def test_tg_falls_with_depth_and_nkvo_moves_attention_to_the_host(trace_file):
    rates = []
    for d in (0, 1000, 10000, 100000):
        _, out = run(trace_file, None, context_tokens=d)
        rates.append(DECODE / decode_s(out))
    assert all(a > b for a, b in zip(rates, rates[1:]))
    _, gpu = run(trace_file, None, context_tokens=100000)
    _, nkvo = run(trace_file, {"kv_on_host": True}, context_tokens=100000)
    assert nkvo.engine.cpu_busy_s > gpu.engine.cpu_busy_s
    assert nkvo.engine.compute_busy_s < gpu.engine.compute_busy_s


def test_kv_at_depth_counts_in_the_gpu_memory(trace_file):
    with pytest.raises(ConfigError, match="KV cache"):
        run(trace_file, None, context_tokens=16_000_000, batch_size=8)
    run(trace_file, {"kv_on_host": True}, context_tokens=16_000_000, batch_size=8)  # -nkvo: none of it on the GPU


def test_bench_trace_rule(trace_file):
    _, trace = trace_file
    b = bench_trace(trace, 300, 20, 2)
    assert b.prefill_lengths.tolist() == [300, 300] and b.num_tokens == 640
    assert np.array_equal(b.experts[:PROMPT], trace.experts[:PROMPT])  # prompt rows replayed, in order
    assert np.array_equal(b.experts[300:320], trace.experts[PROMPT : PROMPT + 12][np.arange(20) % 12])
    decode_only = make_trace(trace.experts[PROMPT:], [DECODE], [0], num_experts=EXPERTS)
    c = bench_trace(decode_only, 5, 0, 1)
    assert np.array_equal(c.experts, decode_only.experts[:5])  # no prompt rows: decode rows as prompt rows
    row = {"model": "m", "size_gib": 1.0, "system": "s", "label": "pp512 @ d32768", "tok_s": 2.0}
    assert "pp512 @ d32768 | 2.00" in format_table([row])


def test_nkvo_attention_on_the_host_kernels_threads_and_sockets(trace_file):
    """-nkvo's attention runs on the host the system gives its kernels: fewer threads or one socket of two read the
    KV slower (h200's host: two Xeon 8480C sockets, a core's bandwidth stated), every core as fast as the default."""

    def attention_s(system):
        cfg, _ = run(trace_file, {"kv_on_host": True, **system}, max_decode_tokens=1)
        costs = CostModel(cfg.model, cfg.hardware, cfg.system)
        gpu, host = PhaseCosts(costs).dense_s("decoder", 1, 200_000)
        assert gpu == costs.dense_s("decoder", 1, 0.0)
        return host, cfg

    every, cfg = attention_s({})
    assert every > 0
    assert attention_s({"host_threads": int(cfg.hardware.cpu_cores)})[0] == every
    assert attention_s({"host_threads": 1})[0] > every
    assert attention_s({"numa": "one_socket"})[0] > every


def test_a_model_stating_its_context_flops_pays_those_at_depth(trace_file):
    """``model.context_pair_flops`` replaces ``4 x n_heads x head_dim`` in the attention over the context: a quarter
    of the FLOPs per pair is a quarter of the FLOPs, the same KV read, never a slower prompt (a hybrid model whose
    linear-attention blocks attend over nothing: Qwen3.5)."""
    path, trace = trace_file
    plain = tiny_model(trace)
    cfg, _ = run(trace_file, None, context_tokens=100000)
    full = cfg.model.attention_pair_flops
    assert full == 4 * cfg.model.n_heads * cfg.model.head_dim
    costs = PhaseCosts(CostModel(cfg.model, cfg.hardware, cfg.system))
    quarter = config_from_dict(
        {**cfg.resolved, "model": {**plain, "context_pair_flops": max(1, full // 4)}},
        "test",
        POLICY_NAMES,
        PREDICTOR_NAMES,
    )
    cheap = PhaseCosts(CostModel(quarter.model, quarter.hardware, quarter.system))
    assert cheap._context("decoder", PROMPT, 1e5)[0] * 4 == costs._context("decoder", PROMPT, 1e5)[0]
    assert cheap._context("decoder", PROMPT, 1e5)[1] == costs._context("decoder", PROMPT, 1e5)[1]  # same KV read
    assert cheap.dense_s("decoder", PROMPT, 1e5)[0] <= costs.dense_s("decoder", PROMPT, 1e5)[0]


def test_uploads_from_pageable_memory_take_the_pageable_share_of_the_link(trace_file):
    """llama.cpp's prompt uploads from mmap'd host memory (``pageable_copies``): the same bytes, each copy's
    bandwidth term over ``pageable_fraction``; decode (nothing uploaded) is unchanged."""
    up = {"prefill_upload": True, "ubatch": 64, "upload_used_only": False}
    cfg, pinned = run(trace_file, up)
    _, pageable = run(trace_file, {**up, "pageable_copies": True, "pageable_fraction": 0.25})
    assert pageable.engine.upload_bytes == pinned.engine.upload_bytes > 0
    copies = (PROMPT // 64) * LAYERS  # one copy per layer and pass
    fixed = copies * cfg.hardware.pcie_latency_s
    assert pageable.engine.upload_s - fixed == pytest.approx(4 * (pinned.engine.upload_s - fixed), rel=1e-9)
    assert prefill_s(pageable) > prefill_s(pinned)
    assert decode_s(pageable) == pytest.approx(decode_s(pinned), rel=1e-12)  # the same steps, later in time
