"""Multistream reading: a real multistream file built from the excerpt, read stream by stream
in parallel (local and gs://), gives exactly the pages of reading it start to end."""
import bz2
import shutil

import pytest
from apache_beam.io.filesystems import FileSystems
from dump_support import ALL_NEGATIVES, as_tuples, run_read

from pipeline.read import dump_writers, multistream
from pipeline.read.dumps import decode_pages, embedded_dump_path

pytestmark = pytest.mark.slow   # pipeline runs on multistream dumps

PAGES_PER_STREAM = 20


@pytest.fixture(scope="module")
def excerpt_parts():
    header, pages = dump_writers.dump_parts(embedded_dump_path())
    return header, list(pages)


@pytest.fixture(scope="module")
def sequential_pages():
    return sorted(as_tuples(decode_pages(embedded_dump_path())))


@pytest.fixture()
def multistream_dump(tmp_path, excerpt_parts):
    header, pages = excerpt_parts
    dump = tmp_path / "dump" / "enwiki-test-pages-articles-multistream.xml.bz2"
    index = tmp_path / "dump" / "enwiki-test-pages-articles-multistream-index.txt.bz2"
    dump.parent.mkdir()
    streams = dump_writers.write_multistream_dump(header, pages, str(dump), str(index), PAGES_PER_STREAM)
    return dump, index, streams


