"""Fit a serving system's software constants to measured tokens/s, and predict other configurations with them.

A *rows file* (CSV) lists measurements, one per line, with the columns :data:`COLUMNS`:

- ``row``: an id; ``source``: where the figure comes from; ``system``: a serving system of :data:`SYSTEMS`
  (``mixtral-offloading``, ``fiddler``, ``ktransformers``, ``llama.cpp``, ``deepspeed``); ``variant``: the system's
  mode (mixtral-offloading ``full`` | ``lru`` | ``none`` | ``naive`` (accelerate's offloading), another by its
  slots; llama.cpp ``n-cpu-moe=N``, N at most the model's MoE layers; others any plain name);
- ``model``: a profile of ``configs/models/`` (``mixtral-8x7b-instruct`` is ``mixtral-8x7b``; blank: ``--model``,
  which may also be a profile's path, as a run config's ``model`` is), replaying its bundled trace (:data:`TRACES`)
  or ``--trace``; ``expert_format``/``dense_format``: weight formats ``sim.config.system.format_bits`` reads (blank:
  the system profile's);
- ``gpu``, ``host``, ``pcie``: the machine: a bundled profile of the same parts, or one composed from them
  (:func:`hardware_of`; a GPU or CPU without a bundled part is refused, never replaced);
- ``batch``, ``prompt_tokens``, ``decode_tokens``: the workload (decode-only traces: the prompt is not simulated);
- ``gpu_experts_per_layer``: experts kept on the GPU per MoE layer (blank: the system's own rule);
- ``measured_tok_s``: the decode tokens/s measured on the machine (blank: unknown; ``published_tok_s``, the column's
  name in the published rows, is its alias); ``role``: ``fit`` (used to fit the constants) or ``predict`` (only
  predicted; its measured value is never read while fitting).

Each system fits one constant (:data:`FITTED`), per GPU where the software's cost depends on the GPU
(``per_gpu``): on the ``fit`` rows only, by bisection on the mean log error of the simulated tokens/s (monotone in
the constant), so that one fit row is matched exactly and several in geometric mean. A row whose GPU has no fit
row of its own takes the fit over all the system's fit rows.

``python -m sim fit-system --measured MY.csv --system NAME --hardware HW --out my-system.yaml`` fits a user's
machine (every row on ``--hardware``) and writes a system profile ``{base: NAME, CONSTANT: value}``;
``benchmarks/published_systems.py --rows ROWS.csv`` checks the published rows. A bad file raises ConfigError naming
the file, the row and the problem. The file is a regular file of at most :data:`MAX_FILE_BYTES` (UTF-8), its header
names each column once; name cells (:data:`NAME_COLUMNS`) are plain names (:data:`NAME`), the others printable
text of bounded length, numbers plain ASCII decimals; what is printed from the rows is escaped
(:func:`table_cell`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moebase.errors import ConfigError, brief, one_line
from moebase.files import PROJECT_ROOT

COLUMNS = (
    "row",
    "source",
    "system",
    "variant",
    "model",
    "expert_format",
    "dense_format",
    "gpu",
    "host",
    "pcie",
    "batch",
    "prompt_tokens",
    "decode_tokens",
    "gpu_experts_per_layer",
    "measured_tok_s",
    "role",
)
#: Other names a header may give a column: the published rows' name of the measured figure.
COLUMN_ALIASES = {"published_tok_s": "measured_tok_s"}
#: What each column holds (``sim fit-system --help``).
COLUMN_HELP = {
    "row": "an id of the row (a plain name)",
    "source": "where the figure comes from (free text)",
    "system": "the serving system (blank: --system)",
    "variant": "the system's mode: mixtral-offloading full|lru|none|naive, llama.cpp n-cpu-moe=N, else any name",
    "model": "a model profile of configs/models/ (blank: --model, a name or a profile's path)",
    "expert_format": "the experts' weight format, e.g. q4_k_m, hqq-2bit, int4, 4.5bpw (blank: the system's)",
    "dense_format": "the dense weights' format (blank: the system's)",
    "gpu": "the GPU, e.g. rtx4090-24gb (ignored with --hardware)",
    "host": "the host's CPUs and memory, in words (ignored with --hardware)",
    "pcie": "the link, in words (not read)",
    "batch": "requests decoded together (blank: 1)",
    "prompt_tokens": "prompt tokens per request (not simulated: the traces replay decode steps)",
    "decode_tokens": "decode tokens per request simulated (blank: the trace's)",
    "gpu_experts_per_layer": "experts kept on the GPU per MoE layer (blank: the system's own rule)",
    "measured_tok_s": "YOUR measured decode tokens/s (alias: published_tok_s; blank: unknown, predict only)",
    "role": "fit (the constant is fitted on it) or predict (only predicted; blank: fit)",
}
ROLES = ("fit", "predict")
MAX_ROWS = 10_000  # a rows file is a table of measurements: the published one holds a few dozen
MAX_FILE_BYTES = 4 << 20  # 10,000 rows of ~400 bytes; at most this + 1 bytes are ever read
#: A name cell (row, system, variant, model, expert_format, dense_format, role): the published ids are under 40.
MAX_NAME_CHARS = 100
#: A gpu, host or pcie cell: a GPU's name, a host's CPUs and memory in words (the published ones are under 60).
MAX_TEXT_CHARS = 200
#: A source cell: a citation with the command it ran (the published ones reach ~900 characters).
MAX_SOURCE_CHARS = 4096
#: A number cell: the largest accepted value (2^30, 1e9) needs far fewer; a longer one is refused before int() or
#: float() reads it (int() of over 4,300 digits raises, and costs time quadratic in the digits).
MAX_NUMBER_CHARS = 32
MAX_INT = 1 << 30  # an integer cell: tokens, batch and expert counts are far below
MAX_TOK_S = 1e9  # a tokens/s cell
#: A printed cell or list item: ids and names are at most MAX_NAME_CHARS; longer text (a path) is cut.
MAX_SHOWN_CHARS = 200
MAX_SHOWN_IDS = 20  # row ids a printed fit or a profile's source lists before "... (N in all)"

#: A plain name: ASCII letters, digits and ``._+=-``, starting with a letter or digit (no space, path separator or
#: control character).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]*")
INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() also takes Arabic-Indic or fullwidth ones, "1_0"
DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # no nan, inf, '1_0'
N_CPU_MOE = re.compile(r"n-cpu-moe[^0-9]{0,3}([0-9]+)")
NAME_COLUMNS = ("row", "system", "variant", "model", "expert_format", "dense_format", "role")
TEXT_COLUMNS = {"source": MAX_SOURCE_CHARS, "gpu": MAX_TEXT_CHARS, "host": MAX_TEXT_CHARS, "pcie": MAX_TEXT_CHARS}

#: Model names in rows -> model profiles (configs/models/).
MODEL_ALIASES = {
    "mixtral-8x7b-instruct": "mixtral-8x7b",
    "mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    "deepseek-r1": "deepseek-v3",
}
#: Model profile -> the bundled trace it replays (traces/data/README.md) and the requests simulated (enough decode
#: tokens for a stable mean: the mixtral trace's requests hold ~144 decode tokens, deepseek's 12).
TRACES = {
    "mixtral-8x7b": ("traces/data/mixtral_8x7b.npz", 8),
    "deepseek-v3": ("traces/data/synth_deepseek_v3.npz", 48),
    "gpt-oss-20b": ("traces/data/gpt_oss_20b.npz", 8),
    "gpt-oss-120b": ("traces/data/synth_gpt_oss_120b.npz", 8),
    "qwen3-30b-a3b": ("traces/data/synth_qwen3_30b_a3b.npz", 16),
    "qwen3-235b-a22b": ("traces/data/synth_qwen3_235b_a22b.npz", 16),
    "kimi-k2": ("traces/data/synth_kimi_k2.npz", 48),
    "qwen3.5-35b-a3b": ("traces/data/qwen3_5_35b_a3b.npz", 12),
}
#: Requests a row simulates when its trace is the user's own (``--trace``): all of the trace's, times the batch.
OWN_TRACE_REQUESTS = None


@dataclass(frozen=True)
class Fitted:
    """The constant a system fits: a system-profile key, its search range and how tokens/s moves with it."""

    key: str  # a key of sim/config/system.py (file units)
    low: float
    high: float
    per_gpu: bool  # one value per GPU (the software's cost depends on it), else one for the system
    increasing: bool  # tokens/s grows with the constant
    log_scale: bool = False  # bisect on log(value)
    measure: str | None = None  # fitted on the fit rows of this measure only (decode | prefill); None: every one


#: System name -> (system profile, the constant it fits).
SYSTEMS: dict[str, tuple[str, Fitted]] = {
    # framework time per MoE layer: 0 to 100 ms
    "mixtral-offloading": ("mixtral-offloading", Fitted("layer_overhead_us", 0.0, 100_000.0, True, False)),
    # share of the host memory bandwidth Fiddler's host expert kernels reach
    "fiddler": ("fiddler", Fitted("host_bw_fraction", 0.01, 1.0, False, True, True)),
    # share of the host memory bandwidth kTransformers' host expert kernels reach
    "ktransformers": ("ktransformers", Fitted("host_bw_fraction", 0.01, 1.0, False, True, True)),
    # llama.cpp and ik_llama.cpp: on their decode rows (their prompt rows fit PREFILL_CONSTANTS' constant)
    "llama.cpp": ("llama-cpp", Fitted("host_bw_fraction", 0.01, 1.0, False, True, True, "decode")),
    # the same constant for ik_llama.cpp's, kTransformers' SOSP'25 build's and kt-kernel's host expert kernels
    "ik_llama.cpp": ("ik-llama-cpp", Fitted("host_bw_fraction", 0.01, 1.0, False, True, True, "decode")),
    "ktransformers-sosp25": ("ktransformers-sosp25", Fitted("host_bw_fraction", 0.01, 1.0, False, True, True)),
    "kt-kernel": ("kt-kernel", Fitted("host_bw_fraction", 0.01, 1.0, False, True, True)),
    # framework time per MoE layer
    "deepspeed": ("deepspeed", Fitted("layer_overhead_us", 0.0, 100_000.0, True, False)),
}
#: System name -> the second constant it fits, on its prompt-processing (prefill) fit rows, after SYSTEMS' constant
#: (on its decode rows) is fitted: what sets a prompt batch's time where the decode constant does not. llama.cpp:
#: the share of the link's bandwidth its uploads of host-held experts reach from pageable (mmap'd) host memory;
#: ik_llama.cpp: the share of its host kernels' compute rate (prompt batches on the host are compute-bound).
PREFILL_CONSTANTS: dict[str, Fitted] = {
    "llama.cpp": Fitted("pageable_fraction", 0.02, 1.0, False, True, True, "prefill"),
    "ik_llama.cpp": Fitted("host_compute_fraction", 0.02, 1.0, False, True, True, "prefill"),
}
SYSTEM_ALIASES = {
    "llama-cpp": "llama.cpp",
    "ik-llama-cpp": "ik_llama.cpp",
    "ik_llama": "ik_llama.cpp",
    "llamacpp": "llama.cpp",
    "accelerate": "deepspeed",
    "deepspeed-inference": "deepspeed",
    "mixtral_offloading": "mixtral-offloading",
}


@dataclass(frozen=True)
class Row:
    """One measurement, checked (see the module docstring for the columns)."""

    row: str
    source: str
    system: str
    variant: str
    model: str
    expert_format: str | None
    dense_format: str | None
    gpu: str
    host: str
    pcie: str
    batch: int
    prompt_tokens: int | None
    decode_tokens: int | None
    gpu_experts_per_layer: int | None
    measured_tok_s: float | None
    role: str
    hardware: str  # the hardware profile (name or path) the row runs on
    line: int = 0  # the file's line number
    file: str = ""  # the file it was read from
    trace: str = ""  # the trace it replays (blank: its model's in TRACES)
    measure: str = "decode"  # what the measured figure times: decode | prefill (a published row's metric)

    @property
    def published_tok_s(self) -> float | None:
        """The measured tokens/s by the published rows' name of it (an alias of :attr:`measured_tok_s`)."""
        return self.measured_tok_s


