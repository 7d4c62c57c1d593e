"""Every measurement committed under docs/validation/ can be compared again.

A measurement folder holds a ``manifest.json`` or a measurement archive (``gpu-check.tar.gz``). Its ``README.md``
says how it compares, in one of three ways:

- nothing said: the archive compares with the current code: ``python -m validate compare`` exits 0 and the simulator
  makes the executor's decisions in every measured configuration;
- a line ``Compare with commit: <40-hex sha>``: the current code replays it differently (a default or a bundled
  trace changed after it was measured); the commit must exist, hold the traces the archive recorded (by checksum),
  and compare the archive cleanly with its own code;
- a line ``Raw data: not kept``: a report only (the CPU runs keep no iteration tables or decisions); the folder must
  then indeed hold no runs and no archive, and its manifest the command that measures it afresh.

Run time on the 2-core VM: 1-2 s per archive compared with the current code (6 of them), 1.3-2.6 s per archive
compared at its named commit (6, from a ``git archive`` export of that commit, run with this interpreter), about
20-25 s for the file. That is within budget, so every archive is checked on every run and none is marked slow: each
is the only copy of its measurement.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT

VALIDATION = ROOT / "docs" / "validation"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
COMMIT_LINE = re.compile(r"^Compare with commit: ([0-9a-f]{40})[ \t]*$", re.M)
NOT_KEPT_LINE = re.compile(r"^Raw data: not kept\b", re.M)
TIMEOUT_S = 300


# ------------------------------------------------------------------------------------------------- discovery
def _archive_stem(name: str) -> str | None:
    for suffix in ARCHIVE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def _derived(folder: Path, top: Path) -> bool:
    """A folder written by compare, not measured: an archive unpacked beside itself (``gpu-check/`` next to
    ``gpu-check.tar.gz``) or a report folder ``compare/``, or anything inside them."""
    for part in [folder, *folder.parents]:
        if part == top:
            return False
        if part.name == "compare" or any((part.parent / (part.name + s)).is_file() for s in ARCHIVE_SUFFIXES):
            return True
    return False


def measurement_folders(top: Path = VALIDATION) -> list[Path]:
    """Every folder under ``top`` that holds a manifest.json or a measurement archive, but none compare wrote."""
    found = {
        p.parent
        for p in top.rglob("*")
        if p.is_file() and (p.name == "manifest.json" or _archive_stem(p.name) is not None)
    }
    return sorted(f for f in found if not _derived(f, top))


def archives(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and _archive_stem(p.name) is not None)


def declared(folder: Path) -> tuple[str, str | None]:
    """How the README says the folder compares: ("current", None), ("commit", sha) or ("not kept", None)."""
    readme = folder / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    commits = COMMIT_LINE.findall(text)
    loose = [ln for ln in text.splitlines() if re.match(r"\s*compare with commit", ln, re.I)]
    if len(loose) != len(commits):
        raise ValueError(f"{readme}: a 'Compare with commit:' line must name one full 40-hex sha, got {loose}")
    if len(commits) > 1:
        raise ValueError(f"{readme}: names {len(commits)} commits to compare with; one at most")
    if commits and NOT_KEPT_LINE.search(text):
        raise ValueError(f"{readme}: names a commit and says the raw data was not kept")
    if commits:
        return "commit", commits[0]
    if NOT_KEPT_LINE.search(text):
        return "not kept", None
    return "current", None


FOLDERS = measurement_folders()
IDS = [str(f.relative_to(VALIDATION)) for f in FOLDERS]
BY_STATUS: dict[str, list[Path]] = {"current": [], "commit": [], "not kept": []}
for _folder in FOLDERS:
    BY_STATUS[declared(_folder)[0]].append(_folder)


def _ids(folders: list[Path]) -> list[str]:
    return [str(f.relative_to(VALIDATION)) for f in folders]


# ------------------------------------------------------------------------------------------------- git
def _git(*args: str, cwd: Path = ROOT, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=60, **kw)


def require_history(sha: str) -> None:
    """Skip (with the reason) where the repository's history is not at hand: an exported tree, no git, or a
    shallow clone that lacks the commit."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the named commit cannot be checked")
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout (an exported tree): the named commit cannot be checked")
    if not commit_exists(sha) and _git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true":
        pytest.skip(f"shallow clone without commit {sha[:12]}: fetch the full history to check it")


