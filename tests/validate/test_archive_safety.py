"""`validate compare` on measurement archives and folders as untrusted input.

An archive holds regular files and folders only, inside one top folder, bounded in count and size, with its gzip
stream checked whole; it unpacks into a private temporary folder that takes its final name only when complete, and
nothing is ever written outside that folder. Inside a measurement folder, every read and write goes through real
folders only (no link), stays inside, and reaches regular files only (a FIFO is refused, not waited on). The fields
compare uses in summary.json and manifest.json are checked. Every refusal is exit status 2 with one bounded line.
Hypothesis draws random member lists (links of every kind, '..', absolute names) and hostile field values.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import string
import subprocess
import sys
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import validate.archive as archive_mod
from moebase.errors import ConfigError, one_line
from tests.support.messages import checked_message
from tests.support.paths import ROOT
from validate.cli import main

SOURCE_ARCHIVE = ROOT / "docs" / "validation" / "h200-2026-11-30-s4-base" / "gpu-check.tar.gz"
CONFIG = "on-demand-b4"  # the quickest configuration of that measurement to simulate
MAX_LINE = 800  # the longest error line (a path of <= 200 characters and a problem of <= 500)
FUZZ = dict(
    max_examples=int(os.environ.get("ARCHIVE_FUZZ_EXAMPLES", 40)),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --------------------------------------------------------------------------------------------- helpers
class Files(dict):
    """File name -> content, shown briefly (hypothesis prints the fixtures of a failing example)."""

    def __repr__(self):
        return f"<measurement files {sorted(self)}>"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, bytes]:
    """A minimal measurement (one configuration of a committed H200 archive): relative name -> content."""
    with tarfile.open(SOURCE_ARCHIVE) as tar:  # a committed archive: trusted

        def read(name):
            return tar.extractfile(f"gpu-check/{name}").read()

        manifest = json.loads(read("manifest.json"))
        manifest["configs"] = [CONFIG]
        return Files(
            {
                "manifest.json": json.dumps(manifest).encode(),
                "calibration.yaml": read("calibration.yaml"),
                f"runs/{CONFIG}/summary.json": read(f"runs/{CONFIG}/summary.json"),
                f"runs/{CONFIG}/config.yaml": read(f"runs/{CONFIG}/config.yaml"),
            }
        )


def write_folder(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def member(name: str, kind: str = "file", data: bytes = b"x", link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    """A tar member: kind is file, dir, sym, hard, fifo, chr, blk, or a raw one-letter tar type."""
    ti = tarfile.TarInfo(name)
    types = {
        "file": tarfile.REGTYPE,
        "dir": tarfile.DIRTYPE,
        "sym": tarfile.SYMTYPE,
        "hard": tarfile.LNKTYPE,
        "fifo": tarfile.FIFOTYPE,
        "chr": tarfile.CHRTYPE,
        "blk": tarfile.BLKTYPE,
    }
    ti.type = types.get(kind, kind.encode() if isinstance(kind, str) else kind)
    ti.mode = 0o755 if kind == "dir" else 0o644
    ti.linkname = link
    if kind == "file":
        ti.size = len(data)
        return ti, data
    return ti, b""


def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for ti, data in members:
            tar.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
    return buf.getvalue()


def measurement_members(files: dict[str, bytes], top: str = "gpu-check") -> list:
    out = [member(top, "dir")]
    for name, data in files.items():
        out.append(member(f"{top}/{name}", "file", data))
    return out


def write_archive(path: Path, members: list, gz: bool = True) -> Path:
    data = tar_bytes(members)
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (links not followed): its kind, and a file's size and modification time (a
    folder's own times change as temporary entries come and go)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            s = os.lstat(p)
            out[str(p.relative_to(root))] = (
                (s.st_mode,) if p.is_dir() and not p.is_symlink() else (s.st_mode, s.st_size, s.st_mtime_ns)
            )
    return out


def run(args: list[str]) -> tuple[int, str, str]:
    """``python -m validate ARGS`` in process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def assert_refused(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) <= MAX_LINE, err
    for w in words:
        assert w in lines[0], (w, err)


# --------------------------------------------------------------------------------------------- archives
def test_a_good_archive_unpacks_and_compares(files, tmp_path):
    arc = write_archive(tmp_path / "gpu-check.tar.gz", measurement_members(files))
    code, out, err = run(["compare", arc])
    assert code == 0, err + out
    target = tmp_path / "gpu-check"
    assert (target / "compare" / "compare.csv").is_file() and (target / "runs" / CONFIG / "summary.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-check", "gpu-check.tar.gz"]  # no temporary left
    code, out, err = run(["compare", arc])  # the folder is reused as it is
    assert code == 0 and "already unpacked" in out, err + out


def test_a_plain_tar_unpacks_too(files, tmp_path):
    arc = write_archive(tmp_path / "m.tar", measurement_members(files), gz=False)
    code, out, err = run(["compare", arc])
    assert code == 0, err + out
    assert (tmp_path / "m" / "manifest.json").is_file()


