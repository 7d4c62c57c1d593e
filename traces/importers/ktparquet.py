"""`traces import kt-parquet FILE... --model NAME --out OUT.npz`: per-token routing logged by kTransformers.

The routing logs of a kTransformers/SGLang deployment (as the Qwen3.5-35B-A3B logs in GitHub r3ndd/ktransformers'
``data/traces/``, with the server's ``output_<prompt>.json`` beside them): Parquet files with one row per forward
token and MoE layer, in execution order:

- ``layer_id`` (integer, 0..L-1): the MoE layer;
- ``token_position`` (integer): the token's position inside its forward pass (restarting at 0 in every pass);
- ``expert_ids`` (list of integers, top-k long): the routed experts, in the router's rank order;
- ``expert_weights`` (list of floats, as long): their gate weights;
- ``context_id`` (string, optional): the request; ``token_category`` (string, optional): its prompt's category.
  Other columns (``token_id``, ``token_text``, ``timestamp``) are not read.

A forward pass starts where ``layer_id`` decreases. Inside a pass of several tokens (a prefill) the rows are
layer-major: layer 0 of every token, then layer 1, and so on. A request is the rows of one ``context_id`` (one
request per file when the column is absent or empty); its passes 0 and 1 are single-token warm-up passes (dropped),
pass 2 is the prefill (its tokens become the request's prompt rows, in token order) and every later pass is one
decode token (one decode row each; the first completion token comes out of the prefill, so a request with C
completion tokens has C - 1 decode passes). Requests come in the order the files are given, then in the order of
their rows. Expert ids keep the router's rank order, and the gate weights are kept (as float16).

``--outputs DIR_OR_FILE`` (repeatable) names the server's output JSONs (``output_<prompt>.json``: ``context_id``,
``trace_file``, ``usage.prompt_tokens`` and ``usage.completion_tokens``, at the top level or under
``raw_response``); a request is matched by its ``context_id`` (else, for a file of one request, by ``trace_file``)
and its prompt and completion counts must equal its prefill tokens and its decode passes + 1.

Every file is untrusted: it is opened only if it is a regular file of at most MAX_PARQUET_BYTES; its footer (at
most MAX_FOOTER_BYTES, MAX_ROW_GROUPS row groups, MAX_ROWS rows) is walked before anything is decoded, and each
column read may hold no more values than its rows allow (a top-k list at most MAX_TOP_K long, or the model's
top-k when its profile says more, and never longer than its experts when they are known: :func:`read_limits`),
all the files of one import decoding to at most MAX_DECODED_BYTES; the columns are then decoded BATCH_ROWS rows
at a time, each batch counted against that bound and checked (list lengths from their offsets first) before it is
kept. Every column, list length, id, weight (finite, not negative), layer and pass is checked. Any problem is one
InputError naming the file (and the request, pass or row: rows count from 0 in the file) and the problem; nothing
is written.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moebase.errors import InputError, brief
from traces.format import MAX_CONTEXT, MAX_REQUESTS, ModelInfo, Provenance, Trace, TraceMeta, today
from traces.importers.common import (
    check_content,
    check_dataset_name,
    check_model_fit,
    check_model_name,
    check_out,
    default_num_experts,
    offsets_from_lengths,
    profiles_held_to,
    read_bounded,
    read_json_file,
    show_list,
)

TOOL = "traces import kt-parquet"
REQUIRED = ("layer_id", "token_position", "expert_ids", "expert_weights")
OPTIONAL = ("context_id", "token_category")
#: Single-token passes that open every request (identical in every request, not part of it).
WARMUP_PASSES = 2
#: The largest Parquet file read, into memory (the real ones are at most 2.6 MB, 43,200 rows).
MAX_PARQUET_BYTES = 256 << 20
#: The most rows a file may say it holds (read from the footer before any column is decoded).
MAX_ROWS = 1 << 24
#: The most row groups a file may have and the largest footer it may have: the real logs hold one group per
#: 1,000 rows and a 46 KB footer for 43,200 rows; the footer is walked (in Python) before anything is decoded.
MAX_ROW_GROUPS = 1 << 14
MAX_FOOTER_BYTES = 16 << 20
#: The most pages the columns read may have, and the largest page (uncompressed): every page header is walked (in
#: Python) before anything is decoded, and a page is decompressed whole. Writers cut pages at 1 MiB by default;
#: the real logs have 2 pages a column and row group.
MAX_PAGES = 1 << 17
MAX_PAGE_BYTES = 16 << 20
#: The most the columns read may decode to, all files of one import together (the 12 real logs, 245,000 rows,
#: decode to 46 MB): estimated from each footer before anything is decoded, then counted batch by batch as it is
#: decoded, so that memory stays a small multiple of it (with the file's own bytes) whatever a file holds.
MAX_DECODED_BYTES = 256 << 20
#: Rows decoded at a time (a batch never spans row groups; the real logs have 1,024 rows a group): larger batches
#: only grow pyarrow's buffers (a top-64 file: 150 MB of them at 65,536 rows, 19 MB at 8,192).
BATCH_ROWS = 1 << 13
#: The most MoE layers (layer_id 0..MAX_LAYERS-1).
MAX_LAYERS = 4096
#: The longest top-k list accepted unless a model profile says more (real MoE models route to 1..16 experts); never
#: more than the model's experts when they are known before reading.
MAX_TOP_K = 64
#: The largest output JSON read, and the most JSON files a folder given to --outputs may hold.
MAX_OUTPUT_JSON_BYTES = 16 << 20
MAX_OUTPUT_FILES = 4096
#: The longest context_id or token_category kept (request names and categories go into the trace's metadata).
MAX_NAME_CHARS = 200
INT16_MAX = int(np.iinfo(np.int16).max)
FLOAT16_MAX = float(np.finfo(np.float16).max)
ROUTING_OF = (
    "prompt rows: each request's prefill pass (its layer-major rows put in token order); decode rows: one "
    "per later forward pass (the first completion token comes out of the prefill, so a request has "
    "completion_tokens - 1 decode rows); the two single-token warm-up passes of each request dropped"
)


def add_parser(fmt) -> None:
    """Register ``kt-parquet`` under ``traces import``."""
    p = fmt.add_parser(
        "kt-parquet", help="kTransformers per-token routing logs (Parquet, one row per token and MoE layer)"
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="Parquet logs (<prompt>_session.parquet), in request order")
    p.add_argument("--out", "-o", required=True, help="trace file to write (.npz)")
    p.add_argument("--model", required=True, help="model name in the trace, e.g. qwen3.5-35b-a3b")
    p.add_argument(
        "--outputs",
        action="append",
        default=None,
        metavar="DIR_OR_FILE",
        help="the server's output JSONs (a folder of *.json, or files; repeatable): each request's "
        "prompt and completion token counts are checked against its rows",
    )
    p.add_argument(
        "--num-experts",
        type=int,
        default=None,
        help="routed experts per MoE layer (default: the model's profile in configs/models/, else a "
        "numeric suffix of --model, else the largest id + 1)",
    )
    p.add_argument("--source-model", default=None, help="checkpoint that produced the routing (default: --model)")
    p.add_argument("--dataset", default=None, help="data set name for provenance (default: the requests' categories)")
    p.set_defaults(func=_run)


# --------------------------------------------------------------------------------------------- reading a file
@dataclass(frozen=True)
class LogRows:
    """One file's rows, checked batch by batch: layer int16 [n], position int32 [n]; ids int16 [n, k]; weights
    [n, k] in the column's float type; per-row context codes [n] into ``contexts`` (None: one request for the
    file); the same for categories."""

    path: Path
    layer: np.ndarray
    position: np.ndarray
    ids: np.ndarray
    weights: np.ndarray
    context_codes: np.ndarray | None
    contexts: list[str]
    category_codes: np.ndarray | None
    categories: list[str]


@dataclass
class ReadLimits:
    """What the files of one import may decode to: top-k lists of at most ``top_k`` values (``why`` says where
    that bound comes from), and ``left`` bytes of decoded columns, all files together."""

    top_k: int = MAX_TOP_K
    why: str = "MAX_TOP_K, the most without a model profile that says more"
    left: int = field(default_factory=lambda: MAX_DECODED_BYTES)

    def check(self, n: int, path: Path, what: str) -> None:
        """InputError naming the file when ``n`` more decoded bytes would pass the bound."""
        if n > self.left:
            used = MAX_DECODED_BYTES - self.left
            before = f" ({used >> 20} MiB of it taken by the files before)" if used else ""
            raise InputError(
                f"{path}: {what} decode to {n >> 20} MiB or more, past the {MAX_DECODED_BYTES >> 20} MiB of "
                f"columns one import may decode{before}"
            )

    def spend(self, n: int, path: Path, what: str) -> None:
        self.check(n, path, what)
        self.left -= n


def read_limits(model: str, num_experts: int | None) -> ReadLimits:
    """The read limits of an import of ``model``: top-k at most MAX_TOP_K, or a profile's top-k when the trace is
    held to one that says more, and never more than the model's experts when known before reading
    (``--num-experts``, the profile, the name's suffix)."""
    specs = [spec for _, spec in profiles_held_to(model)]
    limits = ReadLimits()
    if specs and max(s.top_k for s in specs) > MAX_TOP_K:
        limits = ReadLimits(max(s.top_k for s in specs), "the model profile's top-k")
    experts, source = num_experts, "--num-experts"
    if experts is None and specs:
        experts, source = min(s.num_experts for s in specs), "its model profile"
    elif experts is None:
        try:
            experts, source = default_num_experts(model)
        except InputError:
            experts = None
    if experts is not None and experts < limits.top_k:
        limits = ReadLimits(int(experts), f"the model's {experts} experts, from {source}")
    return limits


def read_log(path: str | os.PathLike, limits: ReadLimits | None = None) -> LogRows:
    """Read and check one Parquet log within ``limits`` (spent by what it decodes); any problem raises InputError
    naming the file."""
    import pyarrow as pa

    limits = limits if limits is not None else ReadLimits()
    path = Path(path)
    data = read_bounded(path, MAX_PARQUET_BYTES, "Parquet log")
    if len(data) < 12 or data[:4] != b"PAR1" or data[-4:] != b"PAR1":
        raise InputError(f"{path}: not a Parquet file (no PAR1 magic at its start and end)")
    size = int.from_bytes(data[-8:-4], "little")
    if size > MAX_FOOTER_BYTES or size > len(data) - 12:
        raise InputError(f"{path}: a footer of {size} bytes, more than the {MAX_FOOTER_BYTES} a Parquet log may have")
    pf, columns = _open(data, path)
    kinds = _column_kinds(pf.schema_arrow, columns)
    limits.check(_check_footer(data, pf.metadata, path, kinds, limits), path, "its columns")
    rows = _Columns(path, limits, pf.metadata.num_rows, [c for c in OPTIONAL if c in columns])
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=False):
            rows.add(batch)
    except (pa.ArrowException, OSError, ValueError, EOFError, MemoryError, IndexError, KeyError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({_why(exc)})") from None
    return rows.finish()


def _open(data: bytes, path: Path):
    """The file (read from memory, on this thread: no file handle for pyarrow's reads to outlive; its footer's
    strings and lists bounded as ours are), its string columns read as dictionaries (a name repeated on every row
    decodes once), and the columns to read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bounded = dict(
        pre_buffer=False, thrift_string_size_limit=MAX_FOOTER_BYTES, thrift_container_size_limit=MAX_ROW_GROUPS
    )
    try:
        names = pq.ParquetFile(pa.BufferReader(data), **bounded).schema_arrow.names
        strings = [c for c in OPTIONAL if names.count(c) == 1]
        pf = pq.ParquetFile(pa.BufferReader(data), read_dictionary=strings, **bounded)
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError, EOFError, MemoryError, IndexError, KeyError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({_why(exc)})") from None
    return pf, _check_schema(schema, path)


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {brief(text, 160)[1:-1]}" if text else type(exc).__name__


def _check_schema(schema, path: Path) -> list[str]:
    """The columns to read: every one of REQUIRED with its type, and those of OPTIONAL present (strings or
    nulls)."""
    import pyarrow.types as pt

    names = list(schema.names)
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise InputError(
            f"{path}: no column {', '.join(repr(c) for c in missing)} (has: {show_list(names)}); a "
            f"kTransformers routing log has {', '.join(REQUIRED)}"
        )
    for name in REQUIRED + OPTIONAL:
        if names.count(name) > 1:
            raise InputError(f"{path}: column {name!r} appears {names.count(name)} times")
    for name in ("layer_id", "token_position"):
        t = schema.field(name).type
        if not pt.is_integer(t):
            raise InputError(f"{path}: column {name!r} is {t}, expected integers")
    for name, ok, what in (("expert_ids", pt.is_integer, "integers"), ("expert_weights", pt.is_floating, "floats")):
        t = schema.field(name).type
        if not (pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t)) or not ok(t.value_type):
            raise InputError(f"{path}: column {name!r} is {t}, expected lists of {what}")
    for name in OPTIONAL:
        if name in names:
            t = schema.field(name).type
            t = t.value_type if pt.is_dictionary(t) else t
            if not (pt.is_string(t) or pt.is_large_string(t) or pt.is_null(t)):
                raise InputError(f"{path}: column {name!r} is {t}, expected strings")
    return list(REQUIRED) + [c for c in OPTIONAL if c in names]


#: Each column read, by name: its kind ("int", "list" or "str") and the bytes one of its values decodes to.
_Kinds = dict[str, tuple[str, int]]


def _column_kinds(schema, columns: list[str]) -> _Kinds:
    """Each column read: its kind ("int", "list" or "str") and the bytes a value of it decodes to (a string's code:
    4), by which its decoded size is estimated."""
    import pyarrow.types as pt

    kinds = {}
    for c in columns:
        t = schema.field(c).type
        if c in ("expert_ids", "expert_weights"):
            kinds[c] = ("list", t.value_type.bit_width // 8)
        else:
            kinds[c] = ("int", t.bit_width // 8) if c in REQUIRED else ("str", 0 if pt.is_null(t) else 4)
    return kinds


# --------------------------------------------------------------------------------------------- the footer
#: Thrift compact-protocol types (the encoding of a Parquet footer).
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)
#: The deepest nesting of footer fields walked (a real footer nests 5 deep).
_MAX_NESTING = 32


class _Thrift:
    """Thrift's compact protocol over ``data[pos:end]`` (a Parquet footer): the fields the importer needs, the rest
    skipped; ValueError on anything malformed. Nothing is allocated from a size it reads, and a list may not say it
    holds more items than there are bytes left (each takes one at least)."""

    def __init__(self, data: bytes, pos: int, end: int):
        self.data, self.pos, self.end = data, pos, end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise ValueError("the footer ends inside a field")
        self.pos += 1
        return self.data[self.pos - 1]

    def advance(self, n: int) -> None:
        if n > self.end - self.pos:
            raise ValueError("a field runs past the footer's end")
        self.pos += n

    def varint(self) -> int:
        value = shift = 0
        while (b := self.byte()) & 0x80:
            value |= (b & 0x7F) << shift
            shift += 7
            if shift > 63:
                raise ValueError("an integer of more than 64 bits")
        return value | (b << shift)

    def integer(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def binary(self) -> bytes:
        n = self.varint()
        self.advance(n)
        return self.data[self.pos - n : self.pos]

    def fields(self):
        """(id, type) of each field of a struct, up to its stop."""
        last = 0
        while (b := self.byte()) & 0x0F != _STOP:
            last = last + (b >> 4) if b >> 4 else self.integer()
            yield last, b & 0x0F

    def items(self, kind: int) -> int:
        """The length of a list whose items must be of type ``kind``."""
        b = self.byte()
        n = b >> 4 if b >> 4 != 15 else self.varint()
        if (b & 0x0F) != kind and n:
            raise ValueError(f"a list of type {b & 0x0F} where type {kind} belongs")
        if n > self.end - self.pos:
            raise ValueError("a list longer than the footer")
        return n

    def skip(self, kind: int, depth: int = 0, item: bool = False) -> None:
        """Pass over one value of type ``kind`` (``item``: a list's, where a bool takes a byte)."""
        if depth > _MAX_NESTING:
            raise ValueError("fields nested too deeply")
        if kind in (_TRUE, _FALSE, _BYTE):
            self.advance(1 if item or kind == _BYTE else 0)
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.advance(8)
        elif kind == _BINARY:
            self.advance(self.varint())
        elif kind in (_LIST, _SET, _MAP):
            self._skip_container(kind, depth)
        elif kind == _STRUCT:
            for _, k in self.fields():
                self.skip(k, depth + 1)
        else:
            raise ValueError(f"a field of unknown type {kind}")

    def _skip_container(self, kind: int, depth: int) -> None:
        """Pass over a list, set or map: its items' types from its header, then each item."""
        types: tuple[int, ...]
        if kind == _MAP:
            n = self.varint()
            both = self.byte() if n else 0
            types = (both >> 4, both & 0x0F)
        else:
            b = self.byte()
            n = b >> 4 if b >> 4 != 15 else self.varint()
            types = (b & 0x0F,)
        if n * len(types) > self.end - self.pos:
            raise ValueError("a list longer than the footer")
        for _ in range(n):
            for t in types:
                self.skip(t, depth + 1, True)


def _check_footer(data: bytes, md, path: Path, kinds: _Kinds, limits: ReadLimits) -> int:
    """Walk the footer, and the page headers of the columns read, before anything is decoded (see
    :class:`_Footer`); returns what the columns read decode to, estimated. Read from the bytes, not from pyarrow's
    column metadata (which can abort the process on a corrupt footer)."""
    if md.num_rows > MAX_ROWS:
        raise InputError(f"{path}: {md.num_rows} rows, more than the {MAX_ROWS} a Parquet log may have")
    size = int.from_bytes(data[-8:-4], "little")  # checked before pyarrow read it (read_log)
    footer = _Footer(data, path, kinds, limits)
    try:
        rows, groups, estimate = footer.walk(_Thrift(data, len(data) - 8 - size, len(data) - 8))
    except ValueError as exc:
        raise InputError(f"{path}: not a readable Parquet file (its footer: {exc})") from None
    if (rows, groups) != (md.num_rows, md.num_row_groups):
        raise InputError(f"{path}: its footer's row groups hold {rows} rows in {groups}; it says {md.num_rows}")
    return estimate


@dataclass
class _Chunk:
    """A column chunk as the footer states it: its column (the first part of its path), its values (levels: one
    at least per row), and where its pages lie (-1: no dictionary page)."""

    name: str = ""
    values: int = 0
    first_page: int = -1
    dictionary_page: int = -1
    length: int = 0


class _Footer:
    """The checks of a file's footer (FileMetaData): at most MAX_ROW_GROUPS row groups of at most MAX_ROWS rows;
    each column read holding no more values than its rows allow (a top-k list at most ``limits.top_k``); each of
    its pages, walked as pyarrow will read them, at most MAX_PAGE_BYTES uncompressed, the data pages holding no
    more values than the footer says (nor a dictionary more entries); at most MAX_PAGES pages in all. Its estimate
    of what the columns decode to: each value at its type's width, 4 bytes a row for list offsets and string codes,
    a string column's page bytes."""

    def __init__(self, data: bytes, path: Path, kinds: _Kinds, limits: ReadLimits):
        self.data, self.path, self.kinds, self.limits, self.pages = data, path, kinds, limits, 0

    def walk(self, t: _Thrift) -> tuple[int, int, int]:
        """(rows, row groups, decoded estimate), each row group checked as it is read."""
        rows = groups = estimate = 0
        for fid, kind in t.fields():
            if fid != 4 or kind != _LIST:
                t.skip(kind)
                continue
            groups = t.items(_STRUCT)
            if groups > MAX_ROW_GROUPS:
                raise InputError(
                    f"{self.path}: {groups} row groups, more than the {MAX_ROW_GROUPS} a Parquet log may have"
                )
            for g in range(groups):
                n, chunks = _row_group(t, self.kinds)
                rows += n
                estimate += self.group(g, n, chunks)
        return rows, groups, estimate

    def group(self, g: int, rows: int, chunks: list[_Chunk]) -> int:
        """Check row group ``g``; returns what its columns read decode to (estimated)."""
        if not 0 <= rows <= MAX_ROWS:
            raise InputError(f"{self.path}: row group {g} says it holds {rows} rows")
        estimate = 0
        for name, (kind, width) in self.kinds.items():
            mine = [c for c in chunks if c.name == name]
            values = sum(c.values for c in mine)
            most = rows * self.limits.top_k if kind == "list" else rows
            if min([values] + [c.values for c in mine]) < 0 or values > most:
                raise InputError(
                    f"{self.path}: row group {g} holds {values} {name} values for {rows} rows"
                    + (f": lists longer than top-{self.limits.top_k} ({self.limits.why})" if kind == "list" else "")
                )
            paged = [self.chunk_pages(g, c) for c in mine]
            page_bytes, entries = sum(p[0] for p in paged), sum(p[1] for p in paged)
            estimate += width * values + (4 * rows + page_bytes if kind == "str" else width * entries)
            estimate += 4 * rows if kind == "list" else 0
        return estimate

    def chunk_pages(self, g: int, c: _Chunk) -> tuple[int, int]:
        """Walk the pages of chunk ``c`` as pyarrow reads them (from its dictionary page, else its first data page,
        over its compressed length, until its data pages hold its values); returns (their uncompressed bytes, the
        dictionary's entries)."""
        where = f"{self.path}: row group {g}, column {c.name}"
        start = c.dictionary_page if 0 < c.dictionary_page < c.first_page else c.first_page
        if not 4 <= start < len(self.data) - 8 or c.length < 0:
            raise InputError(f"{where}: its pages lie outside the file (at byte {start})")
        end = min(start + c.length + _PAGE_PADDING, len(self.data))
        pos, seen, total, entries = start, 0, 0, 0
        while seen < c.values and pos < end:
            self.pages += 1
            if self.pages > MAX_PAGES:
                raise InputError(f"{self.path}: more than the {MAX_PAGES} pages a Parquet log may have")
            t = _Thrift(self.data, pos, len(self.data))
            kind, size, stored, n = _page_header(t)
            if not 0 <= size <= MAX_PAGE_BYTES or stored < 0 or n < 0:
                raise InputError(
                    f"{where}: a page of {size} bytes uncompressed (at byte {pos}); a page may hold 0..{MAX_PAGE_BYTES}"
                )
            seen += n if kind in (_DATA_PAGE, _DATA_PAGE_V2) else 0
            entries += n if kind == _DICTIONARY_PAGE else 0
            if seen > c.values or entries > c.values:
                raise InputError(f"{where}: its pages hold more values than the {c.values} its footer says")
            total += size
            pos = t.pos + stored
        return total, entries


#: Parquet page types, and the bytes pyarrow reads past a chunk's stated length (old parquet-mr writers left the
#: dictionary page's header out of it).
_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = range(4)
_PAGE_PADDING = 100


def _page_header(t: _Thrift) -> tuple[int, int, int, int]:
    """(type, uncompressed bytes, stored bytes, values or dictionary entries) of the PageHeader at ``t``: fields
    1-3 (i32), and field 1 (i32) of the data, dictionary or v2 data page header (fields 5, 7, 8)."""
    got = {1: -1, 2: -1, 3: -1, 0: 0}
    for fid, kind in t.fields():
        if fid in (1, 2, 3) and kind == _I32:
            got[fid] = t.integer()
        elif fid in (5, 7, 8) and kind == _STRUCT:
            for sid, skind in t.fields():
                if sid == 1 and skind == _I32:
                    got[0] = t.integer()
                else:
                    t.skip(skind, 2)
        else:
            t.skip(kind, 1)
    return got[1], got[2], got[3], got[0]


def _row_group(t: _Thrift, kinds: _Kinds) -> tuple[int, list[_Chunk]]:
    """(rows, the chunks of the columns read) of one RowGroup."""
    rows, chunks = -1, []
    for fid, kind in t.fields():
        if fid == 1 and kind == _LIST:
            chunks = [c for c in (_column_chunk(t) for _ in range(t.items(_STRUCT))) if c.name in kinds]
        elif fid == 3 and kind == _I64:
            rows = t.integer()
        else:
            t.skip(kind, 1)
    return rows, chunks


#: ColumnMetaData's fields read (all i64): values, compressed length, first data page, dictionary page.
_CHUNK_FIELDS = {5: "values", 7: "length", 9: "first_page", 11: "dictionary_page"}


def _column_chunk(t: _Thrift) -> _Chunk:
    """One ColumnChunk's ColumnMetaData."""
    c = _Chunk()
    for fid, kind in t.fields():
        if fid != 3 or kind != _STRUCT:
            t.skip(kind, 2)
            continue
        for mid, mkind in t.fields():
            if mid == 3 and mkind == _LIST:
                parts = [t.binary() for _ in range(t.items(_BINARY))]
                c.name = parts[0].decode("utf-8", "replace") if parts else ""
            elif mid in _CHUNK_FIELDS and mkind == _I64:
                setattr(c, _CHUNK_FIELDS[mid], t.integer())
            else:
                t.skip(mkind, 3)
    return c


# --------------------------------------------------------------------------------------------- the columns
class _Columns:
    """One file's columns as they are read, batch by batch: each batch counted against the read limits and
    checked (list lengths from their offsets before the values are flattened) before it is copied into arrays of
    the footer's row count (checked before), compactly."""

    def __init__(self, path: Path, limits: ReadLimits, rows: int, strings: list[str]):
        self.path, self.limits, self.rows, self.n = path, limits, rows, 0
        self.a: dict[str, np.ndarray] = {
            "layer_id": np.empty(rows, dtype=np.int16),
            "token_position": np.empty(rows, dtype=np.int32),
        }
        self.k: dict[str, int] = {}
        self.strings = {name: _Codes(name, path, rows) for name in strings}
        self.dictionaries: set[int] = set()

    def add(self, batch) -> None:
        n, row0 = batch.num_rows, self.n
        self.limits.spend(self.decoded_bytes(batch), self.path, f"its columns (at row {row0})")
        if row0 + n > self.rows:
            raise InputError(f"{self.path}: its columns hold more rows than the {self.rows} its footer says")
        if n == 0:
            return
        batch.validate(full=True)  # list offsets in bounds, strings valid UTF-8
        rows = slice(row0, row0 + n)
        self.a["layer_id"][rows] = self._ints(batch.column("layer_id"), "layer_id", MAX_LAYERS - 1)
        self.a["token_position"][rows] = self._ints(batch.column("token_position"), "token_position", MAX_CONTEXT - 1)
        ids = self._lists(batch.column("expert_ids"), "expert_ids")
        weights = self._lists(batch.column("expert_weights"), "expert_weights")
        _check_ids(ids, self.path, row0)
        _check_weights(weights, self.path, row0)
        if "expert_ids" not in self.a:
            self.a["expert_ids"] = np.empty((self.rows, ids.shape[1]), dtype=np.int16)
            self.a["expert_weights"] = np.empty((self.rows, ids.shape[1]), dtype=weights.dtype)
        self.a["expert_ids"][rows] = ids
        self.a["expert_weights"][rows] = weights
        for name, codes in self.strings.items():
            codes.add(batch.column(name), row0)
        self.n += n

    def decoded_bytes(self, batch) -> int:
        """What ``batch`` holds decoded: its arrays' bytes, a string dictionary counted in the first batch that holds
        it (the batches of a row group share one)."""
        import pyarrow.types as pt

        total = 0
        for arr in batch.columns:
            if not pt.is_dictionary(arr.type):
                total += arr.nbytes
                continue
            data = arr.dictionary.buffers()[-1]
            address = data.address if data is not None else 0
            total += arr.indices.nbytes + (0 if address in self.dictionaries else arr.dictionary.nbytes)
            self.dictionaries.add(address)
        return total

    def _ints(self, arr, name: str, top: int) -> np.ndarray:
        if arr.null_count:
            raise InputError(f"{self.path}: column {name!r} is null at row {self.n + _first_null(arr)}")
        v = arr.to_numpy(zero_copy_only=False)
        bad = np.flatnonzero((v < 0) | (v > top))
        if bad.size:
            row = int(bad[0])
            raise InputError(f"{self.path}: {name} {int(v[row])} at row {self.n + row}, outside 0..{top}")
        return v

    def _lists(self, arr, name: str) -> np.ndarray:
        """A list column's batch whose lists all hold the file's k values (1..top-k), without nulls, as [rows, k]:
        the lengths read from the offsets before a value is touched."""
        import pyarrow.compute as pc

        n = len(arr)
        if arr.null_count:
            raise InputError(f"{self.path}: column {name!r} is null at row {self.n + _first_null(arr)}")
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        k = self.k.setdefault(name, int(lengths[0]))
        bad = np.flatnonzero(lengths != k)
        if bad.size:
            row = int(bad[0])
            raise InputError(
                f"{self.path}: {name} at row {self.n + row} holds {int(lengths[row])} values, row 0 holds {k} "
                f"(every row lists the top-k experts of one token in one layer)"
            )
        if not 1 <= k <= self.limits.top_k:
            raise InputError(
                f"{self.path}: {name} lists hold {k} values; a top-k of 1..{self.limits.top_k} is expected "
                f"({self.limits.why})"
            )
        if self.k.get("expert_weights", k) != self.k.get("expert_ids", k):
            raise InputError(
                f"{self.path}: expert_weights lists hold {self.k['expert_weights']} values, expert_ids lists "
                f"{self.k['expert_ids']} (row 0)"
            )
        values = pc.list_flatten(arr)
        if len(values) != n * k:
            raise InputError(f"{self.path}: column {name!r} holds {len(values)} values for {n} rows of {k}")
        if values.null_count:
            raise InputError(f"{self.path}: {name} at row {self.n + _first_null(values) // k} holds a null")
        return values.to_numpy(zero_copy_only=False).reshape(n, k)

    def finish(self) -> LogRows:
        if self.n != self.rows:
            raise InputError(f"{self.path}: its footer says {self.rows} rows but its columns hold {self.n}")
        if self.n == 0:
            raise InputError(f"{self.path}: no rows")
        a = self.a
        contexts = self.strings["context_id"].finish(True) if "context_id" in self.strings else (None, [])
        categories = self.strings["token_category"].finish(False) if "token_category" in self.strings else (None, [])
        return LogRows(
            self.path, a["layer_id"], a["token_position"], a["expert_ids"], a["expert_weights"], *contexts, *categories
        )


class _Codes:
    """A string column read batch by batch as per-row codes into its distinct values (-1: null), each value a
    printable name of 1..MAX_NAME_CHARS characters."""

    def __init__(self, name: str, path: Path, rows: int):
        self.name, self.path = name, path
        self.index: dict[str, int] = {}
        self.codes = np.full(rows, -1, dtype=np.int32)
        self.first_null: int | None = None

    def add(self, arr, row0: int) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        if not valid.all() and self.first_null is None:
            self.first_null = row0 + int(np.flatnonzero(~valid)[0])
        if not valid.any():
            return
        enc = arr if pa.types.is_dictionary(arr.type) else arr.dictionary_encode()
        idx = pc.fill_null(enc.indices, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        used = np.unique(idx[valid])
        codes = np.array([self._code(v) for v in enc.dictionary.take(pa.array(used)).to_pylist()], dtype=np.int32)
        here = self.codes[row0 : row0 + len(arr)]
        here[valid] = codes[np.searchsorted(used, idx[valid])]

    def _code(self, v) -> int:
        if v not in self.index:
            if not v or not v.isprintable() or len(v) > MAX_NAME_CHARS:
                raise InputError(
                    f"{self.path}: {self.name} {brief(v)} is not a printable name of 1..{MAX_NAME_CHARS} characters"
                )
            if len(self.index) >= MAX_REQUESTS:
                raise InputError(f"{self.path}: {self.name} holds more than {MAX_REQUESTS} distinct values")
            self.index[v] = len(self.index)
        return self.index[v]

    def finish(self, required: bool) -> tuple[np.ndarray | None, list[str]]:
        """Per-row codes and the distinct values; (None, []) when every row is null, or some are and the column is
        not ``required`` (every row needs its request)."""
        if not self.index:
            return None, []
        if self.first_null is not None:
            if not required:
                return None, []
            raise InputError(
                f"{self.path}: {self.name} is null at row {self.first_null} but set elsewhere (every row needs "
                f"its request)"
            )
        return self.codes, list(self.index)


def _first_null(arr) -> int:
    return int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])


def _check_ids(ids: np.ndarray, path: Path, row0: int = 0) -> None:
    bad = np.flatnonzero(((ids < 0) | (ids > INT16_MAX)).any(axis=1))
    if bad.size:
        row = int(bad[0])
        raise InputError(
            f"{path}: expert_ids at row {row0 + row} holds {brief(ids[row].tolist())}, ids must lie in 0..{INT16_MAX}"
        )
    if ids.shape[1] > 1:
        s = np.sort(ids, axis=1)
        dup = np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1))
        if dup.size:
            row = int(dup[0])
            raise InputError(f"{path}: expert_ids at row {row0 + row} repeats an expert ({brief(ids[row].tolist())})")


