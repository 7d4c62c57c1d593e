"""A command's outputs appear together or not at all, and an output never replaces one of the command's inputs.

Every command that writes is run with a write fault injected at each of its writes in turn (ENOSPC, EROFS, EFBIG,
EDQUOT: a full disk, a read-only mount, a file-size limit, a quota): it exits 2 with one line naming the file, leaves
its output place exactly as it was (no file, no temporary, no folder it made), and a rerun without the fault then
writes everything. A real file-size limit (RLIMIT_FSIZE, a subprocess) does the same without any injection. And an
output place that is one of the command's inputs (by the same name, another spelling, a symbolic or a hard link) is
refused with the input left as it was.

The commands are listed here once (``COMMANDS``): a new command that writes is one more row."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.paths import ROOT

FAULTS = (errno.ENOSPC, errno.EROFS, errno.EFBIG, errno.EDQUOT)
VALIDATION_ARCHIVE = ROOT / "docs" / "validation" / "h200-2026-11-30-s4-base" / "gpu-check.tar.gz"


# --------------------------------------------------------------------------------------------- the commands
def _tiny_sweep(tmp: Path) -> Path:
    path = tmp / "tiny-sweep.yaml"
    sweep = {
        "name": "tiny",
        "base": str(ROOT / "configs" / "switch_xxl.yaml"),
        "set": {"workload.requests": 1, "workload.max_decode_tokens": 2},
        "grid": {"policy.name": ["on-demand", "lru"]},
    }
    path.write_text(yaml.safe_dump(sweep))
    return path


def _routing(tmp: Path) -> Path:
    rng = np.random.default_rng(1)
    path = tmp / "routing.npz"
    np.savez(path, expert_ids=np.argsort(rng.random((10, 2, 8)), axis=2)[:, :, :2].astype(np.int16))
    return path


def _hf_config(tmp: Path) -> Path:
    """A Mixtral-style config.json of 2 MoE layers with 8 experts, top-2 (the routing above)."""
    config = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 300,
        "torch_dtype": "bfloat16",
    }
    path = tmp / "config.json"
    path.write_text(json.dumps(config))
    return path


def _measured(tmp: Path) -> Path:
    """One measured fit row for ``sim fit-system`` (the columns of a published rows file)."""
    path = tmp / "measured.csv"
    path.write_text(
        "row,source,system,variant,model,expert_format,dense_format,gpu,host,pcie,batch,prompt_tokens,"
        "decode_tokens,gpu_experts_per_layer,published_tok_s,role\n"
        "mine,test,mixtral-offloading,none,mixtral-8x7b-instruct,hqq-2bit,hqq-4bit,a100-sxm4-80gb,server,gen4,"
        "1,,,0,2.0,fit\n"
    )
    return path


def _prompts(tmp: Path) -> Path:
    path = tmp / "prompts.txt"
    path.write_text("hello\nworld\n")
    return path


def _archive(tmp: Path) -> Path:
    folder = tmp / "measured"
    folder.mkdir(exist_ok=True)
    return Path(shutil.copy(VALIDATION_ARCHIVE, folder / "gpu-check.tar.gz"))


#: name -> (package, arguments given the output place and a scratch folder, where the outputs go given the place)
Command = tuple[str, Callable[[Path, Path], list], Callable[[Path, Path], Path]]
COMMANDS: dict[str, Command] = {
    "sim run": (
        "sim",
        lambda out, tmp: ["run", "configs/switch_xxl.yaml", "--set", "workload.requests=1", "--out", out],
        lambda out, tmp: out,
    ),
    "sim run --timeline": (
        "sim",
        lambda out, tmp: ["run", "configs/switch_xxl.yaml", "--set", "workload.requests=1", "--timeline", "--out", out],
        lambda out, tmp: out,
    ),
    "sim compare": (
        "sim",
        lambda out, tmp: [
            "compare",
            "configs/switch_xxl.yaml",
            "--policies",
            "on-demand,lru",
            "--set",
            "workload.requests=1",
            "--out",
            out,
        ],
        lambda out, tmp: out,
    ),
    "sim sweep": (
        "sim",
        lambda out, tmp: ["sweep", _tiny_sweep(tmp), "--workers", "1", "--quiet", "--out", out],
        lambda out, tmp: out,
    ),
    "sim fit-system": (
        "sim",
        lambda out, tmp: [
            "fit-system",
            "--measured",
            _measured(tmp),
            "--system",
            "mixtral-offloading",
            "--hardware",
            "a100-sxm4-80gb",
            "--out",
            out.with_suffix(".yaml"),
        ],
        lambda out, tmp: out.with_suffix(".yaml"),
    ),
    "sim advise": (
        "sim",
        lambda out, tmp: [
            "advise",
            "configs/switch_base_real.yaml",
            "--policies",
            "lru",
            "--quick",
            "--max-candidates",
            "1",
            "--json",
            out.with_suffix(".json"),
        ],
        lambda out, tmp: out.with_suffix(".json"),
    ),
    "sim capacity": (
        "sim",
        lambda out, tmp: [
            "capacity",
            "configs/gpt_oss_20b.yaml",
            "--set",
            "workload.max_decode_tokens=2",
            "--set",
            "predictor.name=none",
            "--requests",
            "2",
            "--seeds",
            "0",
            "--slo",
            "ttft=100",
            "--json",
            out.with_suffix(".json"),
        ],
        lambda out, tmp: out.with_suffix(".json"),
    ),
    "traces synth": (
        "traces",
        lambda out, tmp: ["synth", "--experts", "8", "--top-k", "2", "--layers", "2", "--requests", "1", "--out", out],
        lambda out, tmp: out,
    ),
    "traces import --hf-config": (
        "traces",
        lambda out, tmp: [
            "import",
            "expert-arrays",
            _routing(tmp),
            "--model",
            "toy-moe",
            "--num-experts",
            "8",
            "--hf-config",
            _hf_config(tmp),
            "--out",
            out.with_suffix(".npz"),
        ],
        lambda out, tmp: out.with_suffix(".npz"),
    ),
    "traces record": (
        "traces",
        lambda out, tmp: [
            "record",
            "--tiny",
            "mixtral",
            "--prompts",
            _prompts(tmp),
            "--max-new-tokens",
            "2",
            "--out",
            out.with_suffix(".npz"),
        ],
        lambda out, tmp: out.with_suffix(".npz"),
    ),
    "validate compare": (
        "validate",
        lambda out, tmp: ["compare", _archive(tmp)],
        lambda out, tmp: tmp / "measured" / "gpu-check" / "compare",
    ),
}


def _main(package: str):
    if package == "sim":
        from sim.cli import main
    elif package == "traces":
        from tests.support.cli import traces_main as main
    else:
        from validate.cli import main
    return main


def _run(package: str, args: list) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = _main(package)([str(a) for a in args])
    return code, err.getvalue()


def _state(folder: Path, keep: Callable[[Path], bool] = lambda p: False) -> dict:
    """Every entry under ``folder`` (kind and size), but those ``keep`` says a failed command may leave."""
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): (p.is_dir(), p.stat().st_size if p.is_file() else 0)
        for p in sorted(folder.rglob("*"))
        if not keep(p.relative_to(folder))
    }


def _resume_state(name: str) -> Callable[[Path], bool]:
    """What a command keeps on purpose when it fails later: a sweep's finished rows (``--resume`` continues from
    them) and its lock file, and the unpacked measurement of ``validate compare`` (a complete unpack, reused)."""
    if name == "sim sweep":  # under out/: result/, result/rows/..., result/.sweep.lock
        return lambda rel: len(rel.parts) == 1 or rel.parts[1] in ("rows", ".sweep.lock")
    if name == "validate compare":  # under measured/: the archive, its lock and its unpacked folder
        return lambda rel: "compare" not in rel.parts
    return lambda rel: False


class _Fault:
    """Replaces the one place file content is written: counts the writes, and fails the ``at``-th with ``code``."""

    def __init__(self, at: int | None, code: int = errno.ENOSPC):
        self.at, self.code, self.calls, self.hit = at, code, 0, None

    def __call__(self, f, data: bytes) -> None:
        self.calls += 1
        if self.at is not None and self.calls - 1 == self.at:
            self.hit = f.name
            raise OSError(self.code, os.strerror(self.code))
        f.write(data)


def _setup(name: str, tmp_path: Path, monkeypatch) -> tuple[str, list, Path, Path]:
    package, argv, where = COMMANDS[name]
    monkeypatch.chdir(ROOT)
    scratch = tmp_path / "in"
    scratch.mkdir(parents=True, exist_ok=True)
    place = tmp_path / "out" / "result"
    place.parent.mkdir(exist_ok=True)
    args = argv(place, scratch)
    watched = tmp_path / "out" if package != "validate" else scratch / "measured"
    return package, args, where(place, scratch), watched


# --------------------------------------------------------------------------------------------- write faults
def _writes(name: str, tmp_path: Path, monkeypatch) -> int:
    """How many files the command writes (a clean run in a scratch copy of the set-up)."""
    import moebase.outputs

    package, args, _, _ = _setup(name, tmp_path / "count", monkeypatch)
    fault = _Fault(None)
    monkeypatch.setattr(moebase.outputs, "_write_all", fault)
    code, err = _run(package, args)
    assert code == 0, err
    return fault.calls


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_write_fault_at_any_write_leaves_nothing_and_a_rerun_then_works(tmp_path, monkeypatch, name):
    import moebase.outputs

    n = _writes(name, tmp_path, monkeypatch)
    assert n >= 1
    keep = _resume_state(name)
    for at in sorted({0, n // 2, n - 1}):
        case = tmp_path / f"fault-{at}"
        case.mkdir()
        package, args, outputs, watched = _setup(name, case, monkeypatch)
        before = _state(watched, keep)
        fault = _Fault(at, FAULTS[at % len(FAULTS)])
        monkeypatch.setattr(moebase.outputs, "_write_all", fault)
        code, err = _run(package, args)
        last = err.strip().splitlines()[-1]  # progress lines may come before it
        assert code == 2, (at, err)
        assert err.count("error: ") == 1 and last.startswith("error: ") and len(last) <= 800, err
        assert "cannot be written" in last and os.strerror(fault.code) in last, last
        assert _state(watched, keep) == before, (at, last)  # nothing new, no temporary, no folder made
        monkeypatch.setattr(moebase.outputs, "_write_all", _Fault(None))
        code, err = _run(package, [*args, "--resume"] if name == "sim sweep" else args)
        assert code == 0, err
        assert outputs.exists()


def _limit_fsize(limit: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_real_file_size_limit_fails_the_run_whole_with_one_line(tmp_path):
    """``sim run --timeline`` under RLIMIT_FSIZE just below its largest file: the system itself refuses the write
    (EFBIG), the run exits 2 naming that file, and none of its files appear."""
    args = [
        sys.executable,
        "-m",
        "sim",
        "run",
        "configs/switch_xxl.yaml",
        "--set",
        "workload.requests=2",
        "--timeline",
    ]
    clean = subprocess.run([*args, "--out", str(tmp_path / "clean")], cwd=ROOT, capture_output=True, timeout=300)
    assert clean.returncode == 0, clean.stderr
    sizes = {p.name: p.stat().st_size for p in (tmp_path / "clean").iterdir()}
    largest = max(sizes, key=lambda k: sizes[k])
    assert sorted(sizes.values())[-2] < sizes[largest]  # a limit can fail the largest file alone
    res = subprocess.run(
        [*args, "--out", str(tmp_path / "limited")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_fsize(sizes[largest] - 1),
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and largest in lines[0] and os.strerror(errno.EFBIG) in lines[0], res.stderr
    assert not (tmp_path / "limited").exists()


# --------------------------------------------------------------------------------------------- outputs that are inputs
def _alias(target: Path, how: str, place: Path) -> Path:
    """``place`` made another name of ``target`` (or ``target`` itself, spelt another way)."""
    if how == "same name":
        return target
    if how == "another spelling":
        return target.parent / "." / target.name
    place.parent.mkdir(parents=True, exist_ok=True)
    if how == "symbolic link":
        place.symlink_to(target)
    else:
        os.link(target, place)
    return place


#: name -> arguments given (the input, the output place), the input made in a scratch folder, its file name
ALIASED: dict[str, tuple[str, Callable[[Path, Path], list], Callable[[Path], Path]]] = {
    "sim run: config.resolved.yaml is the config": (
        "sim",
        lambda given, out: ["run", given, "--set", "workload.requests=1", "--out", out.parent],
        lambda tmp: Path(shutil.copy(ROOT / "configs" / "switch_xxl.yaml", tmp / "config.resolved.yaml")),
    ),
    "sim fit-system: --out is --measured": (
        "sim",
        lambda given, out: [
            "fit-system",
            "--measured",
            given,
            "--system",
            "mixtral-offloading",
            "--hardware",
            "a100-sxm4-80gb",
            "--out",
            out,
        ],
        _measured,
    ),
    "sim fit-system: --out is the --hardware file": (
        "sim",
        lambda given, out: [
            "fit-system",
            "--measured",
            _measured(given.parent),
            "--system",
            "mixtral-offloading",
            "--hardware",
            given,
            "--out",
            out,
        ],
        lambda tmp: Path(shutil.copy(ROOT / "configs" / "hardware" / "a100-sxm4-80gb.yaml", tmp / "hw.yaml")),
    ),
    "sim advise: --json is the config": (
        "sim",
        lambda given, out: ["advise", given, "--policies", "lru", "--quick", "--max-candidates", "1", "--json", out],
        lambda tmp: Path(shutil.copy(ROOT / "configs" / "switch_base_real.yaml", tmp / "advise.yaml")),
    ),
    "traces synth: --out is --fit": (
        "traces",
        lambda given, out: ["synth", "--fit", given, "--requests", "1", "--out", out],
        lambda tmp: Path(shutil.copy(ROOT / "traces" / "data" / "switch_base_128_real_b1.npz", tmp / "fit.npz")),
    ),
    "published_systems.py: --json is --rows": (
        "benchmark",
        lambda given, out: ["--rows", given, "--json", out],
        _measured,
    ),
}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=st.sampled_from(sorted(ALIASED)),
    how=st.sampled_from(["same name", "another spelling", "symbolic link", "hard link"]),
)
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path_factory, monkeypatch, case, how):
    package, argv, make = ALIASED[case]
    tmp = tmp_path_factory.mktemp("alias")
    monkeypatch.chdir(ROOT)
    given_file = make(tmp)
    before = given_file.read_bytes()
    out = _alias(given_file, how, tmp / "out" / given_file.name)
    if package == "benchmark":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        try:
            import published_systems
        finally:
            sys.path.pop(0)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = published_systems.main([str(a) for a in argv(given_file, out)])
        err_text = err.getvalue()
    else:
        code, err_text = _run(package, argv(given_file, out))
    lines = err_text.strip().splitlines()
    assert code == 2, err_text
    assert len(lines) == 1 and "replace" in lines[0], err_text
    assert given_file.read_bytes() == before