# ------------------------------------------------------------------------------------------------ reading rows
def _where(path: str, line: int, row_id: str | None = None) -> str:
    return f"{path}: row {line}" + (f" ({row_id})" if row_id else "")


def _int(value: str, col: str, where: str, minimum: int = 0) -> int | None:
    """An integer cell: ASCII digits (a sign allowed), in [minimum, MAX_INT]; None when blank."""
    if value == "":
        return None
    want = f"{col} must be an integer >= {minimum} (ASCII digits) or blank"
    if len(value) > MAX_NUMBER_CHARS or not INTEGER.fullmatch(value):
        raise ConfigError(where, f"{want}, got {brief(value)}")
    v = int(value)
    if v < minimum or v > MAX_INT:
        raise ConfigError(where, f"{want} and at most {MAX_INT}, got {v}")
    return v


def _positive(value: str, col: str, where: str) -> float | None:
    """A real cell: a plain ASCII decimal (an exponent allowed; no nan or inf), in (0, MAX_TOK_S]; None when
    blank."""
    if value == "":
        return None
    want = f"{col} must be a number > 0 and at most {MAX_TOK_S:g} (ASCII digits) or blank, got {brief(value)}"
    if len(value) > MAX_NUMBER_CHARS or not DECIMAL.fullmatch(value):
        raise ConfigError(where, want)
    v = float(value)
    if not math.isfinite(v) or v <= 0 or v > MAX_TOK_S:
        raise ConfigError(where, want)
    return v


