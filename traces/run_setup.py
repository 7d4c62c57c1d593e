"""What makes a recorded or imported trace simulate in one command: beside the trace ``t.npz``, a model profile
``t.model.yaml`` (derived from the checkpoint's config by :mod:`traces.profile_from_config`, unless a bundled profile
in ``configs/models/`` matches the trace's model name, which is then used and nothing is written for it) and a run
config ``t.run.yaml``: that profile, the trace, one H200 (``configs/hardware/h200.yaml``), LRU over half of each
layer's experts (fewer when they would not fit beside the dense weights), batch 1, no predictor. Then
``python -m sim run t.run.yaml``.

Paths in the run config are absolute, so it loads from any folder (a relative path would be looked up in the
current folder and then the project root: :func:`moebase.files.resolve_path`). Both files are checked as output
places before any work (:func:`check_sim_files`) and written atomically; the run config is checked by the simulator's
own loader before it is written.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moebase.errors import InputError, OutputError, TraceError, brief, one_line
from moebase.outputs import keep_staged, staged_path
from traces.profile_from_config import DerivedProfile, comment_lines

#: Makes the run config of a trace: (model spec, the profile as the run config names it, trace path, trace
#: summary) -> mapping; InputError when none loads. The simulator's is ``sim.config.trace_run.default_run_config``,
#: handed in by the entry point (``traces/__main__.py``), so that the trace tools import nothing of the simulator.
RunConfigMaker = Callable[[Any, Any, Path, Any], dict]


@dataclass(frozen=True)
class SimFiles:
    """The model profile and run config written beside a trace file."""

    model: Path
    run: Path

    @classmethod
    def beside(cls, trace_path: str | Path) -> SimFiles:
        """``t.model.yaml`` and ``t.run.yaml`` for the trace ``t.npz`` (``t.trace`` gives ``t.trace.model.yaml``)."""
        path = Path(trace_path)
        stem = path.name[:-4] if path.name.lower().endswith(".npz") and len(path.name) > 4 else path.name
        return cls(path.with_name(f"{stem}.model.yaml"), path.with_name(f"{stem}.run.yaml"))


def check_sim_files(trace_path: str | Path, flag: str = "--out") -> SimFiles:
    """The profile and run config places beside ``trace_path``, checked before any work (a folder, FIFO or device
    there, or at ``trace_path`` itself, is refused: :func:`traces.io.check_output_file`); InputError naming
    ``flag``."""
    from traces.io import check_output_file

    try:  # the trace's own place first: an empty or folder path has no place beside it
        check_output_file(trace_path, "trace file")
    except TraceError as exc:
        raise InputError(f"{flag} {brief(str(trace_path))}: {exc.problem}") from None
    files = SimFiles.beside(trace_path)
    for path, what in ((files.model, "model profile"), (files.run, "run config")):
        try:
            check_output_file(path, what)
        except TraceError as exc:
            raise InputError(f"{flag} {brief(str(trace_path))}: the {what} beside it, {exc}") from None
    return files


def bundled_profile(name: str) -> str | None:
    """The name of the bundled profile (``configs/models/NAME.yaml``) a trace of model ``name`` is simulated with,
    by the simulator's own name rule; None when there is none."""
    from traces.importers.common import profiles_for

    matches = profiles_for(name)
    return matches[0][0] if matches else None