HOSTILE = {
    "symlink out": [member("gpu-check/runs", "sym", link="../..")],
    "symlink absolute": [member("gpu-check/x", "sym", link="/etc/passwd")],
    "symlink chain": [
        member("gpu-check/a", "sym", link="."),
        member("gpu-check/a/b", "sym", link=".."),
        member("gpu-check/a/b/c", "sym", link=".."),
    ],
    "compare link": [member("gpu-check/compare", "sym", link="..")],
    "summary to /dev/zero": [member(f"gpu-check/runs/{CONFIG}/x", "sym", link="/dev/zero")],
    "hard link inside": [member("gpu-check/h", "hard", link="gpu-check/manifest.json")],
    "hard link out": [member("gpu-check/h", "hard", link="/etc/passwd")],
    "fifo": [member("gpu-check/fifo", "fifo")],
    "char device": [member("gpu-check/zero", "chr")],
    "block device": [member("gpu-check/sda", "blk")],
    "unknown type": [member("gpu-check/odd", "Z")],
    "dotdot name": [member("../x")],
    "dotdot inside": [member("gpu-check/../../x")],
    "absolute name": [member("/tmp/archive-safety-x")],
    "second top folder": [member("other/x")],
    "dot part": [member("gpu-check/./x")],
    "twice": [member("gpu-check/manifest.json", "file", b"{}")],
    "inside a file": [member("gpu-check/manifest.json/x")],
    "control characters": [member("gpu-check/a\nb")],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_members_are_refused_and_leave_nothing(files, tmp_path, case):
    members = measurement_members(files) + HOSTILE[case]
    arc = write_archive(tmp_path / "gpu-check.tar.gz", members)
    before = snapshot(tmp_path)
    code, out, err = run(["compare", arc])
    assert_refused(code, err, str(arc), "refused")
    assert snapshot(tmp_path) == before  # no folder, no temporary, nothing written anywhere


def test_member_types_are_named(files, tmp_path):
    for kind, word in (("sym", "symbolic link"), ("hard", "hard link"), ("fifo", "FIFO"), ("chr", "device")):
        arc = write_archive(
            tmp_path / f"{kind}.tar.gz", measurement_members(files) + [member("gpu-check/m", kind, link="x")]
        )
        code, _, err = run(["compare", arc])
        assert_refused(code, err, word, "'gpu-check/m'")


def test_a_top_that_is_a_file_or_an_archive_without_manifest_is_refused(tmp_path):
    for name, members in (
        ("a.tar.gz", [member("gpu-check")]),
        ("b.tar.gz", [member("gpu-check", "dir"), member("gpu-check/notes.txt")]),
        ("c.tar.gz", []),
    ):
        arc = write_archive(tmp_path / name, members)
        code, _, err = run(["compare", arc])
        assert_refused(code, err, name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar.gz", "b.tar.gz", "c.tar.gz"]


def test_a_member_claiming_1_2_gib_is_refused_before_reading(files, tmp_path):
    ti = tarfile.TarInfo("gpu-check/big")
    ti.size = int(1.2 * (1 << 30))
    head = tar_bytes(measurement_members(files))[:-1024]  # without its end blocks
    data = head + ti.tobuf(tarfile.GNU_FORMAT) + b"\0" * 4096  # the header alone: no 1.2 GiB of data
    arc = tmp_path / "gpu-check.tar.gz"
    arc.write_bytes(gzip.compress(data))
    code, _, err = run(["compare", arc])
    assert_refused(code, err, "'gpu-check/big'", "MB")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-check.tar.gz"]


def test_the_limits_hold(files, tmp_path, monkeypatch):
    monkeypatch.setattr(archive_mod, "MAX_MEMBERS", 8)
    many = measurement_members(files) + [member(f"gpu-check/f{i}") for i in range(10)]
    code, _, err = run(["compare", write_archive(tmp_path / "many.tar.gz", many)])
    assert_refused(code, err, "more than 8 members")
    monkeypatch.setattr(archive_mod, "MAX_MEMBERS", 10_000)
    monkeypatch.setattr(archive_mod, "MAX_MEMBER_BYTES", 100_000)
    big = measurement_members(files) + [member("gpu-check/big", "file", b"\0" * 200_000)]
    code, _, err = run(["compare", write_archive(tmp_path / "big.tar.gz", big)])
    assert_refused(code, err, "'gpu-check/big'", "200000 bytes")
    monkeypatch.setattr(archive_mod, "MAX_TOTAL_BYTES", 150_000)
    total = measurement_members(files) + [member(f"gpu-check/p{i}", "file", b"\0" * 90_000) for i in range(3)]
    code, _, err = run(["compare", write_archive(tmp_path / "total.tar.gz", total)])
    assert_refused(code, err, "more than 0 MB")
    # a stream that inflates past the bound is cut off while decompressing: 3 MB of zeros in a few KB
    monkeypatch.setattr(archive_mod, "MAX_MEMBERS", 10)
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(gzip.compress(tar_bytes(measurement_members(files)) + b"\0" * (3 << 20)))
    assert bomb.stat().st_size < 100_000
    code, _, err = run(["compare", bomb])
    assert_refused(code, err, "unpacks to more than")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.tar.gz", "bomb.tar.gz", "many.tar.gz", "total.tar.gz"]


def _good_gz(files) -> bytes:
    return gzip.compress(tar_bytes(measurement_members(files)), mtime=0)


@pytest.mark.parametrize("damage", ["crc", "length", "cut", "cut in the data", "garbage after"])
def test_a_damaged_gzip_stream_is_refused_before_use(files, tmp_path, damage):
    data = bytearray(_good_gz(files))
    if damage == "crc":
        data[-8] ^= 0xFF  # the trailer: CRC-32, then the length
    elif damage == "length":
        data[-1] ^= 0x01
    elif damage == "cut":
        data = data[:-4]
    elif damage == "cut in the data":
        data = data[: len(data) // 2]
    else:
        data += b"not gzip"
    arc = tmp_path / "gpu-check.tar.gz"
    arc.write_bytes(bytes(data))
    code, _, err = run(["compare", arc])
    assert_refused(code, err, str(arc))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-check.tar.gz"]


def test_a_damaged_tar_header_in_a_plain_tar_is_refused(files, tmp_path):
    data = bytearray(tar_bytes(measurement_members(files) + [member("gpu-check/later")]))
    pos = data.rfind(b"gpu-check/later")
    data[pos + 148 : pos + 156] = b"9999999\0"  # the header's checksum: tarfile would stop there, silently
    arc = tmp_path / "m.tar"
    arc.write_bytes(bytes(data))
    code, _, err = run(["compare", arc])
    assert_refused(code, err, "damaged tar header")


def test_a_failed_unpack_leaves_nothing_and_the_corrected_archive_unpacks(files, tmp_path):
    arc = tmp_path / "gpu-check.tar.gz"
    data = bytearray(_good_gz(files))
    data[-8] ^= 0xFF
    arc.write_bytes(bytes(data))
    code, _, err = run(["compare", arc])
    assert_refused(code, err)
    assert not (tmp_path / "gpu-check").exists()
    arc.write_bytes(_good_gz(files))
    code, out, err = run(["compare", arc])
    assert code == 0, err + out
    assert "unpacked gpu-check.tar.gz" in out


def test_an_existing_target_is_reused_only_when_it_is_a_real_folder_from_this_archive(files, tmp_path):
    arc = tmp_path / "gpu-check.tar.gz"
    arc.write_bytes(_good_gz(files))
    target = tmp_path / "gpu-check"
    (tmp_path / "elsewhere").mkdir()
    target.symlink_to("elsewhere")
    code, _, err = run(["compare", arc])
    assert_refused(code, err, "is a link")
    assert not any((tmp_path / "elsewhere").iterdir())
    target.unlink()
    target.write_text("a file")
    code, _, err = run(["compare", arc])
    assert_refused(code, err, "not a folder")
    target.unlink()
    code, out, err = run(["compare", arc])
    assert code == 0, err
    # another archive of the same name: the old folder is not taken for its content
    changed = dict(files)
    changed["notes.txt"] = b"another measurement"
    arc.write_bytes(gzip.compress(tar_bytes(measurement_members(changed))))
    code, _, err = run(["compare", arc])
    assert_refused(code, err, "another gpu-check.tar.gz")


def test_a_missing_archive_is_refused_even_beside_its_unpacked_folder(files, tmp_path):
    arc = tmp_path / "gpu-check.tar.gz"
    arc.write_bytes(_good_gz(files))
    code, _, err = run(["compare", arc])
    assert code == 0, err
    arc.unlink()
    code, _, err = run(["compare", arc])
    assert_refused(code, err, str(arc), "no such file")


def test_an_archive_that_is_not_a_regular_file_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "x.tar.gz"
    os.mkfifo(fifo)
    code, _, err = run(["compare", fifo])
    assert_refused(code, err, "FIFO")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.tar.gz"]


# --------------------------------------------------------------------------------------------- archive names
ALNUM = set(string.ascii_letters + string.digits)
PLAIN_CHARS = ALNUM | set("._+=@,-")
NAME_CHARS = st.one_of(
    st.sampled_from(list(". -_a0/\\\n\t\x00\x1b~=+@,é")),
    st.characters(),
)
SUFFIXES = st.sampled_from(archive_mod.ARCHIVE_SUFFIXES)


def is_plain(stem: str) -> bool:
    """The plain-name rule, restated: a letter or digit, then letters, digits and ._+=@,- , at most 100."""
    return 0 < len(stem) <= 100 and stem[0] in ALNUM and set(stem) <= PLAIN_CHARS


@given(
    stem=st.one_of(
        st.text(NAME_CHARS, max_size=120),
        st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._+=@,-]{0,110}\Z"),
        st.text(st.sampled_from([".", " "]), max_size=6),
    ),
    suffix=SUFFIXES,
)
@settings(**{**FUZZ, "max_examples": 200})
def test_an_archive_unpacks_to_a_plain_named_folder_beside_it_or_is_refused(stem, suffix):
    """Whatever an archive is called (dots, a leading dot, spaces, slashes, control characters, a long name, any
    suffix), its folder is an entry of the archive's own folder named by a plain name, or it is refused naming
    the archive; a plain name is always taken."""
    archive = Path("/d/e") / (stem + suffix)  # a slash in the stem: the archive's name is its last part
    assert archive.name.endswith(suffix)
    name = archive.name[: -len(suffix)]
    try:
        target = archive_mod.archive_target(archive)
    except ConfigError as exc:
        msg = checked_message(exc, MAX_LINE)
        assert msg.startswith(one_line(str(archive), 200)[:150]) and "plain name" in msg, msg
        assert not is_plain(name), msg
        return
    assert target.parent == archive.parent and target.name == name and is_plain(name)


@given(
    stem=st.text(st.sampled_from([".", " ", "-", "\t", "\x1b"]), max_size=8),
    lead=st.sampled_from(["", ".", "..", " "]),
    suffix=SUFFIXES,
)
@settings(**{**FUZZ, "max_examples": 25})
def test_an_archive_named_by_dots_is_refused_and_writes_nothing(files, tmp_path, stem, lead, suffix):
    """``...tar.gz``, ``..tgz`` and their kind (no letter or digit before the suffix) would name ``..`` or ``.``,
    here measurement folders: compare refuses them in one line naming the archive, and writes nothing anywhere."""
    case = write_folder(tempfile_dir(tmp_path), files)  # measurements where '..' and '.' would lead
    write_folder(case / "sub", files)
    arc = write_archive(case / "sub" / (lead + stem + suffix), measurement_members(files), gz=suffix != ".tar")
    before = snapshot(case)
    code, _, err = run(["compare", arc])
    assert_refused(code, err, "plain name")
    assert one_line(str(arc), 200)[:150] in err
    assert snapshot(case) == before


# --------------------------------------------------------------------------------------------- concurrent unpacks
THREADS = 4


def test_concurrent_unpacks_of_one_archive_take_turns(files, tmp_path, monkeypatch):
    """Several threads unpacking one archive at once: the first unpacks while every other waits on the lock (the
    first holds it until all others say they wait), then each uses the complete folder; all return it, one
    unpack happens, and no lock file or temporary is left."""
    arc = write_archive(tmp_path / "gpu-check.tar.gz", measurement_members(files))
    logs: list[str] = []
    all_waiting = threading.Event()
    inside, most_inside = [0], [0]
    copy = archive_mod._copy_stream

    def log(line: str) -> None:
        logs.append(line)
        if sum(x.startswith("waiting for another unpack") for x in logs) == THREADS - 1:
            all_waiting.set()

    def slow_copy(archive, dest):
        inside[0] += 1
        most_inside[0] = max(most_inside[0], inside[0])
        all_waiting.wait(timeout=60)  # a bound only: without the lock, nobody waits and the counts below fail
        try:
            return copy(archive, dest)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(archive_mod, "_copy_stream", slow_copy)
    start = threading.Barrier(THREADS)

    def one() -> Path:
        start.wait()
        return archive_mod.unpack(arc, log)

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(lambda _: one(), range(THREADS)))
    assert results == [tmp_path / "gpu-check"] * THREADS
    assert most_inside[0] == 1, logs
    assert sum(x.startswith("unpacked ") for x in logs) == 1, logs
    assert sum(x.startswith("using ") for x in logs) == THREADS - 1, logs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-check", "gpu-check.tar.gz"]


UNPACK = "import sys; from validate.archive import unpack; print(unpack(sys.argv[1]))"


def test_concurrent_processes_unpacking_one_archive_all_succeed(files, tmp_path):
    """Real processes started together on one archive: each exits 0 naming the same folder, one unpacks."""
    arc = write_archive(tmp_path / "gpu-check.tar.gz", measurement_members(files))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", UNPACK, str(arc)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(THREADS)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * THREADS, outs
    assert all(out.strip().splitlines()[-1] == str(tmp_path / "gpu-check") for out, _ in outs), outs
    assert sum("unpacked gpu-check.tar.gz" in out for out, _ in outs) == 1, outs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-check", "gpu-check.tar.gz"]


def test_a_lock_file_that_cannot_be_made_is_one_line(files, tmp_path):
    """The lock file's place holding a link, a folder or a FIFO: refused in one line naming it, nothing made."""
    arc = write_archive(tmp_path / "gpu-check.tar.gz", measurement_members(files))
    lock = tmp_path / ".gpu-check.lock"
    for make in (lambda: lock.symlink_to(tmp_path / "elsewhere"), lock.mkdir, lambda: os.mkfifo(lock)):
        make()
        before = snapshot(tmp_path)
        code, _, err = run(["compare", arc])
        assert_refused(code, err, ".gpu-check.lock")
        assert snapshot(tmp_path) == before
        lock.rmdir() if lock.is_dir() and not lock.is_symlink() else lock.unlink()


# --------------------------------------------------------------------------------------------- random archives
PARTS = ["runs", "a", "b", "compare", "manifest.json", "..", ".", "", "gpu-check"]
LINK_TARGETS = [
    ".",
    "..",
    "../..",
    "../../..",
    "a",
    "a/b",
    "../outside",
    "../outside/bait.txt",
    "/dev/zero",
    "/etc/passwd",
    "{outside}",
    "{outside}/bait.txt",
    "gpu-check/manifest.json",
    "gpu-check/a",
]
KINDS = ["file", "file", "dir", "dir", "sym", "sym", "hard", "fifo", "chr"]


@st.composite
def member_lists(draw):
    out = []
    for _ in range(draw(st.integers(0, 5))):
        parts = draw(st.lists(st.sampled_from(PARTS), min_size=1, max_size=3))
        name = "/".join(parts)
        if draw(st.integers(0, 4)):  # mostly inside the top folder, where only the kind can be wrong
            name = "gpu-check/" + name
        if draw(st.integers(0, 9)) == 0:
            name = "/" + name
        kind = draw(st.sampled_from(KINDS))
        link = draw(st.sampled_from(LINK_TARGETS))
        data = draw(st.sampled_from([b"", b"x", b"{}", b"root:x:0:0"]))
        out.append((name, kind, link, data))
    return out


@given(extra=member_lists(), with_measurement=st.integers(0, 3).map(bool))
@settings(**FUZZ)
def test_random_archives_are_refused_or_stay_inside_their_folder(files, tmp_path, extra, with_measurement):
    case = Path(tempfile_dir(tmp_path))
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "bait.txt").write_text("bait")
    members = measurement_members(files) if with_measurement else []
    for name, kind, link, data in extra:
        members.append(member(name, kind, data, link.replace("{outside}", str(outside))))
    try:
        arc = write_archive(case / "gpu-check.tar.gz", members)
    except (ValueError, tarfile.TarError):  # a member tarfile itself will not write
        return
    before = snapshot(tmp_path)
    code, out, err = run(["compare", arc, "--max-median-error", "1000"])
    after = snapshot(tmp_path)
    target = case / "gpu-check"
    new = {k for k in after if k not in before or after[k] != before[k]}
    inside = str(target.relative_to(tmp_path))
    assert all(k == inside or k.startswith(inside + "/") for k in new), sorted(new)  # nothing written elsewhere
    if code == 2:
        assert_refused(code, err)
        assert "root:x" not in err and "bait" not in err
    else:
        assert code in (0, 1), err
    if target.exists():
        for dirpath, dirnames, filenames in os.walk(target):
            for name in dirnames + filenames:
                mode = os.lstat(Path(dirpath) / name).st_mode
                assert Path(dirpath, name).is_dir() or Path(dirpath, name).is_file()
                assert not os.path.islink(Path(dirpath) / name), (dirpath, name, mode)


