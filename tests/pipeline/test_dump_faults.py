"""Faults planted in copies of the real excerpt: each bad page or stream is counted and
dead-lettered with its page id (or stream offset), the rest of the dump is read, and the
counters reconcile exactly with the index."""
import bz2
import itertools

import pytest
from dump_support import as_tuples, run_read

from pipeline.read import dump_writers
from pipeline.read.dumps import Page, decode_pages, embedded_dump_path, page_id_and_title

pytestmark = pytest.mark.slow   # pipeline runs on faulty dumps

PAGES_PER_STREAM = 20
MALFORMED, UNDECODABLE, UNTERMINATED = 25, 27, 65  # positions of pages in the excerpt
TRUNCATED_STREAM = 5  # pages 100..119


@pytest.fixture(scope="module")
def excerpt():
    header, pages = dump_writers.dump_parts(embedded_dump_path())
    return header, list(pages)


def plant_page_faults(pages: list[bytes]) -> list[bytes]:
    """A copy of the pages with three broken ones: bad XML, non-UTF-8 bytes, no </page>."""
    pages = list(pages)
    assert b"</title>" in pages[MALFORMED]
    pages[MALFORMED] = pages[MALFORMED].replace(b"</title>", b"</titel>", 1)
    cut = pages[UNDECODABLE].index(b">", pages[UNDECODABLE].index(b"<text")) + 5  # inside the text
    pages[UNDECODABLE] = pages[UNDECODABLE][:cut] + b"\xff\xfe\xc3" + pages[UNDECODABLE][cut:]
    assert pages[UNTERMINATED].endswith(b"</page>")
    pages[UNTERMINATED] = pages[UNTERMINATED][:-len(b"</page>")]
    return pages


def truncate_stream(dump_path, index_path, stream_number: int) -> None:
    """Rewrites a multistream dump with one page stream cut to half its bytes, and its index
    with the later offsets moved accordingly (as a damaged download + regenerated index)."""
    data = open(dump_path, "rb").read()
    lines = [line.split(":", 2) for line in bz2.decompress(open(index_path, "rb").read()).decode().splitlines()]
    offsets = sorted({int(offset) for offset, _, _ in lines})
    start, end = offsets[stream_number], offsets[stream_number + 1]
    cut = (end - start) // 2
    with open(dump_path, "wb") as out:
        out.write(data[:start + cut] + data[end:])
    moved = {o: (o - (end - start - cut) if o >= end else o) for o in offsets}
    with open(index_path, "wb") as out:
        out.write(bz2.compress("".join(f"{moved[int(o)]}:{i}:{t}\n" for o, i, t in lines).encode()))


def page_ids(pages: list[bytes], positions) -> list[int]:
    return [page_id_and_title(pages[p])[0] for p in positions]


def test_multistream_faults_are_dead_lettered_and_reconcile(tmp_path, excerpt):
    header, pages = excerpt
    dump = tmp_path / "faulty-multistream.xml.bz2"
    index = tmp_path / "faulty-multistream-index.txt.bz2"
    dump_writers.write_multistream_dump(header, plant_page_faults(pages), str(dump), str(index),
                                       PAGES_PER_STREAM)
    truncate_stream(dump, index, TRUNCATED_STREAM)

    read, dead, counters = run_read(str(dump), str(tmp_path / "out"), workers=2)

    truncated = range(TRUNCATED_STREAM * PAGES_PER_STREAM, (TRUNCATED_STREAM + 1) * PAGES_PER_STREAM)
    expected_dead = {page_id: "truncated_stream" for page_id in page_ids(pages, truncated)}
    expected_dead.update(zip(page_ids(pages, [MALFORMED, UNDECODABLE, UNTERMINATED]),
                             ["malformed_xml", "undecodable_bytes", "malformed_xml"]))
    assert {d["page_id"]: d["reason"] for d in dead} == expected_dead
    assert len(dead) == len(expected_dead) == 23
    assert all(d["stage"] == "read" and d["title"] and d["detail"] for d in dead)
    # Everything else is read, unchanged.
    reference = {p.page_id: p for p in decode_pages(embedded_dump_path())}
    assert as_tuples(read) == as_tuples(sorted(p for i, p in reference.items() if i not in expected_dead))
    # Counters reconcile exactly with the index.
    assert counters["index_pages"] == 206
    assert counters["pages_read"] + counters["read_pages_dead_lettered"] == counters["index_pages"]
    assert counters["read_pages_dead_lettered"] == 23
    assert counters.get("read_fragments_dead_lettered", 0) == 0
    assert counters["read_truncated_stream"] == 20
    assert counters["read_malformed_xml"] == 2 and counters["read_undecodable_bytes"] == 1


