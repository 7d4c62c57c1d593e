"""`traces record`: routing recorded with forward hooks on tiny random MoE models (offline, CPU, fp32)."""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.paths import ROOT

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moebase.errors import InputError  # noqa: E402
from sim.config.trace_run import default_run_config  # noqa: E402
from traces.cli import run_main  # noqa: E402
from traces.io import load_trace, save_trace  # noqa: E402
from traces.record.cli import read_prompts, register  # noqa: E402
from traces.record.recording import (  # noqa: E402
    RoutingCapture,
    find_moe_layers,
    record_routing,
    teacher_forced_routing,
)
from traces.record.tiny_models import EOS_ID, TINY_ARCHS, build_tiny_model, encode_bytes  # noqa: E402

PROMPTS = ["Hello world", "The quick brown fox jumps", "a", "Routing experts, one token at a time!"]
MAX_NEW = 6
DECODER_ONLY = ("mixtral", "qwen2-moe", "olmoe", "deepseek-v3")
# (role, block) of every MoE layer, in trace order, and top-k
EXPECTED_LAYERS = {
    "mixtral": ([("decoder", 0), ("decoder", 1)], 2, 8),
    "qwen2-moe": ([("decoder", 0), ("decoder", 2)], 2, 8),  # block 1 is dense (mlp_only_layers)
    "olmoe": ([("decoder", 0), ("decoder", 1)], 2, 8),
    "deepseek-v3": ([("decoder", 1), ("decoder", 2)], 4, 16),  # block 0 is dense (first_k_dense_replace)
    "switch": ([("encoder", 1), ("encoder", 3), ("decoder", 1), ("decoder", 3)], 1, 8),  # sparse_step 2
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # tiny matrices: more threads only add synchronisation, which is very slow on a 2-CPU machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.cache
def tiny(arch: str):
    return build_tiny_model(arch, seed=0)


@functools.cache
def recorded(arch: str, batch_size: int, eos: int | None = EOS_ID, max_new: int = MAX_NEW):
    ids = [encode_bytes(p) for p in PROMPTS]
    return record_routing(
        tiny(arch),
        ids,
        max_new,
        batch_size=batch_size,
        eos_token_id=eos,
        request_ids=[f"p{i}" for i in range(len(ids))],
        dataset="unit-test",
        seed=0,
    )


# --------------------------------------------------------------------------- every architecture


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_records_each_architecture(arch, tmp_path):
    rec = recorded(arch, 2)
    path = save_trace(rec.trace, tmp_path / f"{arch}.npz")
    t = load_trace(path)
    layers, k, num_experts = EXPECTED_LAYERS[arch]
    assert [(x.role, x.index) for x in t.meta.model.layers] == layers
    assert t.top_k == k and t.num_experts == num_experts
    prompt_lens = [len(encode_bytes(p)) for p in PROMPTS]
    gen_lens = [len(g) for g in rec.generated_ids]
    assert t.num_requests == len(PROMPTS)
    assert t.prefill_lengths.tolist() == prompt_lens
    assert t.request_lengths.tolist() == [p + g for p, g in zip(prompt_lens, gen_lens)]
    for g in rec.generated_ids:
        assert 1 <= len(g) <= MAX_NEW
        assert len(g) == MAX_NEW or g[-1] == EOS_ID
        assert EOS_ID not in g[:-1]
    assert t.experts.shape == (sum(prompt_lens) + sum(gen_lens), len(layers), k)
    assert t.experts.dtype == np.int16 and t.experts.max() < num_experts

    decode = t.decode_mask()
    enc = np.array([role == "encoder" for role, _ in layers])
    if arch == "switch":
        # prompt tokens pass the encoder only, generated tokens the decoder only (capacity 128: no drops here)
        assert (t.experts[~decode][:, enc] >= 0).all() and (t.experts[~decode][:, ~enc] == -1).all()
        assert (t.experts[decode][:, ~enc] >= 0).all() and (t.experts[decode][:, enc] == -1).all()
    else:
        assert (t.experts >= 0).all()

    w = t.weights.astype(np.float32)
    assert (w[t.experts < 0] == 0).all() and (w[t.experts >= 0] > 0).all()
    assert (np.diff(w, axis=2) <= 0).all(), "experts are stored highest gate weight first"

    meta = t.meta
    assert meta.provenance.kind == "recorded" and meta.provenance.tool.startswith("traces record ")
    assert meta.provenance.dataset == "unit-test" and meta.request_ids == ("p0", "p1", "p2", "p3")
    assert set(meta.extra["routers"]) == {x.name for x in find_moe_layers(tiny(arch))}
    assert meta.extra["max_new_tokens"] == MAX_NEW and meta.extra["batch_size"] == 2


@pytest.mark.parametrize("arch", ["mixtral", "deepseek-v3", "switch"])
def test_router_ids_are_the_ids_the_experts_receive(arch):
    """The hook reads the router's returned ids: exactly what the experts module (any kernel) is handed."""
    model = tiny(arch)
    layers = find_moe_layers(model)
    seen, handles = {}, []
    for j, layer in enumerate(layers):

        def pre(module, args, j=j):
            idx = args[1]
            if idx.shape[-1] == module.num_experts and not idx.is_floating_point() and arch == "switch":
                flat = idx.reshape(-1, module.num_experts)
                idx = torch.where(flat.sum(-1, keepdim=True) > 0, flat.argmax(-1, keepdim=True), -1)
            seen[j] = {tuple(sorted(r)) for r in idx.reshape(idx.shape[0], -1).tolist()}

        handles.append(layer.experts.register_forward_pre_hook(pre))
    try:
        prompt = encode_bytes("experts kernels")
        with RoutingCapture(model, layers) as cap, torch.no_grad():
            if arch == "switch":
                cap.begin({"encoder": (1, len(prompt)), "decoder": (1, 3)})
                model(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([[0, 5, 6]]), use_cache=False)
            else:
                cap.begin({"decoder": (1, len(prompt))})
                model(input_ids=torch.tensor([prompt]), use_cache=False)
            routed = cap.end()
    finally:
        for h in handles:
            h.remove()
    assert set(routed) == set(seen) == set(range(len(layers)))
    for j, (ids, _) in routed.items():
        assert {tuple(sorted(r)) for r in ids.reshape(-1, ids.shape[-1]).tolist()} == seen[j]


# --------------------------------------------------------------------------- padding, teacher forcing, EOS


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_batched_padded_prompts_route_like_single_prompts(arch):
    """Prompts of different lengths padded into one batch (left padding; right for Switch's encoder) give the
    same routing as each prompt alone. In fp32 the ids are exactly equal on every tiny model (checked for seeds
    0-2 and batch sizes 3 and 6 too); the gate weights may differ in the last bits (batched matmul shapes)."""
    batched, single = recorded(arch, len(PROMPTS)), recorded(arch, 1)
    assert batched.generated_ids == single.generated_ids
    np.testing.assert_array_equal(batched.trace.request_offsets, single.trace.request_offsets)
    np.testing.assert_array_equal(batched.trace.experts, single.trace.experts)
    np.testing.assert_allclose(
        batched.trace.weights.astype(np.float32), single.trace.weights.astype(np.float32), atol=2e-3
    )


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_teacher_forced_pass_routes_like_generation(arch):
    """One forward pass over prompt + generated tokens (Switch: encoder over the prompt, decoder over
    [start] + generated[:-1]) routes every position like the recording did, prefill and decode rows alike."""
    rec = recorded(arch, 2)
    t = rec.trace
    layers = find_moe_layers(tiny(arch))
    for r in range(t.num_requests):
        experts, weights = teacher_forced_routing(tiny(arch), rec.prompt_ids[r], rec.generated_ids[r], layers)
        np.testing.assert_array_equal(experts, t.experts[t.request_slice(r)], err_msg=f"request {r}")
        np.testing.assert_allclose(weights, t.weights[t.request_slice(r)].astype(np.float32), atol=2e-3)


def test_requests_stop_at_eos_and_later_tokens_are_not_recorded():
    full = recorded("mixtral", 1, eos=None)
    assert all(len(g) == MAX_NEW for g in full.generated_ids)
    eos = full.generated_ids[0][2]  # a token request 0 generates: make it the EOS
    stopped = recorded("mixtral", len(PROMPTS), eos=eos)
    t, tf = stopped.trace, full.trace
    for r, (g_full, g) in enumerate(zip(full.generated_ids, stopped.generated_ids)):
        cut = g_full.index(eos) + 1 if eos in g_full else MAX_NEW
        assert g == g_full[:cut]
        n = len(full.prompt_ids[r]) + cut
        rows = t.experts[t.request_slice(r)]
        assert rows.shape[0] == n  # nothing after the EOS, although the batch ran on for the other requests
        np.testing.assert_array_equal(rows, tf.experts[tf.request_slice(r)][:n])
    assert len(stopped.generated_ids[0]) <= 3
    assert t.meta.extra["stopped_at_eos"] >= 1


def test_max_new_tokens_zero_records_prefill_only():
    rec = record_routing(tiny("olmoe"), [encode_bytes("abc"), encode_bytes("de")], 0, batch_size=2)
    assert rec.trace.prefill_lengths.tolist() == [3, 2] and rec.trace.num_tokens == 5
    assert not rec.trace.decode_mask().any()


def test_fallback_reads_the_experts_input_when_the_router_returns_no_ids():
    """DBRX's router returns logits only; the ids are read from its experts module's inputs."""
    import transformers as tf

    try:
        cfg = tf.DbrxConfig(
            d_model=32,
            n_heads=4,
            n_layers=2,
            max_seq_len=128,
            vocab_size=320,
            pad_token_id=0,
            eos_token_id=2,
            attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
            ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 8, "moe_top_k": 2},
        )
        torch.manual_seed(0)
        model = tf.DbrxForCausalLM(cfg).eval()
    except Exception as exc:  # config layout differs across transformers versions
        pytest.skip(f"cannot build a tiny DBRX here: {exc}")
    rec = record_routing(model, [encode_bytes("dbrx"), encode_bytes("hi")], 3, batch_size=2)
    assert all("experts input" in v for v in rec.trace.meta.extra["routers"].values())
    experts, _ = teacher_forced_routing(model, rec.prompt_ids[0], rec.generated_ids[0])
    np.testing.assert_array_equal(experts, rec.trace.experts[rec.trace.request_slice(0)])


