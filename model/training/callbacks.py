"""The trainer's own Keras callbacks, for what Keras' callbacks do not do: write backups and the
best checkpoint atomically, mirror a staged model dir's backups to the remote one, stop on a
wall-clock budget, keep the best checkpoint's score across a resumed run, record the
learning curve, and let Ctrl-C through where Keras would swallow it. `model.train` imports this
module when it trains (Keras loads then, not at `--help`)."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

import keras
import numpy as np
from keras.src.saving import saving_lib

from core.cli import DataLossError
from core.files import replace_folder, write_complete
from core.storage import TreeMirror
from model.training.model_dir import (
    BACKUP,
    BACKUP_EPOCHS,
    BACKUP_STATE,
    BACKUP_WEIGHTS,
    BEST_SCORE,
    BEST_WEIGHTS,
    BEST_WEIGHTS_PARTIAL,
)


def optimizer_step(model: keras.Model) -> int:
    """The optimizer's updates so far, under any backend: with gradient accumulation Keras
    derives them from its batch count (a backend tensor, not a variable)."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)   # a full disk, a quota, a file size limit


class NoRoomError(DataLossError):
    """A write into the model dir failed for want of room; its last complete backup stays."""


@contextlib.contextmanager
def room_in(folder: str):
    """A write into `folder` that fails for want of room (NO_ROOM): NoRoomError naming the folder,
    one `error:` line (`core.cli.run_cli`), not h5py's traceback of the OSError. The backup
    and the best checkpoint are replaced whole, so the same command resumes once there is room."""
    try:
        yield
    except OSError as error:
        if error.errno not in NO_ROOM:
            raise
        _release_failed_files(folder)
        raise NoRoomError(f"writing {folder} failed: {os.strerror(error.errno)}; free space there (or pass another "
                          "--model-dir) and rerun the same command: it resumes from the last backup") from error


def _release_failed_files(folder: str) -> None:
    """Closes, quietly, the h5py files under `folder` that a failed write left open (Keras' store of
    the weights, held on by the failed call's frames): freed only at the interpreter's exit, after
    the `error:` line, their flush on the full disk printed h5py's "Exception ignored" tracebacks,
    then the process died of a segfault (rc 139, seen under JAX on a full tmpfs) instead of exiting 1.
    Closing them fails the same way (the disk is still full), and says nothing the line does not."""
    import gc

    import h5py

    written = os.path.abspath(folder)   # the folder and its `.partial` twin, written beside it
    for handle in [item for item in gc.get_objects() if isinstance(item, h5py.File)]:
        with contextlib.suppress(Exception):
            if os.path.abspath(handle.filename).startswith(written):
                handle.close()


SLICE_BYTES = 4 << 20   # what `save_weights` copies of a large variable at a time


def save_weights(model: keras.Model, path: str) -> None:
    """`model.save_weights(path)`: Keras' own `.weights.h5` file (its walk of the model, its groups,
    names and datasets; `model.load_weights` reads it, byte for byte the same values), written
    without a whole copy of a large variable. Keras converts each variable to NumPy before it
    writes it: two copies at once of the BiLSTM's frozen 400,002 x 50 word vectors (+152 MiB at
    every backup and best checkpoint, the largest transient at the recipe's peak; issue 70 item
    14). Here a variable over SLICE_BYTES goes to its dataset in slices of rows of that size."""
    if not model.built:
        raise ValueError("saving the weights of a model that is not built")
    store = SlicedH5Store(path, mode="w")
    saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="", visited_saveables=set())
    store.close()   # as Keras' own save_weights: the file of a write that failed is closed by `room_in`


