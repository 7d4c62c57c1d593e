"""A recorded or imported trace of a model without a bundled profile simulates in one command: `traces record --name`,
the model profile derived from the checkpoint's config (traces/profile_from_config.py) and the run config written
beside the trace (traces/run_setup.py), `import --hf-config`, and mismatch errors that say what differs, whole.
Offline: tiny models built from configs, no download."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

from moebase.errors import ConfigError, InputError  # noqa: E402
from moebase.model import load_model  # noqa: E402
from sim.cli import main as sim_main  # noqa: E402
from sim.config.run_config import config_from_dict, load_run_config  # noqa: E402
from tests.support.cli import run_traces  # noqa: E402
from tests.support.traces import make_trace  # noqa: E402
from traces.importers.common import check_model_fit, plain_model_name  # noqa: E402
from traces.io import load_trace, save_trace  # noqa: E402
from traces.profile_from_config import derive_profile  # noqa: E402
from traces.record.routers import find_moe_layers  # noqa: E402
from traces.record.tiny_models import TINY_ARCHS, build_tiny_model, tiny_config  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only add synchronisation on a 2-CPU machine
    yield
    torch.set_num_threads(before)


def _prompts(folder: Path) -> Path:
    path = folder / "prompts.txt"
    path.write_text("Hello world\nMixture of experts\n")
    return path


def _sim_run(run_yaml: Path, out: Path) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = sim_main(["run", str(run_yaml), "--out", str(out)])
    return code, stdout.getvalue(), stderr.getvalue()


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# --------------------------------------------------------------------------------------------- derivation
#: (bundled profile, the transformers config of that checkpoint: the class defaults are those models, or the few
#: fields of the published config.json that differ; plus the config.json fields the class does not keep)
PUBLISHED = [
    ("mixtral-8x7b", lambda: tf.MixtralConfig(), {}),
    ("qwen1.5-moe-a2.7b", lambda: tf.Qwen2MoeConfig(), {}),
    ("qwen3-30b-a3b", lambda: tf.Qwen3MoeConfig(num_hidden_layers=48, num_experts=128, head_dim=128), {}),
    ("olmoe-1b-7b", lambda: tf.OlmoeConfig(intermediate_size=1024), {}),
    ("deepseek-v3", lambda: tf.DeepseekV3Config(), {"quantization_config": {"quant_method": "fp8"}}),
    (
        "deepseek-v2-lite",
        lambda: tf.DeepseekV2Config(
            hidden_size=2048,
            intermediate_size=10944,
            moe_intermediate_size=1408,
            num_hidden_layers=27,
            num_attention_heads=16,
            num_key_value_heads=16,
            first_k_dense_replace=1,
            num_experts_per_tok=6,
            q_lora_rank=None,  # the published config: queries straight from the hidden state (the class: 1536)
        ),
        {},
    ),
    (
        "gpt-oss-20b",
        lambda: tf.GptOssConfig(num_local_experts=32, num_hidden_layers=24),
        {"quantization_config": {"quant_method": "mxfp4"}},
    ),
    (
        "switch-base-128",
        lambda: tf.SwitchTransformersConfig(
            d_ff=3072, num_experts=128, num_sparse_encoder_layers=6, num_sparse_decoder_layers=6
        ),
        {},
    ),
]


@pytest.mark.parametrize("stem, make, extra", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_a_profile_derived_from_a_published_config_equals_the_bundled_one(stem, make, extra):
    config = {**make().to_dict(), "torch_dtype": "bfloat16", **extra}
    config.pop("dtype", None)
    derived = derive_profile(config, stem, "config.json")
    assert derived.spec().to_dict() == load_model(stem).to_dict()


def _expert_params(model, layer) -> int:
    """Weights of one routed expert of a built model: its MoE layer's ``experts`` module over the expert count."""
    block = dict(model.named_modules())[layer.name.rsplit(".", 1)[0]]
    experts = block.experts
    return sum(p.numel() for p in experts.parameters()) // layer.num_experts


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_a_tiny_model_s_profile_has_the_figures_its_config_implies(arch):
    config = tiny_config(arch).to_dict()
    spec = derive_profile(config, f"tiny-{arch}", "tiny", 2, "test").spec()
    model = build_tiny_model(arch, seed=0)
    layers = find_moe_layers(model)
    gated = arch != "switch"
    hidden = config["d_model"] if arch == "switch" else config["hidden_size"]
    width = config.get("moe_intermediate_size") or config.get("intermediate_size") or config["d_ff"]
    assert spec.expert_matrices == (3 if gated else 2)
    assert spec.expert_bytes == spec.expert_matrices * hidden * width * 2  # bytes per param: 2 (given)
    assert spec.expert_params == _expert_params(model, layers[0])  # the model's own expert weights
    assert spec.num_experts == layers[0].num_experts
    assert [spec.encoder_moe_layers, spec.decoder_moe_layers] == [
        sum(x.role == role for x in layers) for role in ("encoder", "decoder")
    ]
    assert spec.dtype_bytes == 2 and spec.vocab_size == config["vocab_size"]


