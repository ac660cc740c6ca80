"""tf.data input from the pipeline's gzip TFRecord triplet shards, local or gs://.

Local shards are read by `tf.data.TFRecordDataset` (C++, parallel interleave). `gs://` shards
are read through Beam's `FileSystems` (the layer the pipeline writes them with) into
`tf.data.Dataset.from_generator`: TensorFlow's own GCS filesystem has a hard-wired endpoint
(its only GCS_* settings are timeouts, caches and retries), so it cannot be pointed at
`gcp-storage-emulator`, whereas Beam's GCS client honours `STORAGE_EMULATOR_HOST` and is the
same client Dataflow uses, so what the tests exercise is what runs in the cloud.
"""
from __future__ import annotations

import collections
import logging

import tensorflow as tf

from model.network import TRIPLET_KEYS
from model.text import WordIds, tokenize_graph

LOG = logging.getLogger(__name__)
SPLITS = ("train", "validation", "test")
FEATURES = {key: tf.io.FixedLenFeature([], tf.string) for key in TRIPLET_KEYS}


class TripletDataError(ValueError):
    """The pipeline output lacks the shards asked for."""


def list_shards(data: str, dataset: str, split: str) -> list[str]:
    """Paths of `<data>/<dataset>/<split>/part-*.tfrecord.gz`, sorted; an error names the pattern."""
    from apache_beam.io.filesystems import FileSystems

    pattern = f"{data.rstrip('/')}/{dataset}/{split}/part-*.tfrecord.gz"
    shards = sorted(meta.path for meta in FileSystems.match([pattern])[0].metadata_list)
    if not shards:
        hint = (f" (pipeline.run writes {dataset} only when given --negatives {dataset.rsplit('-', 1)[1]})"
                if dataset.startswith("triplets-sen-") else "")
        raise TripletDataError(f"no triplet shards match {pattern}{hint}")
    return shards


def _beam_records(path: bytes):
    """Records of one gzip TFRecord shard read through Beam FileSystems (CRC-checked)."""
    from apache_beam.io.filesystems import CompressionTypes, FileSystems
    from apache_beam.io.tfrecordio import _TFRecordUtil  # Beam's own TFRecord framing reader

    with FileSystems.open(path.decode(), compression_type=CompressionTypes.GZIP) as handle:
        while (record := _TFRecordUtil.read_record(handle)) is not None:
            yield record


def read_records(shards: list[str]) -> tf.data.Dataset:
    """Serialized tf.train.Examples of all shards, shards read interleaved."""
    paths = tf.data.Dataset.from_tensor_slices(shards)
    if shards[0].startswith("gs://"):
        def open_shard(path):
            return tf.data.Dataset.from_generator(
                _beam_records, args=(path,), output_signature=tf.TensorSpec([], tf.string))
    else:
        def open_shard(path):
            return tf.data.TFRecordDataset(path, compression_type="GZIP")
    return paths.interleave(open_shard, cycle_length=min(len(shards), 8),
                            num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)


def parse_triplets(records: tf.data.Dataset) -> tf.data.Dataset:
    """Serialized Examples -> {anchor, positive, negative} strings. An undecodable record is
    skipped with a logged warning (tf.data's ignore_errors), never fatal; `count_unparseable`
    counts them for the trainer's summary."""
    return (records.map(lambda record: tf.io.parse_single_example(record, FEATURES),
                        num_parallel_calls=tf.data.AUTOTUNE)
            .ignore_errors(log_warning=True))


def count_unparseable(data: str, dataset: str, split: str) -> int:
    """Records of the split that `parse_triplets` skips (raw records minus parsed triplets)."""
    records = read_records(list_shards(data, dataset, split))
    count = lambda ds: int(ds.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1).numpy())
    return count(records) - count(parse_triplets(records))


def triplet_strings(data: str, dataset: str, split: str) -> tf.data.Dataset:
    return parse_triplets(read_records(list_shards(data, dataset, split)))


def count_words(triplets: tf.data.Dataset, batch_size: int = 1024) -> collections.Counter:
    """Token counts over every sentence of the triplets (the vocabulary's source)."""
    counts: collections.Counter = collections.Counter()
    for batch in triplets.batch(batch_size).prefetch(tf.data.AUTOTUNE):
        for key in TRIPLET_KEYS:
            counts.update(tokenize_graph(batch[key]).flat_values.numpy())
    return collections.Counter({word.decode("utf-8"): n for word, n in counts.items()})


def training_batches(triplets: tf.data.Dataset, word_ids: WordIds, batch_size: int, *,
                     shuffle_buffer: int = 0, repeat: bool = False, seed: int = 0) -> tf.data.Dataset:
    """(token ids per role, label 0 = "the positive is distances[:, 0]") batches for Keras."""
    if shuffle_buffer:
        triplets = triplets.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        triplets = triplets.repeat()

    def to_ids(batch):
        ids = {key: word_ids(batch[key]) for key in TRIPLET_KEYS}
        return ids, tf.zeros(tf.shape(batch["anchor"]), tf.int32)

    return (triplets.batch(batch_size)
            .map(to_ids, num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))
