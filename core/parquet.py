"""The Parquet form of a triplet split: the same records as its TFRecord shards, for readers
without TensorFlow (pyarrow, pandas, Hugging Face `datasets`) and for TFDS.

Each TFRecord shard `part-SSSSS-of-NNNNN.tfrecord.gz` has a Parquet twin `part-SSSSS-of-NNNNN.parquet`
beside it, written by the same worker from the same records in the same order: one column per
triplet feature (`core.records.TRIPLET_FEATURES`: UTF-8 strings and int64s, in that order),
then `TFDS_EXAMPLE_COLUMN`, the record itself (the serialised `tf.train.Example`). That last
column is what TFDS's Parquet reader reads (`ParquetFileAdapter` reads one binary column named
`data` and parses it with the dataset's features), so `tfds.builder_from_directory` reads these
files (`core.dataset_info`): TFDS cannot read the gzip TFRecords, its TFRecord reader takes
no compression. The feature columns are built by parsing the records back (protobuf, no
TensorFlow) where the shard is written, so nothing more crosses the job's shuffles.

zstd-compressed: on the excerpt's triplets-sen the twins take 1.42x the bytes of the gzip
TFRecords, the feature columns 0.66x and the record column 0.76x (docs/pipeline.md).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from core.records import BYTES_FEATURES, INT64_FEATURES, TRIPLET_FEATURES, Example, FeatureType

if TYPE_CHECKING:   # pyarrow loads where a shard is written or counted, not with `--help`
    import pyarrow as pa

SUFFIX = ".parquet"
# The column TFDS's Parquet reader reads (tensorflow_datasets' ParquetFileAdapter._PARQUET_FIELD).
TFDS_EXAMPLE_COLUMN = "data"
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 3   # zstd's own default: 8 % smaller than level 1 on the excerpt, at little CPU
ROW_GROUP_RECORDS = 16384   # a row group's worth of records is parsed and held at a time


def triplet_schema() -> pa.Schema:
    """One non-null column per triplet feature, then the serialised record."""
    import pyarrow as pa

    kinds = {FeatureType.BYTES: pa.string(), FeatureType.INT64: pa.int64()}
    return pa.schema([*(pa.field(name, kinds[kind], nullable=False) for name, kind in TRIPLET_FEATURES.items()),
                      pa.field(TFDS_EXAMPLE_COLUMN, pa.binary(), nullable=False)])


def triplet_table(records: list[bytes]) -> pa.Table:
    """The records (serialised triplet Examples) as rows of `triplet_schema`: each record parsed
    once, its features read by name; a string that is not UTF-8 is an ArrowInvalid."""
    import pyarrow as pa

    values: dict[str, list] = {name: [] for name in TRIPLET_FEATURES}
    for record in records:
        example: Any = Example.FromString(record)   # its fields are built at run time (`records._add_features`)
        feature = example.features.feature
        for name in BYTES_FEATURES:
            values[name].append(feature[name].bytes_list.value[0])
        for name in INT64_FEATURES:
            values[name].append(feature[name].int64_list.value[0])
    schema = triplet_schema()
    columns = [pa.array(values[name], pa.binary()).cast(pa.string()) if name in BYTES_FEATURES
               else pa.array(values[name], pa.int64()) for name in TRIPLET_FEATURES]
    return pa.Table.from_arrays([*columns, pa.array(records, pa.binary())], schema=schema)


def passing_through(path: str, chunks: Iterable[list[bytes]]) -> Iterator[list[bytes]]:
    """Yields `chunks` as they come while writing their records, in order, to the Parquet file
    `path` (through Beam's FileSystems, local or gs://), a row group per `ROW_GROUP_RECORDS`:
    the twin is written in the same pass as whatever consumes the chunks (its TFRecord shard),
    so the chunks are read once and at most a row group's records are held here. The file is
    complete once the chunks are exhausted; a consumer that stops early leaves it unfinished."""
    import pyarrow.parquet as pq
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    with FileSystems.create(path, mime_type="application/vnd.apache.parquet",
                            compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        with pq.ParquetWriter(handle, triplet_schema(), compression=COMPRESSION,
                              compression_level=COMPRESSION_LEVEL) as writer:
            batch: list[bytes] = []
            for chunk in chunks:
                yield chunk
                batch.extend(chunk)
                if len(batch) >= ROW_GROUP_RECORDS:
                    writer.write_table(triplet_table(batch), row_group_size=len(batch))
                    batch = []
            if batch:
                writer.write_table(triplet_table(batch), row_group_size=len(batch))


def write_triplet_parquet(path: str, chunks: Iterable[list[bytes]]) -> int:
    """Writes the records of `chunks`, in order, as one Parquet file (`passing_through`); returns the records."""
    return sum(len(chunk) for chunk in passing_through(path, chunks))


def count_rows(path: str) -> tuple[int, str | None]:
    """(rows, why the file is not whole or None) of one Parquet file, from its footer: a file
    cut short has no footer and counts 0."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        try:
            return pq.ParquetFile(handle).metadata.num_rows, None
        except (pa.ArrowInvalid, OSError) as error:
            return 0, f"is not a whole Parquet file ({' '.join(str(error).split())[:200]})"