def _check_weights(w: np.ndarray, path: Path, row0: int = 0) -> None:
    """Finite, within float16's range, and never negative: a gate weight is the router's softmax or sigmoid output
    (probability-like), scaled at most by a positive factor."""
    with np.errstate(all="ignore"):
        bad = np.flatnonzero((~np.isfinite(w) | (np.abs(w) > FLOAT16_MAX)).any(axis=1))
    if bad.size:
        row = int(bad[0])
        raise InputError(
            f"{path}: expert_weights at row {row0 + row} holds a value that is not finite or beyond the range "
            f"of the trace's float16 weights (+-{FLOAT16_MAX:.0f})"
        )
    neg = np.flatnonzero((w < 0).any(axis=1))
    if neg.size:
        row = int(neg[0])
        raise InputError(
            f"{path}: expert_weights at row {row0 + row} holds {float(w[row].min()):.6g}, below 0: a gate weight "
            f"is the router's softmax or sigmoid output (probability-like), never negative"
        )


# --------------------------------------------------------------------------------------------- requests
@dataclass
class Request:
    """One request of a log: its routing (prompt in token order, then decode) and where it came from."""

    name: str
    context_id: str | None
    path: Path
    first_row: int
    category: str | None
    ids: np.ndarray  # int16 [P + D, L, k]
    weights: np.ndarray  # the column's float type, [P + D, L, k]
    prompt: int
    decode: int
    output_file: str | None = None


