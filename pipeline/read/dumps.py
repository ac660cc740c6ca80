"""Reads MediaWiki XML dumps into `Page` records, page by page, with bad bytes set aside.

Inputs: `.xml` or `.xml.bz2` dumps, one file or a glob of part files, local or `gs://`
(every byte goes through `apache_beam.io.filesystems.FileSystems`). A multistream dump
(`*multistream*.xml.bz2`) with its index beside it, or named with `index=`, is read stream by
stream in parallel (`pipeline.read.multistream` plans the byte ranges, `pipeline.read.pages` is the Beam
transform); any other file is read start to end by one worker. Both paths run the same per-page
decoder, so they yield the same pages.

How a byte stream becomes pages: `split_pages` cuts the decompressed bytes at the literal
`<page>` / `</page>` tags (a dump escapes `<` inside text as `&lt;`, so these tags cannot occur
in page content), and each page's bytes are parsed on their own with mwxml
(`mwxml.Dump.from_page_xml`). Parsing page by page, rather than handing the whole stream to
one mwxml iterator, is what isolates faults: expat stops a document at its first malformed or
undecodable byte, which would silently cost the remainder of a 22 GB stream; here it costs one
page, which is counted and dead-lettered with its id. The splitter is hand-written because no
XML library splits elements at the byte level while tolerating malformed neighbours. Memory per
reader: one page's bytes plus one read buffer (`READ_CHUNK_BYTES`).
"""
from __future__ import annotations

import bz2
import os
import queue
import re
import threading
from collections.abc import Generator, Iterable, Iterator
from typing import NamedTuple

import mwxml
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from core.cli import UsageError

READ_CHUNK_BYTES = 1 << 20
READ_AHEAD_CHUNKS = 4  # decompressed chunks a reader holds ahead of the parser
# Content between pages is buffered up to this size before it is handed on (a dump header is a
# few KiB; anything larger between two pages is garbage and is dead-lettered in pieces).
MAX_OUTSIDE_BYTES = 4 << 20

EMBEDDED_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"

# Reasons for a bz2 stream that stops decoding: ended before its end marker, or corrupt data.
STREAM_FAULTS = frozenset({"truncated_stream", "corrupt_stream"})

_PAGE_OPEN = b"<page>"
_PAGE_CLOSE = b"</page>"
_PAGE_ID = re.compile(rb"<id>\s*(\d+)\s*</id>")
_PAGE_TITLE = re.compile(rb"<title>([^<]*)<")
_BETWEEN_PAGES = re.compile(
    rb"\s*(?:<\?xml[^>]*\?>)?\s*(?:<mediawiki\b.*?</siteinfo>)?\s*(?:</mediawiki>)?\s*", re.DOTALL)
_FOOTER = b"</mediawiki>"
HEADER_PATTERN = re.compile(rb"<mediawiki\b.*?</siteinfo>", re.DOTALL)


class Page(NamedTuple):
    """One page of a dump, latest revision only; every namespace, redirects included."""

    page_id: int
    title: str
    namespace: int
    redirect: str | None
    text: str
    source: str


class DumpInputError(UsageError):
    """The input named by `--input` / `--index` cannot be read as a MediaWiki dump."""


