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

import tensorflow as tf

from model.net.text import WordIds, pad_ids, tokenize_graph
from model.training.shards import (
    ARTICLE_ID,
    FEATURES,
    NO_SECTION,
    SECTIONS_PER_ARTICLE,
    STATIC_WIDTHS,
    shard_stream,
    triplet_split,
)
from pipeline import records
from pipeline.published import Run
from pipeline.records import ROLES, SECTION_OF_ROLE, FeatureType

TF_DTYPES = {FeatureType.BYTES: tf.string, FeatureType.INT64: tf.int64}


def triplet_feature_spec() -> dict:
    """The `tf.io.parse_example` spec of every feature of the triplet contract (`pipeline.records.TRIPLET_FEATURES`)."""
    return {name: tf.io.FixedLenFeature([], TF_DTYPES[kind]) for name, kind in records.TRIPLET_FEATURES.items()}


PARSE_SPEC = {name: spec for name, spec in triplet_feature_spec().items() if name in FEATURES}   # what training reads


def _beam_records(path: bytes):
    """Records of one gzip TFRecord shard read through Beam FileSystems (CRC-checked)."""
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    from pipeline.tfrecord import read_records as read_frames

    with FileSystems.open(path.decode(), compression_type=CompressionTypes.GZIP) as handle:
        yield from read_frames(handle, path.decode())


def shard_records(path: tf.Tensor, remote: bool) -> tf.data.Dataset:
    """The serialised records of one gzip TFRecord shard: tf.data's reader for a local path,
    Beam's FileSystems for a `remote` one (gs://). A corrupt or truncated shard ends where it
    breaks (`count_records` counts the loss)."""
    if remote:
        records_of = tf.data.Dataset.from_generator(_beam_records, args=(path,),
                                                    output_signature=tf.TensorSpec([], tf.string))
    else:
        records_of = tf.data.TFRecordDataset(path, compression_type="GZIP", buffer_size=1 << 20)
    return records_of.ignore_errors(log_warning=True)


def read_records(shards: list[str]) -> tf.data.Dataset:
    """Serialized tf.train.Examples of the shards, read one after the other, in the order given:
    the pipeline wrote each split in a fixed pseudo-random order (`pipeline.order`), so reading
    the shards in order reads the split in that order."""
    remote = bool(shards) and "://" in shards[0]
    return tf.data.Dataset.from_tensor_slices(tf.constant(shards, tf.string)).flat_map(
        lambda path: shard_records(path, remote))


def streamed_triplets(run: Run, dataset: str, split: str, seed: int, pipeline: int = 0, pipelines: int = 1,
                      start: int = 0) -> tf.data.Dataset:
    """The split's triplets as an endless stream (`shard_stream`), shard after shard, each read
    front to back: what the pipeline wrote in its pseudo-random order needs no shuffle buffer,
    so memory does not grow with the data, the first batch comes as soon as a shard opens, and a
    resumed run starts at its record (`start`) without reading what it trained on."""
    output = triplet_split(run, dataset, split)
    shards = [(run.path(shard.path), shard.records if shard.records is not None else 0) for shard in output.shards]
    next(shard_stream(shards, seed, pipeline, pipelines, start), None)   # too few shards: refused now, not in fit
    remote = "://" in run.root
    stream = tf.data.Dataset.from_generator(lambda: shard_stream(shards, seed, pipeline, pipelines, start),
                                            output_signature=(tf.TensorSpec([], tf.string),
                                                              tf.TensorSpec([], tf.int64)))
    return parse_triplets(stream.flat_map(lambda path, skip: shard_records(path, remote).skip(skip)))


def parse_triplets(records: tf.data.Dataset) -> tf.data.Dataset:
    """Serialized Examples -> {anchor, positive, negative} strings and the int64 article and
    section fields (`FEATURES`). An undecodable record is
    skipped with a logged warning (tf.data's ignore_errors), never fatal; `count_records`
    counts them for the trainer's summary."""
    return (records.map(lambda record: tf.io.parse_single_example(record, PARSE_SPEC),
                        num_parallel_calls=tf.data.AUTOTUNE)
            .ignore_errors(log_warning=True))


def count_records(run: Run, dataset: str, split: str) -> dict[str, int]:
    """What reading the split loses, against its manifest: `lost` records (a corrupt or
    truncated shard is read up to where it breaks) and `unparseable` ones (read but not a
    triplet Example: `parse_triplets` skips them). One pass, beside training."""
    output = triplet_split(run, dataset, split)
    records_read = read_records([run.path(shard.path) for shard in output.shards])

    def count(ds):
        return int(ds.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1).numpy())

    raw = count(records_read)
    return {"expected": output.records, "read": raw, "lost": max(0, output.records - raw),
            "unparseable": raw - count(parse_triplets(records_read))}