def file_requests(log: LogRows) -> list[Request]:
    """The requests of one file, in row order: runs of one context_id (the whole file without one)."""
    n = log.layer.shape[0]
    if log.context_codes is None:
        runs: list[tuple[int, int, str | None]] = [(0, n, None)]
    else:
        c = log.context_codes
        starts = np.concatenate([[0], np.flatnonzero(c[1:] != c[:-1]) + 1])
        stops = np.concatenate([starts[1:], [n]])
        runs = []
        seen: dict[str, int] = {}
        for a, b in zip(starts.tolist(), stops.tolist()):
            name = log.contexts[int(c[a])]
            if name in seen:
                raise InputError(
                    f"{log.path}: context_id {brief(name)} at row {a} again, after other requests (it "
                    f"first starts at row {seen[name]}); a request's rows must be contiguous"
                )
            seen[name] = a
            runs.append((a, b, name))
    out = []
    for a, b, ctx in runs:
        category = None
        if log.category_codes is not None:
            cats = np.unique(log.category_codes[a:b])
            category = log.categories[int(cats[0])] if cats.size == 1 else None
        out.append(_request(log, a, b, ctx, category))
    return out


def _request(log: LogRows, a: int, b: int, ctx: str | None, category: str | None) -> Request:
    path = log.path
    name = ctx if ctx is not None else path.stem
    where = f"{path}: request {name}"
    layer, pos = log.layer[a:b], log.position[a:b]
    num_layers = int(layer.max()) + 1
    cuts = np.flatnonzero(layer[1:] < layer[:-1]) + 1
    bounds = np.concatenate([[0], cuts, [b - a]]).astype(np.int64)
    passes = bounds.size - 1
    if passes < WARMUP_PASSES + 1:
        raise InputError(
            f"{where}: {passes} forward pass{'es' if passes != 1 else ''} (a pass starts where layer_id "
            f"decreases); expected {WARMUP_PASSES} warm-up passes, a prefill pass, then decode passes"
        )
    for p in range(WARMUP_PASSES + 1):
        t = _check_pass(layer, pos, int(bounds[p]), int(bounds[p + 1]), num_layers, a, f"{where}: pass {p}")
        if p < WARMUP_PASSES and t != 1:
            raise InputError(
                f"{where}: pass {p} (rows {a + bounds[p]}..{a + bounds[p + 1] - 1}) holds {t} tokens; "
                f"the first {WARMUP_PASSES} passes of a request are single-token warm-up passes"
            )
    prompt = (int(bounds[WARMUP_PASSES + 1]) - int(bounds[WARMUP_PASSES])) // num_layers
    first_decode = int(bounds[WARMUP_PASSES + 1])
    decode = passes - WARMUP_PASSES - 1
    lengths = np.diff(bounds[WARMUP_PASSES + 1 :])
    tail = layer[first_decode:]
    ok = (
        (lengths == num_layers).all()
        and (tail.reshape(-1, num_layers) == np.arange(num_layers)).all()
        and not pos[first_decode:].any()
        if decode
        else True
    )
    if not ok:  # find the pass at fault and say what is wrong with it
        for p in range(WARMUP_PASSES + 1, passes):
            t = _check_pass(layer, pos, int(bounds[p]), int(bounds[p + 1]), num_layers, a, f"{where}: pass {p}")
            if t != 1:
                raise InputError(
                    f"{where}: pass {p} (rows {a + bounds[p]}..{a + bounds[p + 1] - 1}) holds {t} "
                    f"tokens; after the prefill (pass {WARMUP_PASSES}) every pass is one decode token"
                )
        raise AssertionError("a decode pass failed its check but no pass was found at fault")
    k = log.ids.shape[1]
    lo, hi = a + int(bounds[WARMUP_PASSES]), a + first_decode
    ids = np.concatenate(
        [log.ids[lo:hi].reshape(num_layers, prompt, k).transpose(1, 0, 2), log.ids[hi:b].reshape(decode, num_layers, k)]
    )
    weights = np.concatenate(
        [
            log.weights[lo:hi].reshape(num_layers, prompt, k).transpose(1, 0, 2),
            log.weights[hi:b].reshape(decode, num_layers, k),
        ]
    )
    return Request(name, ctx, path, a, category, ids, weights, prompt, decode)