def test_dtype_comes_from_the_config_and_a_missing_field_is_named_in_one_line():
    config = tiny_config("mixtral").to_dict()
    assert derive_profile({**config, "torch_dtype": "float32"}, "m", "c").fields["dtype_bytes"] == 4
    derived = derive_profile({**config, "dtype": None}, "m", "c")
    assert derived.fields["dtype_bytes"] == 2 and any("dtype_bytes 2" in a for a in derived.assumptions)
    assert "dtype_bytes 2" in derived.yaml_text("test")
    for missing in ("num_experts_per_tok", "hidden_size", "vocab_size", "num_local_experts"):
        broken = {k: v for k, v in config.items() if k != missing}
        with pytest.raises(InputError) as exc:
            derive_profile(broken, "m", "ckpt/config.json")
        assert f"no field '{missing}'" in str(exc.value) and "ckpt/config.json" in str(exc.value)
        assert "\n" not in str(exc.value)
    with pytest.raises(InputError, match="field 'num_experts_per_tok'.*integer"):
        derive_profile({**config, "num_experts_per_tok": "two"}, "m", "c")


def test_plain_model_names():
    assert plain_model_name("/data/ckpts/Mixtral-8x7B-Instruct-v0.1/") == "Mixtral-8x7B-Instruct-v0.1"
    assert plain_model_name("/hf/models--Qwen--Qwen1.5-MoE-A2.7B/snapshots/0123abcd") == "Qwen/Qwen1.5-MoE-A2.7B"
    assert plain_model_name("my model (v2)") == "my-model-v2"
    assert plain_model_name("/") == "model" and plain_model_name("x" * 300) == "x" * 128


# --------------------------------------------------------------------------------------------- record
def test_record_with_a_name_then_one_sim_run_from_anywhere(tmp_path, monkeypatch):
    out = tmp_path / "rec" / "t.npz"
    code, stdout, err, _ = run_traces(
        "record",
        "--tiny",
        "mixtral",
        "--prompts",
        _prompts(tmp_path),
        "--out",
        out,
        "--name",
        "my-moe",
        "--max-new-tokens",
        "3",
        "--device",
        "cpu",
        timeout=300,
    )
    assert code == 0, err
    trace = load_trace(out)
    assert trace.meta.model.name == "my-moe" and trace.meta.provenance.model == "tiny-mixtral"
    model_yaml, run_yaml = tmp_path / "rec" / "t.model.yaml", tmp_path / "rec" / "t.run.yaml"
    spec = load_model(str(model_yaml))
    assert spec.name == "my-moe" and spec.expert_bytes == 3 * 32 * 64 * 4  # gated, hidden 32, width 64, fp32
    assert "dtype_bytes 4" in model_yaml.read_text()  # the assumption, in the file
    assert stdout.strip().splitlines()[-1] == f"simulate it: python -m sim run {run_yaml}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the run config's paths are absolute
    code, summary, err = _sim_run(run_yaml, tmp_path / "run")
    assert code == 0, err
    assert "policy lru" in summary and "model my-moe" in summary and "hardware h200" in summary
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["model"] == "my-moe"


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_every_tiny_architecture_s_recording_loads_with_its_derived_profile(arch, tmp_path):
    out = tmp_path / "t.npz"
    code, _, err, _ = run_traces(
        "record",
        "--tiny",
        arch,
        "--prompts",
        _prompts(tmp_path),
        "--out",
        out,
        "--max-new-tokens",
        "1",
        "--device",
        "cpu",
        timeout=300,
    )
    assert code == 0, err
    cfg = load_run_config(tmp_path / "t.run.yaml")
    trace = load_trace(out)
    roles = [x.role for x in trace.meta.model.layers]
    assert (cfg.model.name, cfg.model.num_experts, cfg.model.top_k) == (f"tiny-{arch}", trace.num_experts, trace.top_k)
    assert (cfg.model.encoder_moe_layers, cfg.model.decoder_moe_layers) == (
        roles.count("encoder"),
        roles.count("decoder"),
    )
    assert cfg.workload.trace == out.resolve() and cfg.policy.name == "lru"


