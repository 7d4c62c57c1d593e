"""`python -m traces record`: its arguments, prompts files and local
checkpoints, the trace's model name (``--name``), and the model profile and run config written beside the trace
(:mod:`traces.run_setup`); the recording itself is :func:`traces.record.recording.record_routing`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moebase.errors import InputError, OutputError, brief
from moebase.outputs import keep_staged
from traces.importers.common import (
    check_dataset_name,
    check_model_fit,
    check_model_name,
    check_out,
    plain_model_name,
)
from traces.io import file_kind
from traces.record.routers import find_moe_layers
from traces.run_setup import bundled_profile, check_bundled_fits, check_profile_fits, check_sim_files, write_sim_files

DTYPES = ("float32", "float16", "bfloat16", "auto")


@dataclass(frozen=True)
class Prompt:
    """One prompt of a prompts file: its request id and its text."""

    id: str
    text: str


#: The largest prompts file read (prompts for recording are a few KB; a tokenizer would choke long before this).
MAX_PROMPTS_BYTES = 64 << 20


def read_prompts(path: str | Path) -> list[Prompt]:
    """Prompts from a text file (one per non-blank line) or a ``.jsonl`` file (objects with a ``prompt`` string
    and optionally an ``id``). Raises InputError naming the file (and line) on bad input."""
    from moebase.files import read_text
    from traces.io import file_kind

    path = Path(path)
    kind = file_kind(path)
    if kind != "file":
        raise InputError(
            f"{path}: "
            + (
                "no such prompts file"
                if kind == "missing"
                else f"is {'a folder' if kind == 'folder' else kind}, not a prompts file"
            )
        )
    text = read_text(path, str(path), name_file=False, limit=MAX_PROMPTS_BYTES)
    prompts: list[Prompt] = []
    jsonl = path.suffix.lower() == ".jsonl"
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(Prompt(str(len(prompts)), line))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or "prompt" not in obj:
            raise InputError(f'{path}:{lineno}: expected an object with a "prompt" field')
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise InputError(f'{path}:{lineno}: "prompt" must be a non-empty string')
        rid = obj.get("id", len(prompts))
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise InputError(f'{path}:{lineno}: "id" must be a string or an integer')
        prompts.append(Prompt(str(rid), obj["prompt"]))
    if not prompts:
        raise InputError(f"{path}: no prompts in file")
    return prompts


def _check_checkpoint_folder(path: str) -> None:
    """``--model`` names a folder (checked before the prompts are read or torch is loaded) whose path is one
    printable line (the trace's provenance keeps it) and whose config's sizes are within bounds
    (:func:`check_checkpoint_config`); a file, a FIFO or a name too long is refused saying what it is."""
    kind = file_kind(path)
    if kind != "folder":
        what = "there is nothing there" if kind == "missing" else f"it is {kind}"
        raise InputError(f"--model: {brief(str(path))} is not a checkpoint folder ({what})")
    check_printable_path(path, "--model")
    check_checkpoint_config(path)


def check_printable_path(path: str | Path, flag: str) -> None:
    """A path that goes into the trace's metadata: one printable line."""
    if not str(path).isprintable():
        raise InputError(f"{flag}: {brief(str(path))} holds a control character (the trace's metadata keeps the path)")


#: How many times the bytes of its weight files a checkpoint's config may describe (files in bf16 loaded in fp32,
#: tied or small weights initialised rather than stored), plus MAX_UNSTORED_WEIGHT_BYTES: a config that describes
#: more does not belong to its files, and a model built from it would fill memory with weights that are not there.
MAX_WEIGHTS_PER_FILE_BYTE = 4
MAX_UNSTORED_WEIGHT_BYTES = 256 << 20
#: The files a checkpoint's weights are stored in.
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.msgpack", "*.h5")


def check_checkpoint_config(folder: str | Path) -> None:
    """The checkpoint's ``config.json`` (when it has one: else transformers says what is missing), read within its
    bound, every size in it within bounds (:func:`traces.profile_from_config.check_sizes`), and the weights it
    describes, when a profile can be derived from it, no more than its weight files can hold: all before
    transformers builds anything from it."""
    from traces.profile_from_config import DerivedProfile, check_sizes, derive_profile, read_config_file

    path = Path(folder) / "config.json"
    if file_kind(path) == "missing":
        return
    config = read_config_file(path, "--model")
    check_sizes(config, str(path))
    profile: DerivedProfile | None
    try:
        profile = derive_profile(config, "checkpoint", str(path))
    except InputError:
        profile = None  # not a layout read here: the sizes checked above still bound what is built
    if profile is not None:
        _check_weights_stored(profile.spec(), Path(folder), path)


def _check_weights_stored(spec, folder: Path, config: Path) -> None:
    described = spec.dense_bytes + spec.moe_layers * spec.num_experts * spec.expert_bytes
    stored = sum(f.stat().st_size for pattern in WEIGHT_FILES for f in folder.glob(pattern) if f.is_file())
    if described > MAX_WEIGHTS_PER_FILE_BYTE * stored + MAX_UNSTORED_WEIGHT_BYTES:
        raise InputError(
            f"{config}: describes {described / 2**30:.1f} GiB of weights but the checkpoint's weight files hold "
            f"{stored / 2**30:.1f} GiB: the config does not belong to its checkpoint (nothing is built from it)"
        )


def _torch_dtype(name: str):
    import torch

    return None if name == "auto" else getattr(torch, name)


def load_checkpoint(path: str | Path, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer) from a local checkpoint folder, never touching the network."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"--model: {path} is not a checkpoint folder")
    check_checkpoint_config(path)
    import transformers as tf

    try:
        config = tf.AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise InputError(f"--model {path}: cannot read its config ({_first_line(exc)})") from None
    auto = tf.AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else tf.AutoModelForCausalLM
    if _has_no_router(auto, config):
        raise InputError(f"no MoE router modules found in {path}")
    try:
        kwargs: dict[str, Any] = {"local_files_only": True}
        kwargs["dtype" if _accepts_dtype(tf) else "torch_dtype"] = "auto" if dtype == "auto" else _torch_dtype(dtype)
        model: Any = auto.from_pretrained(path, **kwargs)  # its .to() is typed too narrowly for a device name
    except Exception as exc:
        raise InputError(f"--model {path}: cannot load the model ({_first_line(exc)})") from None
    if not find_moe_layers(model):
        raise InputError(f"no MoE router modules found in {path}")
    try:
        tokenizer = tf.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise InputError(f"--model {path}: cannot load its tokenizer ({_first_line(exc)})") from None
    model.to(device)
    model.eval()
    return model, tokenizer


def _has_no_router(auto, config) -> bool:
    """True when the model built from ``config`` (weightless, on the meta device) has no MoE router: a dense
    checkpoint is then refused before its weights are read. False when that cannot be told this way."""
    import torch

    try:
        with torch.device("meta"):
            skeleton = auto.from_config(config)
    except Exception:
        return False
    return not find_moe_layers(skeleton)


def _accepts_dtype(tf) -> bool:
    return int(tf.__version__.split(".")[0]) >= 5


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# --------------------------------------------------------------------------- the command


def register(sub) -> None:
    p = sub.add_parser(
        "record",
        help="record expert routing of a Hugging Face MoE model on prompts",
        description="Greedy-decode prompts with a local MoE checkpoint or a tiny random model and "
        "record the experts its routers pick, with forward hooks, into a trace file.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="DIR", help="local checkpoint folder (loaded with local_files_only=True)")
    src.add_argument(
        "--tiny",
        metavar="ARCH",
        help="tiny random model: mixtral, qwen2-moe, olmoe, deepseek-v3 or switch (byte-level token ids, no tokenizer)",
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        required=True,
        help='one prompt per line, or .jsonl with a "prompt" field (and optional "id")',
    )
    p.add_argument("--out", metavar="FILE", required=True, help="trace file to write (.npz)")
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="generated tokens per request (32)")
    p.add_argument("--batch-size", type=int, default=1, metavar="N", help="prompts per padded batch (1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the tiny model's weights and torch (0)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="model dtype (float32; auto = the checkpoint's)")
    p.add_argument("--device", default="auto", help="torch device (auto: cuda if available, else cpu)")
    p.add_argument(
        "--dataset",
        metavar="NAME",
        help="provenance.dataset, a name like --name's (default: the prompts file name, made such a name)",
    )
    p.add_argument(
        "--name",
        metavar="NAME",
        help="model name stored in the trace (default: the checkpoint folder's name, or tiny-ARCH); a "
        "trace is simulated with the profile of this name in configs/models/ when there is one",
    )
    p.add_argument(
        "--no-run-config",
        action="store_true",
        help="write only the trace: no model profile (OUT.model.yaml) or run config (OUT.run.yaml) beside it",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from traces.io import save_trace
    from traces.record.recording import record_routing
    from traces.record.tiny_models import TINY_ARCHS

    if args.tiny is not None and args.tiny not in TINY_ARCHS:
        raise InputError(f"--tiny: unknown architecture {brief(args.tiny)} (choose from {', '.join(TINY_ARCHS)})")
    if args.max_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.seed < 0:
        raise InputError(f"--seed must be >= 0, got {args.seed}")
    if args.tiny is not None and args.dtype == "auto":
        raise InputError("--dtype auto needs --model (a tiny model has no checkpoint dtype)")
    out = check_out(args.out, [args.prompts])
    name = check_model_name(args.name, "--name") if args.name is not None else default_name(args)
    if args.dataset is not None:
        check_dataset_name(args.dataset)
    check_printable_path(args.prompts, "--prompts")
    where = (
        f"--name {brief(name)}"
        if args.name is not None
        else f"--model {brief(str(args.model))}"
        if args.model is not None
        else f"--tiny {args.tiny}"
    )
    files = None if args.no_run_config else check_sim_files(args.out)
    if args.model is not None:
        _check_checkpoint_folder(args.model)
    prompts = read_prompts(args.prompts)

    import torch

    from traces.record.tiny_models import build_tiny_model, encode_bytes

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise InputError(f"--device: unknown device {device!r}") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: CUDA is not available here")
    torch.manual_seed(args.seed)
    if args.tiny is not None:
        if device == "cpu":
            torch.set_num_threads(1)  # tiny matrices: extra threads only add synchronisation (much slower on 2 CPUs)
        model = build_tiny_model(args.tiny, args.seed, _torch_dtype(args.dtype)).to(device)
        source, tokenizer = f"tiny-{args.tiny}", "bytes (utf-8 byte b -> id b + 3)"
        token_ids = [encode_bytes(p.text) for p in prompts]
    else:
        model, tok = load_checkpoint(args.model, args.dtype, device)
        source, tokenizer = str(args.model), "checkpoint tokenizer"
        token_ids = [list(tok(p.text)["input_ids"]) for p in prompts]
    # after loading (a dense checkpoint is refused as such first), before recording
    profile = None if args.no_run_config else derived_profile(args, name, where)
    for p, ids in zip(prompts, token_ids):
        if not ids:
            raise InputError(f"{args.prompts}: prompt {p.id} has no tokens")
    rec = record_routing(
        model,
        token_ids,
        args.max_new_tokens,
        batch_size=args.batch_size,
        request_ids=[p.id for p in prompts],
        model_name=name,
        source_model=source,
        dataset=args.dataset or plain_model_name(Path(args.prompts).name, "prompts"),
        seed=args.seed,
        extra={"tokenizer": tokenizer, "device": str(device), "prompts_file": str(args.prompts)},
    )
    # a model named like a profiled one must have its shape; a derived profile must fit what was recorded
    check_model_fit(rec.trace, where, hint="give --name the name of the model recorded")
    if profile is not None and bundled_profile(name) is None:
        check_profile_fits(rec.trace.meta, profile)
    save_trace(rec.trace, out)
    t = rec.trace
    print(
        f"{out}: recorded {t.num_tokens} tokens ({int(t.prefill_lengths.sum())} prompt, "
        f"{int(t.decode_mask().sum())} generated), {t.num_requests} requests, {t.num_layers} MoE layers, "
        f"model {name}"
    )
    if files is not None:
        try:
            lines = write_sim_files(
                out, files, profile, "python -m traces record", getattr(args, "make_run_config", None)
            )
        except OutputError:
            raise
        except InputError as exc:
            keep_staged()
            raise InputError(f"{exc} (the trace {out} is written; no run config)") from None
        for line in lines:
            print(line)
    return 0


def default_name(args) -> str:
    """The trace's model name without ``--name``: ``tiny-ARCH``, or the checkpoint folder's last part made a plain
    name (``ORG/NAME`` for a Hugging Face cache snapshot), never a path."""
    if args.tiny is not None:
        return f"tiny-{args.tiny}"
    return plain_model_name(os.path.abspath(args.model))


def derived_profile(args, name: str, where: str):
    """The model profile of the recorded model, derived from its config once it is loaded and before anything is
    recorded (a config it cannot be derived from fails here, in one line). None when a bundled profile of ``name``
    exists; the model's shape is then checked against it, when its config tells it."""
    stem = bundled_profile(name)
    try:
        profile = _derive(args, name)
    except InputError as exc:
        if stem is not None:  # the bundled profile is used; the recorded routing is checked against it
            return None
        raise InputError(f"{exc} (or give --no-run-config to record the trace alone)") from None
    if stem is None:
        return profile
    check_bundled_fits(profile, stem, where)
    return None


def _derive(args, name: str):
    from traces.profile_from_config import DTYPE_BYTES, derive_profile, read_config_file

    if args.tiny is not None:
        from traces.record.tiny_models import tiny_config

        return derive_profile(
            tiny_config(args.tiny).to_dict(),
            name,
            f"the tiny {args.tiny} config",
            DTYPE_BYTES[args.dtype],
            f"a tiny model, recorded in {args.dtype}",
        )
    path = Path(args.model) / "config.json"
    config = read_config_file(path, "--model")
    dtype = "float32" if args.dtype == "auto" else args.dtype  # transformers loads a config without one in fp32
    return derive_profile(config, name, str(path), DTYPE_BYTES[dtype], f"recorded in {dtype}")
