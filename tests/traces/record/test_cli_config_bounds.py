"""`traces record --model DIR` with an untrusted config.json: every size in it (nested configs too) is checked, and
the weights it describes held to what the checkpoint's files can hold, before transformers builds anything from it;
names and paths that go into the trace's metadata are checked before anything runs. transformers is replaced here by
a sentinel that fails the command when reached, so a config reaches it only when it is within the bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import traces.profile_from_config as pfc
import traces.record.tiny_models as tiny
from moebase.errors import InputError
from tests.support.cli import run_traces
from tests.support.fuzz import PLAIN_NAME_CHARS, fuzz_settings, names_near_the_rule
from traces.record.cli import MAX_UNSTORED_WEIGHT_BYTES, MAX_WEIGHTS_PER_FILE_BYTE

HYP = fuzz_settings(30)
SENTINEL = "SENTINEL-transformers-reached"
BASE = {**tiny.tiny_config("mixtral").to_dict(), "torch_dtype": "bfloat16"}
BASE.pop("dtype", None)


@pytest.fixture
def no_transformers(monkeypatch):
    """transformers' config and model loading replaced by a sentinel error."""
    import transformers

    def reached(*args, **kwargs):
        raise InputError(SENTINEL)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", reached)
    monkeypatch.setattr(tiny, "build_tiny_model", reached)


def checkpoint(folder: Path, config: dict, weight_bytes: int = 1 << 16) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    with open(folder / "model.safetensors", "wb") as f:
        f.truncate(weight_bytes)  # sparse: its size is what is checked
    return folder


def record(tmp_path: Path, *args) -> tuple[int, str]:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    code, _, err, _ = run_traces("record", "--prompts", prompts, "--out", tmp_path / "t.npz", "--device", "cpu", *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) <= 600, err
    return code, lines[0]


@HYP
@given(
    field=st.sampled_from(sorted(pfc.SIZE_LIMITS)),
    value=st.one_of(
        st.integers(0, 1 << 41),
        st.sampled_from([-1, 4097, 32768, 1 << 40, "8", True, 1.5, None]),
    ),
    nested=st.booleans(),
)
def test_a_config_reaches_transformers_only_within_the_bounds(tmp_path, no_transformers, field, value, nested):
    config = dict(BASE)
    if nested:
        config["text_config"] = {field: value}
    else:
        config[field] = value
    _, line = record(tmp_path, "--model", checkpoint(tmp_path / "ckpt", config))
    ok = value is None or (type(value) is int and 0 <= value <= pfc.SIZE_LIMITS[field])
    if not ok:
        assert SENTINEL not in line and field in line, line
    elif SENTINEL not in line:  # refused for another reason: the derived shape, or weights beyond the files
        assert "config.json" in line, line


@HYP
@given(
    hidden=st.integers(1, 1 << 20),
    vocab=st.integers(1, 1 << 24),
    layers=st.integers(1, 64),
    stored=st.integers(0, 1 << 34),
)
def test_weights_a_config_describes_beyond_its_files_are_refused_before_anything_is_built(
    tmp_path, no_transformers, hidden, vocab, layers, stored
):
    config = {
        **BASE,
        "hidden_size": hidden,
        "head_dim": 8,
        "vocab_size": vocab,
        "num_hidden_layers": layers,
        "intermediate_size": 64,
    }
    spec = pfc.derive_profile(config, "x", "config.json").spec()
    described = spec.dense_bytes + spec.moe_layers * spec.num_experts * spec.expert_bytes
    _, line = record(tmp_path, "--model", checkpoint(tmp_path / "ckpt", config, stored))
    refuse = described > MAX_WEIGHTS_PER_FILE_BYTE * stored + MAX_UNSTORED_WEIGHT_BYTES
    event("refused" if refuse else "reaches transformers")
    if refuse:
        assert SENTINEL not in line and "does not belong to its checkpoint" in line, line
    else:
        assert SENTINEL in line, line


@HYP
@given(name=names_near_the_rule(["\n", "\x1b", " ", "..", "/../", "\u2028", "\\"]))
def test_a_dataset_name_follows_the_model_name_rule_before_anything_runs(tmp_path, no_transformers, name):
    _, line = record(tmp_path, "--tiny", "mixtral", "--dataset", name)
    plain = name[0].isalnum() and name.isascii() and all(c in PLAIN_NAME_CHARS for c in name) and ".." not in name
    if plain:
        assert SENTINEL in line, line
    else:
        assert line.startswith("error: --dataset"), line


def test_a_checkpoint_path_with_a_control_character_is_refused(tmp_path, no_transformers):
    folder = checkpoint(tmp_path / "ck\x1bpt", dict(BASE))
    _, line = record(tmp_path, "--model", folder)
    assert SENTINEL not in line and "--model" in line and "control character" in line, line