class PageError(ValueError):
    """A page's bytes that cannot be turned into a `Page`; `reason` names the fault class."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Segment(NamedTuple):
    """A piece of a decompressed dump: a whole `<page>` element, an unterminated one, or the
    bytes between pages. `offset` is the position in the decompressed bytes of its read."""

    kind: str  # "page" | "unterminated" | "outside"
    offset: int
    data: bytes


def embedded_dump_path() -> str:
    """The real English Wikipedia excerpt shipped in the gensim wheel (used when no --input)."""
    import gensim

    path = os.path.join(os.path.dirname(gensim.__file__), "test", "test_data", EMBEDDED_DUMP)
    if not os.path.exists(path):
        raise DumpInputError(f"embedded dump not found at {path}; install the 'demo' extra (gensim)")
    return path


def match_dump_files(file_pattern: str) -> list[tuple[str, int]]:
    """(path, size in bytes) of every file the pattern matches, sorted; error if none."""
    try:
        results = FileSystems.match([file_pattern])
    except Exception as err:  # Beam raises BeamIOError, wrapping the filesystem's reason.
        raise DumpInputError(f"cannot list dump input {file_pattern!r}: {err}") from err
    files = sorted((m.path, m.size_in_bytes) for r in results for m in r.metadata_list)
    if not files:
        raise DumpInputError(f"dump input {file_pattern!r} does not exist (no file matches)")
    return files


def raw_chunks(path: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The stored bytes of `path[start:end]` (end None: to the end), read through FileSystems."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        if start:
            raw.seek(start)
        left = None if end is None else end - start
        while left is None or left > 0:
            chunk = raw.read(READ_CHUNK_BYTES if left is None else min(READ_CHUNK_BYTES, left))
            if not chunk:
                return
            if left is not None:
                left -= len(chunk)
            yield chunk


def bz2_chunks(compressed_chunks: Iterable[bytes]) -> Generator[bytes, None, None]:
    """Decompresses one or more concatenated bz2 streams, at most READ_CHUNK_BYTES at a time.

    Hand-written over `bz2.BZ2Decompressor` because the file readers fail quietly: Beam's
    `CompressedFile` ends a truncated stream without error, and `bz2.BZ2File` stops without
    error at undecodable bytes between streams. Here a stream cut short raises EOFError and
    any bytes that do not decode raise OSError, so no lost page goes uncounted.
    """
    decompressor = None
    for compressed in compressed_chunks:
        while compressed:
            if decompressor is None:
                decompressor = bz2.BZ2Decompressor()
            out = decompressor.decompress(compressed, READ_CHUNK_BYTES)
            while True:
                if out:
                    yield out
                if decompressor.eof or decompressor.needs_input:
                    break
                out = decompressor.decompress(b"", READ_CHUNK_BYTES)
            if decompressor.eof:
                compressed, decompressor = decompressor.unused_data, None
            else:
                compressed = b""
    if decompressor is not None:
        raise EOFError("compressed data ended before the bz2 end-of-stream marker")


def decompressed_chunks(path: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The decompressed bytes of `path[start:end]`: bz2 by extension, else plain XML. bz2 is
    decompressed ahead in a thread (`read_ahead`), beside the parsing of the pages before."""
    chunks = raw_chunks(path, start, end)
    return read_ahead(bz2_chunks(chunks)) if path.endswith(".bz2") else chunks


def read_ahead(chunks: Generator[bytes, None, None], depth: int = READ_AHEAD_CHUNKS) -> Iterator[bytes]:
    """The same chunks, produced up to `depth` ahead by a background thread.

    bz2 releases the GIL while it decompresses, so a worker's parsing and its decompression run
    on two cores, as gensim's segment_wiki reads in one process and parses in others. An error
    of the producer is raised here, where the chunk it would have been was expected; a consumer
    that stops early stops the thread. Written here because neither the standard library nor
    Beam offers an iterator read-ahead.
    """
    handoff: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def offer(item) -> bool:
        """Hands `item` on, waiting for room; False once the consumer has stopped."""
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not offer((chunk, None)):
                    return
            offer((done, None))
        except BaseException as err:  # handed to the consumer, which raises it
            offer((done, err))
        finally:
            chunks.close()  # its file, in the thread that reads it

    producer = threading.Thread(target=produce, name="bz2-read-ahead", daemon=True)
    producer.start()
    try:
        while True:
            chunk, err = handoff.get()
            if chunk is done:
                if err is not None:
                    raise err
                return
            yield chunk
    finally:
        stop.set()
        producer.join()


def until_failure(chunks: Iterable[bytes], failures: list[BaseException]) -> Iterator[bytes]:
    """The chunks until a read or decoding error, which is appended to `failures`."""
    try:
        yield from chunks
    except (EOFError, OSError, ValueError) as err:  # truncated / corrupt bz2, broken transport
        failures.append(err)


def split_pages(chunks: Iterable[bytes]) -> Iterator[Segment]:
    """Cuts decompressed dump bytes into `<page>...</page>` segments and what lies between.

    Holds at most one page plus one chunk. A `<page>` with no `</page>` before the next
    `<page>` (or before the end) comes out as an "unterminated" segment.
    """
    buffer = b""
    pos = 0  # buffer[:pos] is handed on already
    base = 0  # decompressed offset of buffer[0]
    in_page = False
    scan_from = 0  # where to look for </page> next (earlier bytes of the page hold none)
    for chunk in chunks:
        buffer, base, scan_from = buffer[pos:] + chunk, base + pos, scan_from - pos
        pos = 0
        while True:
            if not in_page:
                start = buffer.find(_PAGE_OPEN, pos)
                if start < 0:
                    if len(buffer) - pos > MAX_OUTSIDE_BYTES:
                        cut = len(buffer) - len(_PAGE_OPEN) + 1
                        yield Segment("outside", base + pos, buffer[pos:cut])
                        pos = cut
                    break
                if start > pos:
                    yield Segment("outside", base + pos, buffer[pos:start])
                pos, in_page, scan_from = start, True, start + len(_PAGE_OPEN)
            end = buffer.find(_PAGE_CLOSE, scan_from)
            if end < 0:
                scan_from = max(scan_from, len(buffer) - len(_PAGE_CLOSE) + 1)
                break
            end += len(_PAGE_CLOSE)
            nested = buffer.find(_PAGE_OPEN, pos + len(_PAGE_OPEN), end)
            while nested >= 0:  # earlier <page>s that never closed
                yield Segment("unterminated", base + pos, buffer[pos:nested])
                pos = nested
                nested = buffer.find(_PAGE_OPEN, pos + len(_PAGE_OPEN), end)
            yield Segment("page", base + pos, buffer[pos:end])
            pos, in_page = end, False
    if pos < len(buffer):
        yield Segment("unterminated" if in_page else "outside", base + pos, buffer[pos:])