def _check_cell(value: str, col: str, where: str) -> None:
    """A text cell: a name column holds a plain name (:data:`NAME`) or nothing, a text column printable text (no
    control character, line break or tab) of bounded length; number columns are read by :func:`_int` and
    :func:`_positive`."""
    if col in NAME_COLUMNS:
        if value and (len(value) > MAX_NAME_CHARS or not NAME.fullmatch(value)):
            raise ConfigError(
                where,
                f"{'row (the id)' if col == 'row' else col} must be a plain name (at most {MAX_NAME_CHARS} "
                f"characters of A-Z a-z 0-9 _ . + = -, starting with a letter or digit) or blank, got {brief(value)}",
            )
    elif col in TEXT_COLUMNS:
        if len(value) > TEXT_COLUMNS[col]:
            raise ConfigError(where, f"{col} is longer than {TEXT_COLUMNS[col]} characters")
        if not value.isprintable():
            bad = next(c for c in value if not c.isprintable())
            raise ConfigError(where, f"{col} holds {ascii(bad)}: no control character, line break, tab or odd space")


def _cells(raw: dict, path: str, line: int) -> tuple[dict[str, str], str]:
    """A record's cells (stripped, every text cell checked; a column given by its alias under its own name) and
    where it is, for errors (its id once that is a plain name)."""
    raw = {COLUMN_ALIASES.get(k, k) if isinstance(k, str) else k: x for k, x in raw.items()}
    v = {c: (raw.get(c) or "").strip() for c in COLUMNS}
    _check_cell(v["row"], "row", _where(path, line))
    where = _where(path, line, v["row"])
    for col in COLUMNS[1:]:  # the id first: the others' errors name it
        _check_cell(v[col], col, where)
    return v, where


def _profile_exists(kind: str, name: str) -> bool:
    return (
        bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name))
        and (PROJECT_ROOT / "configs" / kind / f"{name}.yaml").is_file()
    )


def hardware_of(gpu: str, host: str, pcie: str = "") -> str:
    """The machine a row ran on (``sim/row_machines.py``): the bundled profile of the same GPU, CPU and
    sockets (``rtx4090d-24gb`` with ``2x Xeon Gold 6454S`` -> ``rtx4090d-2x6454s``; no count is one socket), else a
    machine composed from those parts (``rtx4090-24gb+2x-epyc-9654+gen4``); a host that names no CPU runs on the
    GPU's own profile (``a100-sxm4-80gb``; ``rtx4090-24gb`` -> ``rtx4090``). A GPU or CPU without a bundled part is
    refused with the closest names (ConfigError), never replaced by another."""
    from sim.row_machines import host_of_words, machine_of

    cpu, sockets, memory = host_of_words(host)
    return machine_of(gpu, cpu, sockets, memory, None, pcie)


def _model_of(name: str) -> str:
    """The model profile of a row's model: an alias, the name itself, or the name without an instruct/chat suffix
    or a version (``mixtral-8x7b-instruct-v0.1`` -> ``mixtral-8x7b``)."""
    name = name.strip().lower()
    if name in MODEL_ALIASES:
        return MODEL_ALIASES[name]
    if name in TRACES or _profile_exists("models", name):
        return name
    plain = re.sub(r"(-(instruct|chat|base|it))?(-v?\d+(\.\d+)*)?$", "", name)
    return MODEL_ALIASES.get(plain, plain if plain in TRACES or _profile_exists("models", plain) else name)


def bundled_trace(model: str) -> tuple[str, int] | None:
    """The bundled trace a model replays and its requests (:data:`TRACES`), by its profile's name (a profile's path
    too: a profile whose ``base`` is a bundled model keeps its name); None when it has none."""
    if model in TRACES:
        return TRACES[model]
    if not (model.lower().endswith((".yaml", ".yml", ".json")) or "/" in model):
        return None
    from moebase.model import load_model

    return TRACES.get(load_model(model, "--model").name)


