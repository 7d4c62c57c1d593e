"""`traces import`: the real Mixtral routing files and vLLM's routed-experts arrays."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from moebase.errors import InputError
from tests.support.cli import run_module
from traces.importers.mixtral_jsonl import import_mixtral_jsonl
from traces.importers.vllm import import_vllm
from traces.io import load_trace


def test_real_mixtral_import_aligns_layers_by_token_idx(mixtral_real_paths):
    path = mixtral_real_paths["humaneval"]
    records = defaultdict(dict)  # (problem, layer) -> token_idx -> experts
    for line in path.read_text().splitlines():
        r = json.loads(line)
        records[(r["problem_id"], r["layer"])][r["token_idx"]] = r["experts"]
    trace, dropped = import_mixtral_jsonl([path])
    assert trace.num_layers == 32 and trace.top_k == 2 and trace.num_experts == 8
    assert trace.meta.request_ids == ("humaneval/0", "humaneval/1")
    assert trace.meta.provenance.kind == "imported"
    for r, pid in enumerate((0, 1)):
        common = sorted(set.intersection(*(set(records[(pid, layer)]) for layer in range(32))))
        union = set().union(*(set(records[(pid, layer)]) for layer in range(32)))
        assert trace.request_lengths[r] == len(common)
        assert dropped[f"humaneval/{pid}"] == len(union) - len(common)
        rows = trace.experts[trace.request_slice(r)]
        for i in (0, len(common) // 2, len(common) - 1):
            for layer in (0, 17, 31):
                assert rows[i, layer].tolist() == records[(pid, layer)][common[i]]
    assert trace.meta.extra["dropped_tokens"] == dropped and sum(dropped.values()) > 0
    assert (trace.prefill_lengths == 0).all()  # the real trace has decode tokens only


def test_mixtral_cli_reports_dropped_tokens_and_writes_a_valid_trace(mixtral_real_paths, tmp_path):
    out = tmp_path / "gsm8k.npz"
    res = run_module("traces", "import", "mixtral-jsonl", mixtral_real_paths["gsm8k"], "--out", out)
    assert res.returncode == 0, res.stderr
    assert "dropped" in res.stdout
    assert load_trace(out).num_requests == 2


@pytest.mark.parametrize(
    "line, problem",
    [
        ("{not json", "not valid JSON"),
        ('{"problem_id": 0, "layer": 0, "token_idx": 0}', "'experts'"),
        ('{"problem_id": 0, "layer": 0, "token_idx": 0, "experts": [9, 1]}', "outside 0..7"),
        ('{"problem_id": 0, "layer": -1, "token_idx": 0, "experts": [1, 2]}', "'layer'"),
    ],
)
def test_mixtral_bad_lines_name_file_and_line(tmp_path, line, problem):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"problem_id": 0, "layer": 0, "token_idx": 0, "experts": [1, 2]}\n' + line + "\n")
    with pytest.raises(InputError, match=problem) as info:
        import_mixtral_jsonl([f])
    assert f"{f}:2" in str(info.value)
    out = tmp_path / "out.npz"
    res = run_module("traces", "import", "mixtral-jsonl", f, "--out", out)
    assert res.returncode == 2 and f"{f}:2" in res.stderr and not out.exists()


def _routed(rng, n, layers=4, k=2, experts=16):
    return np.argsort(rng.random((n, layers, experts)), axis=2)[:, :, :k]


def test_vllm_npy_npz_and_jsonl_give_the_same_routing(tmp_path):
    rng = np.random.default_rng(0)
    reqs = [_routed(rng, n) for n in (5, 9, 3)]
    for i, a in enumerate(reqs):
        np.save(tmp_path / f"req{i}.npy", a)
    np.savez(tmp_path / "all.npz", r0=reqs[0], r1=reqs[1], r2=reqs[2])
    with open(tmp_path / "all.jsonl", "w") as f:
        for i, a in enumerate(reqs):
            f.write(json.dumps({"request_id": f"q{i}", "routed_experts": a.tolist(), "prompt_len": 1}) + "\n")
    from_npy = import_vllm([tmp_path / f"req{i}.npy" for i in range(3)], "toy-moe", 16)
    from_npz = import_vllm([tmp_path / "all.npz"], "toy-moe", 16)
    from_jsonl = import_vllm([tmp_path / "all.jsonl"], "toy-moe", 16)
    for t in (from_npy, from_npz, from_jsonl):
        assert np.array_equal(t.experts, np.concatenate(reqs))
        assert t.request_lengths.tolist() == [5, 9, 3]
    assert from_jsonl.meta.request_ids == ("q0", "q1", "q2")
    assert from_jsonl.prefill_lengths.tolist() == [1, 1, 1] and from_npy.prefill_lengths.tolist() == [0, 0, 0]


def test_vllm_bad_inputs_exit_2_naming_the_file(tmp_path):
    rng = np.random.default_rng(1)
    np.save(tmp_path / "a.npy", _routed(rng, 4))
    np.save(tmp_path / "flat.npy", np.zeros((4, 2), dtype=np.int64))
    np.save(tmp_path / "other.npy", _routed(rng, 4, layers=3))
    cases = {
        "flat.npy": "[tokens, layers, top_k]",
        "other.npy": "earlier requests",
        "a.npy --num-experts 4": "outside",
        "missing.npy": "no such file",
    }
    for spec, problem in cases.items():
        name, *extra = spec.split()
        files = [tmp_path / "a.npy", tmp_path / name] if name != "a.npy" else [tmp_path / name]
        ne = extra[1] if extra else "16"
        out = tmp_path / "out.npz"
        res = run_module("traces", "import", "vllm", *files, "--model", "toy", "--num-experts", ne, "--out", out)
        assert res.returncode == 2, (spec, res.stderr)
        assert problem in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert not out.exists()