def test_record_without_a_name_uses_the_checkpoint_folder_and_its_config(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "ckpts" / "My-Qwen-MoE"
    build_tiny_model("qwen2-moe", seed=1).save_pretrained(folder)
    words = ["<pad>", "<s>", "</s>", "<unk>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["torch_dtype"] = "bfloat16"  # the checkpoint's dtype is the profile's, whatever the recording ran in
    config.pop("dtype", None)
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "q.npz"
    code, stdout, err, _ = run_traces(
        "record",
        "--model",
        folder,
        "--prompts",
        _prompts(tmp_path),
        "--out",
        out,
        "--max-new-tokens",
        "2",
        "--device",
        "cpu",
        timeout=300,
    )
    assert code == 0, err
    trace = load_trace(out)
    assert trace.meta.model.name == "My-Qwen-MoE" and trace.meta.provenance.model == str(folder)
    spec = load_model(str(tmp_path / "q.model.yaml"))
    assert (spec.d_ff, spec.dense_d_ff, spec.shared_expert_d_ff, spec.decoder_blocks, spec.decoder_moe_layers) == (
        32,
        64,
        32,
        3,
        2,
    )
    assert spec.dtype_bytes == 2 and spec.expert_bytes == 3 * 32 * 32 * 2
    assert load_run_config(tmp_path / "q.run.yaml").model.name == "My-Qwen-MoE"


@pytest.mark.parametrize(
    "name, problem",
    [
        ("has space", "is not a model name"),
        ("/abs/path/model", "is not a model name"),
        ("../up", "is not a model name"),
        ("x" * 129, "the limit is 128"),
        ("", "give a model name"),
    ],
)
def test_a_bad_name_exits_2_with_one_line_before_anything_runs(tmp_path, name, problem):
    out = tmp_path / "t.npz"
    code, _, err, _ = run_traces(
        "record", "--tiny", "mixtral", "--prompts", _prompts(tmp_path), "--out", out, "--name", name
    )
    assert code == 2
    line = _one_error_line(err)
    assert line.startswith("error: --name") and problem in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.txt"]


def test_the_profile_and_run_config_places_are_checked_before_recording(tmp_path):
    (tmp_path / "t.run.yaml").mkdir()
    code, _, err, _ = run_traces(
        "record", "--tiny", "mixtral", "--prompts", _prompts(tmp_path), "--out", tmp_path / "t.npz"
    )
    assert code == 2 and "t.run.yaml" in _one_error_line(err) and "is a folder" in err
    assert not (tmp_path / "t.npz").exists() and not (tmp_path / "t.model.yaml").exists()


def test_no_run_config_writes_the_trace_alone(tmp_path):
    code, _, err, _ = run_traces(
        "record",
        "--tiny",
        "olmoe",
        "--prompts",
        _prompts(tmp_path),
        "--out",
        tmp_path / "t.npz",
        "--max-new-tokens",
        "1",
        "--device",
        "cpu",
        "--no-run-config",
        timeout=300,
    )
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.txt", "t.npz"]


def test_a_name_of_a_bundled_profile_is_checked_against_its_shape_before_recording(tmp_path):
    code, _, err, _ = run_traces(
        "record",
        "--tiny",
        "mixtral",
        "--prompts",
        _prompts(tmp_path),
        "--out",
        tmp_path / "t.npz",
        "--name",
        "mixtral-8x7b",
        timeout=300,
    )
    assert code == 2
    line = _one_error_line(err)
    assert "has 2 decoder MoE layers; profile 'mixtral-8x7b' has 32 decoder MoE layers" in line, line
    assert not (tmp_path / "t.npz").exists()


# --------------------------------------------------------------------------------------------- mismatch errors
def _named(trace, name: str):
    """``trace`` with its model called ``name``."""
    meta = dataclasses.replace(trace.meta, model=dataclasses.replace(trace.meta.model, name=name))
    return type(trace)(trace.experts, trace.request_offsets, trace.prefill_lengths, meta)


def _tiny_trace(tmp_path: Path, name: str) -> Path:
    rng = np.random.default_rng(0)
    experts = np.argsort(rng.random((12, 2, 8)), axis=2)[:, :, :2]
    return save_trace(_named(make_trace(experts, [6, 6], [2, 2], num_experts=8), name), tmp_path / f"{len(name)}.npz")


def _profile(num_experts: int, name: str) -> dict:
    fields = derive_profile(tiny_config("mixtral").to_dict(), name, "tiny", 2).fields
    return {**fields, "num_experts": num_experts}


def _config(trace: Path, model: dict) -> dict:
    return {
        "model": model,
        "hardware": "h200",
        "workload": {"trace": str(trace)},
        "cache": {"hpc_slots": 0, "mpc_slots": 2, "lpc_buffers": 2},
        "policy": "lru",
    }


def test_the_sim_mismatch_error_says_what_differs_whole(tmp_path):
    trace = _tiny_trace(tmp_path, "my-moe")
    with pytest.raises(ConfigError) as exc:
        config_from_dict(_config(trace, _profile(16, "my-moe")))
    msg = str(exc.value)
    assert msg.startswith(
        "workload.trace: trace model 'my-moe' has 8 experts per layer; profile 'my-moe' has 16 experts per layer:"
    ), msg
    long_name = "org/" + "a-checkpoint-folder-name-" * 4 + "that-differs"  # 116 characters, beyond show()'s 60
    trace = _tiny_trace(tmp_path, long_name)
    with pytest.raises(ConfigError) as exc:
        config_from_dict(_config(trace, _profile(8, "my-moe")))
    assert f"trace model name {long_name!r} is not profile 'my-moe'" in str(exc.value)
    config_from_dict(_config(_tiny_trace(tmp_path, "my-moe-v2"), _profile(8, "my-moe")))  # a variant: fine


def test_the_import_mismatch_error_says_what_differs():
    trace = _named(make_trace(np.zeros((3, 32, 2)) + [0, 1], [3], [0], num_experts=16), "mixtral-8x7b")
    with pytest.raises(InputError) as exc:
        check_model_fit(trace, "x.jsonl")
    assert "trace model 'mixtral-8x7b' has 16 experts per layer; profile 'mixtral-8x7b' has 8 experts per layer" in str(
        exc.value
    )


# --------------------------------------------------------------------------------------------- import
def _routing(tmp_path: Path, layers: int = 2) -> Path:
    rng = np.random.default_rng(1)
    path = tmp_path / "routing.npz"
    np.savez(path, expert_ids=np.argsort(rng.random((10, layers, 8)), axis=2)[:, :, :2].astype(np.int16))
    return path


def _hf_config(tmp_path: Path, **changes) -> Path:
    config = {**tiny_config("mixtral").to_dict(), "torch_dtype": "bfloat16", **changes}
    config.pop("dtype", None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_import_with_hf_config_writes_a_usable_profile(tmp_path):
    out = tmp_path / "imp.npz"
    code, stdout, err, _ = run_traces(
        "import",
        "expert-arrays",
        _routing(tmp_path),
        "--model",
        "toy-moe",
        "--num-experts",
        "8",
        "--out",
        out,
        "--hf-config",
        _hf_config(tmp_path),
    )
    assert code == 0, err
    spec = load_model(str(tmp_path / "imp.model.yaml"))
    assert spec.name == "toy-moe" and spec.expert_bytes == 3 * 32 * 64 * 2 and spec.decoder_moe_layers == 2
    assert f"python -m sim run {tmp_path / 'imp.run.yaml'}" in stdout
    code, summary, err = _sim_run(tmp_path / "imp.run.yaml", tmp_path / "run")
    assert code == 0, err
    assert "model toy-moe" in summary


def test_import_without_a_profile_says_how_to_get_one(tmp_path):
    code, stdout, err, _ = run_traces(
        "import",
        "expert-arrays",
        _routing(tmp_path),
        "--model",
        "toy-moe",
        "--num-experts",
        "8",
        "--out",
        tmp_path / "imp.npz",
    )
    assert code == 0, err
    notes = [line for line in stdout.splitlines() if line.startswith("note: no model profile")]
    assert len(notes) == 1 and "--hf-config" in notes[0]
    assert not (tmp_path / "imp.model.yaml").exists() and not (tmp_path / "imp.run.yaml").exists()


def test_import_of_a_bundled_model_uses_its_profile(tmp_path):
    code, stdout, err, _ = run_traces(
        "import",
        "expert-arrays",
        _routing(tmp_path, layers=32),
        "--model",
        "mixtral-8x7b",
        "--out",
        tmp_path / "m.npz",
        "--hf-config",
        _hf_config(tmp_path),
    )
    assert code == 0, err
    assert not (tmp_path / "m.model.yaml").exists()
    run = yaml.safe_load((tmp_path / "m.run.yaml").read_text())
    assert run["model"] == "mixtral-8x7b"
    assert load_run_config(tmp_path / "m.run.yaml").model == load_model("mixtral-8x7b")


def test_import_with_a_config_missing_a_field_fails_before_writing(tmp_path):
    config = _hf_config(tmp_path)
    broken = {k: v for k, v in json.loads(config.read_text()).items() if k != "num_local_experts"}
    config.write_text(json.dumps(broken))
    code, _, err, _ = run_traces(
        "import",
        "expert-arrays",
        _routing(tmp_path),
        "--model",
        "toy-moe",
        "--out",
        tmp_path / "imp.npz",
        "--hf-config",
        config,
    )
    assert code == 2 and "no field 'num_local_experts'" in _one_error_line(err)
    assert not (tmp_path / "imp.npz").exists()


def test_import_with_a_config_of_another_shape_says_what_differs(tmp_path):
    code, _, err, _ = run_traces(
        "import",
        "expert-arrays",
        _routing(tmp_path),
        "--model",
        "toy-moe",
        "--num-experts",
        "8",
        "--out",
        tmp_path / "imp.npz",
        "--hf-config",
        _hf_config(tmp_path, num_local_experts=16),
    )
    assert code == 2
    line = _one_error_line(err)
    assert "trace model 'toy-moe' has 8 experts per layer; profile 'toy-moe' has 16 experts per layer" in line, line
    assert "derived from --hf-config" in line, line
    assert not (tmp_path / "imp.npz").exists(), "the trace was written although its profile refuses it"
    assert not (tmp_path / "imp.run.yaml").exists()


# --------------------------------------------------------------------------------------------- the run config
def test_the_run_config_caches_what_fits_beside_the_dense_weights(tmp_path):
    from sim.config.trace_run import default_run_config as run_config
    from traces.summary import read_trace_summary

    spec = load_model("deepseek-v3")  # half its experts (128 x 58 layers x 44 MB) would need 327 GB
    experts = np.zeros((4, spec.decoder_moe_layers, spec.top_k), dtype=np.int16) + np.arange(spec.top_k)
    path = save_trace(
        _named(make_trace(experts, [4], [2], num_experts=spec.num_experts), "deepseek-v3"), tmp_path / "d.npz"
    )
    run = run_config(spec, "deepseek-v3", path, read_trace_summary(path))
    slots = run["cache"]["mpc_slots"]
    assert 1 <= slots < spec.num_experts // 2 and run["cache"]["lpc_buffers"] == spec.top_k
    cfg = config_from_dict(run)  # fits: the memory check passes
    assert cfg.cache.mpc_slots == slots
    with pytest.raises(ConfigError, match="tiers need"):  # and one more slot per layer would not
        config_from_dict({**run, "cache": {**run["cache"], "mpc_slots": slots + 1}})


def test_no_run_config_when_the_dense_weights_alone_exceed_the_gpu(tmp_path):
    from sim.config.trace_run import default_run_config as run_config
    from traces.summary import read_trace_summary

    # embedding and LM head of 2e9 x 32 at 2 bytes: 256 GB, beyond the H200's 141
    fields = {**derive_profile(tiny_config("mixtral").to_dict(), "huge", "tiny", 2).fields, "vocab_size": 2 * 10**9}
    path = _tiny_trace(tmp_path, "huge")
    with pytest.raises(InputError, match="no run config for the trace on h200: cache: .* GB of dense weights"):
        run_config(load_model(fields), fields, path, read_trace_summary(path))