def system_of(name: str) -> str:
    name = name.strip().lower()
    return SYSTEM_ALIASES.get(name, name)


def check_row(
    raw: dict,
    path: str,
    line: int,
    hardware: str | None = None,
    default_role: str | None = None,
    default_system: str | None = None,
    default_model: str | None = None,
    trace: str | None = None,
) -> Row:
    """One CSV record checked into a :class:`Row` (``hardware``: the profile every row runs on, else the row's GPU
    and host decide; ``default_role``/``default_system``/``default_model``: the role/system/model (a name or a
    profile's path) of a row that leaves it blank; ``trace``: the trace every row replays, else its model's in
    :data:`TRACES`)."""
    from sim.config.system import format_bits

    v, where = _cells(raw, path, line)
    rid = v["row"]
    if not rid:
        raise ConfigError(where, "row (the id) is blank")
    system = system_of(v["system"] or (default_system or ""))
    if system not in SYSTEMS:
        raise ConfigError(where, f"system must be one of {', '.join(SYSTEMS)}, got {v['system'][:40]!r}")
    model = _model_of(v["model"]) if v["model"] else (default_model or "")
    if not model:
        raise ConfigError(where, "model is blank and no --model is given")
    if v["model"] and not _profile_exists("models", model):
        raise ConfigError(
            where,
            f"model must be a profile of configs/models/ (e.g. {', '.join(sorted(TRACES)[:4])}; aliases: "
            f"{', '.join(MODEL_ALIASES)}) or blank with --model NAME_OR_PATH, got {v['model'][:40]!r}",
        )
    if trace is None and bundled_trace(model) is None:
        raise ConfigError(
            where,
            f"model {printed(model)} has no bundled trace to replay (those with one: {', '.join(sorted(TRACES))}): "
            "give --trace TRACE.npz, a trace of that model (python -m traces import, record or synth)",
        )
    formats = {}
    for col in ("expert_format", "dense_format"):
        if v[col] and format_bits(v[col]) is None:
            raise ConfigError(
                where,
                f"{col} must be a weight format (e.g. hqq-2bit, q4_k_m, bf16, int4, 4.5bpw) or "
                f"blank, got {v[col][:40]!r}",
            )
        formats[col] = v[col].lower() or None
    try:
        hw = hardware or hardware_of(v["gpu"], v["host"], v["pcie"])
    except ConfigError as exc:
        raise ConfigError(where, exc.problem) from None
    role = v["role"].lower() or (default_role or "")
    if role not in ROLES:
        raise ConfigError(where, f"role must be fit or predict, got {v['role'][:40]!r}")
    col = next((a for a in COLUMN_ALIASES if a in raw), "measured_tok_s")  # named as the file names it
    measured = _positive(v["measured_tok_s"], col, where)
    if role == "fit" and measured is None:
        raise ConfigError(where, f"{col} is blank but the row is a fit row")
    variant = v["variant"].lower()
    if system == "llama.cpp":
        _check_cpu_layers(variant, model, where)
    batch = _int(v["batch"], "batch", where, 1)
    return Row(
        row=rid,
        source=v["source"],
        system=system,
        variant=variant,
        model=model,
        gpu=v["gpu"],
        host=v["host"],
        pcie=v["pcie"],
        batch=1 if batch is None else batch,
        prompt_tokens=_int(v["prompt_tokens"], "prompt_tokens", where),
        decode_tokens=_int(v["decode_tokens"], "decode_tokens", where, 1),
        gpu_experts_per_layer=_int(v["gpu_experts_per_layer"], "gpu_experts_per_layer", where),
        measured_tok_s=measured,
        role=role,
        hardware=hw,
        line=line,
        file=path,
        trace=trace or "",
        expert_format=formats["expert_format"],
        dense_format=formats["dense_format"],
    )


def _check_cpu_layers(variant: str, model: str, where: str) -> None:
    """llama.cpp's ``n-cpu-moe=N`` keeps the experts of N MoE layers on the host: at most the model's."""
    from moebase.model import load_model

    n = _n_cpu_moe(variant, where)
    layers = load_model(model).moe_layers
    if n is not None and n > layers:
        raise ConfigError(where, f"variant n-cpu-moe={n} is more than the {layers} MoE layers of {model}")


def read_rows(
    path: str | Path,
    hardware: str | None = None,
    default_role: str | None = None,
    default_system: str | None = None,
    default_model: str | None = None,
    trace: str | None = None,
) -> list[Row]:
    """The rows of a CSV file, every one checked (ConfigError naming the file, the row and the problem; the
    arguments as :func:`check_row`'s)."""
    shown = str(path)
    data = _read_bounded(path, shown)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(shown, "is not UTF-8 text (a CSV rows file)") from None
    try:
        reader = csv.DictReader(io.StringIO(text))
        header = reader.fieldnames or []
        _check_header(header, shown)
        rows, seen = [], set()
        end = reader.line_num  # the header's last line
        for i, raw in enumerate(reader):
            line, end = end + 1, reader.line_num  # where the record starts (a quoted cell may span lines)
            if i >= MAX_ROWS:
                raise ConfigError(shown, f"holds more than {MAX_ROWS} rows")
            if None in raw:
                raise ConfigError(_where(shown, line), f"has more fields than the header's {len(header)}")
            if all(not (x or "").strip() for x in raw.values()):
                continue
            r = check_row(raw, shown, line, hardware, default_role, default_system, default_model, trace)
            if r.row in seen:
                raise ConfigError(_where(shown, line, r.row), "row id repeats an earlier row's")
            seen.add(r.row)
            rows.append(r)
    except csv.Error as exc:
        raise ConfigError(shown, f"is not a valid CSV file ({exc})") from None
    if not rows:
        raise ConfigError(shown, "holds no rows")
    return rows


