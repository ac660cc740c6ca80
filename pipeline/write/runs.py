"""Sorted runs: the external sort behind a triplet split's write-time order (`pipeline.write.order`).

Grouping a split's chunks by shard shuffled every triplet, and Beam's local runners hold a
shuffle whole in the launching process (with the pages' grouping, 5.3 GiB for the 2019 file:
docs/results.md). So the chunks pass no shuffle: each worker gathers a split's (key, chunk)
pairs up to `RUN_BYTES` of records, sorts them by key and writes them to a temporary *run* file
(`write_run`); only each run's `RunInfo` (its path and sizes) goes through Beam. Once every run
is written, their summed sizes give the shard count (`shard_plans`), and shard `i` is every run's
chunks of key range `i` (`shard_chunks`: a run's index of keys and offsets gives the bytes to
read), sorted by key: the same shard, byte for byte, as sorting the whole split would give.

Memory: a worker holds up to `RUN_BYTES` of records per split it spills, and a shard writer the
shard it writes (at most `order.TARGET_SHARD_BYTES` of records). A run file is: per chunk its key
and record count (`_ENTRY`) and each record's length and bytes; then the index, a key and an
offset per chunk (`_INDEX_ENTRY`). The runs lie in the split's temporary folder and go with it.
"""
from __future__ import annotations

import bisect
import struct
import uuid
from collections.abc import Iterator
from typing import NamedTuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipeline.write import order

RUN_BYTES = 32 << 20   # records a worker gathers per split before it writes them as one sorted run
_ENTRY = struct.Struct(">QI")        # a chunk's key, its number of records
_LENGTH = struct.Struct(">I")        # a record's length
_INDEX_ENTRY = struct.Struct(">QQ")  # a chunk's key, its offset in the run


class RunInfo(NamedTuple):
    """A written run: where it lies, its chunks and record bytes, and where its index starts."""

    path: str
    chunks: int
    record_bytes: int
    index_offset: int


class RunBuffer:
    """A split's (key, chunk) pairs gathered by one worker until they make a run."""

    def __init__(self, folder: str, run_bytes: int = RUN_BYTES):
        self.folder = folder
        self.run_bytes = run_bytes
        self.pairs: list[tuple[int, list[bytes]]] = []
        self.size = 0

    def add(self, key: int, chunk: list[bytes]) -> RunInfo | None:
        """Adds one pair; the `RunInfo` of the run it completed, or None."""
        self.pairs.append((key, chunk))
        self.size += sum(map(len, chunk))
        return self.flush() if self.size >= self.run_bytes else None

    def flush(self) -> RunInfo | None:
        """Writes what is gathered as a run (None when nothing is)."""
        if not self.pairs:
            return None
        info = write_run(f"{self.folder}/runs/{uuid.uuid4().hex}.run", self.pairs)
        self.pairs, self.size = [], 0
        return info


def write_run(path: str, pairs: list[tuple[int, list[bytes]]]) -> RunInfo:
    """Writes (key, chunk) pairs sorted by key as one run file; returns its `RunInfo`."""
    pairs.sort(key=lambda pair: pair[0])
    index, offset, record_bytes = [], 0, 0
    with FileSystems.create(path, mime_type="application/octet-stream",
                            compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        for key, chunk in pairs:
            entry = b"".join([_ENTRY.pack(key, len(chunk)),
                              *(part for record in chunk for part in (_LENGTH.pack(len(record)), record))])
            handle.write(entry)
            index.append(_INDEX_ENTRY.pack(key, offset))
            offset += len(entry)
            record_bytes += sum(map(len, chunk))
        handle.write(b"".join(index))
    return RunInfo(path, len(pairs), record_bytes, offset)


def shard_plans(infos: list[RunInfo]) -> Iterator[tuple[int, int, list[RunInfo]]]:
    """(shard, shard count, every run) for each shard of a split, the count from the runs' summed
    sizes (`order.shard_count`); nothing for a split without chunks."""
    n_chunks = sum(info.chunks for info in infos)
    if not n_chunks:
        return
    n_shards = order.shard_count(sum(info.record_bytes for info in infos), n_chunks)
    runs = sorted(infos)
    for shard in range(n_shards):
        yield shard, n_shards, runs


def shard_chunks(infos: list[RunInfo], shard: int, n_shards: int) -> list[list[bytes]]:
    """The chunks of shard `shard` of `n_shards` from every run, sorted by key."""
    pairs = [pair for info in infos for pair in _run_segment(info, shard, n_shards)]
    pairs.sort(key=lambda pair: pair[0])
    return [chunk for _, chunk in pairs]


def _run_segment(info: RunInfo, shard: int, n_shards: int) -> Iterator[tuple[int, list[bytes]]]:
    """The (key, chunk) pairs of one run whose key falls in shard `shard`, read by its index."""
    with FileSystems.open(info.path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.seek(info.index_offset)
        index = list(_INDEX_ENTRY.iter_unpack(_read_exactly(handle, info.chunks * _INDEX_ENTRY.size)))
        first = bisect.bisect_left(index, shard, key=lambda entry: order.shard_of(entry[0], n_shards))
        end = bisect.bisect_left(index, shard + 1, key=lambda entry: order.shard_of(entry[0], n_shards))
        if first == end:
            return
        stop = index[end][1] if end < len(index) else info.index_offset
        handle.seek(index[first][1])
        data = _read_exactly(handle, stop - index[first][1])
    yield from _entries(data)


def _entries(data: bytes) -> Iterator[tuple[int, list[bytes]]]:
    """The (key, chunk) pairs of a run's bytes."""
    position = 0
    while position < len(data):
        key, n_records = _ENTRY.unpack_from(data, position)
        position += _ENTRY.size
        chunk = []
        for _ in range(n_records):
            (length,) = _LENGTH.unpack_from(data, position)
            position += _LENGTH.size
            chunk.append(data[position:position + length])
            position += length
        yield key, chunk


def _read_exactly(handle, size: int) -> bytes:
    """`size` bytes from `handle` (a short read is retried; the end of the file is an error)."""
    parts, left = [], size
    while left:
        part = handle.read(left)
        if not part:
            raise OSError(f"a run file ended {left} bytes early")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)
