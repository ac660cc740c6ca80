"""Multistream dumps: the index -> byte ranges of whole bz2 streams, and writing such dumps.

Wikimedia publishes `pages-articles-multistream.xml.bz2` as thousands of independent bz2
streams (the first holds the `<siteinfo>` header, then 100 pages per stream, the last holds
`</mediawiki>`), with `...-multistream-index.txt.bz2` whose lines are `offset:page_id:title`.
Every stream is decodable on its own, so a worker can seek to its offset and read it without
the rest of the file; `plan_read_units` turns the index into such ranges, and
`pipeline.read.dumps.decode_pages` decodes one. The pages of a range are parsed one by one (each
`<page>` element alone, via mwxml), so a range needs no header of its own.

A dump file without an index (a plain `.xml.bz2` or `.xml`, e.g. one of the ~60 part files)
is one read unit per *page shard* instead: `page_shards` workers each decompress the whole file
and parse only the pages whose id is theirs (`page_id % page_shards`). Decompression costs a few
percent of what parsing a page costs, so this buys page-level parallelism inside one file for
`page_shards` times the cheap part.

Writing such dumps (for tests, benchmarks and sizing runs) is `pipeline.read.dump_writers`, which
workers never import.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from apache_beam.io.filesystems import FileSystems

from pipeline.read.dumps import DumpInputError, decompressed_chunks, match_dump_files

_MULTISTREAM_NAME = re.compile(r"multistream(\d*)\.xml")


class ReadUnit(NamedTuple):
    """What one worker decodes: `path[start:end]` (end None: to the end of the file), and of
    its pages only those with `page_id % n_shards == shard`."""

    path: str
    start: int
    end: int | None
    expected: tuple[tuple[int, str], ...]  # (page_id, title) the index lists in the range
    shard: int = 0
    n_shards: int = 1


def index_path_for(dump_path: str) -> str | None:
    """The conventional index name beside a multistream dump, or None if the name is not one.

    `x-pages-articles-multistream.xml.bz2` -> `x-pages-articles-multistream-index.txt.bz2`,
    `x-multistream3.xml-p1p2.bz2` -> `x-multistream-index3.txt-p1p2.bz2` (part files).
    """
    directory, name = FileSystems.split(dump_path)
    if not _MULTISTREAM_NAME.search(name) or not name.endswith(".bz2"):
        return None
    return FileSystems.join(directory, _MULTISTREAM_NAME.sub(r"multistream-index\1.txt", name, count=1))


def find_index(dump_path: str) -> str | None:
    """The index lying beside a multistream dump, if there is one."""
    candidate = index_path_for(dump_path)
    return candidate if candidate is not None and FileSystems.exists(candidate) else None


def read_index(index_path: str) -> Iterator[tuple[int, int, str]]:
    """(offset, page_id, title) per line of a multistream index (bz2 or plain), streamed."""
    for number, line in enumerate(_lines(decompressed_chunks(index_path)), start=1):
        if not line:
            continue
        try:
            offset, page_id, title = line.decode("utf-8").split(":", 2)
            yield int(offset), int(page_id), title
        except ValueError as err:
            raise DumpInputError(f"{index_path} line {number} is not 'offset:page_id:title': "
                                 f"{line[:200]!r}") from err


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    rest = b""
    for chunk in chunks:
        *lines, rest = (rest + chunk).split(b"\n")
        yield from lines
    if rest:
        yield rest


def plan_read_units(dump_and_index: tuple[str, str | None], page_shards: int = 1) -> Iterator[ReadUnit]:
    """Read units of one dump file: each bz2 stream range from its index, or, without an
    index, the whole file once per page shard.

    With an index, the bytes before the first indexed offset (the header stream) form a unit
    of their own, and the last unit runs to the end of the file (taking the footer stream).
    Holds one stream's index lines at a time.
    """
    dump_path, index_path = dump_and_index
    if index_path is None:
        for shard in range(page_shards):
            yield ReadUnit(dump_path, 0, None, (), shard, page_shards)
        return
    (_, size), = match_dump_files(dump_path)
    start, pages, previous = None, [], -1
    for offset, page_id, title in read_index(index_path):
        if offset < previous or offset >= size:
            raise DumpInputError(f"{index_path}: offset {offset} is out of order or beyond the "
                                 f"{size} bytes of {dump_path}; is it the index of this dump?")
        if start is None:
            if offset > 0:
                yield ReadUnit(dump_path, 0, offset, ())
            start = offset
        elif offset != start:
            yield ReadUnit(dump_path, start, offset, tuple(pages))
            start, pages = offset, []
        pages.append((page_id, title))
        previous = offset
    if start is None:
        raise DumpInputError(f"multistream index {index_path} is empty")
    yield ReadUnit(dump_path, start, None, tuple(pages))
