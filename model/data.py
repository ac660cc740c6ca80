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
from model.text import WordIds, pad_ids, tokenize_graph

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


def read_records(shards: list[str], deterministic: bool = False) -> tf.data.Dataset:
    """Serialized tf.train.Examples of all shards, shards read interleaved (in a fixed order
    when `deterministic`, for samples that must be the same in every run)."""
    paths = tf.data.Dataset.from_tensor_slices(shards)
    if shards[0].startswith("gs://"):
        def open_shard(path):
            return tf.data.Dataset.from_generator(
                _beam_records, args=(path,), output_signature=tf.TensorSpec([], tf.string))
    else:
        def open_shard(path):
            return tf.data.TFRecordDataset(path, compression_type="GZIP")
    return paths.interleave(open_shard, cycle_length=min(len(shards), 8),
                            num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)


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


def triplet_strings(data: str, dataset: str, split: str, deterministic: bool = False) -> tf.data.Dataset:
    return parse_triplets(read_records(list_shards(data, dataset, split), deterministic))


def triplet_sample(data: str, dataset: str, split: str, size: int, seed: int = 0) -> tf.data.Dataset:
    """A seeded sample of about `size` triplets, the same in every run: shards read in a fixed
    order through a 20x shuffle buffer (triplets of one article lie together in a shard, so
    the first `size` records would cover few articles)."""
    triplets = triplet_strings(data, dataset, split, deterministic=True)
    return triplets.shuffle(20 * size, seed=seed, reshuffle_each_iteration=False).take(size).cache()


def count_words(triplets: tf.data.Dataset, batch_size: int = 1024) -> collections.Counter:
    """Token counts over every sentence of the triplets (the vocabulary's source)."""
    counts: collections.Counter = collections.Counter()
    for batch in triplets.batch(batch_size).prefetch(tf.data.AUTOTUNE):
        for key in TRIPLET_KEYS:
            counts.update(tokenize_graph(batch[key]).flat_values.numpy())
    return collections.Counter({word.decode("utf-8"): n for word, n in counts.items()})


# Upper bounds (exclusive) of the token-length groups: a batch is padded to its longest
# sentence, and random batches of Wikipedia openers (mean 21 tokens, p90 33) would be padded
# to about 40, wasting half of the LSTM's steps.
LENGTH_BOUNDARIES = (12, 16, 20, 24, 28, 33, 40, 50)


def triplet_length(ids: dict) -> tf.Tensor:
    """Tokens of the triplet's longest sentence: the width its batch is padded to."""
    return tf.reduce_max([tf.shape(ids[key])[0] for key in TRIPLET_KEYS])


def to_model_inputs(ids: dict) -> tuple[dict, tf.Tensor]:
    """Pads the three roles of a batch to one width (the triplet network stacks them) and adds
    the constant label 0 = "the positive is distances[:, 0]"."""
    width = tf.reduce_max([tf.shape(ids[key])[1] for key in TRIPLET_KEYS])
    padded = {key: pad_ids(tf.cast(ids[key], tf.int32), width) for key in TRIPLET_KEYS}
    return padded, tf.zeros(tf.shape(ids["anchor"])[:1], tf.int32)


def with_known_length(batches: tf.data.Dataset) -> tf.data.Dataset:
    """The dataset with its number of batches counted (one pass) and asserted, so that Keras
    knows where an epoch ends instead of running into the end of the data (and warning)."""
    n_batches = int(batches.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1).numpy())
    return batches.apply(tf.data.experimental.assert_cardinality(n_batches))


def training_batches(triplets: tf.data.Dataset, word_ids: WordIds, batch_size: int, *,
                     shuffle_buffer: int = 0, repeat: bool = False, seed: int = 0,
                     group_by_length: bool = True) -> tf.data.Dataset:
    """(token ids per role, label) batches for Keras.

    With `group_by_length`, triplets are grouped by their longest sentence
    (`LENGTH_BOUNDARIES`) and each group is batched on its own, so a batch is padded only to
    the longest sentence of similar-length triplets; every triplet still appears exactly
    once per pass, its three roles together (the last batch of a group may be smaller)."""
    if shuffle_buffer:
        triplets = triplets.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        triplets = triplets.repeat()
    if not group_by_length:
        def to_ids(batch):
            return to_model_inputs({key: word_ids(batch[key]) for key in TRIPLET_KEYS})

        return (triplets.batch(batch_size)
                .map(to_ids, num_parallel_calls=tf.data.AUTOTUNE)
                .prefetch(tf.data.AUTOTUNE))
    # Tokenise in large batches (one graph call each), then regroup triplet by triplet.
    def padded_with_lengths(batch):
        ragged = {key: word_ids.ragged(batch[key]) for key in TRIPLET_KEYS}
        return {key: (ids.to_tensor(0), ids.row_lengths()) for key, ids in ragged.items()}

    def unpadded(triplet):
        return {key: ids[:length] for key, (ids, length) in triplet.items()}

    ids = (triplets.batch(1024)
           .map(padded_with_lengths, num_parallel_calls=tf.data.AUTOTUNE)
           .unbatch()
           .map(unpadded, num_parallel_calls=tf.data.AUTOTUNE))
    grouped = ids.bucket_by_sequence_length(
        triplet_length, bucket_boundaries=list(LENGTH_BOUNDARIES),
        bucket_batch_sizes=[batch_size] * (len(LENGTH_BOUNDARIES) + 1))
    return grouped.map(to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
