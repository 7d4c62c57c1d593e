"""Small pieces the importers share: the default expert count of a model, request offsets, rows of requests."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from traces.errors import InputError

#: The project's model profiles (``configs/models/NAME.yaml``), read only for their ``num_experts``.
MODEL_PROFILES = Path(__file__).resolve().parent.parent / "configs" / "models"
_SUFFIX = re.compile(r"-(\d+)$")


def default_num_experts(model: str, largest_id: int | None = None) -> tuple[int, str]:
    """Experts per MoE layer of ``model`` when ``--num-experts`` is not given, and where the number came from:
    the model profile ``configs/models/MODEL.yaml``, else the name's numeric suffix (``switch-base-128`` -> 128),
    else the data (largest id + 1) when ``largest_id`` is given. Raises InputError when none applies."""
    n = _profile_num_experts(model)
    if n is not None:
        return n, f"model profile configs/models/{model}.yaml"
    m = _SUFFIX.search(model)
    if m and int(m.group(1)) > 0:
        return int(m.group(1)), f"the model name {model!r}"
    if largest_id is not None and largest_id >= 0:
        return int(largest_id) + 1, "the data (largest expert id + 1)"
    raise InputError(f"--num-experts: not given, and model {model!r} has no profile in configs/models/ "
                     f"and no numeric suffix to take it from")


def _profile_num_experts(model: str) -> int | None:
    """``num_experts`` of a model profile file, or None when there is no such file or it does not say."""
    if "/" in model or "\\" in model or model.startswith("."):
        return None
    path = MODEL_PROFILES / f"{model}.yaml"
    if not path.is_file():
        return None
    try:
        import yaml

        d = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception:  # an unreadable profile is the simulator's problem to report, not the importer's
        return None
    n = d.get("num_experts") if isinstance(d, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def offsets_from_lengths(lengths) -> np.ndarray:
    """int64 [R + 1] request offsets from R request lengths."""
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))]).astype(np.int64)


def rows_of_requests(offsets: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """int64: the rows of requests ``kept`` (indices into ``offsets``), request after request, in order."""
    starts = offsets[kept]
    lengths = offsets[kept + 1] - starts
    total = int(lengths.sum())
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


def parse_index_list(spec: str, count: int, what: str, flag: str, where: str) -> list[int]:
    """Indices from ``"all"`` or a comma list of 0-based indices and inclusive ranges (``1-4``, ``2-`` to the
    end), checked against the ``count`` items (``what``, e.g. "run") that ``where`` (a file) holds; returns them
    sorted without repeats. Bad specs raise InputError naming the flag and the file."""
    spec = spec.strip()
    if spec == "all":
        return list(range(count))
    held = f"{where} holds {count} {what}{'' if count == 1 else 's'}: 0..{count - 1}"
    chosen: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d*))?", part)
        if not m:
            raise InputError(f"{flag}: expected 'all' or indices and ranges like 0,2 or 1-4 or 1-, got {part!r}")
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else (count - 1 if m.group(2) == "" else int(m.group(2)))
        if hi < lo or hi >= count:
            missing = lo if lo >= count else hi
            raise InputError(f"{flag}: {what} {missing} does not exist ({held})" if missing >= count
                             else f"{flag}: range {part!r} is empty")
        chosen.update(range(lo, hi + 1))
    return sorted(chosen)
