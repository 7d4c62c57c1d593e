"""Every import format hands over a run config, as ``traces record`` does: beside ``OUT.npz`` it writes
``OUT.run.yaml`` (the bundled profile of the trace's model, one H200, LRU) and prints the command that simulates it
as its last line; ``--no-run-config`` writes the trace alone; a model without a profile gets one line saying how to
get one (``traces.run_setup.run_import``)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from sim.config.run_config import load_run_config
from tests.support.cli import traces_main as main
from traces.importers.cli import FORMATS


def _ids(rng, tokens: int, layers: int, k: int, experts: int) -> np.ndarray:
    """Distinct top-k ids per token and layer, [tokens, layers, k]."""
    return np.argsort(rng.random((tokens, layers, experts)), axis=2)[:, :, :k]


def _mixtral_jsonl(folder: Path, rng) -> list[str]:
    ids = _ids(rng, 6, 32, 2, 8)
    lines = [
        json.dumps({"problem_id": t // 3, "layer": layer, "token_idx": t % 3, "experts": ids[t, layer].tolist()})
        for t in range(6)
        for layer in range(32)
    ]
    (folder / "routing.jsonl").write_text("\n".join(lines) + "\n")
    return [str(folder / "routing.jsonl"), "--model", "mixtral-8x7b"]


def _vllm(folder: Path, rng) -> list[str]:
    np.save(folder / "req0.npy", _ids(rng, 5, 24, 4, 60).astype(np.int32))
    return [str(folder / "req0.npy"), "--model", "qwen1.5-moe-a2.7b", "--num-experts", "60"]


def _expert_arrays(folder: Path, rng) -> list[str]:
    ids = _ids(rng, 8, 24, 4, 32).astype(np.int8)
    np.savez(folder / "routing.npz", expert_ids=ids, request_offsets=np.array([0, 3, 8]))
    return [str(folder / "routing.npz"), "--model", "gpt-oss-20b", "--no-requests-json"]


def _ft_log(folder: Path, rng) -> list[str]:
    def line(n: int) -> str:
        return "permuted_experts_ " + " ".join(map(str, np.sort(rng.integers(0, 8, n)))) + " "

    lines = [line(4) for _ in range(6)] + [line(1) for _ in range(2 * 6)]
    (folder / "log.txt").write_text("\n".join(lines) + "\n")
    return [str(folder / "log.txt"), "--model", "switch-base-8", "--batch", "1", "--decode-steps", "2"]


def _kt_parquet(folder: Path, rng) -> list[str]:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    layers, prompt, decode = 40, 3, 2
    ids = _ids(rng, 2 + prompt + decode, layers, 8, 256)
    rows: list[tuple[int, int, list[int]]] = []  # (layer, position, ids): 2 warm-up passes, prefill, decode passes
    for t, pos in [(0, 0), (1, 0)]:
        rows += [(layer, pos, ids[t, layer].tolist()) for layer in range(layers)]
    rows += [(layer, j, ids[2 + j, layer].tolist()) for layer in range(layers) for j in range(prompt)]
    for d in range(decode):
        rows += [(layer, 0, ids[2 + prompt + d, layer].tolist()) for layer in range(layers)]
    table = pa.table(
        {
            "context_id": pa.array(["c0"] * len(rows), type=pa.string()),
            "layer_id": pa.array([r[0] for r in rows], type=pa.int32()),
            "token_position": pa.array([r[1] for r in rows], type=pa.int32()),
            "expert_ids": pa.array([r[2] for r in rows], type=pa.list_(pa.int32())),
            "expert_weights": pa.array([[1.0 / (i + 1) for i in range(8)]] * len(rows), type=pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, folder / "p_session.parquet")
    return [str(folder / "p_session.parquet"), "--model", "qwen3.5-35b-a3b"]


#: format -> a small valid input of a model with a bundled profile (the arguments before --out)
INPUTS: dict[str, Callable[[Path, np.random.Generator], list[str]]] = {
    "mixtral-jsonl": _mixtral_jsonl,
    "vllm": _vllm,
    "expert-arrays": _expert_arrays,
    "ft-log": _ft_log,
    "kt-parquet": _kt_parquet,
}


def _import(fmt: str, folder: Path, *extra: str) -> tuple[int, list[str], str, Path]:
    out = folder / "t.npz"
    args = ["import", fmt, *INPUTS[fmt](folder, np.random.default_rng(0)), *extra, "--out", str(out)]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(args)
    return code, stdout.getvalue().splitlines(), stderr.getvalue(), out


def test_every_import_format_is_covered_here():
    registered = set()
    for module in FORMATS:
        sub = _Collect()
        module.add_parser(sub)
        registered |= sub.names
    assert registered == set(INPUTS)


class _Collect:
    """Stands for argparse's sub-parser action: records the names a format registers."""

    def __init__(self):
        self.names: set[str] = set()

    def add_parser(self, name, **kwargs):
        import argparse

        self.names.add(name)
        return argparse.ArgumentParser(prog=name)