def triplet_strings(run: Run, dataset: str, split: str) -> tf.data.Dataset:
    """Every triplet of the split once, in its written order."""
    return parse_triplets(read_records([run.path(shard.path) for shard in triplet_split(run, dataset, split).shards]))


def triplet_sample(run: Run, dataset: str, split: str, size: int, seed: int = 0) -> tf.data.Dataset:
    """A seeded sample of `size` triplets, the same in every run: the split read in its written
    (pseudo-random) order from shard `seed` on (wrapping round), its first `size` records. No
    shuffle buffer: the order was drawn when the run wrote the split."""
    shards = [run.path(shard.path) for shard in triplet_split(run, dataset, split).shards]
    rotation = seed % max(len(shards), 1)
    return parse_triplets(read_records(shards[rotation:] + shards[:rotation])).take(size).cache()


def count_words(triplets: tf.data.Dataset, batch_size: int = 1024) -> collections.Counter:
    """Token counts over every sentence of the triplets (the vocabulary's source)."""
    counts: collections.Counter = collections.Counter()
    for batch in triplets.batch(batch_size).prefetch(tf.data.AUTOTUNE):
        for key in ROLES:
            counts.update(tokenize_graph(batch[key]).flat_values.numpy())
    return collections.Counter({word.decode("utf-8"): n for word, n in counts.items()})


# Upper bounds (exclusive) of the token-length groups: a batch is padded to its longest
# sentence, and random batches of Wikipedia openers (mean 21 tokens, p90 33) would be padded
# to about 40, wasting half of the LSTM's steps.
LENGTH_BOUNDARIES = (12, 16, 20, 24, 28, 33, 40, 50)


def section_keys(triplets: dict) -> tf.Tensor:
    """int64 [3n]: the section of each role's sentence (anchors, then positives, then negatives),
    one key per (article, section index)."""
    return tf.concat([tf.cast(triplets[article], tf.int64) * SECTIONS_PER_ARTICLE + tf.cast(triplets[index], tf.int64)
                      for article, index in (SECTION_OF_ROLE[key] for key in ROLES)], axis=0)


def _distinct_sentences(triplets: dict, word_ids: WordIds) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """(int ids [s, t] of the distinct sentences, shortest first; rows [n, 3] of each triplet's
    anchor, positive and negative among them; the section [s] of each distinct sentence, numbered
    within the block; the sentences [s] themselves, in the same order)."""
    stacked = tf.concat([triplets[key] for key in ROLES], axis=0)
    distinct, row_of_sentence = tf.unique(stacked)
    ids = word_ids.ragged(distinct)
    order = tf.argsort(ids.row_lengths(), stable=True)
    sentences = pad_ids(tf.gather(ids, order).to_tensor(0))
    rank = tf.math.invert_permutation(order)                 # distinct sentence -> its sorted row
    sections = tf.math.unsorted_segment_max(section_keys(triplets), row_of_sentence, tf.size(distinct))
    # int32 section numbers of this block (0, 1, ...), for the int64 keys: only their equality
    # counts, and JAX (without x64) would truncate int64 keys, some to negative "padding".
    _, section_numbers = tf.unique(tf.gather(sections, order), out_idx=tf.int32)
    return (sentences, tf.transpose(tf.reshape(tf.gather(rank, row_of_sentence), [3, -1])),
            section_numbers, tf.gather(distinct, order))


