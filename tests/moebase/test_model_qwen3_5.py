"""Qwen3.5-35B-A3B: the model profile, the bundled real routing (traces/data/qwen3_5_35b_a3b.npz) and its two run
configs (H200 and RTX 4090).
- The bundled trace loads and holds the 12 requests as imported: 40 layers, top-8 of 256, 764 prompt and 5,353
  decode tokens, checked against the profile.
- Both run configs load and a one-request run completes.
- Re-importing from the shared traces folder (skipped with a reason when it is absent) gives the bundled file byte
  for byte, with the import date pinned to the bundled one (the importer stamps today's date otherwise).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT))

TRACE = ROOT / "traces" / "data" / "qwen3_5_35b_a3b.npz"
SOURCE = ROOT.parent / "shared" / "traces" / "qwen3.5-35b-a3b-ktransformers"
CONFIGS = {"qwen3_5_35b_a3b": "h200", "qwen3_5_35b_a3b_rtx4090": "rtx4090"}


def test_profile_has_the_published_shapes():
    from moebase.model import load_model

    m = load_model("qwen3.5-35b-a3b")
    assert (m.d_model, m.d_ff, m.num_experts, m.top_k, m.decoder_moe_layers, m.shared_expert_d_ff) == (
        2048,
        512,
        256,
        8,
        40,
        512,
    )
    assert m.expert_bytes == 3 * 2048 * 512 * 2
    assert m.kv_bytes_per_token == 10 * 2 * 2 * 256 * 2  # the 10 full-attention blocks' K and V
    assert 34e9 < m.total_params < 36e9
    q4 = load_model({"base": "qwen3.5-35b-a3b", "expert_bits": 4.85})
    assert q4.expert_bytes == 1_907_098


def test_bundled_trace_holds_the_12_requests():
    from moebase.model import load_model
    from traces.io import load_trace

    trace = load_trace(TRACE)
    trace.validate()
    model = load_model("qwen3.5-35b-a3b")
    assert trace.num_requests == 12
    assert trace.num_layers == 40 == model.moe_layers
    assert trace.top_k == 8 == model.top_k
    assert trace.num_experts == 256 == model.num_experts
    prompt = int(trace.prefill_lengths.sum())
    assert (prompt, trace.num_tokens - prompt) == (764, 5353)
    assert int(trace.decode_mask().sum()) == 5353
    assert trace.meta.provenance.model == "qwen3.5-35b-a3b"
    assert TRACE.stat().st_size < 5 * 2**20


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_run_config_loads_and_serves_one_request(name, tmp_path):
    from sim.cli import main
    from sim.config.run_config import load_run_config

    path = ROOT / "configs" / f"{name}.yaml"
    cfg = load_run_config(path, [])
    assert cfg.model.name == "qwen3.5-35b-a3b" and cfg.hardware.name == CONFIGS[name]
    assert Path(cfg.workload.trace).resolve() == TRACE.resolve()
    assert cfg.cache.hpc_slots + cfg.cache.mpc_slots < cfg.model.num_experts  # an offloading setting
    assert cfg.predictor.name == "transition"  # no pre-gate: a causal predictor learned on other requests
    out = tmp_path / "run"
    rc = main(["run", str(path), "--set", "workload.requests=1", "--out", str(out), "--json"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["throughput_tok_s"] > 0


def test_reimport_gives_the_bundled_file(tmp_path, monkeypatch):
    if not (SOURCE / "parquet").is_dir():
        pytest.skip("the shared traces folder's qwen3.5-35b-a3b-ktransformers/ is absent (a fresh clone has none)")
    import traces.importers.ktparquet as importer
    from tests.support.cli import run_traces
    from traces.io import load_trace

    monkeypatch.setattr(importer, "today", lambda: load_trace(TRACE).meta.provenance.date)
    out = tmp_path / "q.npz"
    files = sorted((SOURCE / "parquet").glob("*.parquet"))
    code, stdout, err, _ = run_traces(
        "import",
        "kt-parquet",
        *files,
        "--model",
        "qwen3.5-35b-a3b",
        "--outputs",
        SOURCE / "outputs",
        "--out",
        out,
        timeout=300,
    )
    assert code == 0, err
    assert out.read_bytes() == TRACE.read_bytes()
