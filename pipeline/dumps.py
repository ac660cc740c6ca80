"""Reads MediaWiki XML dumps into `Page` records, page by page, with bad bytes set aside.

Inputs: `.xml` or `.xml.bz2` dumps, one file or a glob of part files, local or `gs://`
(every byte goes through `apache_beam.io.filesystems.FileSystems`). A multistream dump
(`*multistream*.xml.bz2`) with its index beside it, or named with `index=`, is read stream by
stream in parallel (see `pipeline.multistream`); any other file is read start to end by one
worker. Both paths run the same per-page decoder, so they yield the same pages.

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
import io
import os
import re
from typing import Iterable, Iterator, NamedTuple

import apache_beam as beam
import mwxml
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

NAMESPACE = "wikisim"
READ_CHUNK_BYTES = 1 << 20
# Content between pages is buffered up to this size before it is handed on (a dump header is a
# few KiB; anything larger between two pages is garbage and is dead-lettered in pieces).
MAX_OUTSIDE_BYTES = 4 << 20

EMBEDDED_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"

_PAGE_OPEN = b"<page>"
_PAGE_CLOSE = b"</page>"
_PAGE_ID = re.compile(rb"<id>\s*(\d+)\s*</id>")
_PAGE_TITLE = re.compile(rb"<title>([^<]*)<")
_BETWEEN_PAGES = re.compile(
    rb"\s*(?:<\?xml[^>]*\?>)?\s*(?:<mediawiki\b.*?</siteinfo>)?\s*(?:</mediawiki>)?\s*", re.DOTALL)
HEADER_PATTERN = re.compile(rb"<mediawiki\b.*?</siteinfo>", re.DOTALL)


class Page(NamedTuple):
    """One page of a dump, latest revision only; every namespace, redirects included."""

    page_id: int
    title: str
    namespace: int
    redirect: str | None
    text: str
    source: str


class DumpInputError(ValueError):
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


def open_decompressed(path: str, start: int = 0, end: int | None = None) -> io.BufferedIOBase:
    """The decompressed bytes of `path[start:end]` (bz2 by extension, else plain XML).

    Bytes come from `FileSystems.open` uncompressed and are decoded with Python's `bz2`, which,
    unlike Beam's `CompressedFile`, raises `EOFError` on a truncated stream instead of ending
    quietly, and reads concatenated streams (a multistream file or range) as one.
    """
    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if start or end is not None:
        raw = _ByteRange(raw, start, end)
    if path.endswith(".bz2"):
        return bz2.BZ2File(raw, mode="rb")
    return raw


class _ByteRange(io.RawIOBase):
    """Read-only view of `raw[start:end]` so a bz2 decoder sees only its own streams."""

    def __init__(self, raw, start: int, end: int | None):
        super().__init__()
        raw.seek(start)
        self._raw = raw
        self._left = None if end is None else end - start

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        size = len(buffer) if self._left is None else min(len(buffer), self._left)
        data = self._raw.read(size)
        buffer[: len(data)] = data
        if self._left is not None:
            self._left -= len(data)
        return len(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


def read_chunks(stream: io.BufferedIOBase, failures: list[BaseException]) -> Iterator[bytes]:
    """Chunks of `stream` until its end or a decoding error, which goes to `failures`."""
    try:
        while chunk := stream.read(READ_CHUNK_BYTES):
            yield chunk
    except (EOFError, OSError, ValueError) as err:  # truncated / corrupt bz2, broken transport
        failures.append(err)


def split_pages(chunks: Iterable[bytes]) -> Iterator[Segment]:
    """Cuts decompressed dump bytes into `<page>...</page>` segments and what lies between.

    Holds at most one page plus one chunk. A `<page>` with no `</page>` before the next
    `<page>` (or before the end) comes out as an "unterminated" segment.
    """
    buffer = b""
    consumed = 0  # decompressed offset of buffer[0]
    in_page = False
    for chunk in chunks:
        buffer += chunk
        while True:
            if not in_page:
                start = buffer.find(_PAGE_OPEN)
                if start < 0:
                    if len(buffer) > MAX_OUTSIDE_BYTES:
                        keep = len(_PAGE_OPEN) - 1
                        yield Segment("outside", consumed, buffer[:-keep])
                        consumed += len(buffer) - keep
                        buffer = buffer[-keep:]
                    break
                if start:
                    yield Segment("outside", consumed, buffer[:start])
                consumed += start
                buffer = buffer[start:]
                in_page = True
            end = buffer.find(_PAGE_CLOSE, len(_PAGE_OPEN))
            if end < 0:
                break
            end += len(_PAGE_CLOSE)
            element = buffer[:end]
            nested = element.rfind(_PAGE_OPEN, len(_PAGE_OPEN))
            while nested > 0:  # earlier <page>s that never closed
                first = element.find(_PAGE_OPEN, len(_PAGE_OPEN))
                yield Segment("unterminated", consumed, element[:first])
                consumed += first
                element = element[first:]
                nested = element.rfind(_PAGE_OPEN, len(_PAGE_OPEN))
            yield Segment("page", consumed, element)
            consumed += len(element)
            buffer = buffer[end:]
            in_page = False
    if buffer:
        yield Segment("unterminated" if in_page else "outside", consumed, buffer)


def is_dump_framing(outside: bytes) -> bool:
    """True when bytes between pages are only the XML declaration, header, footer, whitespace."""
    return _BETWEEN_PAGES.fullmatch(outside) is not None


def page_id_and_title(page_xml: bytes) -> tuple[int | None, str | None]:
    """Best-effort id and title of a page's raw bytes, for dead-letter records."""
    id_match = _PAGE_ID.search(page_xml)
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
        for revision in page:  # pages-articles has one; a history dump ends with the latest
            pass
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


