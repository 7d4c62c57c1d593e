"""sim bench (sim/bench.py, docs/phases.md) through the command line: the config's checks see the benchmark's own
requests (its prompt or generated tokens at the depth), not the config's trace's; a decode-only trace benchmarks its
prompt processing too (its decode rows replayed as prompt rows)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from sim.cli import main
from sim.config.memory import DoesNotFit
from sim.config.run_config import load_run_config
from tests.support.engine import POLICY_NAMES, PREDICTOR_NAMES, tiny_model
from tests.support.traces import make_trace
from traces.io import save_trace

LAYERS, EXPERTS, K, DECODE = 3, 8, 2, 20


def write_config(folder, prefill: list[int]):
    """A trace of two requests of 20 tokens (``prefill`` of them prompt rows) and a config with a small GPU memory."""
    rng = np.random.default_rng(0)
    e = np.argsort(rng.random((2 * DECODE, LAYERS, EXPERTS)), axis=2)[:, :, :K].astype(np.int16)
    trace = make_trace(e, [DECODE, DECODE], prefill, num_experts=EXPERTS)
    path = save_trace(trace, folder / "t.npz")
    d = {
        "model": tiny_model(trace),
        "hardware": {"base": "h200", "gpu_memory_gb": 3, "reserved_gb": 1},
        "system": "ideal",
        "workload": {"trace": str(path), "batch_size": 1, "max_decode_tokens": None, "prefill": False},
        "cache": {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 1, "prefetch_reserve": 0},
        "policy": {"name": "ktransformers", "params": {"cpu_layers": LAYERS}},
        "predictor": "none",
    }
    cfg_path = folder / "bench.yaml"
    cfg_path.write_text(yaml.safe_dump(d))
    return cfg_path


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """Prompt rows in the first request only (5 of its 20 tokens)."""
    return write_config(tmp_path_factory.mktemp("bench"), [5, 0])


def fits(cfg_path, depth: int) -> bool:
    try:
        load_run_config(cfg_path, [f"workload.context_tokens={depth}"], POLICY_NAMES, PREDICTOR_NAMES)
    except DoesNotFit:
        return False
    return True


def most_tokens(cfg_path) -> int:
    """The most KV tokens one request may hold on this config's GPU beside its dense weights, tiers and reserve: the
    config's own requests hold 20 tokens beside the depth (bisection over the depth)."""
    low, high = 0, 16_000_000
    assert fits(cfg_path, low) and not fits(cfg_path, high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(cfg_path, mid) else (low, mid)
    return low + DECODE


def test_bench_checks_its_own_requests(config, tmp_path, capsys):
    top = most_tokens(config)
    out = tmp_path / "rows.json"
    # pp1 and tg1 at top - 1 hold exactly `top` tokens: they fit, though the config's trace (20 tokens a request)
    # at that depth would not
    assert main(["bench", str(config), "-p", "1", "-n", "1", "-d", str(top - 1), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["label"] for r in rows] == [f"pp1 @ d{top - 1}", f"tg1 @ d{top - 1}"]
    assert all(r["tok_s"] > 0 for r in rows)
    capsys.readouterr()
    # a prompt of 30 tokens at top - 29 does not fit (though the trace's 5-token prompt there would): refused,
    # naming the test and the benchmark's token count
    assert main(["bench", str(config), "-p", "30", "-n", "0", "-d", str(top - 29)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cache: pp30 @ d{top - 29} (-d {top - 29}, --batch 1): ")
    assert f"{top + 1:,} tokens" in err and len(err.splitlines()) == 1


def test_decode_only_trace_benchmarks_prompts(tmp_path, capsys):
    """A trace without prompt rows: pp replays its decode rows as prompt rows (docs/phases.md)."""
    cfg = write_config(tmp_path, [0, 0])
    assert main(["bench", str(cfg), "-p", "8", "-n", "4", "-d", "0,1000"]) == 0
    table = capsys.readouterr().out
    for label in ("pp8", "tg4", "pp8 @ d1000", "tg4 @ d1000"):
        assert f"| {label} |" in table


def test_host_memory_refusal_names_no_test(tmp_path, capsys):
    """The host's memory does not depend on the test: its refusal is the config's own line, without a test's name."""
    cfg = write_config(tmp_path, [5, 0])
    full = ["--set", "hardware.host.memory.capacity_gb=8", "--set", "hardware.host.memory.reserved_gb=8"]
    assert main(["bench", str(cfg), "-p", "4", "-n", "0", *full]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: hardware.host.memory.capacity_gb: 8 GB of host memory cannot hold the run")


def test_a_predictor_learning_from_other_requests_needs_two(tmp_path, capsys):
    """sim bench's workload is --batch requests: a predictor that learns from the other requests is refused at one,
    with what to give instead, and runs at two."""
    cfg = write_config(tmp_path, [5, 0])
    learn = ["--set", "predictor.name=transition", "--set", "policy.name=lru", "--set", "policy.params={}"]
    learn += ["--set", "cache.hpc_slots=2", "--set", "cache.mpc_slots=2", "--set", "cache.lpc_buffers=2"]
    assert main(["bench", str(cfg), "-p", "4", "-n", "4", *learn]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: predictor.params.train: other-requests needs a trace of at least 2 requests")
    assert err.endswith(
        "give --batch 2 or more, or a trace of the same model other than the config's to learn from "
        "(--set predictor.params.train=FILE)"
    )
    assert main(["bench", str(cfg), "-p", "4", "-n", "4", "--batch", "2", *learn]) == 0