class SlicedH5Store(saving_lib.H5IOStore):
    """Keras' store of a `.weights.h5` file, whose large variables (`_sliceable`) it writes a
    slice of rows at a time (Keras 3.15's H5IOStore; Keras is pinned)."""

    def __setitem__(self, key, value):
        if not _sliceable(value):
            return super().__setitem__(key, value)
        if not self._h5_entry_initialized:
            self._create_h5_group(self._h5_entry_path)
        shape, dtype = tuple(value.shape), np.dtype(value.dtype)
        dataset = self._h5_entry_group.create_dataset(key, shape=shape, dtype=dtype)
        rows = max(1, SLICE_BYTES // (math.prod(shape[1:]) * dtype.itemsize))
        for start in range(0, shape[0], rows):
            dataset[start:start + rows] = keras.ops.convert_to_numpy(value[start:start + rows])


def _sliceable(value) -> bool:
    """Whether `save_weights` writes `value` in slices: a Keras variable over SLICE_BYTES of a plain
    NumPy dtype (bfloat16 has Keras' own attribute), under TensorFlow or one JAX process (a slice
    of a global array over several is a computation every process would have to run)."""
    if not isinstance(value, keras.Variable) or not value.shape or \
            keras.backend.standardize_dtype(value.dtype) == "bfloat16":
        return False
    if math.prod(value.shape) * np.dtype(value.dtype).itemsize <= SLICE_BYTES:
        return False
    if keras.backend.backend() == "jax":
        import jax

        return jax.process_count() == 1
    return keras.backend.backend() == "tensorflow"


def release_free_heap() -> None:
    """Hands the C heap's free memory back to the system: glibc's `malloc_trim(0)` (25 ms; nothing
    where the C library has none). Training leaves 170-200 MiB free in glibc's heap, kept by it for
    later steps (the BiLSTM recipe on the 2019 run: RSS 1,600-1,690 MiB before, 1,420-1,470 after),
    and a large allocation (NumPy's, TensorFlow's) is a new mapping beside it, not a reuse of it."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def read_backup_state(folder: str) -> dict | None:
    """The state a backup holds, or None without a (complete) backup: "epoch" (the epochs
    completed: trained and validated), "step" (the optimizer's steps), and the record of the
    completed epochs (BACKUP_EPOCHS): "history" (their epoch-end logs, as Keras' History holds
    them), "learning_curve" (their LearningCurve points) and "at_epoch_end" (whether its weights
    are those the last completed epoch's validation scored). A backup without its record (no
    BACKUP_EPOCHS file) has an empty "history" and "learning_curve", "at_epoch_end" False."""
    path = os.path.join(folder, BACKUP_STATE)
    if not (os.path.exists(path) and os.path.exists(os.path.join(folder, BACKUP_WEIGHTS))):
        return None
    with open(path) as handle:
        state = json.load(handle)
    record: dict = {"history": {}, "learning_curve": [], "at_epoch_end": False}
    if os.path.exists(os.path.join(folder, BACKUP_EPOCHS)):
        with open(os.path.join(folder, BACKUP_EPOCHS)) as handle:
            record.update(json.load(handle))
    return {**state, **record}


class AtomicBackup(keras.callbacks.Callback):
    """Backs the training up every `every` steps and at each epoch's end: the weights (with the
    optimizer's state and step), the epochs completed and their record (`read_backup_state`: the
    epoch-end logs of every completed epoch, the points of `curve`, a LearningCurve placed before
    it in the callbacks so that an epoch's point is in that epoch's backup), replaced whole
    (`core.files.replace_folder`). The record goes on from the backup found in `folder` when it is created
    (the one the run resumes from), so a resumed run's backups, and its history, hold every epoch
    since the first run began. Keras' BackupAndRestore writes its weights file in place, so a
    kill mid-write left a truncated file that every rerun failed to load. The trainer restores a
    backup itself before `fit` (`model.training.steps.restored_state`) and deletes it once the export is
    complete."""

    def __init__(self, folder: str, every: int, curve: LearningCurve | None = None):
        super().__init__()
        self.folder, self.every, self.curve = folder, every, curve
        self.epochs_done = 0
        self.since_backup = 0
        self.history: dict[str, list[float]] = dict((read_backup_state(folder) or {}).get("history", {}))

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs_done = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.since_backup += 1
        if self.since_backup >= self.every:
            self.back_up()

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_done = epoch + 1
        for key, value in (logs or {}).items():   # what Keras' History appends for the epoch
            self.history.setdefault(key, []).append(float(value))
        self.back_up(at_epoch_end=True)

    def back_up(self, at_epoch_end: bool = False) -> None:
        self.since_backup = 0
        state = {"epoch": self.epochs_done, "step": optimizer_step(self.model)}
        record = {"history": self.history, "learning_curve": self.curve.points if self.curve is not None else None,
                  "at_epoch_end": at_epoch_end}

        def write(partial):
            save_weights(self.model, os.path.join(partial, BACKUP_WEIGHTS))
            with open(os.path.join(partial, BACKUP_STATE), "w") as handle:
                json.dump(state, handle)
            with open(os.path.join(partial, BACKUP_EPOCHS), "w") as handle:
                json.dump(record, handle)

        with room_in(self.folder):
            replace_folder(self.folder, write)


class MirrorBackups(keras.callbacks.Callback):
    """Pushes a staged model dir to its remote one as soon as AtomicBackup writes a backup
    (checked after every batch, a stat only), so a preempted job resumes from it; at each epoch's
    start it pushes what the previous epoch's callbacks wrote. Placed right after
    AtomicBackup, so a backup goes up before later callbacks run."""

    def __init__(self, mirror: TreeMirror, backup: str = BACKUP):
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
        strategy = getattr(self.model, "distribute_strategy", None)   # tf.distribute's (TensorFlow backend)
        # workers stop at the same step, or the first to stop leaves the others hanging
        tf = sys.modules.get("tensorflow")   # loaded wherever a tf.distribute strategy runs
        if tf is not None and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            votes = strategy.run(lambda: tf.constant(float(expired)))
            expired = bool(strategy.reduce(tf.distribute.ReduceOp.MAX, votes, axis=None) > 0)
        if expired:
            self.model.stop_training = self.stopped = True


class BestCheckpoint(keras.callbacks.Callback):
    """Keeps BEST_WEIGHTS in `directory` (the model dir's CHECKPOINTS), the weights of the best
    validation epoch, with its score (BEST_SCORE): a resumed run starts from that score, so an
    epoch worse than one of the killed run's never replaces its checkpoint. Both are written to a
    temporary file and renamed (ModelCheckpoint writes in place: a kill mid-write left a truncated
    best)."""

    monitor = "val_triplet_accuracy"

    def __init__(self, directory: str):
        super().__init__()
        self.directory = directory
        self.filepath = os.path.join(directory, os.path.basename(BEST_WEIGHTS))
        self.score_path = os.path.join(directory, os.path.basename(BEST_SCORE))
        self.best = float("-inf")
        if os.path.exists(self.score_path):
            with open(self.score_path) as handle:
                self.best = json.load(handle)[self.monitor]
        self.written_from: keras.Model | None = None   # the model BEST_WEIGHTS was written from, no step since

    def on_train_begin(self, logs=None):
        self.written_from = None

    def on_train_batch_begin(self, batch, logs=None):
        self.written_from = None

    def restore(self, model: keras.Model) -> None:
        """Loads BEST_WEIGHTS (where there is one) into `model`, unless `model` holds them: they were
        written from it at an epoch's end and no step trained since (the last epoch was the best).
        Loading them again converted the frozen word vectors twice (+160 MiB, the BiLSTM recipe's
        peak on the 2019 run once the backups wrote theirs in slices; issue 70 item 14) to the
        values the variables hold. Where it loads, the heap's free memory goes back to the system
        first (`release_free_heap`: a reload after training peaked 160 MiB over the steps' peak)."""
        if model is not self.written_from and os.path.exists(self.filepath):
            release_free_heap()   # what training freed, before the load's copies land on top of it
            model.load_weights(self.filepath)

    def on_epoch_end(self, epoch, logs=None):
        score = (logs or {}).get(self.monitor)
        if score is None or not score > self.best:
            return
        self.best = float(score)
        with room_in(self.directory):
            os.makedirs(self.directory, exist_ok=True)
            partial = os.path.join(self.directory, os.path.basename(BEST_WEIGHTS_PARTIAL))
            save_weights(self.model, partial)
            os.replace(partial, self.filepath)
            write_complete(self.score_path, json.dumps({self.monitor: self.best, "epoch": epoch + 1}).encode())
        self.written_from = self.model


class FirstStep(keras.callbacks.Callback):
    """Logs and keeps (`seconds`) the wall time from `started` (a `time.monotonic()` reading taken
    when the trainer began, after its imports) to the end of the first training step: what a
    user waits for before anything is learned (set-up, checks, the first batches' input)."""

    def __init__(self, started: float):
        super().__init__()
        self.started = started
        self.seconds: float | None = None

    def on_train_batch_end(self, batch, logs=None):
        if self.seconds is None:
            self.seconds = round(time.monotonic() - self.started, 1)
            logging.getLogger(__name__).info("first training step after %.1f s", self.seconds)


class KeepInterrupts(keras.callbacks.Callback):
    """Ctrl-C stops `fit` even where Keras swallows it. Under JAX a step runs asynchronously and
    Keras waits for its logs in `pythonify_logs`, inside a bare `except: pass` (Keras 3.15): a
    SIGINT during a step raised KeyboardInterrupt there and was lost, and the run went on to its
    export. While the `with` block runs, SIGINT still raises KeyboardInterrupt where it lands, and
    is remembered: the next batch or epoch end raises it again. A process that ignores SIGINT, or a
    caller's own handler, is left as it is."""

    def __init__(self):
        super().__init__()
        self.interrupted = False
        self.installed = False

    def __enter__(self) -> KeepInterrupts:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._interrupt)
            self.installed = True
        return self

    def __exit__(self, *exc_info) -> None:
        if self.installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def _interrupt(self, signum, frame):
        self.interrupted = True
        signal.default_int_handler(signum, frame)

    def on_train_batch_end(self, batch, logs=None):
        if self.interrupted:
            raise KeyboardInterrupt

    def on_epoch_end(self, epoch, logs=None):
        if self.interrupted:
            raise KeyboardInterrupt


class LearningCurve(keras.callbacks.Callback):
    """Records, at each epoch's end, the training triplets seen so far (`global_batch` per
    optimizer step) and the process CPU and wall seconds, beside the epoch's validation accuracy
    and learning rate: the points of the learning curve (`points`). `earlier`: the points of the
    epochs a resumed run's backup holds (`read_backup_state`); the new points follow them, their
    clocks going on from the last one's (the time between that epoch's end and the kill is not
    counted)."""

    def __init__(self, global_batch: int, earlier: Sequence[dict] = ()):
        super().__init__()
        self.global_batch = global_batch
        self.points: list[dict] = list(earlier)

    def on_train_begin(self, logs=None):
        last = self.points[-1] if self.points else {}
        self.cpu_start = time.process_time() - last.get("cpu_seconds", 0.0)
        self.wall_start = time.monotonic() - last.get("wall_seconds", 0.0)

    def on_epoch_end(self, epoch, logs=None):   # the optimizer's step counts a resumed run's earlier steps too
        self.points.append({
            "epoch": epoch + 1, "triplets_seen": optimizer_step(self.model) * self.global_batch,
            "cpu_seconds": round(time.process_time() - self.cpu_start, 1),
            "wall_seconds": round(time.monotonic() - self.wall_start, 1),
            "val_triplet_accuracy": float((logs or {}).get("val_triplet_accuracy", float("nan"))),
            "learning_rate": float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)),
        })


