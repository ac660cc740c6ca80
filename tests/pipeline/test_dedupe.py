"""A page id read twice goes on once, decided from page ids before the read (`pipeline.read.dedupe`):
real excerpt pages planted twice or three times, in other streams and in the same one, in a
multistream dump with its index and in a plain dump without one."""
import itertools

import pytest
from dump_support import run_read

from pipeline.read import dedupe, dump_writers
from pipeline.read.dumps import Page, embedded_dump_path, page_id_and_title
from pipeline.read.multistream import ReadUnit

PAGES, PER_STREAM = 12, 4
RETITLED, TWICE_MORE = 2, 5     # positions: one copy under a title that sorts first, one copied twice


@pytest.fixture(scope="module")
def excerpt():
    header, pages = dump_writers.dump_parts(embedded_dump_path())
    return header, list(itertools.islice(pages, PAGES))


def _retitled(page: bytes) -> bytes:
    return page.replace(b"<title>", b"<title>0 ", 1)   # "0 ..." sorts before every letter


def _with_copies(pages: list[bytes]) -> list[bytes]:
    """The pages, then (in a stream of its own) a retitled copy of one and two copies of another."""
    return [*pages, _retitled(pages[RETITLED]), pages[TWICE_MORE], pages[TWICE_MORE]]


def _check_one_copy_each(pages: list[bytes], read: list[Page], dead: list[dict], counters: dict) -> None:
    ids = [page_id_and_title(page)[0] for page in pages]
    assert sorted(page.page_id for page in read) == sorted(ids)          # every id once
    kept = {page.page_id: page for page in read}
    first_title = page_id_and_title(_retitled(pages[RETITLED]))[1]
    assert kept[ids[RETITLED]].title == first_title                      # the first by source, title, text
    letters = sorted((letter["page_id"], letter["title"]) for letter in dead)
    twice_title = page_id_and_title(pages[TWICE_MORE])[1]
    assert letters == sorted([(ids[RETITLED], page_id_and_title(pages[RETITLED])[1]),
                              (ids[TWICE_MORE], twice_title), (ids[TWICE_MORE], twice_title)])
    assert all(letter["reason"] == "duplicate_page_id" and letter["stage"] == "dedupe"
               and "was already read from" in letter["detail"] for letter in dead)
    assert counters["pages_read"] == PAGES + 3 and counters["pages_duplicate_id"] == 3
    assert counters["page_ids_repeated"] == 2


def test_a_multistream_dump_listing_ids_twice_gives_each_page_once(tmp_path, excerpt):
    header, pages = excerpt
    dump, index = tmp_path / "twice-multistream.xml.bz2", tmp_path / "twice-multistream-index.txt.bz2"
    dump_writers.write_multistream_dump(header, _with_copies(pages), str(dump), str(index), PER_STREAM)
    read, dead, counters = run_read(str(dump), str(tmp_path / "out"), workers=2)
    _check_one_copy_each(pages, read, dead, counters)
    assert counters["index_pages"] == PAGES + 3


def test_a_plain_dump_holding_ids_twice_gives_each_page_once_with_page_shards(tmp_path, excerpt):
    header, pages = excerpt
    dump = tmp_path / "twice.xml.bz2"
    dump_writers.write_plain_dump(header, _with_copies(pages), str(dump))
    read, dead, counters = run_read(str(dump), str(tmp_path / "out"), page_shards=2)
    _check_one_copy_each(pages, read, dead, counters)


def test_a_copy_that_cannot_be_read_is_no_copy_the_other_is_kept(tmp_path, excerpt):
    header, pages = excerpt
    broken = _retitled(pages[RETITLED]).replace(b"</ns>", b"</nss>", 1)   # would be chosen, but is malformed
    dump, index = tmp_path / "broken-multistream.xml.bz2", tmp_path / "broken-multistream-index.txt.bz2"
    dump_writers.write_multistream_dump(header, [*pages, broken], str(dump), str(index), PER_STREAM)
    read, dead, counters = run_read(str(dump), str(tmp_path / "out"))
    page_id, title = page_id_and_title(pages[RETITLED])
    assert [page.title for page in read if page.page_id == page_id] == [title]
    assert [(letter["page_id"], letter["reason"]) for letter in dead] == [(page_id, "malformed_xml")]
    assert counters.get("pages_duplicate_id", 0) == 0 and counters["page_ids_repeated"] == 1


def _page(page_id: int, title: str, text: str, source: str = "dump.xml") -> Page:
    return Page(page_id, title, 0, None, text, source)


def test_the_chosen_copy_does_not_depend_on_the_order_the_copies_arrive_in():
    units = [("b.xml", 0, None, 0, 1), ("a.xml", 100, 200, 0, 1), ("a.xml", 0, 100, 0, 1)]
    copies = [(units[0], 0, _page(7, "A", "x", "b.xml")), (units[1], 0, _page(7, "B", "x", "a.xml")),
              (units[2], 1, _page(7, "B", "x", "a.xml")), (units[2], 0, _page(7, "B", "y", "a.xml"))]
    chosen = {dedupe.choose_copy(7, order) for order in itertools.permutations(copies)}
    assert chosen == {(7, dedupe.Choice(units[2], 1, "a.xml", "B"))}   # source, title, text, then unit and rank


def test_a_unit_passes_on_only_the_chosen_copy_of_a_repeated_id():
    unit = ReadUnit("a.xml", 0, 100, ((7, "B"), (7, "B"), (8, "C")))
    choices = {7: dedupe.Choice(dedupe.unit_key(unit), 1, "a.xml", "B")}
    copies = dedupe.Copies(unit, choices)
    pages = [_page(7, "B", "y"), _page(8, "C", "z"), _page(7, "B", "x")]
    assert [copies.is_kept(page) for page in pages] == [choices[7], None, None]
    elsewhere = dedupe.Copies(ReadUnit("a.xml", 100, 200, ((7, "B"),)), choices)
    assert elsewhere.is_kept(_page(7, "B", "x")) == choices[7]
    assert list(dedupe.unit_page_ids(unit)) == [7, 7, 8]   # from the index, no decode
