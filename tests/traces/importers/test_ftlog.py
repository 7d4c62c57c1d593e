"""`traces import ft-log`: FasterTransformer permuted_experts_ logs become static batches whose replay gives the
log's active sets. Expected figures are computed here from the text lines, independently of the importer."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moebase.errors import InputError
from sim.config.run_config import config_from_dict
from sim.core.workload import active_sets, build_iterations, phase_layers
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from sim.run import simulate
from tests.support.cli import run_module
from tests.support.paths import ROOT
from traces.importers.ftlog import LogShape, import_ft_log
from traces.io import load_trace, save_trace

SHARED_LOGS = ROOT.parent / "shared" / "traces" / "switch-base-pregated-logs"
PREFIX = "permuted_experts_"


def random_log(rng, runs, batch, prompt, steps, enc=6, dec=6, experts=128, encoder_only=False) -> list[str]:
    """Text lines of a log: per run, ``enc`` lines of batch x prompt sorted ids, then steps x dec lines of batch
    ids; skewed choices so that ids repeat within a line."""
    weights = rng.random(experts) ** 4
    weights /= weights.sum()

    def line(n):
        return PREFIX + " " + " ".join(map(str, np.sort(rng.choice(experts, size=n, p=weights)))) + " "

    lines = []
    for _ in range(runs):
        lines += [line(batch * prompt) for _ in range(enc)]
        if not encoder_only:
            lines += [line(batch) for _ in range(steps * dec)]
    return lines


def write_log(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def line_ids(text: str) -> list[int]:
    """A log line's ids, read the plain way."""
    words = text.split()
    assert words[0] == PREFIX
    return [int(w) for w in words[1:]]


def replay_sets(trace, batch):
    """(active experts, tokens per expert) of every (iteration, layer) of a static-batch replay, in run order."""
    its, _ = build_iterations(trace, batch, "static")
    layers = phase_layers(trace)
    out = []
    for it in its:
        out.extend(active_sets(trace, it.rows, layers[it.kind]))
    return out


def on_demand_copies(path, batch, model="switch-base-128"):
    """Copies per iteration kind of the simulator's on-demand policy replaying ``path`` at ``batch``."""
    cfg = config_from_dict(
        {
            "model": model,
            "hardware": "h200",
            "workload": {"trace": str(path), "batch_size": batch},
            "cache": {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 4},
            "policy": "on-demand",
        },
        "test",
        POLICIES.names(),
        PREDICTORS.names(),
    )
    its = simulate(cfg).engine.iterations
    return {kind: sum(i.copies for i in its if i.kind == kind) for kind in ("prefill", "decode")}


# ------------------------------------------------------------------------------------------- synthetic logs
def test_layout_prompt_rows_in_encoder_layers_decode_rows_in_decoder_layers(tmp_path):
    rng = np.random.default_rng(0)
    lines = random_log(rng, runs=2, batch=3, prompt=4, steps=5)
    path = write_log(tmp_path / "log.txt", lines)
    trace, summary = import_ft_log(path, "switch-base-128", 3, shape=LogShape(6, 6, 5))
    assert trace.num_requests == 6 and trace.num_layers == 12 and trace.top_k == 1 and trace.num_experts == 128
    assert [x.role for x in trace.meta.model.layers] == ["encoder"] * 6 + ["decoder"] * 6
    assert trace.request_lengths.tolist() == [4 + 5] * 6 and trace.prefill_lengths.tolist() == [4] * 6
    assert summary["runs_in_file"] == 2 and summary["runs_kept"] == [0, 1]
    dec = trace.decode_mask()
    assert (trace.experts[~dec][:, 6:] == -1).all() and (trace.experts[~dec][:, :6] >= 0).all()
    assert (trace.experts[dec][:, :6] == -1).all() and (trace.experts[dec][:, 6:] >= 0).all()
    # request j of run 0, decode step s, decoder layer l: the j-th id of that step's line
    first_decoder_line = line_ids(lines[6 + 2 * 6 + 3])  # step 2, decoder layer 3
    for j in range(3):
        assert trace.experts[trace.request_slice(j)][4 + 2, 6 + 3, 0] == first_decoder_line[j]
    assert trace.meta.request_info == {"run": [0, 0, 0, 1, 1, 1], "slot": [0, 1, 2, 0, 1, 2]}
    assert "active set" in trace.meta.extra["exact"] and "which request" in trace.meta.extra["not_exact"]
    assert trace.meta.provenance.kind == "imported" and trace.meta.provenance.tool == "traces import ft-log"


