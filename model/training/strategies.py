"""The tf.distribute strategies of the TensorFlow backend (`model.train --distribution-strategy`);
Keras' JAX backend distributes with `keras.distribution` instead (`model.training.devices.KerasDevices`)."""
from __future__ import annotations

import json
import os

import tensorflow as tf


def make_strategy(name: str) -> tf.distribute.Strategy:
    """`auto`: TPU when one is configured, MultiWorkerMirrored when TF_CONFIG names several
    workers, Mirrored with more than one GPU, otherwise the default (single-device) strategy."""
    if name == "auto":
        if os.environ.get("TPU_NAME") or tf.config.list_logical_devices("TPU"):
            name = "tpu"
        elif len(json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {}).get("worker", [])) > 1:
            name = "multi_worker"
        elif len(tf.config.list_logical_devices("GPU")) > 1:
            name = "mirrored"
        else:
            return tf.distribute.get_strategy()
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(os.environ.get("TPU_NAME", ""))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if name == "multi_worker":
        return NestedReduceMultiWorkerStrategy()
    gpus = [device.name for device in tf.config.list_logical_devices("GPU")]
    if name == "mirrored":
        # Without GPUs, mirror over the logical CPU devices (tests configure two).
        return tf.distribute.MirroredStrategy(gpus or [d.name for d in tf.config.list_logical_devices("CPU")])
    return tf.distribute.OneDeviceStrategy(gpus[0] if gpus else "/cpu:0")


class NestedReduceMultiWorkerStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """MultiWorkerMirroredStrategy with the two `reduce` calls Keras 3 makes that MWMS' own
    rejects (Keras 3 and MWMS have not been made to fit, tensorflow/tensorflow#72388):
    * the first distributed batch of `fit` and `evaluate`, reduced to build the model, is a nest
      (the triplet model's dict of inputs), which MWMS converts to one tensor and fails
      ("Attempt to convert a value ({'sentences': PerReplica..."): reduced one tensor at a time;
    * every scalar metric of the logs is reduced with `axis=0` ("Invalid reduction dimension 0
      for input with 0 dimensions"): a scalar is reduced across replicas only (`axis=None`)."""

    def reduce(self, reduce_op, value, axis):
        if isinstance(value, dict):
            return {key: self.reduce(reduce_op, part, axis) for key, part in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.reduce(reduce_op, part, axis) for part in value)
        if axis is not None and self.experimental_local_results(value)[0].shape.rank == 0:
            axis = None
        return super().reduce(reduce_op, value, axis)