def _check_pass(layer: np.ndarray, pos: np.ndarray, lo: int, hi: int, num_layers: int, base: int, where: str) -> int:
    """Rows lo..hi of a request as one forward pass: a whole number t of tokens, each passing layers
    0..num_layers-1 once, layer-major, with token_position 0..t-1 in each layer; returns t."""
    rows = f"rows {base + lo}..{base + hi - 1}"
    n = hi - lo
    if n % num_layers:
        raise InputError(
            f"{where} ({rows}): {n} rows, not a whole number of tokens x {num_layers} MoE layers (a pass "
            f"starts where layer_id decreases; every token of it passes every layer once)"
        )
    t = n // num_layers
    want = np.repeat(np.arange(num_layers), t)
    bad = np.flatnonzero(layer[lo:hi] != want)
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"{where} ({rows}): layer_id {int(layer[lo + i])} at row {base + lo + i}, expected "
            f"{int(want[i])} (the {t} token{'s' if t != 1 else ''} of a pass pass layers "
            f"0..{num_layers - 1} once each, layer-major)"
        )
    want = np.tile(np.arange(t), num_layers)
    bad = np.flatnonzero(pos[lo:hi] != want)
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"{where} ({rows}): token_position {int(pos[lo + i])} at row {base + lo + i}, expected "
            f"{int(want[i])} (positions restart at 0 in every forward pass, and a multi-token pass is "
            f"layer-major: layer 0 of all its tokens in order, then layer 1, ...)"
        )
    return t


