"""Writing dumps from any page source: a real multistream file with its index, or a plain one.

Tests, `pipeline.benchmark` and `infra.sizing` use these to turn the embedded excerpt (or a
cut of a real dump) into inputs of a chosen layout and size; the workers never import them
(`pipeline.read.multistream` is the reading side).
"""
from __future__ import annotations

import bz2
import re
from collections.abc import Iterable, Iterator
from xml.sax.saxutils import unescape as xml_unescape

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipeline.read.dumps import (
    HEADER_PATTERN,
    DumpInputError,
    decompressed_chunks,
    page_id_and_title,
    split_pages,
    until_failure,
)

_ENTITIES = {"&quot;": '"', "&apos;": "'"}
_FOOTER = b"\n</mediawiki>\n"


def dump_parts(source_path: str) -> tuple[bytes, Iterator[bytes]]:
    """A dump's `<mediawiki>...</siteinfo>` header and an iterator over its `<page>` elements."""
    failures: list[BaseException] = []
    segments = split_pages(until_failure(decompressed_chunks(source_path), failures))
    header = b""
    first_page = None
    for segment in segments:
        if segment.kind == "outside":
            match = HEADER_PATTERN.search(segment.data)
            header = header or (match.group(0) if match else b"")
            continue
        first_page = segment.data
        break
    if not header:
        raise DumpInputError(f"{source_path} has no MediaWiki header")

    def pages() -> Iterator[bytes]:
        if first_page is not None:
            yield first_page
        for segment in segments:
            if segment.kind != "outside":
                yield segment.data
        if failures:
            raise DumpInputError(f"{source_path}: {failures[0]}")

    return header, pages()


_ID = re.compile(rb"<id>\s*(\d+)\s*</id>")
_TITLE = re.compile(rb"<title>([^<]*)</title>")


def renumber_page(page_xml: bytes, copy: int, id_stride: int) -> bytes:
    """The page as its `copy`-th duplicate: page id + copy * id_stride, title + " (copy N)".

    Copy 0 is the page unchanged. Used to build larger dumps from a real excerpt.
    """
    if copy == 0:
        return page_xml
    match = _ID.search(page_xml)
    if match is None:
        raise ValueError("a page without an <id> cannot be renumbered")
    page_id = int(match.group(1))
    page_xml = page_xml[:match.start()] + b"<id>%d</id>" % (page_id + copy * id_stride) + page_xml[match.end():]
    return _TITLE.sub(lambda m: b"<title>%s (copy %d)</title>" % (m.group(1), copy), page_xml, count=1)


def write_multistream_dump(header: bytes, pages: Iterable[bytes], dump_path: str,
                           index_path: str, pages_per_stream: int = 100) -> int:
    """Writes pages as a multistream `.xml.bz2` (header stream, page streams, footer stream)
    and its `offset:page_id:title` index (bz2), local or gs://. Returns the number of streams.

    The index takes each page's id and title from its raw bytes, so a deliberately broken page
    (the fault tests plant some) still gets its line, as it would in a real dump.
    """
    streams = 0
    index_lines = []
    with FileSystems.create(dump_path, compression_type=CompressionTypes.UNCOMPRESSED) as out:
        offset = 0

        def write_stream(data: bytes) -> int:
            compressed = bz2.compress(data)
            out.write(compressed)
            return len(compressed)

        offset += write_stream(header + b"\n")
        batch: list[bytes] = []

        def flush() -> int:
            nonlocal streams
            for page_xml in batch:
                page_id, title = page_id_and_title(page_xml)
                index_lines.append(f"{offset}:{page_id}:{xml_unescape(title or '', _ENTITIES)}\n")
            streams += 1
            return write_stream(b"".join(b"  " + page_xml + b"\n" for page_xml in batch))

        for page_xml in pages:
            batch.append(page_xml)
            if len(batch) == pages_per_stream:
                offset += flush()
                batch = []
        if batch:
            offset += flush()
        write_stream(_FOOTER)
    with FileSystems.create(index_path, compression_type=CompressionTypes.UNCOMPRESSED) as out:
        out.write(bz2.compress("".join(index_lines).encode("utf-8")))
    return streams


def write_plain_dump(header: bytes, pages: Iterable[bytes], dump_path: str) -> None:
    """Writes pages as one ordinary dump (a single bz2 stream for `.bz2`, else plain XML)."""
    with FileSystems.create(dump_path, compression_type=CompressionTypes.UNCOMPRESSED) as out:
        compressor = bz2.BZ2Compressor() if dump_path.endswith(".bz2") else None

        def write(data: bytes) -> None:
            out.write(compressor.compress(data) if compressor else data)

        write(header + b"\n")
        for page_xml in pages:
            write(b"  " + page_xml + b"\n")
        write(_FOOTER)
        if compressor:
            out.write(compressor.flush())