def test_api_rejects_bad_input():
    with pytest.raises(InputError, match="no prompts"):
        record_routing(tiny("mixtral"), [], 4)
    with pytest.raises(InputError, match="prompt 1 has no tokens"):
        record_routing(tiny("mixtral"), [[5], []], 4)
    import transformers as tf

    dense = tf.LlamaForCausalLM(
        tf.LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    with pytest.raises(InputError, match="no MoE router modules found in dense-llama"):
        record_routing(dense, [[5, 6]], 2, model_name="dense-llama")


# --------------------------------------------------------------------------- prompts files and the CLI


def test_read_prompts(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\n  second one\n")
    assert [(p.id, p.text) for p in read_prompts(txt)] == [("0", "first prompt"), ("1", "  second one")]
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"prompt": "x", "id": "a"}\n\n{"prompt": "y"}\n')
    assert [(p.id, p.text) for p in read_prompts(jl)] == [("a", "x"), ("1", "y")]


def _record_cli(argv, capsys):
    parser = argparse.ArgumentParser(prog="python -m traces")
    register(parser.add_subparsers(dest="command", required=True))
    parser.set_defaults(make_run_config=default_run_config)  # as the entry point hands it (traces/__main__.py)
    capsys.readouterr()  # drop what the test printed before (e.g. progress bars of save_pretrained)
    code = run_main(parser, ["record", *argv])
    return code, capsys.readouterr()


def test_cli_records_a_tiny_model(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": p}) for i, p in enumerate(PROMPTS[:3])))
    out = tmp_path / "out" / "switch.npz"
    code, io = _record_cli(
        [
            "--tiny",
            "switch",
            "--prompts",
            str(prompts),
            "--out",
            str(out),
            "--max-new-tokens",
            "4",
            "--batch-size",
            "2",
            "--device",
            "cpu",
        ],
        capsys,
    )
    assert code == 0, io.err
    assert str(out) in io.out
    t = load_trace(out)
    assert t.meta.request_ids == ("q0", "q1", "q2") and t.meta.model.name == "tiny-switch"
    assert t.meta.provenance.dataset == "prompts.jsonl" and t.meta.seed == 0
    assert t.prefill_lengths.tolist() == [len(encode_bytes(p)) for p in PROMPTS[:3]]
    assert (np.diff(t.request_offsets) - t.prefill_lengths <= 4).all()


def _save_tiny_checkpoint(model, folder: Path, vocab_size: int) -> Path:
    """A local checkpoint folder: the model plus a word-level tokenizer built here (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    assert len(words) <= vocab_size
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def test_cli_records_a_local_checkpoint(tmp_path, capsys):
    ckpt = _save_tiny_checkpoint(build_tiny_model("qwen2-moe", seed=1), tmp_path / "ckpt", 320)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\nabc\n")
    out = tmp_path / "q.npz"
    code, io = _record_cli(
        [
            "--model",
            str(ckpt),
            "--prompts",
            str(prompts),
            "--out",
            str(out),
            "--max-new-tokens",
            "3",
            "--batch-size",
            "2",
            "--device",
            "cpu",
        ],
        capsys,
    )
    assert code == 0, io.err
    t = load_trace(out)
    assert t.meta.provenance.model == str(ckpt) and t.meta.extra["tokenizer"] == "checkpoint tokenizer"
    assert t.meta.model.name == "ckpt"  # the folder's name, not its path
    assert (tmp_path / "q.model.yaml").is_file() and (tmp_path / "q.run.yaml").is_file()
    assert t.prefill_lengths.tolist() == [11, 3]  # one token per character
    assert [(x.role, x.index) for x in t.meta.model.layers] == [("decoder", 0), ("decoder", 2)]


@pytest.mark.parametrize(
    "case, argv, expect",
    [
        ("missing prompts", ["--tiny", "mixtral", "--prompts", "{tmp}/nope.txt"], "nope.txt: no such prompts file"),
        ("empty prompts", ["--tiny", "mixtral", "--prompts", "{tmp}/empty.txt"], "empty.txt: no prompts"),
        ("bad jsonl", ["--tiny", "mixtral", "--prompts", "{tmp}/bad.jsonl"], "bad.jsonl:2: expected an object"),
        ("unknown tiny", ["--tiny", "gpt5", "--prompts", "{tmp}/ok.txt"], "--tiny: unknown architecture 'gpt5'"),
        (
            "negative max new",
            ["--tiny", "olmoe", "--prompts", "{tmp}/ok.txt", "--max-new-tokens", "-1"],
            "--max-new-tokens must be >= 0",
        ),
        (
            "zero batch",
            ["--tiny", "olmoe", "--prompts", "{tmp}/ok.txt", "--batch-size", "0"],
            "--batch-size must be >= 1",
        ),
        ("model not a folder", ["--model", "{tmp}/ok.txt", "--prompts", "{tmp}/ok.txt"], "is not a checkpoint folder"),
        (
            "model without MoE",
            ["--model", "{tmp}/dense", "--prompts", "{tmp}/ok.txt"],
            "no MoE router modules found in",
        ),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(case, argv, expect, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "ok.txt").write_text("hi\n")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n["y"]\n')
    if case == "model without MoE":
        import transformers as tf

        tf.LlamaForCausalLM(
            tf.LlamaConfig(
                vocab_size=64,
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=1,
            )
        ).save_pretrained(tmp_path / "dense")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--out", str(tmp_path / "x.npz")]
    code, io = _record_cli(argv, capsys)
    assert code == 2
    lines = io.err.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], io.err
    assert not (tmp_path / "x.npz").exists()


def test_python_m_traces_record(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("Hello\nMixture of experts\n")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    out = tmp_path / "m.npz"
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "traces",
            "record",
            "--tiny",
            "mixtral",
            "--prompts",
            str(prompts),
            "--out",
            str(out),
            "--max-new-tokens",
            "3",
            "--device",
            "cpu",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    t = load_trace(out)
    assert t.num_requests == 2 and t.meta.provenance.dataset == "p.txt"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "traces",
            "record",
            "--tiny",
            "mixtral",
            "--prompts",
            str(tmp_path / "missing.txt"),
            "--out",
            str(tmp_path / "y.npz"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"error: {tmp_path / 'missing.txt'}: no such prompts file"]