# --------------------------------------------------------------------------------------------- output JSONs
@dataclass(frozen=True)
class Output:
    path: Path
    context_id: str | None
    trace_file: str | None
    prompt_tokens: int
    completion_tokens: int


def load_outputs(specs: list[str | os.PathLike]) -> list[Output]:
    """The output JSONs named by ``--outputs``: each a file, or a folder whose ``*.json`` files are read."""
    files: list[Path] = []
    for spec in specs:
        p = Path(spec)
        try:
            is_dir = p.is_dir()
        except (OSError, ValueError):
            is_dir = False
        if is_dir:
            try:
                found = sorted(x for x in p.iterdir() if x.name.endswith(".json"))
            except OSError as exc:
                raise InputError(f"--outputs {brief(str(p))}: cannot be listed ({exc.strerror or exc})") from None
            if not found:
                raise InputError(f"--outputs {brief(str(p))}: a folder without .json files")
            files.extend(found)
        else:
            files.append(p)
        if len(files) > MAX_OUTPUT_FILES:
            raise InputError(f"--outputs: more than {MAX_OUTPUT_FILES} output JSON files")
    return [_output(f) for f in files]


def _output(path: Path) -> Output:
    d = read_json_file(path, MAX_OUTPUT_JSON_BYTES, "output JSON file")
    if not isinstance(d, dict):
        raise InputError(f"{path}: expected a JSON object (a server output with usage.prompt_tokens)")
    usage = d.get("usage")
    if usage is None and isinstance(d.get("raw_response"), dict):
        usage = d["raw_response"].get("usage")
    if not isinstance(usage, dict):
        raise InputError(
            f"{path}: no 'usage' object (at the top level or under 'raw_response') with the prompt and "
            f"completion token counts"
        )
    counts = []
    for key in ("prompt_tokens", "completion_tokens"):
        v = usage.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_CONTEXT:
            raise InputError(f"{path}: usage.{key} must be an integer 0..{MAX_CONTEXT}, got {brief(v)}")
        counts.append(v)
    names = []
    for key in ("context_id", "trace_file"):
        v = d.get(key)
        if v is not None and not (isinstance(v, str) and v):
            raise InputError(f"{path}: field '{key}' must be a non-empty string, got {brief(v)}")
        names.append(v)
    return Output(path, names[0], names[1], counts[0], counts[1])


