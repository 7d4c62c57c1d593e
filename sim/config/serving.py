"""The serving keys of a run's workload: request arrivals, the token budget of an iteration, the SLO.

``workload.arrivals`` (absent: every request is there at time zero, and the run is what it always was)::

    arrivals: {process: poisson, rate_per_s: 4.0, seed: 0}      # exponential gaps, mean 1 / rate
    arrivals: {process: gamma, rate_per_s: 4.0, cv: 3.0}        # gamma gaps: bursts (cv > 1) or regular (cv < 1)
    arrivals: {process: trace, file: arrivals.csv, column: arrival_s}   # timestamps (s) from a file

``workload.max_batch_tokens`` (with arrivals): the tokens one iteration may process, decodes (one each) and prompt
chunks together: prompts are then prefilled in chunks within it, beside the running requests' decodes (chunked
prefill). Null: whole prompts, each in a prefill iteration of its own before the decode iteration it joins (the
continuous batching of a run without arrivals).

``workload.slo: {ttft_s: X, tpot_s: Y}`` (with arrivals): a request meets the SLO when its time to first token is at
most X and its time per output token at most Y (either may be null: not constrained).

A trace of arrivals is a CSV file with a header (the timestamps in the column ``column``) or a JSON file (a list of
numbers, or a mapping whose ``column`` is one): at most ``MAX_ARRIVAL_BYTES`` and ``MAX_REQUESTS`` timestamps,
finite, in seconds, in non-decreasing order; they are shifted so that the first is at 0.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moebase.checks import check_keys, check_mapping, check_number, integer, one_of, show, text
from moebase.errors import ConfigError
from moebase.fields import keys_of, read_settings, required_keys, setting
from moebase.files import file_status, read_text, resolve_path

PROCESSES = ("poisson", "gamma", "trace")
MAX_RATE = 1e6  # requests per second
MAX_CV = 100.0  # the gaps' coefficient of variation
MAX_SEED = 2**32 - 1
MAX_ARRIVAL_BYTES = 32 << 20  # an arrivals file (a million timestamps in CSV fit)
MAX_REQUESTS = 1 << 20  # timestamps read from a file (the most requests a run serves)
MAX_SLO_S = 1e6  # an SLO's bound (s)
MAX_TIME_S = 1e9  # a timestamp, once shifted to start at 0 (about 30 years)


def positive_or_null(maximum: float):
    """A check for a number > 0 and <= ``maximum``, or null."""
    return lambda value, where: None if value is None else check_number(value, where, 0.0, True, maximum)


def _arrivals_file(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(where, f"must be a path to a CSV or JSON file of timestamps, got {show(value)}")
    return str(resolve_path(value, where, "arrivals file").resolve())


@dataclass(frozen=True)
class ArrivalsConfig:
    """When each request arrives: a Poisson or gamma process of a rate, or the timestamps of a file."""

    process: str = setting(check=one_of(*PROCESSES))
    rate_per_s: float | None = setting(None, positive_or_null(MAX_RATE))
    cv: float | None = setting(None, positive_or_null(MAX_CV))
    seed: int = setting(0, integer(0, MAX_SEED))
    file: str | None = setting(None, _arrivals_file)
    column: str = setting("arrival_s", text(max_chars=200))


@dataclass(frozen=True)
class SloConfig:
    """The service-level objective a request meets: time to first token and time per output token (s)."""

    ttft_s: float | None = setting(None, positive_or_null(MAX_SLO_S))
    tpot_s: float | None = setting(None, positive_or_null(MAX_SLO_S))


ARRIVAL_KEYS = keys_of(ArrivalsConfig)
SLO_KEYS = keys_of(SloConfig)


def check_arrivals(value: Any, where: str) -> ArrivalsConfig | None:
    """``workload.arrivals``: null, or a mapping of its keys whose process has what it needs (a rate for poisson
    and gamma, a cv for gamma, a file for trace) and nothing another process takes."""
    if value is None:
        return None
    d = check_mapping(value, where)
    check_keys(d, where, required_keys(ArrivalsConfig), ARRIVAL_KEYS)
    a = ArrivalsConfig(**read_settings(ArrivalsConfig, d, where))
    needs = {"poisson": ("rate_per_s",), "gamma": ("rate_per_s", "cv"), "trace": ("file",)}[a.process]
    for key in needs:
        if getattr(a, key) is None:
            raise ConfigError(f"{where}.{key}", f"missing (process {a.process} needs {', '.join(needs)})")
    takes = set(needs) | {"seed"} | ({"column"} if a.process == "trace" else set())
    defaults = {"column": "arrival_s"}  # a resolved config holds every key, unused ones at their defaults
    for key in ("rate_per_s", "cv", "file", "column"):
        if d.get(key) is not None and d[key] != defaults.get(key) and key not in takes:
            raise ConfigError(f"{where}.{key}", f"does not apply to process {a.process}")
    return a


def check_slo(value: Any, where: str) -> SloConfig | None:
    """``workload.slo``: null, or a mapping of ``ttft_s`` and ``tpot_s`` (at least one given)."""
    if value is None:
        return None
    d = check_mapping(value, where)
    check_keys(d, where, (), SLO_KEYS)
    slo = SloConfig(**read_settings(SloConfig, d, where))
    if slo.ttft_s is None and slo.tpot_s is None:
        raise ConfigError(where, "give ttft_s, tpot_s or both (seconds)")
    return slo


def check_serving(workload, policy_name: str, policy_origin: str | None) -> None:
    """The serving keys together: arrivals need continuous batching and an online policy (an offline one reads
    the workload's future, which arrivals make depend on the run's own timing); a token budget and an SLO need
    arrivals, and the budget holds a whole batch of decodes."""
    arrivals, budget, slo = workload.arrivals, workload.max_batch_tokens, workload.slo
    if arrivals is None:
        for key, value in (("max_batch_tokens", budget), ("slo", slo)):
            if value is not None:
                raise ConfigError(f"workload.{key}", "applies only with workload.arrivals (requests arriving in time)")
        return
    if workload.batching != "continuous":
        raise ConfigError(
            "workload.batching",
            f"must be continuous with workload.arrivals (got {show(workload.batching)}): requests join as they arrive",
        )
    if policy_origin == "bound":
        raise ConfigError(
            "workload.arrivals",
            f"policy {show(policy_name)} reads the workload's future, which arrivals make depend on the run's own "
            "timing: use an online policy",
        )
    if budget is not None and budget < workload.batch_size:
        raise ConfigError(
            "workload.max_batch_tokens",
            f"{budget} is less than workload.batch_size {workload.batch_size}: an iteration must hold one decode "
            "token of every running request",
        )


def drop_unset(resolved_workload: dict) -> None:
    """The serving keys left out of a resolved workload when unset, so that a config without them (and its sweep
    point's id) reads as before they existed."""
    for key in ("arrivals", "max_batch_tokens", "slo"):
        if resolved_workload.get(key) is None:
            resolved_workload.pop(key, None)


# --------------------------------------------------------------------------------------------- the file
def read_arrival_times(path: str | Path, column: str, where: str = "workload.arrivals.file") -> list[float]:
    """The timestamps of an arrivals file (CSV with a header, or JSON), in seconds, shifted to start at 0; every
    problem a ConfigError naming ``where`` and the file."""
    p = Path(path)
    st = file_status(p)
    if st is not None and st.st_size > MAX_ARRIVAL_BYTES:
        raise ConfigError(where, f"{p} is larger than {MAX_ARRIVAL_BYTES:,} bytes: not a file of arrivals")
    data = read_text(p, where, limit=MAX_ARRIVAL_BYTES)
    raw = _json_column(data, column, where, p) if p.suffix.lower() == ".json" else _csv_column(data, column, where, p)
    if not raw:
        raise ConfigError(where, f"{p} holds no timestamps")
    if len(raw) > MAX_REQUESTS:
        raise ConfigError(where, f"{p} holds more than {MAX_REQUESTS} timestamps")
    times: list[float] = []
    for i, v in enumerate(raw):
        t = _finite(v)
        if t is None:
            raise ConfigError(where, f"{p}: timestamp {i + 1} is not a finite number of seconds, got {show(v)}")
        if times and t < times[-1]:
            raise ConfigError(where, f"{p}: timestamp {i + 1} ({t:g}) is before the one above it ({times[-1]:g})")
        times.append(t)
    first = times[0]
    shifted = [t - first for t in times]
    if shifted[-1] > MAX_TIME_S:
        raise ConfigError(where, f"{p}: the timestamps span {shifted[-1]:g} s, more than {MAX_TIME_S:g}")
    return shifted


def _finite(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, str):
        s = v.strip()
        if not s or len(s) > 40 or not s.isascii():
            return None
        try:
            v = float(s)
        except ValueError:
            return None
    if not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if f == f and abs(f) != float("inf") else None


def _csv_column(data: str, column: str, where: str, p: Path) -> list:
    reader = csv.reader(io.StringIO(data))
    try:
        header = next(reader)
    except StopIteration:
        raise ConfigError(where, f"{p} is empty") from None
    except csv.Error as exc:
        raise ConfigError(where, f"{p} is not CSV ({exc})") from None
    names = [h.strip() for h in header]
    if column not in names:
        raise ConfigError(
            "workload.arrivals.column", f"{show(column)} is not a column of {p} (its header: {show(names[:20])})"
        )
    k = names.index(column)
    out: list[str] = []
    try:
        for row in reader:
            if not row:
                continue
            if len(out) >= MAX_REQUESTS:
                raise ConfigError(where, f"{p} holds more than {MAX_REQUESTS} timestamps")
            if k >= len(row):
                raise ConfigError(where, f"{p}: line {reader.line_num} has no {show(column)} cell")
            out.append(row[k])
    except csv.Error as exc:
        raise ConfigError(where, f"{p} is not CSV (line {reader.line_num}: {exc})") from None
    return out


def _json_column(data: str, column: str, where: str, p: Path) -> list:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(where, f"{p} is not valid JSON ({str(exc)[:200]})") from None
    if isinstance(value, dict):
        if column not in value:
            raise ConfigError("workload.arrivals.column", f"{show(column)} is not a key of {p}")
        value = value[column]
    if not isinstance(value, list):
        raise ConfigError(where, f"{p} must hold a list of timestamps, or a mapping whose {show(column)} is one")
    return value


__all__ = [
    "ARRIVAL_KEYS",
    "ArrivalsConfig",
    "PROCESSES",
    "SLO_KEYS",
    "SloConfig",
    "check_arrivals",
    "check_serving",
    "check_slo",
    "drop_unset",
    "read_arrival_times",
]