_cases = iter(range(10**9))


def tempfile_dir(tmp_path: Path) -> Path:
    """A fresh folder for one example (hypothesis reuses the test's tmp_path)."""
    d = tmp_path / f"case-{next(_cases)}"
    d.mkdir()
    return d


# --------------------------------------------------------------------------------------------- inside a folder
@pytest.fixture
def folder(files, tmp_path) -> Path:
    return write_folder(tmp_path / "m", files)


def test_the_minimal_measurement_compares(folder):
    code, out, err = run(["compare", folder])
    assert code == 0, err + out
    assert (folder / "compare" / "compare.md").is_file()


def _link(path: Path, target: str | Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


SUMMARY = f"runs/{CONFIG}/summary.json"


@pytest.mark.parametrize(
    "case",
    [
        "summary link to /etc/passwd",
        "summary link to /dev/zero",
        "summary is a folder",
        "summary link inside",
        "runs link",
        "config link",
        "calibration link",
        "manifest link",
        "hardware snapshot link",
        "summary is /dev/null-like FIFO",
    ],
)
def test_reads_stay_inside_the_folder_through_real_folders_only(folder, tmp_path, case):
    outside = tmp_path / "outside"
    write_folder(outside, {"x": b"root:x:0:0:root:/root:/bin/bash\n"})
    if case == "summary link to /etc/passwd":
        _link(folder / SUMMARY, "/etc/passwd")
    elif case == "summary link to /dev/zero":
        _link(folder / SUMMARY, "/dev/zero")
    elif case == "summary is a folder":
        (folder / SUMMARY).unlink()
        (folder / SUMMARY).mkdir()
    elif case == "summary link inside":
        shutil.copy(folder / SUMMARY, folder / "copy.json")
        _link(folder / SUMMARY, "../../copy.json")
    elif case == "runs link":
        shutil.copytree(folder / "runs", outside / "runs")
        _link(folder / "runs", outside / "runs")
    elif case == "config link":
        _link(folder / f"runs/{CONFIG}/config.yaml", outside / "x")
    elif case == "calibration link":
        _link(folder / "calibration.yaml", outside / "x")
    elif case == "manifest link":
        _link(folder / "manifest.json", outside / "x")
    elif case == "hardware snapshot link":
        summary = json.loads((folder / SUMMARY).read_text())
        summary["decisions_sha256"] = "0" * 64  # so that compare looks for the snapshot
        (folder / SUMMARY).write_text(json.dumps(summary))
        _link(folder / f"runs/{CONFIG}/hardware.yaml", outside / "x")
    else:
        (folder / SUMMARY).unlink()
        os.mkfifo(folder / SUMMARY)
    before = snapshot(tmp_path)
    code, _, err = run(["compare", folder])
    assert_refused(code, err)
    assert "root:x" not in err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "name", ["../../elsewhere", "/etc", "", "a/b", "..", ".", "x" * 101, 5, None, ["a"], "-rf", "a\nb", CONFIG + "/"]
)
def test_manifest_configs_are_plain_names(folder, tmp_path, name):
    (tmp_path / "elsewhere" / "summary.json").parent.mkdir(parents=True)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["configs"] = [CONFIG, name]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run(["compare", folder])
    assert_refused(code, err, "manifest.json", "configs[1]")
    assert not (folder / "compare").exists()