def commit_exists(sha: str) -> bool:
    return _git("cat-file", "-e", f"{sha}^{{commit}}").returncode == 0


def repo_path(recorded: str) -> str:
    """The repository path of a trace the manifest recorded by its absolute path on the measuring machine
    (``/work/main/.clean/traces/data/x.npz`` -> ``traces/data/x.npz``)."""
    i = recorded.rfind("traces/data/")
    if i < 0:
        raise ValueError(f"recorded trace {recorded!r} is not under traces/data/")
    return recorded[i:]


# ------------------------------------------------------------------------------------------------- helpers
def archive_manifest(archive: Path) -> dict:
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if Path(m.name).parts[1:] == ("manifest.json",))
        return json.loads(tar.extractfile(member).read())


def run_compare(archive: Path, tmp_path: Path, code: Path = ROOT) -> tuple[subprocess.CompletedProcess, Path]:
    """``python -m validate compare`` on a copy of ``archive`` (compare unpacks beside the archive: never in docs/),
    with the code at ``code``; the report goes to ``tmp_path/out``."""
    work = tmp_path / "archive"
    work.mkdir()
    copy = work / archive.name
    shutil.copyfile(archive, copy)
    out = tmp_path / "out"
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(code)}
    res = subprocess.run(
        [sys.executable, "-m", "validate", "compare", str(copy), "--out", str(out)],
        cwd=code,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )
    return res, out


def assert_clean(res: subprocess.CompletedProcess, out: Path, manifest: dict, where: str) -> None:
    """Exit 0, every measured configuration compared, and the same decisions as the executor in each."""
    tail = (res.stdout + res.stderr)[-1500:]
    assert res.returncode == 0, f"{where}: compare exited {res.returncode}:\n{tail}"
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [r["config"] for r in rows] == list(manifest["configs"]), f"{where}: not every configuration compared"
    differ = [r["config"] for r in rows if r["decisions_identical"] != "True"]
    assert not differ, f"{where}: the simulator's decisions differ from the executor's in {differ}"


# ------------------------------------------------------------------------------------------------- the folders
def test_every_measurement_is_found():
    """Discovery finds the nested folders too, and every folder under docs/validation/ that holds files is a
    measurement (a folder of another kind would otherwise be skipped silently)."""
    assert len(FOLDERS) >= 17, IDS
    assert "h200-2026-11-30-run1/xxl" in IDS and "h200-2026-11-30-run1/base" in IDS
    for folder in [p for p in VALIDATION.rglob("*") if p.is_dir() and not _derived(p, VALIDATION)]:
        if any(f.is_file() for f in folder.iterdir()):
            assert folder in FOLDERS, f"{folder} holds files but no manifest.json or measurement archive"


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_readme_declares_one_way_to_compare(folder):
    """The README line is well formed; a folder without an archive must say its raw data was not kept."""
    status, _ = declared(folder)
    if status != "not kept":
        assert len(archives(folder)) == 1, f"{folder}: one measurement archive expected, found {archives(folder)}"


@pytest.mark.parametrize("folder", BY_STATUS["current"], ids=_ids(BY_STATUS["current"]))
def test_archive_compares_with_the_current_code(folder, tmp_path):
    archive = archives(folder)[0]
    manifest = archive_manifest(archive)
    if (folder / "manifest.json").is_file():
        assert json.loads((folder / "manifest.json").read_text()) == manifest, (
            f"{folder}/manifest.json is not the archive's"
        )
    res, out = run_compare(archive, tmp_path)
    assert_clean(res, out, manifest, str(folder.relative_to(VALIDATION)))


@pytest.mark.parametrize("folder", BY_STATUS["commit"], ids=_ids(BY_STATUS["commit"]))
def test_named_commit_exists_and_holds_the_measured_traces(folder):
    _, sha = declared(folder)
    require_history(sha)
    assert commit_exists(sha), f"{folder}/README.md names commit {sha}, which is not in the repository"
    for recorded, checksum in archive_manifest(archives(folder)[0])["traces"].items():
        path = repo_path(recorded)
        blob = _git("show", f"{sha}:{path}")
        assert blob.returncode == 0, f"commit {sha[:12]} has no {path}"
        assert hashlib.sha256(blob.stdout).hexdigest() == checksum, (
            f"commit {sha[:12]}'s {path} is not the trace {folder.name} measured"
        )


