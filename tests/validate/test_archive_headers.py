"""Raw tar headers of a measurement archive, read by validate/archive.py before tarfile parses any.

Python 3.11's tarfile reads a pax header in time quadratic in its runs of digits and allocates what a GNU long
name or pax header claims; so every header is checked first: a checksum that holds, number fields read as tarfile
reads them, sizes in range (an extended header at most MAX_EXTENDED_HEADER_BYTES), pax records well formed, and a
stream that ends only after its end-of-archive block. Hypothesis draws size fields (octal, base-256, negative,
garbage), pax records (good and damaged), GNU long names and cut streams: each either unpacks as written or is
refused with one line, and a negative, oversized or malformed header never reaches tarfile.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import validate.archive as archive_mod
from moebase.errors import ConfigError
from tests.support.messages import checked_message

FUZZ = dict(
    max_examples=int(os.environ.get("ARCHIVE_FUZZ_EXAMPLES", 60)),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
MAX_LINE = 800  # the longest error line (a path of <= 200 characters and a problem of <= 500)
BOUND = archive_mod.MAX_EXTENDED_HEADER_BYTES
TOP = b"m"
MANIFEST = b'{"configs": []}'


# --------------------------------------------------------------------------------------------- building streams
def octal(n: int, width: int = 12) -> bytes:
    assert 0 <= n < 8 ** (width - 1)
    return b"%0*o\0" % (width - 1, n)


def base256(n: int) -> bytes:
    """A size field in GNU's base-256 (lead byte 0x80)."""
    return b"\x80" + n.to_bytes(11, "big")