def shared_sentences(batch: dict, word_ids: WordIds, replicas: int = 1,
                     teacher=None) -> tuple[dict, tf.Tensor, tf.Tensor]:
    """A batch of triplet strings -> the triplet model's (inputs, labels, sample weights).

    The batch is cut into `replicas` blocks (the first ones full, like `tf.distribute`'s own
    split); each block holds its distinct sentences once (`sentences` [s, t], sorted by length)
    and each triplet's rows in them (`roles` [n, 3]), with each sentence's section key
    (`sections` [s], `NO_SECTION` on padding rows). Blocks are padded to a common shape and
    stacked on a leading replica axis, so a strategy splits the global batch into whole blocks.
    With a `teacher` (1-D tf.string -> float32 [s, d], `model.train --teacher`), `teacher` [s, d]
    holds its embedding of each sentence (zeros on padding rows).
    Labels and sample weights are flat ([replicas * n], one per triplet, split alike), so Keras
    averages metrics over triplets, not over batches; padded triplets have sample weight 0. The
    label is the constant 0 = "the positive is distances[..., 0]"."""
    count = tf.shape(batch[ROLES[0]])[0]
    per_replica = -(-count // replicas)
    blocks = [_distinct_sentences({key: batch[key][r * per_replica:(r + 1) * per_replica] for key in FEATURES},
                                  word_ids) for r in range(replicas)]
    rows = tf.reduce_max([tf.shape(sentences)[0] for sentences, *_ in blocks])
    width = tf.reduce_max([tf.shape(sentences)[1] for sentences, *_ in blocks])
    triplets = tf.reduce_max([tf.shape(roles)[0] for _, roles, *_ in blocks])

    inputs = {"sentences": tf.stack([_pad_sentences(pad_ids(sentences, width), rows) for sentences, *_ in blocks]),
              "roles": tf.stack([_pad_rows(roles, triplets) for _, roles, *_ in blocks]),
              "sections": tf.stack([_pad_rows(sections, rows, NO_SECTION) for _, _, sections, _ in blocks])}
    if teacher is not None:
        inputs["teacher"] = tf.stack([_pad_rows(teacher(strings), rows) for *_, strings in blocks])
    weights = tf.concat([_pad_rows(tf.ones(tf.shape(roles)[:1]), triplets) for _, roles, *_ in blocks], axis=0)
    return inputs, tf.zeros([replicas * triplets], tf.int32), weights


def _pad_rows(tensor: tf.Tensor, size, value=0) -> tf.Tensor:
    """`tensor` with rows of `value` appended up to `size` rows (section keys: `NO_SECTION`)."""
    return tf.pad(tensor, [[0, size - tf.shape(tensor)[0]]] + [[0, 0]] * (len(tensor.shape) - 1),
                  constant_values=value)


def _pad_sentences(sentences: tf.Tensor, size) -> tf.Tensor:
    """Sentence ids [s, t] padded to `size` rows with copies of the first sentence, not with empty
    rows: no triplet points at them, but Net still encodes them, and an all-padding row makes the
    transformer's masked mean pooling divide 0 by 0 (NaN, whose gradient poisons the weights)."""
    filler = tf.concat([sentences[:1], tf.zeros_like(sentences[:1])], axis=0)[:1]   # a zero row for an empty block
    return tf.concat([sentences, tf.repeat(filler, size - tf.shape(sentences)[0], axis=0)], axis=0)


def static_batch(inputs: dict, labels: tf.Tensor, weights: tf.Tensor, batch_size: int, max_tokens: int
                 ) -> tuple[dict, tf.Tensor, tf.Tensor]:
    """A `shared_sentences` batch padded to one of a few fixed shapes (`--static-shapes`): each
    block's triplets to `batch_size` (weight 0), its distinct sentences to the next multiple of
    `batch_size` (at most 3 x: three per triplet), the token axis to the next of `STATIC_WIDTHS`
    or `max_tokens`; a teacher's embeddings padded with the rows. The same triplets, distances
    and (with full batches) loss as the dynamic batch; what a padded triplet adds is zero."""
    sentences, roles, sections = inputs["sentences"], inputs["roles"], inputs["sections"]
    replicas = roles.shape[0]
    widths = tf.constant(sorted({width for width in STATIC_WIDTHS if width < max_tokens} | {max_tokens}))
    width = tf.reduce_min(tf.boolean_mask(widths, widths >= tf.shape(sentences)[2]))
    rows = -(-tf.shape(sentences)[1] // batch_size) * batch_size
    padded = tf.stack([_pad_sentences(pad_ids(block, width), rows) for block in tf.unstack(sentences, replicas)])

    def pad_triplets(per_replica):   # [replicas, n, ...] -> [replicas, batch_size, ...]
        return tf.pad(per_replica, [[0, 0], [0, batch_size - tf.shape(per_replica)[1]]]
                      + [[0, 0]] * (len(per_replica.shape) - 2))

    def flat(per_triplet):           # labels and weights: [replicas * n] -> [replicas * batch_size]
        return tf.reshape(pad_triplets(tf.reshape(per_triplet, [replicas, -1])), [-1])

    padded_inputs = {"sentences": padded, "roles": pad_triplets(roles),
                     "sections": tf.stack([_pad_rows(block, rows, NO_SECTION)
                                           for block in tf.unstack(sections, replicas)])}
    if "teacher" in inputs:
        padded_inputs["teacher"] = tf.stack([_pad_rows(block, rows)
                                             for block in tf.unstack(inputs["teacher"], replicas)])
    return padded_inputs, flat(labels), flat(weights)


def distributed_by_blocks(batches: tf.data.Dataset) -> tf.data.Dataset:
    """`training_batches` as a multi-worker job must read them. Every worker reads the whole
    stream and builds the same global batches (a fixed shard order, a seeded shuffle), each
    holding one block per replica on axis 0. `experimental_distribute_dataset` first splits each
    global batch into its blocks (rebatch), then shards by the policy: DATA gives worker i the
    blocks i, i + W, ...: its own block of every global batch, so a step equals one process's
    step on the same global batch (tests/model/test_model_multi_worker.py). AUTO would try FILE
    first: each worker would read other shard files, so other batches than one process, and
    unevenly when a split has few shards. The price: every worker tokenises whole global batches
    (input work, not model work). One worker or one machine: no effect."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return batches.with_options(options)


def with_known_length(batches: tf.data.Dataset) -> tf.data.Dataset:
    """The dataset with its number of batches counted (one pass) and asserted, so that Keras
    knows where an epoch ends instead of running into the end of the data (and warning)."""
    n_batches = int(batches.reduce(tf.constant(0, tf.int64), lambda n, *_: n + 1).numpy())
    return batches.apply(tf.data.experimental.assert_cardinality(n_batches))


def article_chunks(triplets: tf.data.Dataset, chunk: int) -> tf.data.Dataset:
    """Batches of up to `chunk` triplets of one article (tf.data's group_by_window on article_id;
    an article's last chunk may be smaller): kept together in a training batch, their shared
    sentences are encoded once."""
    return triplets.group_by_window(key_func=lambda triplet: tf.cast(triplet[ARTICLE_ID], tf.int64),
                                    reduce_func=lambda _, window: window.batch(chunk), window_size=chunk)


def training_batches(triplets: tf.data.Dataset, word_ids: WordIds, batch_size: int, *,
                     shuffle_buffer: int = 0, seed: int = 0, article_chunk: int = 16, group_by_length: bool = True,
                     replicas: int = 1, static_shapes: bool = False, teacher=None,
                     skip_batches: int = 0) -> tf.data.Dataset:
    """(inputs, labels, weights) batches for Keras (`shared_sentences`), `batch_size` triplets
    per replica (`replicas` blocks per batch); every triplet of `triplets` appears once, its
    three roles together.

    With `article_chunk` > 0, the stream is taken in blocks of that many consecutive triplets,
    batched side by side: the pipeline wrote each article's triplets in chunks of 16, together
    (`pipeline.order`), so a batch holds about `batch_size / article_chunk` articles whose shared
    sentences are encoded once; a `shuffle_buffer` (triplets) shuffles whole blocks. With
    `article_chunk` 0, triplets are shuffled one by one (with a buffer) and, with
    `group_by_length`, grouped by their longest sentence (`LENGTH_BOUNDARIES`), each group batched
    on its own so a batch is padded only to similar-length sentences (the last batch of a group
    may be smaller). The split's order was drawn when it was written, so the stream needs no
    buffer to be shuffled; one keeps the batches of a second pass from repeating the first's.

    With `static_shapes`, batches are padded to a few fixed shapes (`static_batch`): string work
    stays here, in the input pipeline, and the device gets ints. A `teacher` adds its embeddings
    of the sentences (`shared_sentences`), computed here, beside the training step.

    `skip_batches` drops that many batches first (a resumed run's, trained before: see
    `model.train.training_stream`), as they are grouped, before they are turned into model inputs."""
    global_batch = batch_size * replicas
    if article_chunk:
        blocks = triplets.batch(article_chunk)
        if shuffle_buffer:
            blocks = blocks.shuffle(max(1, shuffle_buffer // article_chunk), seed=seed, reshuffle_each_iteration=True)
        batches = blocks.unbatch().batch(global_batch)
    else:
        if shuffle_buffer:
            triplets = triplets.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if group_by_length:
            def with_lengths(batch):   # tokenised in large batches (one graph call each)
                return {**batch, "length": tf.reduce_max(
                    [word_ids.ragged(batch[key]).row_lengths() for key in ROLES], axis=0)}

            triplets = (triplets.batch(1024).map(with_lengths, num_parallel_calls=tf.data.AUTOTUNE).unbatch())
            batches = triplets.bucket_by_sequence_length(
                lambda triplet: tf.cast(triplet["length"], tf.int32), bucket_boundaries=list(LENGTH_BOUNDARIES),
                bucket_batch_sizes=[global_batch] * (len(LENGTH_BOUNDARIES) + 1), no_padding=True)
        else:
            batches = triplets.batch(global_batch)
    batches = batches.skip(skip_batches).map(lambda batch: shared_sentences(batch, word_ids, replicas, teacher),
                                             num_parallel_calls=tf.data.AUTOTUNE)
    if static_shapes:
        batches = batches.map(lambda inputs, labels, weights: static_batch(inputs, labels, weights, batch_size,
                                                                           word_ids.max_tokens),
                              num_parallel_calls=tf.data.AUTOTUNE)
    return batches.prefetch(tf.data.AUTOTUNE)