@pytest.mark.parametrize("folder", BY_STATUS["commit"], ids=_ids(BY_STATUS["commit"]))
def test_archive_compares_at_its_named_commit(folder, tmp_path):
    """The named commit's own code (an export of it, run with this interpreter) compares the archive cleanly."""
    _, sha = declared(folder)
    require_history(sha)
    code = tmp_path / "code"
    code.mkdir()
    exported = _git("archive", "--format=tar", sha)
    assert exported.returncode == 0, exported.stderr.decode()[-500:]
    with tarfile.open(fileobj=io.BytesIO(exported.stdout)) as tar:
        tar.extractall(code, filter="data")
    archive = archives(folder)[0]
    res, out = run_compare(archive, tmp_path, code=code)
    assert_clean(res, out, archive_manifest(archive), f"{folder.relative_to(VALIDATION)} at {sha[:12]}")


@pytest.mark.parametrize("folder", BY_STATUS["not kept"], ids=_ids(BY_STATUS["not kept"]))
def test_report_only_folder_holds_no_runs_and_says_how_to_measure(folder):
    assert not archives(folder) and not (folder / "runs").exists(), (
        f"{folder}: holds raw data, so its README must not say it was not kept"
    )
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest.get("command", "").startswith("python -m validate "), f"{folder}: no measuring command"
    assert manifest.get("configs"), f"{folder}: no configurations"
    assert (folder / "compare.md").is_file(), f"{folder}: the report is missing"


def test_index_says_how_each_folder_compares():
    """docs/validation/README.md's index names every folder with how it compares (a short sha for a pinned one)."""
    text = (VALIDATION / "README.md").read_text()
    for folder, name in zip(FOLDERS, IDS):
        rows = [ln for ln in text.splitlines() if ln.startswith(f"| `{name}/`")]
        assert len(rows) == 1, f"the index has {len(rows)} rows for {name}/"
        status, sha = declared(folder)
        want = {"current": "current code", "not kept": "not kept"}.get(status) or f"`{sha[:7]}`"
        assert want in rows[0], f"the index row of {name}/ does not say {want!r}: {rows[0]}"


# ------------------------------------------------------------------------------------------------- the checks can fail
def test_the_checks_can_fail(tmp_path):
    """A malformed or doubled commit line is refused, an unknown commit does not exist, derived folders are not
    measurements, and a bad archive does not compare cleanly."""
    top = tmp_path / "v"
    (top / "m").mkdir(parents=True)
    (top / "m" / "manifest.json").write_text("{}")
    (top / "m" / "gpu-check.tar.gz").write_bytes(b"")
    (top / "m" / "gpu-check" / "runs").mkdir(parents=True)
    (top / "m" / "gpu-check" / "manifest.json").write_text("{}")
    (top / "m" / "compare").mkdir()
    (top / "m" / "compare" / "manifest.json").write_text("{}")
    assert measurement_folders(top) == [top / "m"]
    for text in [
        "Compare with commit: c86f2c2\n",
        "compare with commit: " + "a" * 40 + "\n",
        "Compare with commit: " + "a" * 40 + "\nCompare with commit: " + "b" * 40 + "\n",
        "Compare with commit: " + "a" * 40 + "\nRaw data: not kept\n",
    ]:
        (top / "m" / "README.md").write_text(text)
        with pytest.raises(ValueError):
            declared(top / "m")
    (top / "m" / "README.md").write_text("Compare with commit: " + "a" * 40 + "\n")
    assert declared(top / "m") == ("commit", "a" * 40)
    if shutil.which("git") and _git("rev-parse", "--git-dir").returncode == 0:
        assert not commit_exists("0" * 40)
    with pytest.raises(ValueError):
        repo_path("/elsewhere/x.npz")
    res = subprocess.CompletedProcess([], 1, "", "FAIL: the simulator and the executor made different decisions")
    with pytest.raises(AssertionError):
        assert_clean(res, tmp_path, {"configs": []}, "bad")