def write_sim_files(
    trace_path: str | Path,
    files: SimFiles,
    profile: DerivedProfile | None,
    made_by: str,
    make_run_config: RunConfigMaker | None,
) -> list[str]:
    """Write the profile (when no bundled one matches the trace's model) and the run config for the trace saved at
    ``trace_path`` (its header is read, not its routing); returns the lines to print, the last one the command that
    simulates it. InputError when the derived profile does not fit the trace (another expert count, top-k or MoE
    layers) or the run config does not load (e.g. the dense weights alone exceed the GPU)."""
    from moebase.model import load_model
    from moebase.outputs import atomic_write_bytes
    from traces.summary import read_trace_summary

    trace = read_trace_summary(staged_path(trace_path))
    name = trace.meta.model.name
    stem = bundled_profile(name)
    if stem is not None:
        model_value: str | dict = stem
        spec, model_ref = load_model(stem), stem
    elif profile is None:
        raise ValueError("a trace without a bundled profile needs a derived one")
    else:
        check_profile_fits(trace.meta, profile)
        spec, model_ref, model_value = profile.spec(), str(Path(files.model).resolve()), profile.fields
    if make_run_config is None:
        raise InputError("no run config: this command line was started without the simulator (python -m traces)")
    run = make_run_config(spec, model_value, Path(trace_path), trace)
    lines = []
    if stem is None:
        assert profile is not None  # checked above: no bundled profile needs a derived one
        atomic_write_bytes(files.model, profile.yaml_text(made_by).encode("utf-8"))
        said = f"{len(profile.assumptions)} assumption{'' if len(profile.assumptions) == 1 else 's'} listed in it"
        lines.append(
            f"{files.model}: model profile {brief(name)} derived from {one_line(profile.source, 200)} ({said})"
        )
    run["model"] = model_ref
    atomic_write_bytes(files.run, run_config_text(run, trace_path, stem, made_by).encode("utf-8"))
    lines.append(
        f"{files.run}: run config ({'bundled profile ' + stem if stem else 'that profile'}, "
        f"{run['hardware']}, {run['policy']['name']} with {run['cache']['mpc_slots']} of {spec.num_experts} "
        f"experts per layer cached)"
    )
    lines.append(f"simulate it: python -m sim run {shlex.quote(str(files.run))}")
    return lines


def check_profile_fits(meta, profile: DerivedProfile) -> None:
    """InputError when a trace (its :class:`~traces.format.TraceMeta`) is not of the derived profile's model (what
    differs, whole)."""
    from traces.importers.common import meta_summary
    from traces.summary import model_mismatch

    problem = model_mismatch(meta_summary(meta), profile.spec())
    if problem:
        raise InputError(
            f"the model profile derived from {one_line(profile.source, 200)} does not fit the routing: {problem}"
        )


def check_bundled_fits(profile: DerivedProfile, stem: str, where: str) -> None:
    """InputError naming ``where`` when the model a config describes (``profile``) is not of the shape of the bundled
    profile ``stem`` its name matches: checked before recording, which the simulator would refuse."""
    from moebase.model import load_model
    from traces.importers.common import meta_like, meta_summary
    from traces.summary import model_mismatch

    problem = model_mismatch(
        meta_summary(meta_like(profile.name, profile.spec())),
        load_model(stem),
        f"the model of {one_line(profile.source, 200)},",
    )
    if problem:
        raise InputError(
            f"{where}: {problem} (the profile: configs/models/{stem}.yaml), so every run of it would "
            f"refuse the trace (give --name the name of the model recorded)"
        )


# --------------------------------------------------------------------------------------------- the run config
def run_config_text(run: dict, trace_path: str | Path, stem: str | None, made_by: str) -> str:
    """The run config file: what it runs, in comments, then the mapping."""
    import yaml

    source = f"bundled profile configs/models/{stem}.yaml" if stem else "the model profile beside it"
    head = comment_lines(
        [
            f"Run config for the trace {Path(trace_path).name}, written by {made_by}: {source}, one H200, "
            f"LRU at batch 1 with {run['cache']['mpc_slots']} experts per layer cached and "
            f"{run['cache']['lpc_buffers']} working buffers, no predictor. Paths are absolute: it loads from any "
            "folder.",
            "Run: python -m sim run THIS_FILE [--set key.path=value ...] (e.g. --set policy.name=diffmoe)",
        ]
    )
    return "\n".join(head) + "\n" + yaml.safe_dump(run, sort_keys=False, default_flow_style=False)


# --------------------------------------------------------------------------------------------- imports
def add_hf_config_flag(parser) -> None:
    """Give an import format's parser ``--hf-config`` and ``--no-run-config`` and wrap its command: every import
    writes a run config beside ``--out`` (and a model profile derived from ``--hf-config`` when ``--model`` names no
    bundled profile) and prints the command that simulates it, as ``traces record`` does."""
    parser.add_argument(
        "--hf-config",
        metavar="CONFIG_JSON",
        default=None,
        help="the checkpoint's config.json: when --model has no profile in configs/models/, derive "
        "one and write OUT.model.yaml beside the trace (and OUT.run.yaml with it)",
    )
    parser.add_argument(
        "--no-run-config",
        action="store_true",
        help="write only the trace: no run config (OUT.run.yaml) or model profile (OUT.model.yaml) beside it",
    )
    parser.set_defaults(func=functools.partial(run_import, parser.get_default("func")))