def _read_bounded(path: str | Path, shown: str) -> bytes:
    """At most MAX_FILE_BYTES bytes of the regular file ``path`` (a FIFO or device is refused, never waited on;
    at most the bound + 1 bytes are read, whatever the file's size)."""
    from moebase.errors import TraceError
    from traces.io import open_regular_file

    try:
        with open_regular_file(path, "CSV rows file") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except TraceError as exc:
        raise ConfigError(shown, exc.problem) from None
    except OSError as exc:
        raise ConfigError(shown, f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(shown, f"is larger than {MAX_FILE_BYTES >> 20} MiB: not a rows file")
    return data


def _check_header(header: Iterable[str], shown: str) -> None:
    """The header names every column of :data:`COLUMNS` (or its alias, :data:`COLUMN_ALIASES`), and no column
    twice, by either name (a repeated one would hide the first)."""
    seen: dict[str, str] = {}
    for name in header:
        column = COLUMN_ALIASES.get(name, name)
        if column in seen:
            both = name if seen[column] == name else f"{column} (as {seen[column]} and {name})"
            raise ConfigError(shown, f"row 1 (the header) names the column {brief(both)} twice")
        seen[column] = name
    missing = [c for c in COLUMNS if c not in seen]
    if missing:
        raise ConfigError(shown, f"row 1 (the header) lacks the columns {', '.join(missing)}")


# ------------------------------------------------------------------------------------------------ run configs
def _n_cpu_moe(variant: str, where: str = "variant") -> int | None:
    """N of a llama.cpp variant ``n-cpu-moe=N`` (ASCII digits), None without one."""
    m = N_CPU_MOE.search(variant.strip())
    if m is None:
        return None
    if len(m.group(1)) > MAX_NUMBER_CHARS:
        raise ConfigError(where, f"variant n-cpu-moe=N has more than {MAX_NUMBER_CHARS} digits")
    return int(m.group(1))


def _fits_on_gpu(cfg_dict: dict) -> int:
    """How many experts Fiddler puts on the GPU: ``(0.95 x GPU memory - what is allocated) // expert bytes``, what
    is allocated being the dense weights, the KV cache and the working buffer (sourced: efeslab/fiddler
    src/fiddler/mixtral.py, ``calc_n_expert_on_gpu``), and never more than the config's memory check admits (the
    hardware profile's reserved memory aside)."""
    from moebase.model import load_model
    from sim.config.hardware import load_hardware
    from sim.config.run_config import config_from_dict, dense_bytes_of, with_formats
    from sim.config.system import load_system

    system = load_system(cfg_dict["system"])
    model = with_formats(load_model(cfg_dict["model"]), system)
    hw = load_hardware(cfg_dict["hardware"])
    probe = dict(cfg_dict, cache={"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": cfg_dict["cache"]["lpc_buffers"]})
    cfg = config_from_dict(probe)  # the config's own checks (KV cache, dense weights)
    kv = cfg.workload.batch_size * _request_tokens(cfg) * model.kv_bytes_per_token
    usable = min(0.95 * hw.gpu_memory_bytes, hw.gpu_memory_bytes - hw.reserved_bytes)
    free = usable - dense_bytes_of(model, system) - kv - cfg.cache.lpc_buffers * model.expert_bytes
    return max(int(free // model.expert_bytes), 0)


def _request_tokens(cfg) -> int:
    from sim.config.run_config import read_trace_summary

    return read_trace_summary(cfg.workload.trace).max_request_tokens(cfg.workload.max_decode_tokens)


def run_config(row: Row, constants: dict[str, float], system_profile: str | None = None) -> dict:
    """The run config (a mapping for ``sim.config.run_config.config_from_dict``) that simulates ``row`` with the
    system's fitted ``constants`` (file keys) set on its profile."""
    profile, _ = SYSTEMS[row.system]
    if row.system == "mixtral-offloading" and re.search(r"naive|accelerate", row.variant):
        # the paper's "naive offloading (accelerate)" baseline: accelerate's on-demand copies (the deepspeed
        # profile's copy path) under the same Hugging Face framework time per layer (this system's constant)
        profile = SYSTEMS["deepspeed"][0]
    system: dict[str, Any] = {"base": system_profile or profile, **constants}
    if row.expert_format:
        system["expert_format"] = row.expert_format
    if row.dense_format:
        system["dense_format"] = row.dense_format
    bundled = bundled_trace(row.model)
    trace, requests = (row.trace, OWN_TRACE_REQUESTS) if row.trace or bundled is None else bundled
    workload = {
        "trace": trace,
        "batch_size": row.batch,
        "batching": "static",
        "prefill": False,
        "max_decode_tokens": row.decode_tokens,
        "requests": None if requests is None else requests * row.batch,
    }
    slots = row.gpu_experts_per_layer
    d: dict[str, Any] = {
        "model": row.model,
        "hardware": row.hardware,
        "system": system,
        "workload": workload,
        "predictor": "none",
        "seed": 0,
    }
    # working buffers for experts in flight: 4 (assumption: mixtral-offloading's buffer_size 4, one layer's
    # top-2 and its speculative pair)
    if row.system == "mixtral-offloading":  # variants full | lru | none; another variant: by its slots
        if row.variant == "none" or not slots:
            d["policy"] = "on-demand"
            d["cache"] = {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 4}
        else:
            d["policy"] = "lru"
            d["cache"] = {"hpc_slots": 0, "mpc_slots": slots, "lpc_buffers": 4}
            if row.variant == "full":  # speculative loading: the system profile's own predictor
                d.pop("predictor")
    elif row.system == "deepspeed":
        d["policy"] = "on-demand"
        d["cache"] = {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 4}
    elif row.system == "fiddler":
        d["cache"] = {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 1}
        d["policy"] = {"name": "fiddler", "params": {"placement": "global"}}
        if slots is None:  # the most popular experts of the whole model, as many as the GPU holds
            n = _fits_on_gpu(d)
            d["cache"] = {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 1, "organization": "shared", "shared_slots": n}
        else:
            d["cache"] = {"hpc_slots": slots, "mpc_slots": 0, "lpc_buffers": 1}
    else:  # ktransformers, llama.cpp: routed experts on the host, hot or whole layers on the GPU
        n_cpu = _n_cpu_moe(row.variant) if row.system == "llama.cpp" else None
        params: dict[str, Any] = {}
        if n_cpu is not None:  # the one field: cpu_layers and the GPU layers' shared cache follow from it
            system["placement"] = {"n_cpu_moe": n_cpu}  # more than the model's layers: refused naming it
        else:
            d["cache"] = {"hpc_slots": slots or 0, "mpc_slots": 0, "lpc_buffers": 1}
        d["policy"] = {"name": "ktransformers", "params": params}
    return d


def simulate_row(row: Row, constants: dict[str, float], system_profile: str | None = None) -> float:
    """Simulated decode tokens/s of ``row`` with the system's ``constants``."""
    from sim.config.run_config import config_from_dict
    from sim.run import simulate

    try:
        cfg = config_from_dict(run_config(row, constants, system_profile), source=f"row {row.row}")
    except ConfigError as exc:  # the row's configuration cannot run (it does not fit in the GPU's memory, say)
        raise ConfigError(_where(row.file or "rows", row.line, row.row), f"cannot be simulated: {exc}") from None
    return float(simulate(cfg).summary["throughput_tok_s"])


# ------------------------------------------------------------------------------------------------ fitting
@dataclass(frozen=True)
class SystemFit:
    """A system's fitted constant: its value over all fit rows, and per GPU where it depends on the GPU; and the
    second constant it fits on its prefill rows (:data:`PREFILL_CONSTANTS`), when it has such rows."""

    system: str
    key: str
    value: float | None  # over the system's fit rows of its measure (None: no such row)
    per_gpu: dict[str, float]  # hardware profile -> value
    rows: tuple[str, ...]  # the fit rows' ids
    rows_by_gpu: dict[str, tuple[str, ...]]
    at_bound: bool = False  # the search range's end was reached (the rows want more)
    extra: dict[str, float] = dataclasses.field(default_factory=dict)  # second constants: key -> value
    extra_rows: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # key -> its fit rows

    def constants_for(self, hardware: str) -> dict[str, float]:
        v = self.per_gpu.get(hardware, self.value)
        return {**({} if v is None else {self.key: v}), **self.extra}


def fit_rows(
    fit_rows: list[Row], simulate: Callable[[Row, dict], float] | None = None, iterations: int = 24
) -> dict[str, SystemFit]:
    """Fit each system's constant on its ``fit`` rows (only those are given; a row of another role is refused).
    Returns system -> :class:`SystemFit`."""
    sim = simulate or (lambda r, c: simulate_row(r, c))
    out = {}
    for r in fit_rows:
        if r.role != "fit" or r.measured_tok_s is None:
            raise ValueError(f"row {r.row}: only fit rows with a measured value may be fitted on")
    for system in dict.fromkeys(r.system for r in fit_rows):
        spec = SYSTEMS[system][1]
        mine = [r for r in fit_rows if r.system == system]
        rows = [r for r in mine if spec.measure is None or r.measure == spec.measure]
        value: float | None = None
        bound = False
        per_gpu: dict[str, float] = {}
        by_gpu: dict[str, tuple[str, ...]] = {}
        if rows:
            value, bound = _fit_one(rows, spec, sim, iterations)
        if spec.per_gpu and value is not None:
            gpus = list(dict.fromkeys(r.hardware for r in rows))
            for hw in gpus:
                group = [r for r in rows if r.hardware == hw]
                by_gpu[hw] = tuple(r.row for r in group)
                if len(gpus) == 1:  # one machine: its fit is the system's
                    per_gpu[hw] = value
                    continue
                per_gpu[hw], b = _fit_one(group, spec, sim, iterations)
                bound = bound or b
        extra, extra_rows = {}, {}
        second = PREFILL_CONSTANTS.get(system)
        prefill = [r for r in mine if second is not None and r.measure == second.measure]
        if second is not None and prefill:  # fitted with the first constant fixed at its fitted value
            fixed = {} if value is None or spec.per_gpu else {spec.key: value}
            extra[second.key], b = _fit_one(prefill, second, sim, iterations, fixed)
            extra_rows[second.key] = tuple(r.row for r in prefill)
            bound = bound or b
        out[system] = SystemFit(
            system, spec.key, value, per_gpu, tuple(r.row for r in rows), by_gpu, bound, extra, extra_rows
        )
    return out


def _fit_one(rows: list[Row], spec: Fitted, sim, iterations: int, fixed: dict | None = None) -> tuple[float, bool]:
    """The constant at which the mean log error of the rows' simulated tokens/s is zero (bisection, at most
    ``iterations`` halvings; the constants ``fixed`` set beside it), and whether the search range's end was
    reached. The answer is rounded
    (:func:`_round`), so the bisection stops once both ends of its bracket round alike: every later midpoint lies
    between them and rounding is monotone, so it would round alike too (the same answer, fewer simulations)."""

    def err(x: float) -> float:
        return sum(math.log(sim(r, {**(fixed or {}), spec.key: x}) / r.measured_tok_s) for r in rows) / len(rows)

    lo, hi = spec.low, spec.high
    to = math.log if spec.log_scale else float
    back = math.exp if spec.log_scale else float
    a, b = to(lo), to(hi)
    ea, eb = err(lo), err(hi)
    # tokens/s increasing in x: the error rises from ea to eb
    sign = 1.0 if spec.increasing else -1.0
    if sign * ea >= 0:
        return lo, sign * ea > 1e-9
    if sign * eb <= 0:
        return hi, sign * eb < -1e-9
    for _ in range(iterations):
        if _round(back(a)) == _round(back(b)):
            break
        m = 0.5 * (a + b)
        em = err(back(m))
        if sign * em < 0:
            a = m
        else:
            b = m
    return _round(back(0.5 * (a + b))), False


def _round(x: float) -> float:
    """Four significant figures (the fit's precision is far coarser than the bisection's)."""
    return float(f"{x:.4g}")


def predict_rows(
    rows: list[Row], fits: dict[str, SystemFit], simulate: Callable[[Row, dict], float] | None = None
) -> list[dict]:
    """Each row's simulated tokens/s with its system's fitted constants (a system without fit rows runs its profile
    as committed). The measured value is not given to the simulation."""
    sim = simulate or (lambda r, c: simulate_row(r, c))
    out = []
    for r in rows:
        fit = fits.get(r.system)
        constants = fit.constants_for(r.hardware) if fit is not None else {}
        blind = dataclasses.replace(r, measured_tok_s=None)
        problem = None
        try:
            predicted = sim(blind, constants)
        except ConfigError as exc:  # a predicted row that cannot run is reported, the others still predicted
            if r.role == "fit":
                raise
            predicted, problem = None, str(exc)
        pub = r.measured_tok_s
        err = None if pub is None or predicted is None else predicted / pub - 1.0
        out.append(
            {
                "row": r.row,
                "role": r.role,
                "system": r.system,
                "hardware": r.hardware,
                "predicted_tok_s": predicted,
                "measured_tok_s": pub,
                "published_tok_s": pub,  # the name benchmarks/published_systems.py --json gives it
                "error": err,
                "constants": constants,
                "problem": problem,
            }
        )
    return out


def fit_and_predict(rows: list[Row], simulate=None) -> tuple[dict[str, SystemFit], list[dict]]:
    """Fit on the rows whose role is ``fit`` (only those reach the fit), then predict every row."""
    fit_only = [r for r in rows if r.role == "fit"]
    fits = fit_rows(fit_only, simulate)
    return fits, predict_rows(rows, fits, simulate)


def summary_of(results: Iterable[dict], role: str = "predict") -> dict:
    """Median and max |error| over the rows of ``role`` that have a measured value."""
    errs = sorted(abs(r["error"]) for r in results if r["role"] == role and r["error"] is not None)
    if not errs:
        return {"rows": 0, "median_abs_error": None, "max_abs_error": None}
    n = len(errs)
    median = errs[n // 2] if n % 2 else 0.5 * (errs[n // 2 - 1] + errs[n // 2])
    return {"rows": n, "median_abs_error": median, "max_abs_error": errs[-1]}


def printed(value: object) -> str:
    """``value`` as printed text: one line, control characters escaped (a terminal never interprets them), at most
    MAX_SHOWN_CHARS characters."""
    return one_line(value, MAX_SHOWN_CHARS)


def table_cell(value: object) -> str:
    """``value`` as a Markdown table cell: :func:`printed`, with ``|`` escaped (it would end the cell)."""
    return printed(value).replace("|", "\\|")


def printed_ids(ids: Iterable[str]) -> str:
    """Row ids as a printed list: at most MAX_SHOWN_IDS of them, then how many there are."""
    ids = list(ids)
    head = ", ".join(printed(i) for i in ids[:MAX_SHOWN_IDS])
    return head + (f" ... ({len(ids)} in all)" if len(ids) > MAX_SHOWN_IDS else "")


def format_table(results: list[dict], measured: str = "published") -> str:
    """The rows as a Markdown table: role, the measured figure (headed ``MEASURED tok/s``: published figures for the
    published rows, measured ones for a user's), simulated, error (text from the rows escaped, see
    :func:`table_cell`)."""
    lines = [
        f"| row | role | system | hardware | {measured} tok/s | simulated tok/s | error |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for r in results:
        value = r.get("measured_tok_s", r.get("published_tok_s"))  # the results of a --json written before
        pub = "" if value is None else f"{value:.3g}"
        err = "" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        role = "fitted" if r["role"] == "fit" else "predicted"
        sim = "not simulated" if r["predicted_tok_s"] is None else f"{r['predicted_tok_s']:.3g}"
        cells = [table_cell(r[k]) for k in ("row", "system", "hardware")]
        lines.append(f"| {cells[0]} | {role} | {cells[1]} | {cells[2]} | {pub} | {sim} | {err} |")
    problems = [f"- {printed(r['row'])}: {one_line(r['problem'])}" for r in results if r.get("problem")]
    return "\n".join(lines + (["", "Rows not simulated:"] + problems if problems else []))


def format_fits(fits: dict[str, SystemFit]) -> str:
    lines = []
    for f in fits.values():
        value = "none (no fit row)" if f.value is None else f"{f.value:g}"
        lines.append(
            f"- {printed(f.system)}: {f.key} = {value} (fitted on {printed_ids(f.rows)})"
            + (" [at the end of its search range]" if f.at_bound else "")
        )
        for hw, v in f.per_gpu.items():
            lines.append(f"  - on {printed(hw)}: {f.key} = {v:g} (fitted on {printed_ids(f.rows_by_gpu[hw])})")
        for key, v in f.extra.items():
            lines.append(f"  - {key} = {v:g} (fitted on the prefill rows {printed_ids(f.extra_rows[key])})")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ fit-system
def fit_system(
    measured: str, system: str, hardware: str, out: str, model: str | None = None, trace: str | None = None
) -> tuple[SystemFit, list[dict], dict]:
    """Fit ``system``'s constant on the measured rows (every row on ``hardware``; a blank role counts as fit, a blank
    system as ``system``, a blank model as ``model``, a profile's name or path; every row replays ``trace``, else its
    model's bundled trace), write the profile ``{base: PROFILE, KEY: value}`` to ``out`` and return the fit, each
    row's result and the profile."""
    import yaml

    from moebase.outputs import check_not_input
    from sim.config.hardware import load_hardware
    from sim.config.system import load_system
    from traces.io import atomic_write_bytes, check_output_file

    name = system_of(system)
    if name not in SYSTEMS:
        raise ConfigError("--system", f"must be one of {', '.join(SYSTEMS)}, got {brief(system)}")
    load_hardware(hardware, "--hardware")
    if model is not None:
        from moebase.model import load_model

        load_model(model, "--model")
    if trace is not None:
        _check_trace_file(trace)
    check_output_file(out, "system profile (--out)")
    rows = read_rows(measured, hardware, "fit", name, model, trace)
    if trace is not None:
        _check_trace_fits(trace, rows)
    check_not_input(out, [measured], "--out")  # nor the hardware profile, nor any other file read
    other = [r for r in rows if r.system != name]
    if other:
        raise ConfigError(
            _where(measured, other[0].line, other[0].row), f"system is {other[0].system}, but --system is {name}"
        )
    if not any(r.role == "fit" for r in rows):
        raise ConfigError(measured, "holds no fit row with a measured tokens/s")
    fits, results = fit_and_predict(rows)
    fit = fits[name]
    spec = SYSTEMS[name][1]
    # one machine: the fit over all its rows (per_gpu is the same single group)
    profile = {
        "base": SYSTEMS[name][0],
        spec.key: fit.value,
        **fit.extra,  # a second constant, where prefill rows fitted one
        "source": f"fitted by python -m sim fit-system on the fit rows of {printed(Path(measured).name)} "
        f"({printed_ids(fit.rows)}) on hardware {printed(hardware)}",
    }
    load_system(profile, "--out")  # the profile loads back
    comment = f"{name} on {printed(hardware)}: {spec.key} fitted on {printed_ids(fit.rows)} of {printed(measured)}"
    text = f"# {one_line(comment)}\n" + yaml.safe_dump(profile, sort_keys=False)
    atomic_write_bytes(out, text.encode())
    return fit, results, profile


def _check_trace_file(trace: str) -> None:
    """``--trace``: a trace file the simulator reads (its header; ConfigError naming ``--trace``)."""
    from moebase.errors import TraceError
    from traces.summary import read_trace_summary

    try:
        read_trace_summary(trace)
    except TraceError as exc:
        raise ConfigError("--trace", str(exc)) from None


def _check_trace_fits(trace: str, rows: list[Row]) -> None:
    """Every row's model is the trace's (its shape: experts, top-k, MoE layers), before anything is simulated."""
    from moebase.model import load_model
    from traces.summary import model_mismatch, read_trace_summary

    summary = read_trace_summary(trace)
    for model in dict.fromkeys(r.model for r in rows):
        problem = model_mismatch(summary, load_model(model, "--model"))
        if problem:
            raise ConfigError("--trace", f"{problem} (model {printed(model)} of the rows)")


def cmd_fit_system(args) -> int:
    fit, results, profile = fit_system(args.measured, args.system, args.hardware, args.out, args.model, args.trace)
    print(format_table(results, "measured"))
    print(format_fits({fit.system: fit}))
    for role in ("fit", "predict"):
        s = summary_of(results, role)
        if s["rows"]:
            print(
                f"{role} rows: {s['rows']}, median |error| {100 * s['median_abs_error']:.1f}%, "
                f"max {100 * s['max_abs_error']:.1f}%"
            )
    print(f"wrote {args.out}")
    return 0


def columns_epilog() -> str:
    """The rows file's columns and what each holds (the epilog of ``sim fit-system --help``)."""
    width = max(len(c) for c in COLUMNS)
    lines = ["columns of --measured (a CSV file whose header names each once; any order, others ignored):"]
    lines += [f"  {c:<{width}}  {COLUMN_HELP[c]}" for c in COLUMNS]
    lines += [
        "",
        "example (one row per measured configuration; blank cells take the flags' values):",
        "  " + ",".join(COLUMNS),
        "  mine-1,my desk,,n-cpu-moe=20,,q4_k_m,q4_k_m,,,,1,,64,,31.5,fit",
    ]
    return "\n".join(lines)


def register(sub) -> None:
    import argparse

    p = sub.add_parser(
        "fit-system",
        help="fit a serving system's software constants to measured tokens/s",
        description="Fit the software constant of a serving system (sim/fit_system.py: SYSTEMS) to the decode "
        "tokens/s you measured on your machine, write it as a system profile, and print how well it explains "
        "each row. Then: python -m sim run CONFIG --set system=OUT.",
        epilog=columns_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--measured", required=True, help="CSV of measured rows (the columns below)")
    p.add_argument("--system", required=True, help=f"the serving system: {', '.join(SYSTEMS)}")
    p.add_argument("--hardware", required=True, help="the machine's hardware profile (name or path)")
    p.add_argument(
        "--model",
        default=None,
        help="the model of rows whose model cell is blank: a profile of configs/models/ or a profile's path",
    )
    p.add_argument(
        "--trace",
        default=None,
        help="the trace every row replays (default: the model's bundled trace; needed for a model without one)",
    )
    p.add_argument("--out", required=True, help="the system profile to write (YAML)")
    p.set_defaults(func=cmd_fit_system)


__all__ = [
    "COLUMNS",
    "COLUMN_ALIASES",
    "COLUMN_HELP",
    "Fitted",
    "Row",
    "SYSTEMS",
    "SystemFit",
    "TRACES",
    "check_row",
    "cmd_fit_system",
    "fit_and_predict",
    "fit_rows",
    "fit_system",
    "format_fits",
    "format_table",
    "hardware_of",
    "predict_rows",
    "printed",
    "printed_ids",
    "read_rows",
    "register",
    "run_config",
    "simulate_row",
    "summary_of",
    "table_cell",
]