def is_dump_framing(outside: bytes) -> bool:
    """True when bytes between pages are only the XML declaration, header, footer, whitespace."""
    return _BETWEEN_PAGES.fullmatch(outside) is not None


def page_id_and_title(page_xml: bytes) -> tuple[int | None, str | None]:
    """Best-effort id and title of a page's raw bytes, for dead-letter records. The page id is the
    `<id>` before `<revision>` (a page without one has None, not its revision's id)."""
    id_match = _PAGE_ID.search(page_xml.split(b"<revision", 1)[0])
    title_match = _PAGE_TITLE.search(page_xml)
    title = title_match.group(1).decode("utf-8", "replace") if title_match else None
    return (int(id_match.group(1)) if id_match else None), title


def parse_page(page_xml: bytes, source: str) -> Page:
    """One `<page>` element's bytes -> `Page` (latest revision), via mwxml; raises PageError."""
    try:
        text = page_xml.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PageError("undecodable_bytes", f"{err.reason} at byte {err.start} of the page") from err
    try:
        page = next(iter(mwxml.Dump.from_page_xml(text)))
        revision = None
        for latest in page:  # pages-articles has one; a history dump ends with the latest
            revision = latest
    except (mwxml.errors.MalformedXML, SyntaxError, ValueError, TypeError, AttributeError) as err:
        # expat's ParseError is a SyntaxError; mwxml raises the others on unexpected structure.
        raise PageError("malformed_xml", f"{type(err).__name__}: {err}") from err
    if page.id is None or page.title is None or page.namespace is None:
        raise PageError("malformed_xml", "page lacks <id>, <title> or <ns>")
    if revision is None:
        raise PageError("missing_revision", "page has no <revision>")
    return Page(page_id=int(page.id), title=str(page.title), namespace=int(page.namespace),
                redirect=page.redirect, text=revision.text or "", source=source)


def dead_letter(source: str, page_id: int | None, title: str | None, reason: str,
                detail: str) -> dict:
    """A read-stage dead-letter record in the shared shape."""
    return {"stage": "read", "source": source, "page_id": page_id, "title": title,
            "reason": reason, "detail": detail}


def page_shard(page_id: int | None, n_shards: int) -> int:
    """The page shard a page belongs to; pages whose id cannot be read go to shard 0."""
    return 0 if page_id is None else page_id % n_shards