def tensorboard_log(folder: str, update_freq: int) -> keras.callbacks.Callback:
    """The run's TensorBoard scalars: Keras' own callback where TensorFlow runs (it writes through
    tf.summary), `ScalarLog` where it does not (the JAX backend's arrays)."""
    if sys.modules.get("tensorflow") is not None:
        return keras.callbacks.TensorBoard(folder, update_freq=update_freq)
    return ScalarLog(folder, update_freq)


class ScalarLog(keras.callbacks.Callback):
    """What Keras' TensorBoard callback writes of scalars, without TensorFlow (tensorboardX; as
    `simple_value`s, which TensorBoard and `model.curves` read beside tf.summary's tensors):
    `epoch_<metric>` in `train/` and `validation/` at each epoch's end, `batch_<metric>` in
    `train/` every `update_freq` steps."""

    def __init__(self, folder: str, update_freq: int):
        super().__init__()
        self.folder, self.update_freq = folder, update_freq
        self.writers: dict = {}
        self.last_step = -1

    def _write(self, split: str, tag: str, value, step: int) -> None:
        from tensorboardX import SummaryWriter

        if split not in self.writers:
            self.writers[split] = SummaryWriter(os.path.join(self.folder, split))
        self.writers[split].add_scalar(tag, float(value), step)

    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.model)
        # once per optimizer step: with gradient accumulation several batches end at one step
        if self.update_freq and step % self.update_freq == 0 and step != self.last_step:
            self.last_step = step
            for name, value in (logs or {}).items():
                self._write("train", f"batch_{name}", value, step)

    def on_epoch_end(self, epoch, logs=None):
        for name, value in (logs or {}).items():
            split, metric = ("validation", name[4:]) if name.startswith("val_") else ("train", name)
            self._write(split, f"epoch_{metric}", value, epoch)
        for writer in self.writers.values():
            writer.flush()

    def on_train_end(self, logs=None):
        for writer in self.writers.values():
            writer.close()
        self.writers = {}