def test_replay_active_sets_and_on_demand_copies_equal_the_log(tmp_path):
    rng = np.random.default_rng(1)
    batch, steps = 4, 6
    lines = random_log(rng, runs=3, batch=batch, prompt=5, steps=steps)
    path = write_log(tmp_path / "log.txt", lines)
    out = tmp_path / "trace.npz"
    res = run_module(
        "traces",
        "import",
        "ft-log",
        path,
        "--model",
        "switch-base-128",
        "--batch",
        batch,
        "--decode-steps",
        steps,
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr
    assert "3 runs x batch 4" in res.stdout
    trace = load_trace(out)
    sets = replay_sets(trace, batch)
    assert len(sets) == len(lines)
    for text, (active, tokens) in zip(lines, sets):
        ids = line_ids(text)
        assert set(active) == set(ids) and tokens == dict(Counter(ids))
    copies = on_demand_copies(out, batch)
    per_run = 6 + steps * 6
    is_decoder = [i % per_run >= 6 for i in range(len(lines))]
    assert copies["decode"] == sum(len(set(line_ids(t))) for t, d in zip(lines, is_decoder) if d)
    assert copies["prefill"] == sum(len(set(line_ids(t))) for t, d in zip(lines, is_decoder) if not d)


def test_runs_pick_runs_by_index(tmp_path):
    rng = np.random.default_rng(2)
    lines = random_log(rng, runs=4, batch=2, prompt=3, steps=2)
    path = write_log(tmp_path / "log.txt", lines)
    per_run = 6 + 2 * 6
    for spec, kept in (("1-", [1, 2, 3]), ("0,2", [0, 2]), ("3", [3]), ("all", [0, 1, 2, 3]), ("1-2", [1, 2])):
        trace, summary = import_ft_log(path, "switch-base-128", 2, runs=spec, shape=LogShape(6, 6, 2))
        assert summary["runs_kept"] == kept and trace.meta.request_info["run"] == [r for r in kept for _ in (0, 1)]
        expected = [lines[r * per_run + i] for r in kept for i in range(per_run)]
        assert [set(a) for a, _ in replay_sets(trace, 2)] == [set(line_ids(t)) for t in expected]


def test_a_file_with_only_one_runs_encoder_gives_an_encoder_only_trace(tmp_path):
    rng = np.random.default_rng(3)
    lines = random_log(rng, runs=1, batch=4, prompt=8, steps=0, encoder_only=True)
    path = write_log(tmp_path / "enc.txt", lines)
    out = tmp_path / "enc.npz"
    res = run_module("traces", "import", "ft-log", path, "--model", "switch-base-128", "--batch", 4, "--out", out)
    assert res.returncode == 0, res.stderr
    assert "encoder only" in res.stdout
    trace = load_trace(out)
    assert trace.prefill_lengths.tolist() == [8] * 4 and not trace.decode_mask().any()
    assert (trace.experts[:, 6:] == -1).all()
    assert [set(a) for a, _ in replay_sets(trace, 4)] == [set(line_ids(t)) for t in lines]


def test_num_experts_defaults_from_the_model_name(tmp_path):
    rng = np.random.default_rng(4)
    path = write_log(tmp_path / "e8.txt", random_log(rng, 1, 1, 3, 2, experts=8))
    trace, summary = import_ft_log(path, "toy-switch-8", 1, shape=LogShape(6, 6, 2))  # no profile of that name
    assert trace.num_experts == 8 and "model name" in summary["num_experts_from"]
    trace, summary = import_ft_log(path, "switch-base-128", 1, shape=LogShape(6, 6, 2))
    assert trace.num_experts == 128 and "profile" in summary["num_experts_from"]
    with pytest.raises(InputError, match="--num-experts"):
        import_ft_log(path, "mystery-model", 1, shape=LogShape(6, 6, 2))
    assert import_ft_log(path, "mystery-model", 1, 8, shape=LogShape(6, 6, 2))[0].num_experts == 8


def _good_lines(rng):
    return random_log(rng, runs=2, batch=2, prompt=3, steps=2, experts=16)


@pytest.mark.parametrize(
    "case",
    [
        "prefix",
        "not_int",
        "empty_line",
        "encoder_not_multiple",
        "encoder_unequal",
        "decoder_count",
        "id_too_big",
        "negative",
        "line_count",
        "runs_range",
        "runs_syntax",
        "batch_zero",
    ],
)
def test_bad_logs_exit_2_with_one_line_naming_file_and_line(tmp_path, case):
    rng = np.random.default_rng(5)
    lines = _good_lines(rng)
    args = ["--batch", "2", "--decode-steps", "2", "--num-experts", "16"]
    expect_line = None
    if case == "prefix":
        lines[3] = lines[3].replace(PREFIX, "experts_")
        expect_line, problem = 4, "expected a line starting"
    elif case == "not_int":
        lines[9] = lines[9].rstrip() + " 4x"
        expect_line, problem = 10, "'4x' is not an expert id"
    elif case == "empty_line":
        lines[7] = PREFIX
        expect_line, problem = 8, "no expert ids"
    elif case == "encoder_not_multiple":
        lines[18] = lines[18].rstrip() + " 1"  # run 1's first encoder line: 7 ids
        expect_line, problem = 19, "not a multiple of --batch 2"
    elif case == "encoder_unequal":
        lines[2] = lines[2].rstrip() + " 1 1"
        expect_line, problem = 3, "every encoder layer"
    elif case == "decoder_count":
        lines[10] = lines[10].rstrip() + " 3"
        expect_line, problem = 11, "expected 2"
    elif case == "id_too_big":
        lines[12] = PREFIX + " 1 16"
        expect_line, problem = 13, "expert id 16 outside 0..15"
    elif case == "negative":
        lines[12] = PREFIX + " -1 3"
        expect_line, problem = 13, "expert id -1 outside"
    elif case == "line_count":
        lines = lines[:-1]
        problem = "35 lines are neither whole runs of 18 lines"
    elif case == "runs_range":
        args += ["--runs", "1-2"]
        problem = "--runs: run 2 does not exist"
    elif case == "runs_syntax":
        args += ["--runs", "first"]
        problem = "--runs: expected"
    else:
        args[1] = "0"
        problem = "--batch: must be >= 1"
    path = write_log(tmp_path / "bad.txt", lines)
    out = tmp_path / "out.npz"
    res = run_module("traces", "import", "ft-log", path, "--model", "toy", *args, "--out", out)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and problem in res.stderr, res.stderr
    if expect_line is not None:
        assert f"{path}:{expect_line}:" in res.stderr
    assert not out.exists()


def test_missing_file_exits_2(tmp_path):
    res = run_module(
        "traces",
        "import",
        "ft-log",
        tmp_path / "nope.txt",
        "--model",
        "switch-base-128",
        "--batch",
        1,
        "--out",
        tmp_path / "o.npz",
    )
    assert res.returncode == 2 and "no such file" in res.stderr


@st.composite
def logs(draw):
    enc, dec = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    runs, batch = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    prompt, steps = draw(st.integers(1, 4)), draw(st.integers(0, 4))
    experts = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**32 - 1))
    return enc, dec, runs, batch, prompt, steps, experts, seed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logs())