def decode_pages(path: str, start: int = 0, end: int | None = None,
                 shard: int = 0, n_shards: int = 1) -> Iterator[Page | dict]:
    """Every page of `path[start:end]` as a `Page`, every fault as a dead-letter dict.

    Faults: a page whose bytes are not UTF-8 or not well-formed (its record carries the page
    id); an unterminated page or stray bytes between pages; a truncated or corrupt bz2 stream
    (a record with the decompressed offset where decoding stopped).

    With `n_shards > 1` only the pages of page shard `shard` (`page_shard`) are parsed and
    yielded; the others are skipped on their raw bytes. Faults that belong to no page (stray
    bytes, a stream that stops decoding) are reported by shard 0 only, so the shards of a file
    together yield exactly what one unsharded read yields.
    """
    source = range_source(path, start, end)
    failures: list[BaseException] = []
    last_offset, ends_with_footer = 0, False
    for segment in split_pages(until_failure(decompressed_chunks(path, start, end), failures)):
        last_offset = segment.offset + len(segment.data)
        ends_with_footer = segment.kind == "outside" and _FOOTER in segment.data
        if n_shards > 1:
            owner = 0 if segment.kind == "outside" else page_shard(page_id_and_title(segment.data)[0], n_shards)
            if owner != shard:
                continue
        if segment.kind == "outside":
            if not is_dump_framing(segment.data):
                page_id, title = page_id_and_title(segment.data)
                yield dead_letter(source, page_id, title, "stray_bytes",
                                  f"{len(segment.data)} bytes outside any <page> at "
                                  f"decompressed offset {segment.offset}")
            continue
        if segment.kind == "unterminated":
            page_id, title = page_id_and_title(segment.data)
            # Only the trailing segment can follow a read failure: a page cut off by it.
            reason = stream_fault_reason(failures[0]) if failures else "malformed_xml"
            yield dead_letter(source, page_id, title, reason,
                              f"<page> at decompressed offset {segment.offset} has no </page>")
            continue
        try:
            yield parse_page(segment.data, path)
        except PageError as err:
            page_id, title = page_id_and_title(segment.data)
            yield dead_letter(source, page_id, title, err.reason,
                              f"{err.detail} (page at decompressed offset {segment.offset})")
    if shard != 0:
        return
    if start == 0 and end is None and not failures and not ends_with_footer:
        # A whole file that stops before </mediawiki> (a plain .xml cut short, whose decoding
        # cannot fail): the pages after the cut are lost, how many is unknown.
        yield dead_letter(source, None, None, "truncated_stream",
                          f"the file ends without </mediawiki> after decompressed offset {last_offset}")
    for failure in failures:
        yield dead_letter(source, None, None, stream_fault_reason(failure),
                          f"{type(failure).__name__}: {failure} (decoding stopped after "
                          f"decompressed offset {last_offset})")


def raw_page_ids(path: str, start: int = 0, end: int | None = None) -> Iterator[int]:
    """The page id of every whole `<page>` of `path[start:end]`, read off its raw bytes as
    `decode_pages` shards them: no XML parse, so it costs about what decompressing costs. Every
    page `decode_pages` yields has its id here; a read fault ends the ids quietly (`decode_pages`
    reports it)."""
    for segment in split_pages(until_failure(decompressed_chunks(path, start, end), [])):
        if segment.kind == "page":
            page_id = page_id_and_title(segment.data)[0]
            if page_id is not None:
                yield page_id


def stream_fault_reason(failure: BaseException) -> str:
    return "truncated_stream" if isinstance(failure, EOFError) else "corrupt_stream"


def range_source(path: str, start: int, end: int | None) -> str:
    """How dead letters name where they came from: the file, or the file's byte range."""
    if start == 0 and end is None:
        return path
    return f"{path}#bytes={start}-{'' if end is None else end}"


def read_dump_header(path: str) -> bytes:
    """The `<mediawiki>...</siteinfo>` header of a dump file, or DumpInputError naming it.

    Also errors when the file holds no `<page>` at all (an empty dump). Streams the file only
    up to its first page.
    """
    failures: list[BaseException] = []
    header = None
    for segment in split_pages(until_failure(decompressed_chunks(path), failures)):
        if segment.kind == "outside":
            if header is None:
                match = HEADER_PATTERN.search(segment.data)
                if not match:
                    break
                header = match.group(0)
            continue
        if header is None:
            break
        return header
    if failures:
        raise DumpInputError(f"{path} is not a readable dump: {failures[0]}")
    if header is None:
        raise DumpInputError(f"{path} is not a MediaWiki XML dump (no <mediawiki> header with "
                             "<siteinfo> before the first page)")
    raise DumpInputError(f"{path} is an empty MediaWiki dump (no <page>)")


def check_input(file_pattern: str, index: str | None = None) -> list[str]:
    """The dump files the pattern names, after checking each is a MediaWiki dump with pages.

    Raises DumpInputError naming the path: nothing matches, two files are one dump compressed
    and not, not a MediaWiki dump, no pages, or an `index` that does not exist or that is given
    for more than one dump file.
    """
    paths = [path for path, _ in match_dump_files(file_pattern)]
    same_dump: dict[str, str] = {}
    for path in paths:   # `wiki.xml*` matching wiki.xml and wiki.xml.bz2 would read every page twice
        stem = path.removesuffix(".bz2").removesuffix(".gz")
        if stem in same_dump:
            raise DumpInputError(f"{file_pattern!r} matches {same_dump[stem]} and {path}, the same dump compressed "
                                 "and not: every page would be read twice; give one of them")
        same_dump[stem] = path
    for path in paths:
        read_dump_header(path)
    if index is not None:
        if len(paths) != 1:
            raise DumpInputError(f"--index {index} names one index, but {file_pattern!r} "
                                 f"matches {len(paths)} dump files")
        if not FileSystems.exists(index):
            raise DumpInputError(f"multistream index {index} does not exist")
    return paths