def header(name: bytes, kind: bytes = b"0", size: bytes | int = 0) -> bytes:
    """One ustar header block with a checksum that holds; ``size`` an int or the raw 12-byte field."""
    b = bytearray(512)
    b[0 : min(len(name), 100)] = name[:100]
    b[100:108], b[108:116], b[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    b[124:136] = octal(size) if isinstance(size, int) else size
    b[136:148] = octal(0)
    b[156:157] = kind
    b[257:265] = b"ustar\x0000"
    b[148:156] = b" " * 8
    b[148:156] = b"%06o\0 " % sum(b)
    return bytes(b)


def padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def entry(name: bytes, data: bytes = b"", kind: bytes = b"0") -> bytes:
    return header(name, kind, len(data)) + padded(data)


def measurement() -> bytes:
    """The smallest measurement archive's members: its top folder and manifest.json."""
    return entry(TOP + b"/", kind=b"5") + entry(TOP + b"/manifest.json", MANIFEST)


def pax_record(key: bytes, value: bytes) -> bytes:
    """``LEN KEY=VALUE\\n`` with LEN counting the whole record."""
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


END = b"\0" * 1024


# --------------------------------------------------------------------------------------------- unpacking
@contextlib.contextmanager
def tarfile_forbidden(forbid: bool) -> Iterator[list[str]]:
    """While active (when ``forbid``), reaching tarfile fails the test."""
    reached: list[str] = []

    def fail(*args, **kwargs):
        reached.append("tarfile.open")
        raise AssertionError("tarfile was reached")

    with pytest.MonkeyPatch.context() as mp:
        if forbid:
            mp.setattr(archive_mod.tarfile, "open", fail)
        yield reached


def unpacked(stream: bytes, forbid_tarfile: bool = False) -> dict[str, bytes] | str:
    """The files the plain tar ``stream`` unpacks to (relative name -> content), or the one-line refusal;
    nothing but the folder is left beside the archive either way."""
    with tempfile.TemporaryDirectory() as d, tarfile_forbidden(forbid_tarfile) as reached:
        arc = Path(d) / "m.tar"
        arc.write_bytes(stream)
        try:
            target = archive_mod.unpack(arc, log=lambda line: None)
        except ConfigError as exc:
            assert sorted(os.listdir(d)) == ["m.tar"]
            assert not reached
            return checked_message(exc, MAX_LINE)
        assert sorted(os.listdir(d)) == ["m", "m.tar"]
        return {
            str(p.relative_to(target)): p.read_bytes()
            for p in target.rglob("*")
            if p.is_file() and p.name != archive_mod.ORIGIN_FILE
        }


def refused_before_tarfile(stream: bytes, *words: str) -> str:
    msg = unpacked(stream, forbid_tarfile=True)
    assert isinstance(msg, str), f"unpacked: {sorted(msg)}"
    for w in words:
        assert w in msg, (w, msg)
    return msg


# --------------------------------------------------------------------------------------------- number fields
FIELDS = st.one_of(
    st.binary(min_size=12, max_size=12),
    st.integers(0, 8**11 - 1).map(octal),
    st.builds(lambda lead, rest: lead + rest, st.sampled_from([b"\x80", b"\xff"]), st.binary(min_size=11, max_size=11)),
    st.builds(
        lambda pad, digits, end: (pad + digits + end).ljust(12, b"\0")[:12],
        st.sampled_from([b"", b" ", b"  "]),
        st.text("01234567+-_ 89a", max_size=11).map(str.encode),
        st.sampled_from([b"", b"\0", b" ", b" \0"]),
    ),
)


@given(field=FIELDS)
@settings(**{**FUZZ, "max_examples": 300})
def test_a_number_field_is_read_as_tarfile_reads_it_or_refused(field):
    """Every number field the scan reads, tarfile reads as the same number (so both find the same data and the
    same next header); what tarfile's writer makes, the scan reads."""
    n = archive_mod._number(field)
    if n is not None:
        assert tarfile.nti(field) == n


@given(n=st.integers(-(256**11) + 1, 256**11 - 1))
@settings(**{**FUZZ, "max_examples": 100})
def test_every_number_tarfile_writes_is_read_back(n):
    assert archive_mod._number(tarfile.itn(n, 12, tarfile.GNU_FORMAT)) == n


@given(flips=st.lists(st.tuples(st.integers(0, 511), st.integers(1, 255)), max_size=3), size=FIELDS)
@settings(**{**FUZZ, "max_examples": 200})
def test_a_checksum_holds_exactly_when_tarfile_accepts_it(flips, size):
    block = bytearray(header(b"m/x", b"0", size))
    for at, xor in flips:
        block[at] ^= xor
    ours = archive_mod._checksum_holds(bytes(block))
    if archive_mod._number(bytes(block[148:156])) is not None:
        assert ours == (tarfile.nti(bytes(block[148:156])) in tarfile.calc_chksums(bytes(block)))
    else:
        assert not ours


WHOLE = measurement() + entry(TOP + b"/f", b"x" * 700) + END
HEADERS = [0, 512, 1024 + 512]  # where the headers of WHOLE begin


@given(at=st.sampled_from(HEADERS), pos=st.integers(0, 511), xor=st.integers(1, 255))
@settings(**FUZZ)
def test_a_header_whose_checksum_fails_is_refused_before_tarfile(at, pos, xor):
    """Any byte of any header changed: when tarfile would find its checksum wrong, it is refused before tarfile
    (tarfile itself would end the archive there, silently); else it unpacks or is refused in one line."""
    stream = bytearray(WHOLE)
    stream[at + pos] ^= xor
    block = bytes(stream[at : at + 512])
    try:
        holds = tarfile.nti(block[148:156]) in tarfile.calc_chksums(block)
    except tarfile.HeaderError:
        holds = False
    if not holds:
        refused_before_tarfile(bytes(stream), "m.tar")
    else:
        unpacked(bytes(stream))


# --------------------------------------------------------------------------------------------- size fields
KINDS = [b"0", b"\0", b"5", b"x", b"g", b"L", b"K", b"V", b"S", b"2"]


def tarfile_size(field: bytes) -> int | None:
    """The size tarfile would read from ``field`` (None: it cannot)."""
    try:
        return tarfile.nti(field)
    except tarfile.HeaderError:
        return None


@given(kind=st.sampled_from(KINDS), field=FIELDS, fill=st.integers(0, 3))
@settings(**FUZZ)
def test_random_size_fields_unpack_or_are_refused_and_bad_ones_never_reach_tarfile(kind, field, fill):
    """A header of any type with any size field, before a measurement: a size tarfile would read as negative,
    over MAX_MEMBER_BYTES, over MAX_EXTENDED_HEADER_BYTES for a header that is not a regular member, or not as a
    number at all, is refused before tarfile; any other either unpacks as written or is refused in one line."""
    size = tarfile_size(field)
    data = b"\x07" * max(0, min(size or 0, 3000)) if fill else b""
    stream = header(TOP + b"/odd", kind, field) + padded(data) + measurement() + END
    carries_data = kind not in (b"5", b"2")  # tarfile reads a folder's or a link's next header right after it
    bad = (
        size is None
        or size < 0
        or size > archive_mod.MAX_MEMBER_BYTES
        or (kind not in (b"0", b"\0", b"5", b"2") and size > BOUND)
        or kind == b"S"
        or (kind in (b"x", b"g") and size > 0)  # its records: the bytes after it, none of them a pax record
        or (carries_data and -(-size // 512) * 512 > len(stream) - 512)
    )
    if bad:
        refused_before_tarfile(stream, "m.tar")
        return
    out = unpacked(stream)
    if isinstance(out, dict):
        assert out["manifest.json"] == MANIFEST
        if (
            data and len(data) == size and kind != b"K"
        ):  # its data is there: only a regular member unpacks, as written (a long link's
            # name is the next member's link name, which a folder ignores)
            assert kind in (b"0", b"\0") and out == {"odd": data, "manifest.json": MANIFEST}, out


def test_a_negative_or_huge_extended_header_is_refused_before_tarfile():
    for kind in (b"x", b"g", b"L", b"K"):
        for field in (b"\xff" * 12, base256(1 << 40), octal(BOUND + 1), b"-0000000001\0"):
            refused_before_tarfile(header(TOP + b"/x", kind, field) + measurement() + END, "m.tar")


# --------------------------------------------------------------------------------------------- pax headers
KEYS = st.one_of(
    st.sampled_from([b"path", b"size", b"mtime", b"uid", b"comment", b"hdrcharset", b"GNU.sparse.size"]),
    st.binary(min_size=1, max_size=12).filter(lambda k: b"=" not in k and b"\n" not in k),
)
VALUES = st.one_of(
    st.just(b"<the data's length>"),
    st.text(" a=\n9\u00e9", max_size=20).map(str.encode),
    st.binary(max_size=30),
    st.text("0123456789", min_size=1, max_size=14).map(str.encode),
    st.integers(1, 12_000).map(lambda n: b"9" * n),  # a long run of digits: tarfile's slow case
)
DAMAGE = st.sampled_from(["none"] * 6 + ["longer", "shorter", "zero lead", "no newline", "not digits", "no space"])


def damaged(record: bytes, how: str) -> bytes:
    length, rest = record.split(b" ", 1)
    n = int(length)
    if how in ("longer", "shorter") and len(str(n + (1 if how == "longer" else -1))) != len(length):
        how = "no newline"  # 9 -> 10 or 10 -> 9 digits would make the record right again
    return {
        "none": record,
        "longer": b"%d %s" % (n + 1, rest),
        "shorter": b"%d %s" % (n - 1, rest),
        "zero lead": b"0" + record,
        "no newline": record[:-1] + b"x",
        "not digits": b"1a" + record[2:],
        "no space": length + b"_" + rest,
    }[how]


def pax_verdict(records: list[tuple[bytes, bytes, str]], payload: bytes, data: bytes) -> str:
    """What the rules say of a pax header: "bad" over the bound, with a damaged record, one not UTF-8 or of
    several lines, a sparse key, or a size not of 1-12 plain digits or over MAX_MEMBER_BYTES; "either" for a
    size that is not the data's length (the headers after it are then read elsewhere); else "good"."""
    verdict = "good"
    if len(payload) > BOUND:
        return "bad"
    for key, value, how in records:
        try:
            key.decode("utf-8"), value.decode("utf-8")
        except UnicodeDecodeError:
            return "bad"
        if how != "none" or b"\n" in value or key.startswith(b"GNU.sparse."):
            return "bad"
        if key == b"size":
            if not (value.isdigit() and len(value) <= 12) or int(value) > archive_mod.MAX_MEMBER_BYTES:
                return "bad"
            if int(value) != len(data):
                verdict = "either"
    return verdict


@given(
    records=st.lists(st.tuples(KEYS, VALUES, DAMAGE), max_size=4, unique_by=lambda r: r[0]),
    kind=st.sampled_from([b"x", b"g"]),
    data=st.binary(max_size=600),
)
@settings(**FUZZ)
def test_random_pax_headers_unpack_or_are_refused_and_bad_ones_never_reach_tarfile(records, kind, data):
    """A pax header of random records before a member: a damaged record (its length off, no newline, not
    digits), one not UTF-8 or of several lines, a sparse key, a size not of plain digits, a global header giving
    a size, or a header over MAX_EXTENDED_HEADER_BYTES is refused before tarfile; a good one unpacks the member
    as written (or is refused in one line by the member rules, for a path of its own)."""
    records = [(k, str(len(data)).encode() if v == b"<the data's length>" else v, how) for k, v, how in records]
    payload = b"".join(damaged(pax_record(key, value), how) for key, value, how in records)
    stream = header(b"pax", kind, len(payload)) + padded(payload) + measurement()
    stream += entry(TOP + b"/data.bin", data) + END
    verdict = pax_verdict(records, payload, data)
    if kind == b"g" and any(key == b"size" for key, _, _ in records):
        verdict = "bad"  # a size for every member after it: refused, only a local header gives one
    if verdict == "bad":
        refused_before_tarfile(stream, "m.tar")
        return
    out = unpacked(stream)
    if verdict == "good" and not any(key == b"path" for key, _, _ in records):
        assert out == {"manifest.json": MANIFEST, "data.bin": data}, out


def test_a_global_pax_header_giving_a_size_is_refused_before_tarfile():
    """tarfile applies a global size to each later member after finding its data: refused, whatever the size."""
    for size in (b"0", b"15", b"1000"):
        record = pax_record(b"size", size)
        refused_before_tarfile(header(b"g", b"g", len(record)) + padded(record) + measurement() + END, "size")


def test_a_pax_header_at_the_bound_unpacks_and_one_byte_more_is_refused_before_tarfile():
    """A record of digits filling MAX_EXTENDED_HEADER_BYTES (the slowest for tarfile) is read; one byte longer is
    refused without tarfile."""
    for extra, ok in ((0, True), (1, False)):
        total = BOUND + extra
        record = pax_record(b"comment", b"9" * (total - len(str(total)) - len(b" comment=\n")))
        assert len(record) == BOUND + extra
        stream = header(b"pax", b"x", len(record)) + padded(record) + measurement() + END
        if ok:
            assert unpacked(stream) == {"manifest.json": MANIFEST}
        else:
            refused_before_tarfile(stream, str(BOUND))


def with_pax_size(size: int, member: bytes, member_size: int, data: bytes) -> bytes:
    """A measurement, then ``member`` (header size ``member_size``) with a pax header giving ``size``, then
    ``data``."""
    record = pax_record(b"size", b"%d" % size)
    return measurement() + header(b"pax", b"x", len(record)) + padded(record) + header(member, b"0", member_size) + data


def test_a_pax_size_moves_the_next_header_as_tarfile_moves_it():
    """A pax size is the one both read, not the member header's: a larger one covers what would be a header, a
    smaller one uncovers a header (here a GNU long name claiming 1 TiB) that is then checked before tarfile."""
    covered = b"d" * 10 + b"\0" * 502 + entry(TOP + b"/hidden", b"h")
    stream = with_pax_size(len(covered), TOP + b"/d", 10, covered) + END
    assert unpacked(stream) == {"manifest.json": MANIFEST, "d": covered}
    uncovered = b"d" * 10 + b"\0" * 502 + header(b"././@LongLink", b"L", base256(1 << 40)) + entry(TOP + b"/x", b"x")
    stream = with_pax_size(10, TOP + b"/d", len(uncovered), uncovered) + END
    refused_before_tarfile(stream, "1099511627776 bytes")


@pytest.mark.parametrize("kind,name", [(b"5", b"m/d"), (b"\0", b"m/d/"), (b"2", b"m/l"), (b"6", b"m/f")])
def test_the_size_of_a_folder_link_or_fifo_is_ignored_as_tarfile_ignores_it(kind, name):
    """tarfile reads the header right after a folder (also an old-style one: a file named with a trailing
    slash), a link, a device or a FIFO, whatever its size says: so does the check, which finds a GNU long name
    claiming 1 TiB there, that the size would have covered."""
    hidden = header(b"././@LongLink", b"L", base256(1 << 40)) + entry(TOP + b"/x", b"x")
    stream = measurement() + header(name, kind, len(hidden)) + hidden + END
    refused_before_tarfile(stream, "1099511627776 bytes")


def test_an_oversized_member_is_named_as_tarfile_names_it():
    """A member claiming more than MAX_MEMBER_BYTES is refused before tarfile, named by its GNU long name, its pax
    path or its ustar prefix and name."""
    big = octal(archive_mod.MAX_MEMBER_BYTES + 1)
    long = b"m/" + b"l" * 150
    stream = measurement() + header(b"././@LongLink", b"L", len(long)) + padded(long) + header(b"m/x", b"0", big)
    refused_before_tarfile(stream + END, "member 'm/llllllllll", "MB")
    path = pax_record(b"path", b"m/by-pax")
    stream = measurement() + header(b"pax", b"x", len(path)) + padded(path) + header(b"m/x", b"0", big)
    refused_before_tarfile(stream + END, "'m/by-pax'", "MB")
    prefixed = bytearray(header(b"x", b"0", big))
    prefixed[345:347] = b"m/"  # the ustar prefix, before the name
    prefixed[148:156] = b" " * 8
    prefixed[148:156] = b"%06o\0 " % sum(prefixed)
    refused_before_tarfile(measurement() + bytes(prefixed) + END, "'m//x'", "MB")


# --------------------------------------------------------------------------------------------- chains and ends
@given(
    chain=st.lists(st.sampled_from([b"x", b"X", b"g", b"L", b"K"]), min_size=1, max_size=4),
    member=st.booleans(),
)
@settings(**FUZZ)
def test_extended_headers_given_twice_or_before_no_member_are_refused_before_tarfile(chain, member):
    """Each kind of extended header at most once before a member ('x' and 'X' being one kind), and a member after
    them: tarfile reads such a chain by recursion, and one with no member at the end of the stream."""
    stream = measurement()
    for kind in chain:
        data = pax_record(b"comment", b"c") if kind in (b"x", b"X", b"g") else b"m/long\0"
        stream += header(b"ext", kind, len(data)) + padded(data)
    stream += (entry(TOP + b"/f", b"f") if member else b"") + END
    kinds = [b"x" if k == b"X" else k for k in chain]
    if len(set(kinds)) < len(kinds) or not member:
        refused_before_tarfile(stream, "m.tar")
    else:
        out = unpacked(stream)
        expected = "long" if b"L" in chain else "f"
        assert out == {"manifest.json": MANIFEST, expected: b"f"}, out


LONG_NAMES = st.one_of(
    st.binary(max_size=BOUND + 600),
    st.builds(
        lambda name, tail: b"m/" + name.encode() + tail,
        st.from_regex(r"\A[a-z0-9][a-z0-9._-]{0,300}\Z"),
        st.sampled_from([b"", b"\0", b"\0garbage"]),
    ),
)


@given(long=LONG_NAMES, field=st.one_of(st.none(), st.none(), FIELDS))
@settings(**{**FUZZ, "max_examples": 30})
def test_gnu_long_names_of_random_size_unpack_or_are_refused(long, field):
    """A GNU long name of any content and claimed size: within the bound it is read (the member then named by
    it, or refused by the member rules), past it or negative it is refused before tarfile."""
    size = len(long) if field is None else tarfile_size(field)
    stream = measurement() + header(b"././@LongLink", b"L", len(long) if field is None else field)
    stream += padded(long) + entry(TOP + b"/f", b"f") + END
    if size is None or size < 0 or size > BOUND:
        refused_before_tarfile(stream, "m.tar")
        return
    out = unpacked(stream)
    if isinstance(out, dict) and field is None:
        assert out == {"manifest.json": MANIFEST, long.split(b"\0")[0].decode()[2:]: b"f"}, out


def test_a_sparse_member_is_refused_before_tarfile():
    refused_before_tarfile(measurement() + header(TOP + b"/s", b"S", 0) + END, "sparse")
    sparse = pax_record(b"GNU.sparse.major", b"1") + pax_record(b"GNU.sparse.minor", b"0")
    stream = measurement() + header(b"pax", b"x", len(sparse)) + padded(sparse) + entry(TOP + b"/s", b"1\n") + END
    refused_before_tarfile(stream, "sparse")


@given(cut=st.integers(0, len(WHOLE)))
@settings(**{**FUZZ, "max_examples": 40})
def test_a_tar_stream_cut_before_its_end_block_is_refused(cut):
    """A plain tar cut anywhere before the end of its first end-of-archive block is refused before tarfile (a cut
    at a header's edge would otherwise lose the members after it); after it, it unpacks whole."""
    whole = WHOLE
    end_block = len(whole) - len(END)
    if cut < end_block + 512:
        refused_before_tarfile(whole[:cut], "m.tar")
    else:
        assert unpacked(whole[:cut]) == {"manifest.json": MANIFEST, "f": b"x" * 700}


# --------------------------------------------------------------------------------------------- the reported archives
def compare(archive: Path) -> tuple[int, str]:
    """``python -m validate compare ARCHIVE`` in process: exit status and stderr."""
    from validate.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["compare", str(archive)])
    return code, err.getvalue()


@pytest.mark.parametrize(
    "case",
    ["pax header of 300,000 digits", "long name claiming 1 TiB", "pax header of negative size", "long link of -1"],
)
def test_the_reported_archives_end_in_one_line_before_tarfile(tmp_path, case):
    """The issue's archives (a few KB of gzip): compare exits 2 with one line naming the archive, tarfile never
    reached, nothing left beside the archive."""
    head = {
        "pax header of 300,000 digits": header(b"pax", b"x", 300_000) + padded(b"9" * 300_000),
        "long name claiming 1 TiB": header(b"././@LongLink", b"L", base256(1 << 40)),
        "pax header of negative size": header(b"pax", b"x", b"\xff" * 12),
        "long link of -1": header(b"././@LongLink", b"K", b"\xff" * 12),
    }[case]
    arc = tmp_path / "gpu-check.tar.gz"
    arc.write_bytes(gzip.compress(measurement() + head + entry(TOP + b"/f", b"f") + END))
    assert arc.stat().st_size < 5000
    with tarfile_forbidden(True):
        code, err = compare(arc)
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(arc) in err, err
    assert sorted(os.listdir(tmp_path)) == ["gpu-check.tar.gz"]
