"""The trainer's own Keras callbacks, for what Keras' callbacks do not do: mirror a staged model
dir's backups to the remote one, stop on a wall-clock budget, keep the best checkpoint's score
across a resumed run, and record the learning curve. `model.train` imports this module when it
trains (Keras loads then, not at `--help`)."""
from __future__ import annotations

import json
import time

import keras
import tensorflow as tf

from model.storage import TreeMirror


class MirrorBackups(keras.callbacks.Callback):
    """Pushes a staged model dir to its remote one as soon as BackupAndRestore writes a backup
    (checked after every batch, a stat only), so a preempted job resumes from it; at each epoch's
    start it pushes what the previous epoch's callbacks wrote. Placed right after
    BackupAndRestore, so a backup goes up before later callbacks run."""

    def __init__(self, mirror: TreeMirror, backup: str = "backup"):
        super().__init__()
        self.mirror = mirror
        self.backup = backup

    def on_train_batch_end(self, batch, logs=None):
        if self.mirror.changed(self.backup):
            self.mirror.push()

    def on_epoch_begin(self, epoch, logs=None):
        self.mirror.push()


class TimeBudget(keras.callbacks.Callback):
    """Stops training after the step during which `minutes` of wall-clock time (counted from the
    start of `fit`) ran out; Keras then still validates that epoch, so the curve and the best
    checkpoint (what is exported) see the last weights. No Keras callback stops on time.
    `stopped`: whether the budget ended training."""

    def __init__(self, minutes: float):
        super().__init__()
        self.minutes = minutes
        self.stopped = False

    def on_train_begin(self, logs=None):
        self.deadline = time.monotonic() + 60 * self.minutes
        self.stopped = False

    def on_train_batch_end(self, batch, logs=None):
        expired = time.monotonic() >= self.deadline
        strategy = self.model.distribute_strategy
        # workers stop at the same step, or the first to stop leaves the others hanging
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            votes = strategy.run(lambda: tf.constant(float(expired)))
            expired = bool(strategy.reduce(tf.distribute.ReduceOp.MAX, votes, axis=None) > 0)
        if expired:
            self.model.stop_training = self.stopped = True


class BestCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keeps `<directory>/best.weights.h5`, the weights of the best validation epoch, with its
    score in `best.json`: a resumed run starts from that score, so an epoch worse than one of the
    killed run's never replaces its checkpoint (ModelCheckpoint alone forgets its best)."""

    def __init__(self, directory: str):
        score_path = f"{directory}/best.json"
        previous_best = None
        if tf.io.gfile.exists(score_path):
            with tf.io.gfile.GFile(score_path) as handle:
                previous_best = json.load(handle)["val_triplet_accuracy"]
        super().__init__(f"{directory}/best.weights.h5", save_weights_only=True, monitor="val_triplet_accuracy",
                         mode="max", save_best_only=True, initial_value_threshold=previous_best)
        self.score_path = score_path

    def on_epoch_end(self, epoch, logs=None):
        best_before = self.best
        super().on_epoch_end(epoch, logs)
        if self.best != best_before:
            with tf.io.gfile.GFile(self.score_path, "w") as handle:
                json.dump({"val_triplet_accuracy": float(self.best), "epoch": epoch + 1}, handle)


class LearningCurve(keras.callbacks.Callback):
    """Records, at each epoch's end, the training triplets seen so far (`global_batch` per
    optimizer step) and the process CPU and wall seconds, beside the epoch's validation accuracy
    and learning rate: the points of the learning curve (`points`)."""

    def __init__(self, global_batch: int):
        super().__init__()
        self.global_batch = global_batch
        self.points: list[dict] = []

    def on_train_begin(self, logs=None):
        self.cpu_start, self.wall_start = time.process_time(), time.monotonic()

    def on_epoch_end(self, epoch, logs=None):   # the optimizer's step counts a resumed run's earlier steps too
        self.points.append({
            "epoch": epoch + 1, "triplets_seen": int(self.model.optimizer.iterations.numpy()) * self.global_batch,
            "cpu_seconds": round(time.process_time() - self.cpu_start, 1),
            "wall_seconds": round(time.monotonic() - self.wall_start, 1),
            "val_triplet_accuracy": float((logs or {}).get("val_triplet_accuracy", float("nan"))),
            "learning_rate": float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)),
        })