def test_sequential_file_isolates_bad_pages(tmp_path, excerpt):
    header, pages = excerpt
    dump = tmp_path / "faulty.xml.bz2"
    faulty = plant_page_faults(pages)
    garbage_at = 150
    faulty[garbage_at] = faulty[garbage_at] + b"\n  <junk>left by a broken export</junk>"
    dump_writers.write_plain_dump(header, faulty, str(dump))

    read, dead, counters = run_read(str(dump), str(tmp_path / "out"))

    bad = page_ids(pages, [MALFORMED, UNDECODABLE, UNTERMINATED])
    assert [(d["page_id"], d["reason"]) for d in dead if d["page_id"] is not None] == sorted(
        zip(bad, ["malformed_xml", "undecodable_bytes", "malformed_xml"]))
    stray = [d for d in dead if d["page_id"] is None]
    assert [d["reason"] for d in stray] == ["stray_bytes"] and "offset" in stray[0]["detail"]
    assert len(read) == 206 - 3 and not set(bad) & {p.page_id for p in read}
    assert counters["pages_read"] == 203 and counters["read_pages_dead_lettered"] == 3
    assert counters["read_fragments_dead_lettered"] == 1


@pytest.mark.parametrize("n_shards", [2, 3])
def test_page_shards_of_a_faulty_plain_file_add_up_to_one_read(tmp_path, excerpt, n_shards):
    header, pages = excerpt
    faulty = plant_page_faults(pages)
    faulty[150] = faulty[150] + b"\n  <junk>left by a broken export</junk>"
    dump = tmp_path / "faulty.xml.bz2"
    dump_writers.write_plain_dump(header, faulty, str(dump))
    data = dump.read_bytes()
    dump.write_bytes(data[: len(data) * 9 // 10])  # and the stream ends early

    whole = list(decode_pages(str(dump)))
    shards = [list(decode_pages(str(dump), shard=shard, n_shards=n_shards)) for shard in range(n_shards)]

    reasons = {item["reason"] for item in whole if isinstance(item, dict)}
    assert reasons == {"malformed_xml", "undecodable_bytes", "stray_bytes", "truncated_stream"}
    assert sorted(map(repr, itertools.chain(*shards))) == sorted(map(repr, whole))
    for shard, items in enumerate(shards):  # each page parsed by one shard only, every shard busy
        parsed = [item.page_id for item in items if isinstance(item, Page)]
        assert parsed and all(page_id % n_shards == shard for page_id in parsed)


def test_truncated_single_stream_file_keeps_what_it_read(tmp_path, excerpt):
    header, pages = excerpt
    whole = tmp_path / "whole.xml.bz2"
    dump_writers.write_plain_dump(header, pages, str(whole))
    data = whole.read_bytes()
    truncated = tmp_path / "truncated.xml.bz2"
    truncated.write_bytes(data[: len(data) * 6 // 10])

    read, dead, counters = run_read(str(truncated), str(tmp_path / "out"))

    reference = [p.page_id for p in decode_pages(embedded_dump_path())]
    got = [p.page_id for p in read]
    assert 0 < len(got) < 206 and got == reference[: len(got)]  # a prefix, nothing skipped
    assert {d["reason"] for d in dead} == {"truncated_stream"}
    stream_fault = [d for d in dead if d["page_id"] is None]
    assert len(stream_fault) == 1 and "EOFError" in stream_fault[0]["detail"]
    cut_pages = [d["page_id"] for d in dead if d["page_id"] is not None]
    assert cut_pages in ([], [reference[len(got)]])  # the page being decoded when it ended
    assert counters["pages_read"] == len(got)


def test_undecodable_bytes_after_the_last_stream_are_reported(tmp_path, excerpt):
    header, pages = excerpt
    dump = tmp_path / "garbage-tail.xml.bz2"
    dump_writers.write_plain_dump(header, pages, str(dump))
    with open(dump, "ab") as out:
        out.write(b"BZh9 this is not bz2 data")  # Python's bz2.open would stop here silently

    items = list(decode_pages(str(dump)))

    assert [p.page_id for p in items[:-1]] == [p.page_id for p in decode_pages(embedded_dump_path())]
    assert items[-1]["reason"] == "corrupt_stream" and items[-1]["page_id"] is None
    assert bz2.open(dump).read().endswith(b"</mediawiki>\n")  # the quiet behaviour avoided
