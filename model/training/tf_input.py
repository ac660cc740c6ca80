"""The trainer's one input (`model.training.arrays`) under TensorFlow: its NumPy batches as the
tf.data datasets Keras and tf.distribute strategies read, through `from_generator` (no batching
here), and the contract's `tf.io` parse spec for readers of the shards in tf.data."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import tensorflow as tf

from core import records
from core.records import FeatureType
from model.training.arrays import Batch, SplitBatches, TripletInput

TF_DTYPES = {FeatureType.BYTES: tf.string, FeatureType.INT64: tf.int64}


def triplet_feature_spec() -> dict:
    """The `tf.io.parse_example` spec of every feature of the triplet contract (`core.records.TRIPLET_FEATURES`)."""
    return {name: tf.io.FixedLenFeature([], TF_DTYPES[kind]) for name, kind in records.TRIPLET_FEATURES.items()}


def batch_signature(blocks: int, teacher_dim: int | None) -> tuple:
    """The `tf.TensorSpec`s of an `arrays.batch_arrays` batch of `blocks` blocks."""
    inputs = {"sentences": tf.TensorSpec([blocks, None, None], tf.int32),
              "roles": tf.TensorSpec([blocks, None, 3], tf.int32),
              "sections": tf.TensorSpec([blocks, None], tf.int32)}
    if teacher_dim:
        inputs["teacher"] = tf.TensorSpec([blocks, None, teacher_dim], tf.float32)
    return inputs, tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.float32)


def dataset(batches: Callable[[], Iterator[Batch]], blocks: int = 1, teacher_dim: int | None = None,
            length: int | None = None) -> tf.data.Dataset:
    """The batches `batches()` makes, made in tf.data's background thread ahead of the step.
    `length`: the batches of a pass, asserted so Keras knows where an evaluation ends. Sharded
    by DATA: a multi-worker job splits each global batch of an evaluation into its blocks, and
    worker i scores the blocks i, i + W, ...: its own block of every global batch, so a step
    equals one process's step on the same global batch (tests/model/test_model_multi_worker.py)."""
    data = tf.data.Dataset.from_generator(batches, output_signature=batch_signature(blocks, teacher_dim))
    if length is not None:
        data = data.apply(tf.data.experimental.assert_cardinality(length))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return data.with_options(options).prefetch(2)


def evaluation(batches: SplitBatches, source: TripletInput) -> tf.data.Dataset:
    """An evaluation's batches (`TripletInput.evaluation`) as a dataset: every worker reads the
    whole split, in global batches of `source.blocks` blocks."""
    return dataset(lambda: (batches[index] for index in range(len(batches))), source.blocks, source.teacher_dim,
                   len(batches))


def training(source: TripletInput, strategy: tf.distribute.Strategy, resume_at_step: int = 0):
    """The training stream: with one replica, `source`'s; under a strategy of several, each input
    pipeline (one per worker) streams its own shards of the train split, a replica's batch per
    element (`distribute_datasets_from_function`: no worker reads, parses or tokenises another's)."""
    if strategy.num_replicas_in_sync == 1 and getattr(strategy, "cluster_resolver", None) is None:
        batches = source.training_batches(resume_at_step)
        return dataset(lambda: batches, 1, source.teacher_dim)

    def pipeline(context: tf.distribute.InputContext) -> tf.data.Dataset:
        share = source.share(context.input_pipeline_id, context.num_input_pipelines,
                             context.num_replicas_in_sync // context.num_input_pipelines)
        batches = share.training_batches(resume_at_step)   # too few shards for the workers: refused here, not in fit
        return dataset(lambda: batches, 1, share.teacher_dim)

    return strategy.distribute_datasets_from_function(pipeline)
