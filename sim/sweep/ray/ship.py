"""What a sweep sends to a Ray cluster, so that a worker node needs only Python, Ray and the simulator's
dependencies: the code (a runtime environment), each point's resolved config, and the files those name.

- The code: ``runtime_env()`` ships this checkout's ``moebase``, ``sim`` and ``traces`` packages and the ``configs``
  folder (the job's ``working_dir``, without caches, without ``traces/data`` and without the other top-level folders; a
  resolved config may still name parts of ``configs/parts/``, which a worker looks up where ``sim`` sits) and
  passes the ``SIM_SWEEP_TEST_*`` test hooks on to the workers.
- The configs: a point is sent as its resolved config (``RunConfig.resolved``: model and hardware expanded), so
  no config file is needed on the node.
- The files: every file a point's config names (``workload.trace``, a ``cache.hot_profile`` path, a policy's or
  predictor's file params) is read once here, put in the object store once per distinct content (keyed by its
  SHA-256; paths with the same bytes share one object), and written on each node that needs it by
  ``sim.sweep.ray.task``.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from sim.config.run_config import resolve_config
from sim.sweep.spec import Point, Sweep
from sim.sweep.worker import task_options

SHIPPED = ("moebase", "sim", "traces", "configs")  # what a worker imports or reads (validate is not needed)
EXCLUDES = ["__pycache__/", "*.pyc", "/traces/data/"]  # the bundled traces travel through the object store
HOOK_PREFIX = "SIM_SWEEP_TEST_"
NODE_CHECK_TIMEOUT_S = 60.0


def runtime_env(env=os.environ) -> dict:
    """The job's runtime environment: this checkout's packages, and the test hooks set here."""
    root = Path(__file__).resolve().parents[3]
    hooks = {k: v for k, v in env.items() if k.startswith(HOOK_PREFIX)}
    others = sorted(f"/{p.name}" for p in root.iterdir() if p.name not in SHIPPED)
    out: dict[str, Any] = {"working_dir": str(root), "excludes": others + EXCLUDES}
    if hooks:
        out["env_vars"] = hooks
    return out


def file_fields(resolved: dict) -> dict[tuple, Path]:
    """The fields of a resolved config that name files (key path -> the file here)."""
    from moebase.files import resolve_path
    from sim.config.params import names_file
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS

    out: dict[tuple[str, ...], Path] = {("workload", "trace"): Path(resolved["workload"]["trace"])}
    hot = (resolved.get("cache") or {}).get("hot_profile")
    if isinstance(hot, str) and hot != "trace":
        out[("cache", "hot_profile")] = Path(hot)
    for section, registry in (("policy", POLICIES), ("predictor", PREDICTORS)):
        part = resolved.get(section) or {}
        rules = getattr(registry.get(str(part.get("name"))), "PARAM_RULES", None) or {}
        params = part.get("params") or {}
        for key, rule in rules.items():
            value = params.get(key)
            if isinstance(value, str) and names_file(rule, value) and value.strip():  # a path, not a rule's word
                out[(section, "params", key)] = resolve_path(value, f"{section}.params.{key}", rule.file).resolve()
    return out


def ship_name(path: Path) -> str:
    """The name a shipped file gets on the nodes: its own, made plain (letters, digits, ``.``, ``_``, ``-``; no
    leading dot; at most 120 characters, its suffix kept, which the readers go by)."""

    def plain(text: str, limit: int) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:limit]

    stem = plain(path.stem, 100).lstrip(".") or "file"
    suffix = plain(path.suffix, 19) if path.suffix.startswith(".") else ""
    return stem + suffix


class Shipment:
    """The files of a sweep's points, put in the object store once each; ``task_args`` gives a point's task."""

    def __init__(self, ray, sweep: Sweep):
        self.ray, self.sweep = ray, sweep
        self.sha_of: dict[Path, str] = {}  # file here -> SHA-256 of its bytes
        self.refs: dict[str, object] = {}  # SHA-256 -> object store reference to the bytes

    def _ship(self, path: Path) -> str:
        if path not in self.sha_of:
            data = path.read_bytes()
            sha = hashlib.sha256(data).hexdigest()
            if sha not in self.refs:
                self.refs[sha] = self.ray.put(data)
            self.sha_of[path] = sha
        return self.sha_of[path]

    def task_args(self, point: Point) -> tuple:
        """The arguments of ``sim.sweep.ray.task.run_shipped`` for ``point``: its resolved config, its files
        ((key path, sha, name)), their references (only this point's), the sweep file, the overrides and what
        the task does besides the run (``sim.sweep.worker.task_options``)."""
        resolved = resolve_config(self.sweep.base, point.overrides, self.sweep.source).resolved
        files = [(keys, self._ship(path), ship_name(path)) for keys, path in file_fields(resolved).items()]
        refs = {sha: self.refs[sha] for _, sha, _ in files}
        return resolved, files, refs, self.sweep.source, point.overrides, task_options(self.sweep)


def check_nodes(ray, timeout: float = NODE_CHECK_TIMEOUT_S) -> tuple[list[str], list[str]]:
    """Ask every alive node, once, whether it can run points: (problems, notes). A problem (a node lacking the
    simulator's packages) stops the sweep before it starts; a note (a node that did not answer) does not."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from sim.sweep.ray.task import node_report

    report = ray.remote(num_cpus=0, max_retries=0)(node_report)
    asked = {}
    for node in ray.nodes():
        if node.get("Alive"):
            strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            asked[report.options(scheduling_strategy=strategy).remote()] = node.get("NodeManagerAddress", "?")
    ready, late = ray.wait(list(asked), num_returns=len(asked), timeout=timeout)
    problems, notes = [], []
    for ref in ready:
        try:
            r = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - RuntimeEnvSetupError, a node lost meanwhile...
            notes.append(
                f"node {asked[ref]} could not run the check: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else ''}"
            )
            continue
        if r["missing"]:
            problems.append(
                f"node {asked[ref]} ({r['host']}, Python {r['python']}) lacks the Python package(s) "
                f"{', '.join(r['missing'])}: install them there (pip install numpy simpy pyyaml)"
            )
    notes += [f"node {asked[ref]} did not answer the check within {timeout:.0f} s" for ref in late]
    return problems, notes
