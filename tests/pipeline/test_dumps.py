"""Reading dumps: the pages match mwxml's own reading of the real excerpt; bad inputs name the path."""
import bz2
from pathlib import Path

import apache_beam as beam
import mwxml
import pytest
from dump_support import as_tuples, run_read

from pipeline.read import dump_writers
from pipeline.read.dumps import (
    DumpInputError,
    Page,
    bz2_chunks,
    check_input,
    decode_pages,
    decompressed_chunks,
    embedded_dump_path,
    raw_chunks,
    read_ahead,
    split_pages,
)
from pipeline.read.pages import ReadDumpPages


def reference_pages(path: str) -> list[tuple]:
    """The excerpt as mwxml reads it in one pass over the whole file (no page splitting)."""
    with bz2.open(path, "rt", encoding="utf-8") as stream:
        pages = []
        for page in mwxml.Dump.from_file(stream):
            revision = list(page)[-1]
            pages.append((page.id, page.title, page.namespace, page.redirect, revision.text or ""))
        return pages


@pytest.fixture(scope="module")
def embedded_reference():
    return reference_pages(embedded_dump_path())


def test_decode_pages_matches_mwxml_whole_file_reading(embedded_reference):
    items = list(decode_pages(embedded_dump_path()))
    assert all(isinstance(item, Page) for item in items)
    assert as_tuples(items) == embedded_reference
    assert {p.source for p in items} == {embedded_dump_path()}
    assert len(embedded_reference) == 206
    assert sum(1 for p in items if p.redirect) == 100


def test_read_dump_pages_transform_yields_every_page_and_counts_them(tmp_path, embedded_reference):
    pages, dead, counters = run_read(embedded_dump_path(), str(tmp_path / "out"))
    assert as_tuples(pages) == sorted(embedded_reference)
    assert dead == []
    assert counters["pages_read"] == len(embedded_reference)


@pytest.mark.slow   # seconds of real work: the fast tier stays under 3 minutes
def test_glob_of_plain_xml_and_bz2_parts(tmp_path, embedded_reference):
    header, page_iter = dump_writers.dump_parts(embedded_dump_path())
    page_bytes = list(page_iter)
    dump_writers.write_plain_dump(header, page_bytes[:80], str(tmp_path / "part1.xml"))
    dump_writers.write_plain_dump(header, page_bytes[80:], str(tmp_path / "part2.xml.bz2"))
    pages, dead, counters = run_read(str(tmp_path / "part*"), str(tmp_path / "out"))
    assert as_tuples(pages) == sorted(embedded_reference)
    assert {p.source for p in pages} == {str(tmp_path / "part1.xml"), str(tmp_path / "part2.xml.bz2")}
    assert dead == [] and counters["pages_read"] == 206


def test_split_pages_holds_pages_whole_across_chunk_boundaries():
    data = b"<mediawiki><siteinfo></siteinfo>\n<page>a</page>\n<page>bb</page></mediawiki>"
    chunks = [data[i:i + 3] for i in range(0, len(data), 3)]
    segments = list(split_pages(chunks))
    assert [(s.kind, s.data) for s in segments] == [
        ("outside", b"<mediawiki><siteinfo></siteinfo>\n"), ("page", b"<page>a</page>"),
        ("outside", b"\n"), ("page", b"<page>bb</page>"), ("outside", b"</mediawiki>")]
    assert all(data[s.offset:s.offset + len(s.data)] == s.data for s in segments)


def test_split_pages_separates_a_page_that_never_closes():
    data = b"<page>one<page>two</page>"
    assert [(s.kind, s.data) for s in split_pages([data])] == [
        ("unterminated", b"<page>one"), ("page", b"<page>two</page>")]


def test_missing_path_and_empty_glob_name_the_input(tmp_path):
    missing = str(tmp_path / "nope.xml.bz2")
    with pytest.raises(DumpInputError, match="nope.xml.bz2"):
        check_input(missing)
    with pytest.raises(DumpInputError, match=r"dump-\*\.xml"):
        check_input(str(tmp_path / "dump-*.xml"))


