"""The run's file writers, in blocks: Beam's text sink for the JSON-lines outputs, and one
ordered TFRecord shard at a time for the triplet splits (`pipeline.write.order`).

A run writes about ten gzip files at once (three splits of each triplet dataset, SCB, passages,
dead letters) and Beam's sinks hand each record to its file's zlib compressor as it comes, so
the compressors take turns record by record and their state keeps leaving the CPU caches:
compressing the 16x excerpt's 191 MB of triplets-sen records one by one took 1.5 s into one
stream, 2.2 s spread over three and 3.5 s over nine. Gathering each file's writes into blocks
gives zlib the same bytes in fewer, larger pieces, and deflate's output does not depend on how
its input is cut, so the files are the same byte for byte. A thread per file writes its blocks
(`BlockWriter`), so the compressing runs beside the parsing: zlib releases the GIL.

The text sink is Beam's public `FileBasedSink` (what `WriteToText` builds on) with the same
arguments that transform passes: it adds only `open` (a block-gathering handle around Beam's
own) and the line framing, so sharding and finalisation stay Beam's; its shards are numbered in
the order of their first records, not of Beam's random temporary names, so the same shards get
the same numbers on every run and runner. A test checks the files equal Beam's own sink's byte
for byte. A triplet shard is written whole by one worker in its key order
(`write_tfrecord_shard`, framed by `core.tfrecord`) to a temporary folder, and the split's
shards are renamed into place together (`finalize_shards`), as Beam's sinks finalise; a test
checks a shard equals `WriteToTFRecord`'s file of the same records. Its Parquet twin
(`core.parquet`) is written beside it, by the same worker, from the same records.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterable

import apache_beam as beam
from apache_beam.coders.coders import Coder, ToBytesCoder
from apache_beam.io.filebasedsink import FileBasedSink
from apache_beam.io.filesystem import CompressionTypes

from core import parquet
from core.tfrecord import frame
from pipeline.write.order import shard_name

BLOCK_BYTES = 1 << 20  # per open file
WRITE_BEHIND_BLOCKS = 2  # blocks a file holds waiting for its writing thread


class BlockWriter:
    """A file handle that gathers writes into blocks of at least `block_bytes` and hands them,
    in order, to a thread that writes them to the wrapped handle (the rest when it is closed).

    The thread is where Beam's gzip file compresses: zlib releases the GIL while it deflates,
    so compression runs beside the parsing, as `dumps.read_ahead` does for bz2. A write error
    of the thread is raised by the next `write` or by `close`, so no block is lost quietly.
    """
    def __init__(self, handle, block_bytes: int = BLOCK_BYTES):
        self.handle = handle
        self.block_bytes = block_bytes
        self.parts: list[bytes] = []
        self.size = 0
        self.blocks: queue.Queue = queue.Queue(maxsize=WRITE_BEHIND_BLOCKS)
        self.error: BaseException | None = None
        self.writer = threading.Thread(target=self._write_blocks, name="block-writer", daemon=True)
        self.writer.start()

    def _write_blocks(self) -> None:
        while (block := self.blocks.get()) is not None:
            if self.error is None:
                try:
                    self.handle.write(block)
                except BaseException as err:  # raised in the writing thread by write() or close()
                    self.error = err

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def write(self, data: bytes) -> None:
        self.parts.append(data)
        self.size += len(data)
        if self.size >= self.block_bytes:
            self._raise_error()
            self.blocks.put(b"".join(self.parts))
            self.parts.clear()
            self.size = 0

    def close(self) -> None:
        if self.parts:
            self.blocks.put(b"".join(self.parts))
            self.parts.clear()
        self.blocks.put(None)
        self.writer.join()
        self._raise_error()
        self.handle.close()


class _BlockSink(FileBasedSink):
    """Gzip files of the runner's choice of shards, as `WriteToTFRecord` / `WriteToText` name them,
    numbered in the order of their first records (`_FirstRecordNamedWriter`)."""
    def __init__(self, prefix: str, suffix: str, coder: Coder, mime_type: str):
        super().__init__(prefix, coder, file_name_suffix=suffix, num_shards=0, shard_name_template=None,
                         mime_type=mime_type, compression_type=CompressionTypes.GZIP)

    def open(self, temp_path):
        return BlockWriter(super().open(temp_path))

    def open_writer(self, init_result, uid):
        return _FirstRecordNamedWriter(super().open_writer(init_result, uid))


class _FirstRecordNamedWriter:
    """Beam's writer of one temporary shard, whose file is renamed at its close after its first
    record (`<sha1 of the first record>-<Beam's name>`). Beam numbers a sink's shards in the order
    of their temporary files' names, which are random (a uuid each): the same shards came out
    numbered differently from run to run and runner to runner (the 2019 file's two passages shards
    were swapped between the DirectRunner and a Flink cluster). Named after their first records
    (distinct: each shard holds other articles), they are numbered the same wherever the same
    shards are written."""
    def __init__(self, writer):
        self.writer = writer
        self.first: bytes | None = None

    def write(self, value) -> None:
        if self.first is None:
            self.first = self.writer.sink.coder.encode(value)
        self.writer.write(value)

    def at_capacity(self) -> bool:
        return self.writer.at_capacity()

    def close(self) -> str:
        import hashlib

        from apache_beam.io.filesystems import FileSystems

        path = self.writer.close()
        folder, name = path.rsplit("/", 1)
        named = f"{folder}/{hashlib.sha1(self.first or b'').hexdigest()[:16]}-{name}"
        FileSystems.rename([path], [named])
        return named


class _BlockTextSink(_BlockSink):
    def write_encoded_record(self, file_handle, encoded_line: bytes) -> None:
        file_handle.write(encoded_line)
        file_handle.write(b"\n")


def write_text(prefix: str, suffix: str = ".jsonl.gz") -> beam.PTransform:
    """`beam.io.WriteToText(prefix, file_name_suffix=suffix, compression_type=GZIP)` for bounded
    input, writing in blocks."""
    return beam.io.Write(_BlockTextSink(prefix, suffix, ToBytesCoder(), "text/plain"))


def write_tfrecord_shard(path: str, chunks) -> int:
    """Writes the records of `chunks` (lists of serialised records), in order, as one gzip
    TFRecord file (through Beam's FileSystems, compressed by a `BlockWriter`'s thread); returns
    the records written."""
    from apache_beam.io.filesystems import FileSystems

    written = 0
    writer = BlockWriter(FileSystems.create(path, mime_type="application/octet-stream",
                                            compression_type=CompressionTypes.GZIP))
    for chunk in chunks:
        for record in chunk:
            writer.write(frame(record))
        written += len(chunk)
    writer.close()
    return written


def write_triplet_shard(folder: str, index: int, n_shards: int, chunks: Iterable[list[bytes]]) -> list[str]:
    """Shard `index` of `n_shards` of a triplet split in both its forms, in one pass over
    `chunks` (any iterable): the gzip TFRecord file and its Parquet twin (`core.parquet`),
    the same records in the same order. Returns their paths."""
    tfrecord = f"{folder}/{shard_name(index, n_shards)}"
    table = f"{folder}/{shard_name(index, n_shards, parquet.SUFFIX)}"
    write_tfrecord_shard(tfrecord, parquet.passing_through(table, chunks))
    return [tfrecord, table]


def finalize_shards(temp_paths: list[str], folder: str, temp_folder: str) -> list[str]:
    """Renames a split's shards from its temporary folder into `folder` (all at the end, as Beam's
    file sinks finalise), or writes one empty shard (in both forms) when the split got none, then
    removes the temporary folder. Returns the final paths."""
    from apache_beam.io.filesystems import FileSystems

    if not temp_paths:
        return write_triplet_shard(folder, 0, 1, [])
    final = [f"{folder}/{path.rsplit('/', 1)[1]}" for path in sorted(temp_paths)]
    FileSystems.rename(sorted(temp_paths), final)
    if FileSystems.exists(temp_folder):
        FileSystems.delete([temp_folder])
    return final
