"""Where a training runs, as the trainer asks of it (replicas, a scope, whether this process is
the chief): a tf.distribute strategy under TensorFlow (`model.training.strategies`), or under
JAX `KerasDevices` (`keras.distribution`). Nothing here loads TensorFlow under JAX."""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import types
from typing import TYPE_CHECKING, TypeAlias

from model.config import TrainConfig
from model.training.shards import needs_tensorflow

if TYPE_CHECKING:
    import tensorflow as tf

LOG = logging.getLogger(__name__)


class KerasDevices:
    """What the trainer asks of its strategy (replicas, a scope, whether it is the chief), under
    the JAX backend, from `keras.distribution`: one device, or with `data-parallel` every device
    (`DataParallel`: the weights replicated, each global batch split on its block axis, one
    compiled program over all of them). Set before the model is built, as Keras requires.

    Several processes (a multi-node GPU job, a TPU pod slice) run the same command, each with
    `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator first), `KERAS_DISTRIBUTION_NUM_PROCESSES`
    and `KERAS_DISTRIBUTION_PROCESS_ID`, which `keras.distribution.initialize()` reads; JAX's CPU
    collectives between processes go through gloo. Each process feeds its own devices' blocks of
    every global batch, read from its own share of the shards; process 0 is the chief, and the
    others write to a folder of their own (`worker_temp_dir`), as tf.distribute's workers do."""

    cluster_resolver = None   # one process: the chief, as `is_chief` reads it

    def __init__(self, name: str, tensorflow_input: bool = False, article_chunks: bool = True):
        import keras

        if tensorflow_input:   # TensorFlow tokenises or teaches on the CPU; the GPUs are JAX's
            import tensorflow as tf

            tf.config.set_visible_devices([], "GPU")
        self.processes = int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES") or 1)
        if self.processes > 1 and (name != "data-parallel" or not article_chunks):
            from pipeline.cli import UsageError

            raise UsageError(f"KERAS_DISTRIBUTION_NUM_PROCESSES={self.processes}: several processes train one model "
                             "with --distribution-strategy data-parallel and --article-chunk > 0 (the processes' "
                             "evaluation shares must run as many steps)")
        if self.processes > 1:
            import jax

            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            keras.distribution.initialize()
            self.process_id = jax.process_index()
            self.cluster_resolver = types.SimpleNamespace(task_type="worker", task_id=self.process_id)
        else:
            self.process_id = 0
        devices = keras.distribution.list_devices()
        self.num_replicas_in_sync = len(devices) if name == "data-parallel" else 1
        self.local_replicas = self.num_replicas_in_sync // self.processes
        if name == "data-parallel":
            # each process reads its own shards (`TripletInput`): Keras is not to shard them again
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices,
                                                                                auto_shard_dataset=False))
        LOG.info("JAX backend: process %d of %d, %d device(s) (%s), %d replica(s)", self.process_id, self.processes,
                 len(devices), ", ".join(devices), self.num_replicas_in_sync)

    def scope(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


Strategy: TypeAlias = "tf.distribute.Strategy | KerasDevices"   # what `strategy_of` gives


def device_kind() -> str:
    """The first local device's kind under JAX ("NVIDIA H200", "cpu"): a run on an accelerator
    records it, and its learning curve is drawn against training minutes there."""
    import jax

    return str(jax.devices()[0].device_kind)


def strategy_of(config: TrainConfig) -> Strategy:
    """`--distribution-strategy` under `--backend`: a tf.distribute strategy, or `KerasDevices`."""
    if config.runtime.backend == "jax":
        return KerasDevices(config.runtime.distribution_strategy, tensorflow_input=needs_tensorflow(config) is not None,
                            article_chunks=config.inputs.article_chunk > 0)
    from model.training.strategies import make_strategy

    return make_strategy(config.runtime.distribution_strategy)


def processes_of(strategy: Strategy) -> int:
    """The processes training one model: `KerasDevices`' own count, or the tasks of a
    tf.distribute cluster (chief and workers of `TF_CONFIG`); 1 for a strategy of one process."""
    if isinstance(strategy, KerasDevices):
        return strategy.processes
    resolver = getattr(strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    return sum(len(cluster.get(task, [])) for task in ("chief", "worker")) or 1


def is_chief(strategy: Strategy) -> bool:
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver is None or resolver.task_type in (None, "chief") or (
        resolver.task_type == "worker" and resolver.task_id == 0)


@contextlib.contextmanager
def worker_temp_dir(strategy: tf.distribute.Strategy):
    """The folder a non-chief worker writes to, Keras' multi-worker saving rule (every worker runs
    the same callbacks and saves, but only the chief's files count: the others write to a
    temporary folder of their own, deleted at the end): `workertemp_<task id>-*` in the system's
    temporary folder (TMPDIR), outside the model dir, so nothing of the worker's lands there."""
    task_id = strategy.cluster_resolver.task_id
    with tempfile.TemporaryDirectory(prefix=f"workertemp_{task_id}-") as folder:
        yield folder