def match_outputs(requests: list[Request], outputs: list[Output], files_requests: dict[Path, int]) -> None:
    """Give each request its output JSON (by context_id, else by trace_file for a file of one request) and check
    its counts; InputError naming the request's file when one has none or disagrees."""
    by_ctx: dict[str, Output] = {}
    by_file: dict[str, Output] = {}
    for o in outputs:
        for key, table in ((o.context_id, by_ctx), (o.trace_file, by_file)):
            if key is None:
                continue
            if key in table and table[key].path != o.path:
                raise InputError(f"{o.path}: names {brief(key)} like {table[key].path}; which one belongs to it?")
            table[key] = o
    for r in requests:
        found = by_ctx.get(r.context_id) if r.context_id is not None else None
        if found is None and files_requests[r.path] == 1:
            found = by_file.get(r.path.name)
        if found is None:
            raise InputError(
                f"{r.path}: request {r.name}: no output JSON in --outputs has context_id {brief(r.name)}"
                f"{'' if files_requests[r.path] != 1 else f' or trace_file {brief(r.path.name)}'} "
                f"({len(outputs)} read)"
            )
        o = found
        if o.prompt_tokens != r.prompt:
            raise InputError(
                f"{r.path}: request {r.name}: its prefill pass holds {r.prompt} tokens but {o.path} says "
                f"prompt_tokens {o.prompt_tokens}"
            )
        if o.completion_tokens - 1 != r.decode:
            raise InputError(
                f"{r.path}: request {r.name}: {r.decode} decode passes but {o.path} says "
                f"completion_tokens {o.completion_tokens} (expected {o.completion_tokens - 1} decode "
                f"passes: the first completion token comes out of the prefill)"
            )
        r.output_file = o.path.name


