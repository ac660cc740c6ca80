"""pipeline.write.sinks writes the files Beam's own sinks write, byte for byte, in blocks."""
import glob
import gzip

import apache_beam as beam
import pytest

from pipeline.write import sinks
from pipeline.write.sinks import BlockWriter


def _records(n: int) -> list[bytes]:
    return [f"record {i} ".encode() * (1 + i % 7) for i in range(n)]


def _only_file(pattern: str) -> bytes:
    (path,) = glob.glob(pattern)
    with open(path, "rb") as handle:
        return handle.read()


def test_an_ordered_shard_is_the_file_write_to_tfrecord_gives(tmp_path):
    records = _records(5000)  # about 250 KB: several blocks' worth of writes below
    chunks = [records[i:i + 13] for i in range(0, len(records), 13)]
    with beam.Pipeline(runner="DirectRunner") as pipeline:
        _ = (pipeline | "Records" >> beam.Create([records]) | beam.FlatMap(lambda rs: rs)
             | beam.io.WriteToTFRecord(str(tmp_path / "beam" / "part"), file_name_suffix=".tfrecord.gz",
                                       compression_type=beam.io.filesystem.CompressionTypes.GZIP))
    assert sinks.write_tfrecord_shard(str(tmp_path / "ours" / "part-00000-of-00001.tfrecord.gz"), chunks) == 5000
    beams, ours = _only_file(str(tmp_path / "beam" / "part-*")), _only_file(str(tmp_path / "ours" / "part-*"))
    assert gzip.decompress(ours) == gzip.decompress(beams)
    assert ours == beams  # deflate's output does not depend on how its input was cut


def test_text_lines_give_the_file_write_to_text_gives(tmp_path):
    lines = [line.decode() for line in _records(3000)]
    with beam.Pipeline(runner="DirectRunner") as pipeline:
        created = pipeline | beam.Create([lines]) | beam.FlatMap(lambda ls: ls)
        _ = created | "Beam" >> beam.io.WriteToText(str(tmp_path / "beam" / "part"), file_name_suffix=".jsonl.gz",
                                                    compression_type=beam.io.filesystem.CompressionTypes.GZIP)
        _ = created | "Ours" >> sinks.write_text(str(tmp_path / "ours" / "part"))
    assert _only_file(str(tmp_path / "ours" / "part-*")) == _only_file(str(tmp_path / "beam" / "part-*"))


class _Recorder:
    def __init__(self, fail_on_write: bool = False):
        self.writes, self.closed, self.fail_on_write = [], False, fail_on_write

    def write(self, data):
        if self.fail_on_write:
            raise OSError("disk full")
        self.writes.append(data)

    def close(self):
        self.closed = True


def test_the_block_writer_passes_writes_on_in_blocks_in_order_and_the_rest_at_close():
    inner = _Recorder()
    writer = BlockWriter(inner, block_bytes=10)
    for piece in (b"abcd", b"efgh", b"ijkl", b"mn", b"opqrstuvwx", b"yz"):
        writer.write(piece)
    writer.close()
    assert inner.writes == [b"abcdefghijkl", b"mnopqrstuvwx", b"yz"]  # blocks of >= 10 bytes, then the rest
    assert inner.closed
    assert not writer.writer.is_alive()


def test_a_failed_block_write_is_raised_not_lost():
    inner = _Recorder(fail_on_write=True)
    writer = BlockWriter(inner, block_bytes=4)
    writer.write(b"abcdef")  # one block for the writing thread, which fails
    with pytest.raises(OSError, match="disk full"):
        writer.close()
    assert not inner.closed  # the file is not closed as if complete


def test_text_shards_are_numbered_by_their_first_records_not_by_beams_random_names(tmp_path):
    """Beam numbers shards in the order of their temporary files' uuids: the same two shards came
    out swapped between two runners. Written under uuids in either order, they get one numbering."""
    shards = {"a": ['{"article_id": 7}', '{"article_id": 9}'], "b": ['{"article_id": 3}']}
    numbered = []
    for uids in (("0-uid", "1-uid"), ("1-uid", "0-uid")):   # the uuids' order flips between the runs
        prefix = str(tmp_path / uids[0] / "part")
        sink = sinks.write_text(prefix).sink
        init = sink.initialize_write()
        results = []
        for uid, lines in zip(uids, shards.values()):
            writer = sink.open_writer(init, uid)
            for line in lines:
                writer.write(line)
            results.append(writer.close())
        list(sink.finalize_write(init, results, sink.pre_finalize(init, results)))
        numbered.append([gzip.decompress(_only_file(f"{prefix}-0000{n}-of-00002.jsonl.gz")) for n in (0, 1)])
    assert numbered[0] == numbered[1]
    assert sorted(numbered[0]) == sorted("".join(line + "\n" for line in lines).encode() for lines in shards.values())
