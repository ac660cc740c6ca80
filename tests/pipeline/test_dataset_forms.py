"""A published run as a dataset for readers other than the trainer, read back with the real libraries:
TFDS (`tfds.builder_from_directory(RUN/<dataset>)`), pyarrow and, where it is installed, Hugging
Face `datasets` (`load_dataset("parquet", ...)`), each yielding what the manifest lists; and the
run's own checks (`Run.verify`, `--overwrite`) covering the Parquet files and the TFDS metadata."""
import gzip
import shutil

import pyarrow.parquet as pq
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from core import dataset_info, folders, parquet
from core.folders import LOCK, READERS
from core.published import Run, ShardError
from core.records import PAPER_DATASET, TRIPLET_DATASETS, TRIPLET_FEATURES, FeatureType
from core.splits import SPLITS
from core.tfrecord import read_records


def _records(path) -> list[bytes]:
    with gzip.open(path) as handle:
        return list(read_records(handle, str(path)))


def _features(record: bytes) -> dict:
    """A triplet record's features as TensorFlow parses it: {name: bytes or int}."""
    feature = tf.train.Example.FromString(record).features.feature
    return {name: feature[name].bytes_list.value[0] if kind is FeatureType.BYTES else feature[name].int64_list.value[0]
            for name, kind in TRIPLET_FEATURES.items()}


def test_the_files_and_column_are_those_tfds_reads():
    from google.protobuf import json_format
    from tensorflow_datasets.core import constants
    from tensorflow_datasets.core.file_adapters import ParquetFileAdapter

    assert (dataset_info.DATASET_INFO, dataset_info.FEATURES) == (constants.DATASET_INFO_FILENAME,
                                                                  constants.FEATURES_FILENAME)
    assert parquet.TFDS_EXAMPLE_COLUMN == ParquetFileAdapter._PARQUET_FIELD
    own = tfds.features.FeaturesDict({name: tfds.features.Text() if kind is FeatureType.BYTES
                                      else tfds.features.Scalar(tf.int64) for name, kind in TRIPLET_FEATURES.items()})
    assert dataset_info.features_json() == json_format.MessageToDict(own.to_proto())


def test_tfds_reads_each_triplet_split_as_the_manifest_lists_it(embedded_pipeline_output):
    out = embedded_pipeline_output
    run = Run.open(str(out))
    for dataset in TRIPLET_DATASETS:   # the fixture writes all four
        builder = tfds.builder_from_directory(str(out / dataset))
        assert builder.info.file_format.value == "parquet"
        for split in SPLITS:
            output = run.output(f"{dataset}/{split}")
            assert builder.info.splits[split].shard_lengths == [shard.records for shard in output.shards]
    builder = tfds.builder_from_directory(str(out / PAPER_DATASET))
    assert sum(1 for _ in builder.as_dataset(split="train")) == run.output(f"{PAPER_DATASET}/train").records
    in_order = tfds.ReadConfig(interleave_cycle_length=1)   # TFDS interleaves 16 files by default
    for split in SPLITS:
        expected = [_features(record) for shard in run.paths(f"{PAPER_DATASET}/{split}") for record in _records(shard)]
        read = list(tfds.as_numpy(builder.as_dataset(split=split, read_config=in_order)))
        assert len(read) == run.output(f"{PAPER_DATASET}/{split}").records > 0
        assert [{name: (value if isinstance(value, bytes) else int(value)) for name, value in example.items()}
                for example in read] == expected   # the TFRecords' triplets, in their order


def test_each_parquet_twin_holds_its_tfrecord_shards_records_in_order(embedded_pipeline_output):
    run = Run.open(str(embedded_pipeline_output))
    schema = parquet.triplet_schema()
    assert schema.names == [*TRIPLET_FEATURES, parquet.TFDS_EXAMPLE_COLUMN]
    for folder, output in run.manifest.outputs.items():
        if folder.split("/")[0] not in TRIPLET_DATASETS:
            assert output.parquet == ()
            continue
        assert [twin.path.removesuffix(parquet.SUFFIX) for twin in output.parquet] \
            == [shard.path.removesuffix(".tfrecord.gz") for shard in output.shards]
        rows = 0
        for shard, twin in zip(output.shards, output.parquet):
            table = pq.read_table(run.path(twin.path))
            assert table.schema.equals(schema) and table.num_rows == twin.records == shard.records
            records = _records(run.path(shard.path))
            assert table.column(parquet.TFDS_EXAMPLE_COLUMN).to_pylist() == records
            if folder == f"{PAPER_DATASET}/validation":   # the columns hold what the records hold
                columns = table.drop_columns([parquet.TFDS_EXAMPLE_COLUMN]).to_pylist()
                assert [{name: value.encode() if isinstance(value, str) else value for name, value in row.items()}
                        for row in columns] == [_features(record) for record in records]
            rows += table.num_rows
        assert rows == output.records


def test_hugging_face_datasets_loads_the_parquet_form(embedded_pipeline_output, tmp_path, monkeypatch):
    """Where `datasets` is installed (not in the dev extra: it brings pandas 3 and dill 0.4 into
    the environment Beam runs in); checked by hand with datasets 5.2.0 (docs/pipeline.md)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    run = Run.open(str(embedded_pipeline_output))
    files = {split: str(embedded_pipeline_output / PAPER_DATASET / split / "*.parquet") for split in SPLITS}
    loaded = datasets.load_dataset("parquet", data_files=files, cache_dir=str(tmp_path))
    assert {split: loaded[split].num_rows for split in SPLITS} \
        == {split: run.output(f"{PAPER_DATASET}/{split}").records for split in SPLITS}


def test_verify_checks_the_parquet_twins_and_overwrite_deletes_every_form(embedded_pipeline_output, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(embedded_pipeline_output, out, ignore=shutil.ignore_patterns(READERS))
    run = Run.open(str(out))
    folder = f"{PAPER_DATASET}/validation"
    assert run.verify(folder) == 0
    twin = out / run.output(folder).parquet[0].path
    whole = twin.read_bytes()
    twin.write_bytes(whole[:-8] + b"\0" * 8)   # same size, its footer's length and magic gone
    with pytest.raises(ShardError, match=f"{twin}: is not a whole Parquet file"):
        run.verify(folder)
    twin.write_bytes(whole[:-1])
    with pytest.raises(ShardError, match=f"{twin}: .* bytes where the run wrote"):
        run.check_sizes(folder)
    twin.unlink()
    with pytest.raises(ShardError, match=f"{twin}: missing"):
        run.check_sizes(folder)
    twin.write_bytes(whole)
    assert (out / PAPER_DATASET / dataset_info.DATASET_INFO).exists()
    folders.claim_output(str(out), overwrite=True, folders=["scb"])   # what the run listed, every form, goes
    assert [path.name for path in out.rglob("*") if path.is_file()] == [LOCK]