# --------------------------------------------------------------------------------------------- building
def import_kt_parquet(
    files: list[str | os.PathLike],
    model: str,
    num_experts: int | None = None,
    outputs: list[str | os.PathLike] | None = None,
    source_model: str | None = None,
    dataset: str | None = None,
) -> tuple[Trace, dict]:
    """Read kTransformers Parquet logs into a trace (prompt rows from each prefill pass, a decode row per later
    pass); returns the trace and a summary (for the terminal)."""
    check_names(model, source_model, dataset)
    if num_experts is not None and (
        isinstance(num_experts, bool)
        or not isinstance(num_experts, (int, np.integer))
        or not 1 <= num_experts <= INT16_MAX
    ):
        raise InputError(f"--num-experts: must be between 1 and {INT16_MAX}, got {brief(num_experts)}")
    if not files:
        raise InputError("give at least one Parquet file")
    out_list = load_outputs(outputs) if outputs else None
    limits = read_limits(model, None if num_experts is None else int(num_experts))
    requests: list[Request] = []
    per_file: dict[Path, int] = {}
    shape: tuple[int, int, Path] | None = None  # (layers, top-k, file)
    seen: dict[str, Path] = {}
    largest = (-1, Path(), 0)  # the largest id of any row (warm-up rows too), its file and row
    for f in files:
        log = read_log(f, limits)
        reqs = file_requests(log)
        for r in reqs:
            here = (r.ids.shape[1], r.ids.shape[2])
            if shape is None:
                shape = (*here, log.path)
            elif here != shape[:2]:
                raise InputError(
                    f"{log.path}: request {r.name} has {here[0]} MoE layers and top-{here[1]}, "
                    f"{shape[2]} has {shape[0]} and top-{shape[1]}"
                )
            if r.name in seen:
                raise InputError(
                    f"{log.path}: request {brief(r.name)} again (also in {seen[r.name]}); every request "
                    f"is imported once"
                )
            seen[r.name] = log.path
        if log.path in per_file:
            raise InputError(f"{log.path}: given twice")
        per_file[log.path] = len(reqs)
        row = int(np.argmax(log.ids.max(axis=1)))
        largest = max(largest, (int(log.ids[row].max()), log.path, row), key=lambda x: x[0])
        requests.extend(reqs)
    if out_list is not None:
        match_outputs(requests, out_list, per_file)
    if shape is None:
        raise InputError(f"{files[0]}: no requests found")
    num_layers, top_k = shape[0], shape[1]

    if num_experts is not None:
        experts, source = int(num_experts), "--num-experts"
    else:
        experts, source = default_num_experts(model, largest[0])
    if largest[0] >= experts:
        _id_beyond(requests, largest, experts, source)
    if top_k > experts:
        raise InputError(f"{files[0]}: top-{top_k} exceeds num_experts {experts} (from {source}; see --num-experts)")

    lengths = [r.prompt + r.decode for r in requests]
    categories = [r.category for r in requests]
    known = [c for c in dict.fromkeys(categories) if c]
    info: dict[str, list[Any]] = {
        "context_id": [r.context_id for r in requests],
        "source_file": [r.path.name for r in requests],
        "category": categories,
        "prompt_len": [r.prompt for r in requests],
        "completion_tokens": [r.decode + 1 for r in requests],
        "output_file": [r.output_file for r in requests],
    }
    meta = TraceMeta(
        model=ModelInfo.decoder_only(model, experts, top_k, num_layers),
        provenance=Provenance(
            "imported", TOOL, source_model or model, dataset or "+".join(known) or "unknown", today()
        ),
        seed=None,
        request_ids=tuple(r.name for r in requests),
        extra={
            "source_files": [Path(f).name for f in files],
            "routing_of": ROUTING_OF,
            "warmup_passes_dropped": WARMUP_PASSES * len(requests),
            "num_experts_from": source,
            "counts_checked_against": "output JSONs (usage.prompt_tokens, usage.completion_tokens)"
            if out_list is not None
            else "nothing (no --outputs given)",
        },
        request_info=info,
    )
    weights = np.concatenate([r.weights for r in requests]).astype(np.float16)
    trace = Trace(
        np.concatenate([r.ids for r in requests]).astype(np.int16),
        offsets_from_lengths(lengths),
        np.array([r.prompt for r in requests], dtype=np.int64),
        meta,
        weights,
    )
    check_model_fit(trace, str(files[0]), source)
    check_content(trace, str(files[0]))
    summary = {
        "requests": len(requests),
        "prompt_tokens": sum(r.prompt for r in requests),
        "decode_tokens": sum(r.decode for r in requests),
        "num_experts_from": source,
        "outputs_checked": out_list is not None,
        "per_request": [(r.name, r.prompt, r.decode) for r in requests],
    }
    return trace, summary