def decode_pages(path: str, start: int = 0, end: int | None = None) -> Iterator[Page | dict]:
    """Every page of `path[start:end]` as a `Page`, every fault as a dead-letter dict.

    Faults: a page whose bytes are not UTF-8 or not well-formed (its record carries the page
    id); an unterminated page or stray bytes between pages; a truncated or corrupt bz2 stream
    (a record with the decompressed offset where decoding stopped).
    """
    source = path if (start == 0 and end is None) else f"{path}#bytes={start}-{end if end is not None else ''}"
    failures: list[BaseException] = []
    last_offset = 0
    with open_decompressed(path, start, end) as stream:
        for segment in split_pages(read_chunks(stream, failures)):
            last_offset = segment.offset + len(segment.data)
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
                reason = "truncated_stream" if failures else "malformed_xml"
                yield dead_letter(source, page_id, title, reason,
                                  f"<page> at decompressed offset {segment.offset} has no </page>")
                continue
            try:
                yield parse_page(segment.data, path)
            except PageError as err:
                page_id, title = page_id_and_title(segment.data)
                yield dead_letter(source, page_id, title, err.reason,
                                  f"{err.detail} (page at decompressed offset {segment.offset})")
    for failure in failures:
        yield dead_letter(source, None, None, "truncated_stream" if isinstance(failure, EOFError)
                          else "corrupt_stream",
                          f"{type(failure).__name__}: {failure} (decoding stopped after "
                          f"decompressed offset {last_offset})")


def read_dump_header(path: str) -> bytes:
    """The `<mediawiki>...</siteinfo>` header of a dump file, or DumpInputError naming it.

    Also errors when the file holds no `<page>` at all (an empty dump). Streams the file only
    up to its first page.
    """
    failures: list[BaseException] = []
    header = None
    try:
        with open_decompressed(path) as stream:
            for segment in split_pages(read_chunks(stream, failures)):
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
    except OSError as err:
        raise DumpInputError(f"cannot read dump {path}: {err}") from err
    if failures and header is None:
        raise DumpInputError(f"{path} is not a readable dump: {failures[0]}")
    if header is None:
        raise DumpInputError(f"{path} is not a MediaWiki XML dump (no <mediawiki> header with "
                             "<siteinfo> before the first page)")
    raise DumpInputError(f"{path} is an empty MediaWiki dump (no <page>)")


def check_input(file_pattern: str, index: str | None = None) -> list[str]:
    """The dump files the pattern names, after checking each is a MediaWiki dump with pages.

    Raises DumpInputError naming the path: nothing matches, not a MediaWiki dump, no pages,
    or an `index` that does not exist or that is given for more than one dump file.
    """
    paths = [path for path, _ in match_dump_files(file_pattern)]
    for path in paths:
        read_dump_header(path)
    if index is not None:
        if len(paths) != 1:
            raise DumpInputError(f"--index {index} names one index, but {file_pattern!r} "
                                 f"matches {len(paths)} dump files")
        if not FileSystems.exists(index):
            raise DumpInputError(f"multistream index {index} does not exist")
    return paths