def test_not_a_mediawiki_dump_names_the_file(tmp_path):
    bogus = tmp_path / "notes.xml.bz2"
    bogus.write_bytes(bz2.compress(b"<html><body>hello</body></html>"))
    with pytest.raises(DumpInputError, match="notes.xml.bz2.*not a MediaWiki"):
        check_input(str(bogus))
    plain_text = tmp_path / "plain.xml.bz2"
    plain_text.write_bytes(b"this is not bz2 at all")
    with pytest.raises(DumpInputError, match="plain.xml.bz2"):
        check_input(str(plain_text))


def test_empty_dump_names_the_file(tmp_path):
    header, _ = dump_writers.dump_parts(embedded_dump_path())
    empty = tmp_path / "empty.xml.bz2"
    dump_writers.write_plain_dump(header, [], str(empty))
    with pytest.raises(DumpInputError, match="empty.xml.bz2.*empty"):
        check_input(str(empty))
    zero_bytes = tmp_path / "zero.xml"
    zero_bytes.write_bytes(b"")
    with pytest.raises(DumpInputError, match="zero.xml"):
        check_input(str(zero_bytes))


def test_read_dump_pages_fails_at_construction_on_bad_input(tmp_path):
    with pytest.raises(DumpInputError, match="absent.xml"):
        with beam.Pipeline(runner="DirectRunner") as pipeline:
            _ = pipeline | ReadDumpPages(str(tmp_path / "absent.xml"))


@pytest.mark.parametrize("chunk_size", [997, 65536])
def test_split_pages_does_not_depend_on_chunk_boundaries(chunk_size):
    data = b"".join(decompressed_chunks(embedded_dump_path()))
    whole = list(split_pages([data]))
    chunked = list(split_pages(data[i:i + chunk_size] for i in range(0, len(data), chunk_size)))
    assert chunked == whole
    assert sum(s.kind == "page" for s in whole) == 206
    assert b"".join(s.data for s in whole) == data  # nothing lost between segments


@pytest.mark.slow   # seconds: the full tier (the fast tier stays under 3 minutes)
def test_reading_holds_one_page_not_the_dump(tmp_path):
    """Python-heap peak while streaming a plain dump 8x the excerpt stays near the 1x peak."""
    import tracemalloc

    header, pages = dump_writers.dump_parts(embedded_dump_path())
    pages = list(pages)
    id_stride = 10 ** 6

    def peak_bytes(path: str) -> int:
        tracemalloc.start()
        try:
            assert sum(1 for item in decode_pages(path) if isinstance(item, Page)) > 0
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = tmp_path / "x1.xml", tmp_path / "x8.xml"
    dump_writers.write_plain_dump(header, pages, str(small))
    dump_writers.write_plain_dump(
        header, (dump_writers.renumber_page(p, copy, id_stride) for copy in range(8) for p in pages),
        str(large))
    small_peak, large_peak = peak_bytes(str(small)), peak_bytes(str(large))
    assert large.stat().st_size > 7 * small.stat().st_size
    assert large_peak < 1.5 * small_peak
    assert large_peak < large.stat().st_size / 4


@pytest.mark.slow   # seconds: a real dump decompressed twice
def test_read_ahead_gives_the_same_chunks_as_decompressing_in_line():
    path = embedded_dump_path()
    assert list(decompressed_chunks(path)) == list(bz2_chunks(raw_chunks(path)))
    assert b"".join(read_ahead(bz2_chunks(raw_chunks(path)), depth=1)) == bz2.decompress(Path(path).read_bytes())


def test_read_ahead_raises_the_producers_error_after_the_chunks_before_it():
    def chunks():
        yield b"one"
        yield b"two"
        raise EOFError("compressed data ended before the bz2 end-of-stream marker")

    received = []
    with pytest.raises(EOFError, match="end-of-stream"):
        for chunk in read_ahead(chunks()):
            received.append(chunk)
    assert received == [b"one", b"two"]


def test_a_consumer_that_stops_early_stops_the_read_ahead_thread():
    import threading

    closed = threading.Event()

    def endless():
        try:
            while True:
                yield b"x" * 1024
        finally:
            closed.set()

    ahead = read_ahead(endless(), depth=2)
    assert next(ahead) == b"x" * 1024
    ahead.close()  # what a reader that stops (an error, a page shard's end) does
    assert closed.is_set()
    assert not any(thread.name == "bz2-read-ahead" for thread in threading.enumerate())