def _id_beyond(requests: list[Request], largest: tuple[int, Path, int], experts: int, source: str) -> None:
    """InputError naming the first request and token routed to an expert beyond ``experts``, else (only a dropped
    warm-up row is) the file and row of the ``largest`` id."""
    for r in requests:
        beyond = np.flatnonzero((r.ids >= experts).any(axis=(1, 2)))
        if beyond.size:
            t = int(beyond[0])
            token = f"prompt token {t}" if t < r.prompt else f"decode step {t - r.prompt}"
            raise InputError(
                f"{r.path}: request {r.name}: {token} routes to expert {int(r.ids[t].max())}, outside "
                f"0..{experts - 1} (num_experts {experts} from {source}; see --num-experts)"
            )
    raise InputError(
        f"{largest[1]}: row {largest[2]} (a warm-up pass) routes to expert {largest[0]}, outside 0..{experts - 1} "
        f"(num_experts {experts} from {source}; see --num-experts)"
    )


def check_names(model: str, source_model: str | None, dataset: str | None) -> None:
    """``--model``, ``--source-model`` and ``--dataset`` (names that go into the trace's metadata) by the model-name
    rule, before anything is read."""
    check_model_name(model)
    if source_model is not None:
        check_model_name(source_model, "--source-model")
    if dataset is not None:
        check_dataset_name(dataset)


def _run(args) -> int:
    from traces.io import save_trace

    t0 = time.perf_counter()
    check_out(args.out, list(args.files) + [o for o in (args.outputs or []) if not Path(o).is_dir()])
    check_names(args.model, args.source_model, args.dataset)
    trace, s = import_kt_parquet(
        args.files, args.model, args.num_experts, args.outputs, args.source_model, args.dataset
    )
    save_trace(trace, args.out)
    checked = "checked against the output JSONs" if s["outputs_checked"] else "not checked (no --outputs)"
    print(
        f"wrote {args.out}: {trace.num_tokens} tokens ({s['prompt_tokens']} prompt, {s['decode_tokens']} decode) "
        f"in {trace.num_requests} requests, {trace.num_layers} layers, top-{trace.top_k} of {trace.num_experts} "
        f"experts (from {s['num_experts_from']}); {WARMUP_PASSES * trace.num_requests} warm-up passes dropped; "
        f"counts {checked}; {time.perf_counter() - t0:.1f} s"
    )
    if not s["outputs_checked"]:
        print(
            "note: give --outputs to check each request's prompt and completion counts against the server's",
            file=sys.stderr,
        )
    return 0