class _DecodeDumpRangesFn(beam.DoFn):
    """Decodes one (path, start, end, expected pages) read unit into pages and dead letters.

    `expected` lists (page_id, title) from a multistream index; pages it lists that the range
    did not yield in any form (e.g. lost to a truncated stream) are dead-lettered one by one,
    so `index_pages == pages_read + pages_dead_lettered` holds exactly.
    """

    def __init__(self):
        self.pages_read = beam.metrics.Metrics.counter(NAMESPACE, "pages_read")
        self.pages_dead_lettered = beam.metrics.Metrics.counter(NAMESPACE, "read_pages_dead_lettered")
        self.fragments_dead_lettered = beam.metrics.Metrics.counter(
            NAMESPACE, "read_fragments_dead_lettered")
        self.ranges_read = beam.metrics.Metrics.counter(NAMESPACE, "read_ranges")
        self.index_pages = beam.metrics.Metrics.counter(NAMESPACE, "index_pages")

    def process(self, read_unit):
        path, start, end, expected = read_unit
        self.ranges_read.inc()
        self.index_pages.inc(len(expected))
        seen: set[int] = set()
        stream_faults = []
        for item in decode_pages(path, start, end):
            if isinstance(item, Page):
                seen.add(item.page_id)
                self.pages_read.inc()
                yield item
                continue
            if item["page_id"] is None and item["reason"] in ("truncated_stream", "corrupt_stream") and expected:
                stream_faults.append(item)
                continue
            if item["page_id"] is not None:
                seen.add(item["page_id"])
                self.pages_dead_lettered.inc()
            else:
                self.fragments_dead_lettered.inc()
            beam.metrics.Metrics.counter(NAMESPACE, f"read_{item['reason']}").inc()
            yield beam.pvalue.TaggedOutput("dead_letters", item)
        missing = [(page_id, title) for page_id, title in expected if page_id not in seen]
        # A stream fault with an index behind it becomes one record per page it cost.
        if missing or stream_faults:
            fault = stream_faults[0] if stream_faults else None
            reason = fault["reason"] if fault else "missing_from_stream"
            detail = fault["detail"] if fault else "listed in the index but not found in its stream"
            for page_id, title in missing:
                self.pages_dead_lettered.inc()
                beam.metrics.Metrics.counter(NAMESPACE, f"read_{reason}").inc()
                yield beam.pvalue.TaggedOutput(
                    "dead_letters", dead_letter(fault["source"] if fault else f"{path}#bytes={start}-{end}",
                                                page_id, title, reason, detail))
            if fault and not missing:
                self.fragments_dead_lettered.inc()
                beam.metrics.Metrics.counter(NAMESPACE, f"read_{reason}").inc()
                yield beam.pvalue.TaggedOutput("dead_letters", fault)


class ReadDumpPages(beam.PTransform):
    """Dump file(s) -> {"pages": PCollection[Page], "dead_letters": PCollection[dict]}.

    Files are listed and checked when the pipeline is built (a bad `--input` fails at once with
    its path). Each file becomes read units: one per bz2 stream range when a multistream index
    is given or lies beside it, else the whole file; units are reshuffled so that workers decode
    them in parallel, and each unit is read and decoded by one worker, fused with whatever
    consumes the pages (no dump-sized buffer between read and parse).
    """

    def __init__(self, file_pattern: str, index: str | None = None):
        super().__init__()
        self.file_pattern = file_pattern
        self.index = index

    def expand(self, pbegin):
        from pipeline import multistream

        paths = check_input(self.file_pattern, self.index)
        files = [(path, self.index if self.index is not None else multistream.find_index(path))
                 for path in paths]
        decoded = (
            pbegin
            | "ListDumpFiles" >> beam.Create(files)
            | "PlanReadUnits" >> beam.FlatMap(multistream.plan_read_units)
            | "SpreadReadUnits" >> beam.Reshuffle()
            | "DecodePages" >> beam.ParDo(_DecodeDumpRangesFn()).with_outputs("dead_letters", main="pages")
        )
        return {"pages": decoded.pages, "dead_letters": decoded.dead_letters}