@pytest.mark.parametrize("fmt", sorted(INPUTS))
def test_every_import_writes_a_run_config_and_prints_the_command(tmp_path, fmt):
    code, lines, err, out = _import(fmt, tmp_path)
    assert code == 0, err
    run = tmp_path / "t.run.yaml"
    assert run.is_file() and not (tmp_path / "t.model.yaml").exists()  # a bundled profile: none derived
    assert lines[-1] == f"simulate it: python -m sim run {run}", lines
    assert any(line.startswith(f"{run}: run config (bundled profile ") for line in lines), lines
    data = yaml.safe_load(run.read_text())
    assert data["workload"]["trace"] == str(out.resolve()) and Path(data["workload"]["trace"]).is_absolute()
    cfg = load_run_config(str(run))  # the simulator's own loader takes it as written
    assert cfg.model.name == data["model"] and cfg.policy.name == "lru"


@pytest.mark.parametrize("fmt", ["kt-parquet", "ft-log"])
def test_the_printed_command_runs(tmp_path, fmt, monkeypatch):
    from sim.cli import main as sim_main

    code, lines, err, _ = _import(fmt, tmp_path)
    assert code == 0, err
    command = lines[-1].removeprefix("simulate it: python -m sim ").split()
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert sim_main([*command, "--json", "--out", str(tmp_path / "run")]) == 0
    assert json.loads(printed.getvalue())["throughput_tok_s"] > 0
    assert (tmp_path / "run" / "summary.json").is_file()


@pytest.mark.parametrize("fmt", sorted(INPUTS))
def test_no_run_config_writes_the_trace_alone(tmp_path, fmt):
    code, lines, err, out = _import(fmt, tmp_path, "--no-run-config")
    assert code == 0, err
    assert out.is_file() and not (tmp_path / "t.run.yaml").exists()
    assert not any("simulate it" in line for line in lines)


def test_no_run_config_with_hf_config_is_refused_naming_both(tmp_path):
    code, _, err, out = _import("vllm", tmp_path, "--no-run-config", "--hf-config", str(tmp_path / "config.json"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--no-run-config" in err and "--hf-config" in err and not out.exists()


def test_a_model_without_a_profile_gets_one_line_on_how_to_get_one(tmp_path):
    np.save(tmp_path / "req0.npy", _ids(np.random.default_rng(1), 4, 3, 2, 8).astype(np.int32))
    args = ["import", "vllm", str(tmp_path / "req0.npy"), "--model", "toy-moe", "--num-experts", "8"]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main([*args, "--out", str(tmp_path / "t.npz")]) == 0
    lines = printed.getvalue().splitlines()
    assert lines[-1].startswith("note: no model profile in configs/models/ is of 'toy-moe', so no run config")
    assert "--hf-config" in lines[-1] and not (tmp_path / "t.run.yaml").exists()