def run_import(command, args) -> int:
    """An import command, then its sim files, as ``traces record`` writes them: the run config (and, with
    ``--hf-config``, the profile derived before the import reads anything) and the command that simulates it; with
    no profile of the trace's model and no ``--hf-config``, one line saying how to get one."""
    from traces.importers.common import check_dataset_name, check_model_name, check_name

    check_model_name(args.model)  # the names every format puts in the trace's metadata, before anything is read
    if getattr(args, "source_model", None) is not None:
        check_name(args.source_model, "--source-model", "checkpoint name")
    if getattr(args, "dataset", None) is not None:
        check_dataset_name(args.dataset)
    if args.no_run_config and args.hf_config is not None:
        raise InputError("--no-run-config: --hf-config only serves the run config; give one of the two")
    files = None if args.no_run_config else check_sim_files(args.out)
    profile = _import_profile(args)
    try:
        code = _imported(command, args, profile)
    except OutputError:
        raise
    except InputError as exc:  # a message naming a file deep in long folders: the path cut, not the message
        from traces.importers.common import with_short_paths

        given = [
            *(getattr(args, "files", None) or []),
            getattr(args, "file", None),
            *(getattr(args, "outputs", None) or []),
        ]
        raise with_short_paths(exc, given) from None
    if code or files is None:
        return code
    for line in _import_sim_files(args, files, profile):
        print(line)
    return 0


def _imported(command, args, profile: DerivedProfile | None) -> int:
    """Run the import command, its trace held to the profile ``--hf-config`` derived (when there is one)."""
    if profile is None:
        return command(args)
    from traces.importers.common import also_checked_against

    with also_checked_against(f"derived from --hf-config {one_line(str(args.hf_config), 200)}", profile.spec()):
        return command(args)


def _import_profile(args) -> DerivedProfile | None:
    """The profile ``--hf-config`` derives (read and checked before the import reads its input); None without it
    or when ``--model`` names a bundled profile."""
    from traces.profile_from_config import derive_profile, read_config_file

    if args.hf_config is None:
        return None
    config = read_config_file(args.hf_config)
    return derive_profile(config, args.model, f"{args.hf_config}") if bundled_profile(args.model) is None else None


def _import_sim_files(args, files: SimFiles, profile: DerivedProfile | None) -> list[str]:
    """The lines to print after an import: what :func:`write_sim_files` wrote, or how to get a profile when the
    trace's model has none. The trace is kept (and the command fails in one line) when no run config loads."""
    from traces.summary import read_trace_summary

    name = read_trace_summary(staged_path(args.out)).meta.model.name
    if profile is None and bundled_profile(name) is None:
        return [
            f"note: no model profile in configs/models/ is of {brief(name)}, so no run config: give --hf-config "
            f"CONFIG_JSON (the checkpoint's config.json) to write {files.model.name} and {files.run.name} beside the "
            f"trace, or write configs/models/{name.rsplit('/', 1)[-1]}.yaml by hand (fields: "
            "moebase/model.py)"
        ]
    try:
        return write_sim_files(
            args.out, files, profile, "python -m traces import", getattr(args, "make_run_config", None)
        )
    except OutputError:
        raise
    except InputError as exc:
        keep_staged()
        flag = "--hf-config: " if args.hf_config is not None else ""
        raise InputError(
            f"{flag}{exc} (the trace {one_line(str(args.out), 200)} is written; no run config: --no-run-config "
            "writes the trace alone)"
        ) from None


__all__ = [
    "RunConfigMaker",
    "SimFiles",
    "add_hf_config_flag",
    "bundled_profile",
    "check_bundled_fits",
    "check_profile_fits",
    "check_sim_files",
    "run_config_text",
    "run_import",
    "write_sim_files",
]