def test_random_logs_replay_to_their_lines(tmp_path, params):
    """Any well-formed log: every (iteration, layer) of the batch-B replay holds exactly its line's ids (set and
    count per expert), and the token counts add up."""
    enc, dec, runs, batch, prompt, steps, experts, seed = params
    rng = np.random.default_rng(seed)
    lines = random_log(rng, runs, batch, prompt, steps, enc, dec, experts)
    path = write_log(tmp_path / "h.txt", lines)
    trace, _ = import_ft_log(path, f"toy-{experts}", batch, shape=LogShape(enc, dec, steps))
    trace.validate()
    sets = replay_sets(trace, batch)
    assert len(sets) == len(lines)
    for text, (_active, tokens) in zip(lines, sets):
        assert tokens == dict(Counter(line_ids(text)))
    assert trace.num_tokens == runs * batch * (prompt + steps)
    assert int((trace.experts >= 0).sum()) == sum(len(line_ids(t)) for t in lines)


# ------------------------------------------------------------------------------------------- the real logs
def _real(name):
    path = SHARED_LOGS / name
    if not path.is_file():
        pytest.skip(f"real FasterTransformer logs not found ({path}): ../shared is absent in this checkout")
    return path


@pytest.mark.parametrize(
    "name, model, batch",
    [
        ("experts_e128_Pre-gated_b8.txt", "switch-base-128", 8),
        ("experts_e128_Pre-gated_b1.txt", "switch-base-128", 1),
        ("experts_e64_Pre-gated_b1.txt", "switch-base-64", 1),
    ],
)
def test_real_log_replays_to_its_lines(tmp_path, name, model, batch):
    path = _real(name)
    lines = [t for t in path.read_text().splitlines() if t.strip()]
    per_run = 6 + 256 * 6
    assert len(lines) % per_run == 0
    runs = len(lines) // per_run
    trace, summary = import_ft_log(path, model, batch, runs="1")  # one run (not the warm-up), to keep it quick
    assert summary["runs_in_file"] == runs
    run = lines[per_run : 2 * per_run]
    assert trace.prefill_lengths.tolist() == [len(line_ids(run[0])) // batch] * batch
    assert [set(a) for a, _ in replay_sets(trace, batch)] == [set(line_ids(t)) for t in run]
    if model == "switch-base-128":
        out = save_trace(trace, tmp_path / "real.npz")
        copies = on_demand_copies(out, batch, model)
        assert copies["decode"] == sum(len(set(line_ids(t))) for t in run[6:])
        assert copies["prefill"] == sum(len(set(line_ids(t))) for t in run[:6])


def test_real_prefill_only_log_gives_an_encoder_only_trace():
    path = _real("experts_e128_Pre-gated_b512.txt")
    lines = [t for t in path.read_text().splitlines() if t.strip()]
    trace, summary = import_ft_log(path, "switch-base-128", 512)
    assert summary["decode_steps"] == [0] and not trace.decode_mask().any()
    assert trace.num_tokens == len(line_ids(lines[0]))
    assert [set(a) for a, _ in replay_sets(trace, 512)] == [set(line_ids(t)) for t in lines]


def test_several_logs_become_one_trace_in_file_order_with_each_lines_sets(tmp_path):
    from traces.importers.ftlog import import_ft_logs

    rng = np.random.default_rng(11)
    a = write_log(tmp_path / "a.txt", random_log(rng, runs=2, batch=2, prompt=5, steps=3))
    b = write_log(tmp_path / "b.txt", random_log(rng, runs=1, batch=2, prompt=4, steps=3))
    trace, summary = import_ft_logs([a, b], "switch-base-128", 2, shape=LogShape(decode_steps=3))
    assert trace.num_requests == 6 and trace.meta.request_info["file"] == ["a.txt"] * 4 + ["b.txt"] * 2
    lines = [line_ids(x) for p in (a, b) for x in p.read_text().splitlines()]
    sets = replay_sets(trace, 2)
    assert [tuple(sorted(set(ids))) for ids in lines] == [s for s, _ in sets]
    assert [dict(Counter(ids)) for ids in lines] == [c for _, c in sets]
    assert set(summary["files"]) == {"a.txt", "b.txt"}


def test_prompt_rows_keep_each_requests_ids_but_not_their_sorted_order(tmp_path):
    rng = np.random.default_rng(5)
    path = write_log(tmp_path / "x.txt", random_log(rng, runs=1, batch=2, prompt=40, steps=1))
    trace, _ = import_ft_log(path, "switch-base-128", 2, shape=LogShape(decode_steps=1))
    first = line_ids(path.read_text().splitlines()[0])
    rows = trace.experts[:40, 0, 0].tolist()  # request 0's prompt rows in encoder layer 0
    assert sorted(rows) == first[:40] and rows != first[:40]
    again, _ = import_ft_log(path, "switch-base-128", 2, shape=LogShape(decode_steps=1))
    assert np.array_equal(again.experts, trace.experts)  # seeded: the same file gives the same trace
