"""The TFRecord framing, the one place it is written and read outside TensorFlow.

Each record is framed as the TFRecord format defines it: its length (uint64, little-endian),
the masked CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the data. It is written
here because Beam keeps its framing private (`_TFRecordUtil` in `apache_beam.io.tfrecordio`)
and TensorFlow's `tf.io.TFRecordWriter` / `tf.data.TFRecordDataset` take only file paths on
filesystems TensorFlow knows (no gs:// without tensorflow-io), while the pipeline writes through
Beam's sinks and the trainer reads gs:// shards through Beam FileSystems. CRC-32C comes from
google-crc32c. Tests check the frames against Beam's `WriteToTFRecord` byte for byte and read
them back with `tf.data.TFRecordDataset`.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Protocol

import google_crc32c

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
HEADER_BYTES = _LENGTH.size + _CRC.size   # length and its CRC
FOOTER_BYTES = _CRC.size                  # the data's CRC


class Readable(Protocol):
    """What `read_records` reads from: a binary file, or a stream that decompresses one (`gzip.GzipFile`)."""

    def read(self, size: int = -1, /) -> bytes: ...


class CorruptRecordError(ValueError):
    """A frame whose length or data does not match its CRC, or a file that ends inside a frame."""


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """The record as it is stored in a TFRecord file."""
    length = _LENGTH.pack(len(record))
    return b"".join((length, _CRC.pack(masked_crc32c(length)), record, _CRC.pack(masked_crc32c(record))))


def read_records(handle: Readable, where: str = "") -> Iterator[bytes]:
    """The records of an open (decompressed) TFRecord file, each checked against its CRCs;
    CorruptRecordError naming `where` and the record on the first that is not intact."""
    count = 0
    while header := handle.read(HEADER_BYTES):
        count += 1
        if len(header) != HEADER_BYTES or _CRC.unpack(header[8:])[0] != masked_crc32c(header[:8]):
            raise CorruptRecordError(f"{where}: record {count}: damaged length")
        length = _LENGTH.unpack(header[:8])[0]
        body = handle.read(length + FOOTER_BYTES)
        if len(body) != length + FOOTER_BYTES:
            raise CorruptRecordError(f"{where}: ends inside record {count}")
        record = body[:length]
        if _CRC.unpack(body[length:])[0] != masked_crc32c(record):
            raise CorruptRecordError(f"{where}: record {count}: data does not match its CRC")
        yield record