def test_written_file_is_a_real_multistream_dump(multistream_dump, excerpt_parts):
    dump, index, streams = multistream_dump
    data = dump.read_bytes()
    lines = [line.split(":", 2) for line in bz2.decompress(index.read_bytes()).decode().splitlines()]
    offsets = sorted({int(offset) for offset, _, _ in lines})
    assert len(offsets) == streams == -(-206 // PAGES_PER_STREAM)
    # Every indexed offset starts a bz2 stream that decodes alone and begins with a <page>.
    for offset in offsets:
        decoder = bz2.BZ2Decompressor()
        text = decoder.decompress(data[offset:])
        assert decoder.eof and text.lstrip().startswith(b"<page>")
    # The whole file, decoded as one, is a dump of the same pages in the same order.
    assert [int(page_id) for _, page_id, _ in lines] == [p.page_id for p in decode_pages(str(dump))]


def test_read_units_tile_the_file_and_follow_the_index(multistream_dump):
    dump, index, streams = multistream_dump
    units = list(multistream.plan_read_units((str(dump), str(index))))
    assert len(units) == streams + 1  # + the header stream
    assert units[0][1] == 0 and units[0][3] == ()
    assert all(a[2] == b[1] for a, b in zip(units, units[1:]))
    assert units[-1][2] is None
    listed = [page_id for unit in units for page_id, _ in unit[3]]
    assert listed == [p.page_id for p in decode_pages(str(dump))]
    # Each unit alone decodes to exactly the pages the index lists for it.
    for unit in units:
        assert (unit.shard, unit.n_shards) == (0, 1)
        assert [(p.page_id, p.title) for p in decode_pages(unit.path, unit.start, unit.end)] == list(unit.expected)


def test_index_name_beside_dump_and_part_files():
    assert multistream.index_path_for("/d/enwiki-20240601-pages-articles-multistream.xml.bz2") == \
        "/d/enwiki-20240601-pages-articles-multistream-index.txt.bz2"
    assert multistream.index_path_for("gs://b/enwiki-x-pages-articles-multistream3.xml-p1p41242.bz2") == \
        "gs://b/enwiki-x-pages-articles-multistream-index3.txt-p1p41242.bz2"
    assert multistream.index_path_for("/d/enwiki-latest-pages-articles.xml.bz2") is None


@pytest.mark.parametrize("workers", [1, 2])
def test_split_reading_equals_sequential_reading(tmp_path, multistream_dump, sequential_pages, workers):
    dump, index, streams = multistream_dump
    pages, dead, counters = run_read(str(dump), str(tmp_path / "split"), workers=workers)
    assert dead == []
    assert as_tuples(pages) == sequential_pages
    assert counters["read_ranges"] == streams + 1  # the index was found beside the dump
    assert counters["pages_read"] == 206
    # The same file with no index beside it is read start to end, as one unit.
    lone = tmp_path / "lone" / "enwiki-test-pages-articles-multistream.xml.bz2"
    lone.parent.mkdir()
    shutil.copy(dump, lone)
    whole, dead, counters = run_read(str(lone), str(tmp_path / "whole"), workers=workers)
    assert counters["read_ranges"] == 1 and dead == []
    assert as_tuples(whole) == as_tuples(pages)


def test_index_given_explicitly(tmp_path, multistream_dump, sequential_pages):
    dump, index, streams = multistream_dump
    elsewhere = tmp_path / "elsewhere.txt.bz2"
    shutil.move(index, elsewhere)
    pages, dead, counters = run_read(str(dump), str(tmp_path / "out"), index=str(elsewhere))
    assert as_tuples(pages) == sequential_pages and dead == []
    assert counters["read_ranges"] == streams + 1


def test_gcs_multistream_read(gcs_emulator, tmp_path, excerpt_parts, sequential_pages):
    prefix = gcs_emulator()
    header, pages = excerpt_parts
    dump = f"{prefix}/enwiki-test-pages-articles-multistream.xml.bz2"
    streams = dump_writers.write_multistream_dump(
        header, pages, dump, f"{prefix}/enwiki-test-pages-articles-multistream-index.txt.bz2",
        PAGES_PER_STREAM)
    assert FileSystems.exists(dump)
    read, dead, counters = run_read(dump, str(tmp_path / "out"))
    assert as_tuples(read) == sequential_pages and dead == []
    assert counters["read_ranges"] == streams + 1
    assert {p.source for p in read} == {dump}


# The whole pipeline: split reading gives the same outputs as reading the original excerpt
# start to end (the session's `embedded_pipeline_output`), with the same seed, whatever the
# number of workers and whether the dump and the outputs live on local disk or gs://.
READ_ONLY_COUNTERS = {"read_ranges", "index_pages"}  # differ by design between the two readings


def pipeline_outputs(out: str, scratch) -> dict:
    """Every output of a run as comparable values: sorted serialized triplets per dataset and
    split (serialized deterministically by the pipeline), sorted JSON lines, counters."""
    import gzip
    import json

    import tensorflow as tf

    files = sorted(m.path for r in FileSystems.match([f"{out}/**"]) for m in r.metadata_list)
    local = {}
    for path in files:  # gs:// outputs are fetched through Beam's FileSystems, like any reader
        relative = path[len(out):].lstrip("/")
        target = scratch / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileSystems.open(path, compression_type="uncompressed") as source:
            target.write_bytes(source.read())
        local[relative] = target
    triplets = {}
    for relative, target in local.items():
        if relative.endswith(".tfrecord.gz"):
            key = relative.rsplit("/", 1)[0]
            records = tf.data.TFRecordDataset([str(target)], compression_type="GZIP")
            triplets.setdefault(key, []).extend(bytes(r.numpy()) for r in records)
    lines = {}
    for relative, target in local.items():
        if relative.endswith(".jsonl.gz"):
            with gzip.open(target, "rt", encoding="utf-8") as f:
                lines.setdefault(relative.split("/", 1)[0], []).extend(f.read().splitlines())
    counters = json.loads(local["stats.json"].read_text())["counters"]
    return {"triplets": {k: sorted(v) for k, v in triplets.items()},
            "json_lines": {k: sorted(v) for k, v in lines.items()},
            "counters": {k: v for k, v in counters.items() if k not in READ_ONLY_COUNTERS},
            "read_ranges": counters.get("read_ranges")}


@pytest.fixture(scope="module")
def sequential_outputs(embedded_pipeline_output, tmp_path_factory):
    return pipeline_outputs(str(embedded_pipeline_output), tmp_path_factory.mktemp("sequential"))


def assert_same_outputs(split: dict, sequential: dict) -> None:
    assert split["triplets"].keys() == sequential["triplets"].keys()
    assert sum(map(len, sequential["triplets"].values())) > 0
    for key, records in sequential["triplets"].items():
        assert split["triplets"][key] == records, key
    assert split["json_lines"] == sequential["json_lines"]  # scb, passages, dead letters
    assert len(sequential["json_lines"]["scb"]) > 0
    assert split["counters"] == sequential["counters"]


def test_pipeline_on_split_reading_equals_sequential(tmp_path, multistream_dump, sequential_outputs):
    from pipeline import run

    dump, _, streams = multistream_dump
    out = tmp_path / "out"
    run.main(["--output", str(out), "--input", str(dump), "--runner", "DirectRunner", *ALL_NEGATIVES])
    split = pipeline_outputs(str(out), tmp_path / "fetched")
    assert split["read_ranges"] == streams + 1 and sequential_outputs["read_ranges"] == 1
    assert_same_outputs(split, sequential_outputs)


def test_pipeline_gcs_in_and_out_with_2_workers_equals_sequential(
        gcs_emulator, tmp_path, excerpt_parts, sequential_outputs):
    from pipeline import run

    prefix = gcs_emulator()
    header, pages = excerpt_parts
    dump = f"{prefix}/in/enwiki-test-pages-articles-multistream.xml.bz2"
    streams = dump_writers.write_multistream_dump(
        header, pages, dump, multistream.index_path_for(dump), PAGES_PER_STREAM)
    run.main(["--output", f"{prefix}/out", "--input", dump, "--runner", "DirectRunner", *ALL_NEGATIVES,
              "--direct_running_mode", "multi_processing", "--direct_num_workers", "2"])
    split = pipeline_outputs(f"{prefix}/out", tmp_path / "fetched")
    assert split["read_ranges"] == streams + 1
    assert_same_outputs(split, sequential_outputs)