def test_manifest_configs_given_twice_and_bad_traces_are_refused(folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    for change, word in (
        ({"configs": [CONFIG, CONFIG]}, "twice"),
        ({"configs": "abc"}, "configs"),
        ({"traces": ["x"]}, "traces"),
        ({"traces": {"x": 5}}, "traces"),
        ({"traces": {"": "0" * 64}}, "traces"),
        ({"traces": {"a" * 2000: "0" * 64}}, "traces"),
    ):
        (folder / "manifest.json").write_text(json.dumps({**manifest, **change}))
        code, _, err = run(["compare", folder])
        assert_refused(code, err, "manifest.json", word)


@pytest.mark.parametrize(
    "case",
    [
        "compare link up",
        "compare link absolute",
        "compare is a file",
        "compare is a FIFO",
        "compare.md is a FIFO",
        "compare.csv is a folder",
        "compare.png link to a FIFO",
    ],
)
def test_the_output_folder_is_a_real_folder_inside(folder, tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    out = folder / "compare"
    if case == "compare link up":
        out.symlink_to("..")
    elif case == "compare link absolute":
        out.symlink_to(outside)
    elif case == "compare is a file":
        out.write_text("x")
    elif case == "compare is a FIFO":
        os.mkfifo(out)
    else:
        out.mkdir()
        if case == "compare.md is a FIFO":
            os.mkfifo(out / "compare.md")
        elif case == "compare.csv is a folder":
            (out / "compare.csv").mkdir()
        else:
            os.mkfifo(outside / "fifo")
            (out / "compare.png").symlink_to(outside / "fifo")
    before = snapshot(tmp_path)
    code, _, err = run(["compare", folder])
    assert_refused(code, err, "compare")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["file", "fifo", "empty"])
def test_a_bad_out_is_refused_before_anything_runs(folder, tmp_path, kind):
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("x")
    elif kind == "fifo":
        os.mkfifo(out)
    else:
        out = ""
    before = snapshot(tmp_path)
    code, stdout, err = run(["compare", folder, "--out", out])
    assert_refused(code, err)
    assert "[1/1]" not in stdout and snapshot(tmp_path) == before


def test_a_long_suite_string_is_cut_in_the_title_and_report(folder, tmp_path):
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["suite"] = "s" * 1_000_000
    manifest["device"] = {"odd": ["x" * 5000]}
    manifest["date"] = "a|b\nc"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = run(["compare", folder])
    assert code == 0, err
    md = (folder / "compare" / "compare.md").read_text()
    assert max(len(line) for line in md.splitlines()[:3]) < 400
    assert "a/b c" in md


# --------------------------------------------------------------------------------------------- summary values
@pytest.mark.parametrize(
    "path,value,word",
    [
        (("throughput_tok_s",), -85.6, "throughput_tok_s"),
        (("throughput_tok_s",), 0, "throughput_tok_s"),
        (("iteration_ms", "mean"), 0, "iteration_ms.mean"),
        (("iteration_ms", "p50"), "12", "iteration_ms.p50"),
        (("iteration_ms",), [1, 2], "iteration_ms"),
        (("iterations",), 0, "iterations"),
        (("iterations",), 2.5, "iterations"),
        (("iterations",), True, "iterations"),
        (("copies",), None, "copies"),
        (("decisions_sha256",), 5, "decisions_sha256"),
        (("cpu_expert_frac",), 1.5, "cpu_expert_frac"),
        (("host_phase_ms",), "x", "host_phase_ms"),
        (("host_phase_ms", "decide"), -1, "host_phase_ms.decide"),
        (("stall_ms",), float("nan"), "stall_ms"),
        (("iteration_ms", "mean"), 1e308, "iteration_ms.mean"),
        (("throughput_tok_s",), 1e-300, "throughput_tok_s"),
        (("mean_copy_ms",), 1e300, "mean_copy_ms"),
    ],
)
def test_bad_summary_fields_are_named(folder, path, value, word):
    summary = json.loads((folder / SUMMARY).read_text())
    target = summary
    for k in path[:-1]:
        target = target[k]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    (folder / SUMMARY).write_text(json.dumps(summary))
    code, _, err = run(["compare", folder])
    assert_refused(code, err, "summary.json", word)
    assert not (folder / "compare").exists()


HOSTILE_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
SUMMARY_PATHS = [keys for keys, _ in __import__("validate.compare", fromlist=["x"]).SUMMARY_FIELDS] + [("config",)]


@given(
    changes=st.lists(
        st.tuples(st.sampled_from(SUMMARY_PATHS), st.one_of(st.just("<delete>"), HOSTILE_VALUES)),
        min_size=1,
        max_size=3,
    ),
    manifest_change=st.one_of(
        st.none(),
        st.tuples(st.sampled_from(["configs", "traces", "suite", "device", "date", "<whole>"]), HOSTILE_VALUES),
    ),
)
@settings(**{**FUZZ, "max_examples": int(os.environ.get("ARCHIVE_FUZZ_EXAMPLES", 30))})
def test_random_summary_and_manifest_values_exit_0_1_or_2_never_a_traceback(files, tmp_path, changes, manifest_change):
    folder = write_folder(tempfile_dir(tmp_path), files)
    summary = json.loads((folder / SUMMARY).read_text())
    for keys, value in changes:
        target = summary
        for k in keys[:-1]:
            if not isinstance(target.get(k), dict):
                target[k] = {}
            target = target[k]
        if value == "<delete>":
            target.pop(keys[-1], None)
        else:
            target[keys[-1]] = value
    (folder / SUMMARY).write_text(json.dumps(summary))
    if manifest_change is not None:
        manifest = json.loads((folder / "manifest.json").read_text())
        key, value = manifest_change
        manifest = value if key == "<whole>" else {**manifest, key: value}
        (folder / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = run(["compare", folder])
    if code == 2:
        assert_refused(code, err)
    else:
        assert code in (0, 1) and not err, err
        table = (folder / "compare" / "compare.csv").read_text().lower()
        assert "nan" not in table and "inf" not in table


# --------------------------------------------------------------------------------------------- end to end
def _cli(args, cwd=ROOT, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "validate", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def test_end_to_end_a_link_chain_archive_writes_nothing_outside(files, tmp_path):
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    members = measurement_members(files) + [
        member("gpu-check/l1", "sym", link="."),
        member("gpu-check/l1/l2", "sym", link=".."),
        member("gpu-check/l1/l2/l3", "sym", link="../.."),
        member("gpu-check/compare", "sym", link="l1/l2/l3"),
    ]
    arc = write_archive(deep / "gpu-check.tar.gz", members)
    before = snapshot(tmp_path)
    res = _cli(["compare", arc])
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "symbolic link" in res.stderr and "Traceback" not in res.stderr and res.stdout == ""
    assert snapshot(tmp_path) == before


def test_end_to_end_a_fifo_summary_does_not_hang(folder):
    (folder / SUMMARY).unlink()
    os.mkfifo(folder / SUMMARY)
    res = _cli(["compare", folder], timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "summary.json" in res.stderr


def test_end_to_end_a_bad_gzip_checksum_is_refused(files, tmp_path):
    data = bytearray(_good_gz(files))
    data[-6] ^= 0x10
    arc = tmp_path / "gpu-check.tar.gz"
    arc.write_bytes(bytes(data))
    res = _cli(["compare", arc])
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "gzip" in res.stderr and str(arc) in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-check.tar.gz"]


def test_end_to_end_a_negative_real_throughput_is_refused(folder):
    summary = json.loads((folder / SUMMARY).read_text())
    summary["throughput_tok_s"] = -summary["throughput_tok_s"]
    (folder / SUMMARY).write_text(json.dumps(summary))
    res = _cli(["compare", folder])
    assert res.returncode == 2 and "throughput_tok_s" in res.stderr and "must be > 0" in res.stderr, res.stderr


def test_plain_names():
    for good in ("on-demand-b8", "diffmoe-arc-b32-c13", "a.b_c+d=e@f,g"):
        assert archive_mod.plain_name(good, "x") == good
    for bad in ("..", ".", "", "a/b", "/a", "-a", "a b", "x" * 101, 3, None):
        with pytest.raises(ConfigError):
            archive_mod.plain_name(bad, "x")


# --------------------------------------------------------------------------------------------- what a file names
SECRET = "root:x:0:0:secret-first-line"


def _edit_yaml(path: Path, edit) -> None:
    import yaml

    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))


REFERENCES = {
    "model path": lambda d: d.__setitem__("model", "{secret}"),
    "model base": lambda d: d.__setitem__("model", {"base": "{secret}"}),
    "trace": lambda d: d["workload"].__setitem__("trace", "{secret}"),
    "relative escape": lambda d: d["workload"].__setitem__("trace", "../../../../../../../../..{secret}"),
    "home": lambda d: d.__setitem__("model", "~/../..{secret}"),
}


@pytest.mark.parametrize("case", sorted(REFERENCES))
def test_a_measurement_may_not_reference_files_outside_itself_and_the_project(folder, tmp_path, case):
    """A config inside a measurement naming a file elsewhere on the machine is refused by where that file lies,
    before it is read: no error ever shows what such a file holds."""
    secret = tmp_path / "elsewhere" / "secret.yaml"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\n")
    config = folder / "runs" / CONFIG / "config.yaml"

    def edit(d):
        REFERENCES[case](d)
        for section in (d, d["workload"]):
            for key, value in section.items():
                if isinstance(value, str):
                    section[key] = value.replace("{secret}", str(secret))
                elif isinstance(value, dict) and value.get("base") == "{secret}":
                    value["base"] = str(secret)

    _edit_yaml(config, edit)
    before = snapshot(tmp_path / "elsewhere")
    code, _, err = run(["compare", folder])
    assert_refused(code, err)
    assert "secret-first-line" not in err and ("outside" in err or "no such" in err), err
    assert snapshot(tmp_path / "elsewhere") == before


def test_a_calibration_base_outside_is_refused_without_echo(folder, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET + "\n")
    cal = folder / "calibration.yaml"
    _edit_yaml(cal, lambda d: d.__setitem__("base", str(secret)))
    code, _, err = run(["compare", folder])
    assert_refused(code, err, "outside")
    assert "secret-first-line" not in err


def test_a_profile_the_manifest_recorded_is_reachable_only_while_its_checksum_holds(folder, tmp_path):
    """A measurement of a model profile outside the project (the validator's own tests do this) records the file
    and its checksum; compare may read it while it is unchanged, and refuses it once it has changed."""
    import hashlib

    model = ROOT / "configs" / "models" / "switch-base-128.yaml"
    own = tmp_path / "models" / "switch-base-128.yaml"  # the measured model, outside the project
    own.parent.mkdir()
    own.write_bytes(model.read_bytes())
    _edit_yaml(folder / "runs" / CONFIG / "config.yaml", lambda d: d.__setitem__("model", str(own)))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["profiles"] = {str(own): hashlib.sha256(own.read_bytes()).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = run(["compare", folder, "--out", tmp_path / "c1"])
    assert code == 0, err + out
    own.write_bytes(own.read_bytes() + b"\n# changed\n")
    code, _, err = run(["compare", folder, "--out", tmp_path / "c2"])
    assert_refused(code, err, "outside")


def test_file_content_of_the_wrong_shape_is_described_not_shown(tmp_path):
    """Every profile or config read from a file that does not hold a mapping says what it holds, not the text."""
    from sim.config.run_config import load_run_config
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS

    for i, text in enumerate([SECRET, "- " + SECRET, "12345", ""]):
        prof = tmp_path / f"p{i}.yaml"
        prof.write_text(text)
        for raw in ({"model": str(prof)}, {"hardware": str(prof)}, {"model": {"base": str(prof)}}):
            cfg = tmp_path / f"c{i}.yaml"
            base = (ROOT / "configs" / "switch_xxl.yaml").read_text()
            import yaml

            d = yaml.safe_load(base)
            d.update(raw)
            cfg.write_text(yaml.safe_dump(d))
            with pytest.raises(ConfigError) as exc:
                load_run_config(str(cfg), [], POLICIES.names(), PREDICTORS.names())
            assert "secret" not in str(exc.value) and "12345" not in str(exc.value), str(exc.value)


def test_the_measured_trace_checksum_is_found_under_the_measuring_machines_path():
    from validate.compare import measured_digest

    a, b = "a" * 64, "b" * 64
    here = Path("/home/me/project/traces/data/x.npz")
    assert measured_digest({str(here): a}, here, "traces/data/x.npz") == a
    assert measured_digest({"/work/main/.clean/traces/data/x.npz": a}, here, "traces/data/x.npz") == a
    assert measured_digest({"/m1/traces/data/x.npz": a, "/m2/traces/data/x.npz": b}, here, "traces/data/x.npz") is None
    assert measured_digest({"/m1/traces/data/x.npz": a, "/m2/traces/data/x.npz": a}, here, "traces/data/x.npz") == a
    assert measured_digest({"/m1/other/y.npz": a}, here, "traces/data/x.npz") is None
    assert measured_digest({"/m1/traces/data/xx.npz": a}, here, "data/x.npz") is None
    assert measured_digest({"/abs/x.npz": a}, here, "/abs2/x.npz") is None


def test_a_committed_measurement_whose_trace_changed_is_refused_by_its_checksum(files, tmp_path):
    """The manifest records the trace under the measuring machine's path; a changed trace here is caught."""
    manifest = json.loads(files["manifest.json"])
    key = next(iter(manifest["traces"]))
    manifest["traces"] = {key: "0" * 64}
    folder = write_folder(tmp_path / "m", {**files, "manifest.json": json.dumps(manifest).encode()})
    code, _, err = run(["compare", folder])
    assert_refused(code, err, "checksum mismatch")
