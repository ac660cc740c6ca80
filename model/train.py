"""Trains the triplet network on the pipeline's shards and exports the strings-in encoder.

    python -m model.train --data DIR_OR_GS --model-dir DIR [--dataset triplets-sen]
        [--embeddings GLOVE.txt] [--epochs N] [--steps N] [--batch-size N]
        [--distribution-strategy auto|one_device|mirrored|multi_worker|tpu] ...   (flags = TrainConfig)

Writes into the model dir: `vocabulary.txt`, `backup/` (`model.training.callbacks.AtomicBackup`, replaced
whole every `--checkpoint-every` steps: a killed job resumes from its last backup, at the step it
holds; it is deleted once the export is complete, so a job killed between training and export
resumes at the export), `checkpoints/best.{weights.h5,json}` (the best
validation epoch, which is tested and exported), `logs/` (TensorBoard), `history.json`,
`training_curve.png` and `encoder/` (SavedModel: 1-D tf.string -> {"embeddings": [n, d]}); for a
transformer also `sentence-transformers/` (`model.export`: the same weights for sentence-transformers
and Hugging Face users).

Resuming: the training stream is the same seeded stream in every run (shards read in a fixed
order, a seeded shuffle), so a resumed run starts it at the backup's optimizer step: no batch is
trained twice, none is skipped, and the epoch count goes on from the backup's epoch. The epoch the
job was killed in then runs a full `--steps` from that step (Keras cannot run a shorter first
epoch), so a resumed run of N epochs trains at most one epoch's steps more than an unbroken one.
With pass-long epochs (`--steps none`) the interrupted pass restarts. The time budget counts
from each start.

A remote model dir (`gs://...`, any Beam FileSystems scheme) is staged in a local directory
(`model.training.storage`: TensorFlow's GCS filesystem cannot reach the emulator the tests use, Beam's
FileSystems can): its contents are downloaded first, so a preempted job resumes from its backup;
every new backup is mirrored up as soon as it is written (with the previous epoch's
checkpoint and logs); everything is uploaded at the end.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import types
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, TypeAlias

from model.config import TrainConfig, parse_args
from pipeline.cli import parse_first, refuse_file_as_folder, run_cli


def use_backend(config: TrainConfig) -> None:
    """Sets KERAS_BACKEND to `--backend` before Keras loads (Keras reads it once, at its import).
    A UsageError where another backend was chosen: KERAS_BACKEND set otherwise, or Keras
    already loaded under another backend (an in-process caller)."""
    from pipeline.cli import UsageError

    backend = config.runtime.backend
    if "keras" in sys.modules:
        loaded = sys.modules["keras"].backend.backend()
        if loaded != backend:
            raise UsageError(f"--backend {backend}: Keras is already loaded in this process under {loaded}; run "
                             "python -m model.train in its own process")
        return
    chosen = os.environ.get("KERAS_BACKEND")
    if chosen and chosen != backend:
        raise UsageError(f"KERAS_BACKEND={chosen} but --backend {backend}: pass --backend {chosen}, or unset "
                         "KERAS_BACKEND")
    os.environ["KERAS_BACKEND"] = backend
    from model.training.shards import needs_tensorflow

    if needs_tensorflow(config) is None and "tensorflow" not in sys.modules:
        # Nothing of this run needs TensorFlow (`model.training.arrays`), but keras-hub imports it at its
        # own import wherever it is installed (for tokenizers this run does not use): kept out, so the
        # process is the one an accelerator image without TensorFlow runs, and its memory JAX's alone.
        sys.modules["tensorflow"] = None   # type: ignore[assignment]


if __name__ == "__main__":   # the flags first: --help and a bad flag answer before TensorFlow and Keras load
    parse_first(parse_args)
    parse_first(lambda argv: use_backend(parse_args(argv)))

import numpy as np  # noqa: E402

from model.encoding.encoder import SavedModelEncoder  # noqa: E402
from model.net.vectors import load_word_vectors  # noqa: E402
from model.similarity import Similarity  # noqa: E402
from model.training.model_dir import ModelDir  # noqa: E402
from model.training.plots import plot_history, plot_learning_curve  # noqa: E402
from model.training.shards import (  # noqa: E402
    TripletDataError,
    TripletDataLoss,
    needs_tensorflow,
    open_run,
    triplet_split,
)
from model.training.storage import TreeMirror, claim_is_live, staged  # noqa: E402
from pipeline.published import Run, owner_record, read_json_object, write_complete  # noqa: E402
from pipeline.splits import SPLITS  # noqa: E402

# TensorFlow loads only where it runs: under its backend, or under JAX for the BiLSTM's tokenizer
# and a teacher (a transformer under JAX never imports it).
if TYPE_CHECKING:   # annotations only: the callbacks load Keras, which `_fit` imports when it runs
    import tensorflow as tf

    from model.net.text import WordIds
    from model.training.arrays import SplitBatches, Tokenizer, TripletInput
    from model.training.callbacks import BestCheckpoint, LearningCurve, TimeBudget

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


# What a non-chief worker copies from the chief's model dir into its own before training: a
# restarted job resumes every worker from the chief's backup and best-epoch score.
RESUME_ENTRIES = ("backup", "checkpoints")   # BACKUP, and BestCheckpoint's folder


# What a model dir's state (vocabulary, backups, checkpoints) was built from: a rerun or a resumed
# run must see the same, or it would silently continue on other data or another id space.
STATE_INPUTS = ("data", "dataset", "encoder", "embeddings", "vocabulary", "min_count", "num_oov_buckets", "max_tokens")


# Flags a resumed run may change: how long and how loudly it runs, and checks; any other change
# (batch size, learning rate, network...) would continue the backup as another run than
# history.json says, so it is refused unless --overwrite.
RESUME_MAY_CHANGE = ("model_dir", "overwrite", "budget_minutes", "progress", "serving_version", "epochs",
                     "patience", "max_lost_fraction", "jit_compile", "checkpoint_every")

# What a training run writes into its model dir, and only that: `--overwrite` deletes these and
# nothing else. `inputs.json` is the claim: a non-empty folder without it is not a model dir.
CLAIM = "inputs.json"
BACKUP = "backup"
FIT_RECORD = "fit.json"   # in the backup, once `fit` returned: its history, for a rerun that only exports
RUN_ENTRIES = (CLAIM, "vocabulary.txt", "vocabulary.txt.partial", BACKUP, f"{BACKUP}.partial", f"{BACKUP}.previous",
               "checkpoints", "logs", "history.json", "training_curve.png", "learning_curve.png", "encoder",
               "encoder.partial", "serving", "model", "model.partial", "sentence-transformers",
               "sentence-transformers.partial")


PATH_FLAGS = ("data", "embeddings", "teacher")   # compared without a trailing slash


def recorded_flags(config: TrainConfig, flags: dict | None = None) -> dict:
    """The flags a model dir's state depends on, as they take effect: a flag left at none is its
    default (`TrainConfig.default`), a path has no trailing slash; so a rerun that spells a
    default out (`--dropout 0.2`) or ends `--data` with `/` continues the same run. `flags`:
    recorded ones (an earlier `inputs.json`) instead of `config`'s."""
    recorded = {}
    for name, value in (config.flags() if flags is None else flags).items():
        if value is None and name in config.network.kind.defaults:
            value = config.default(name)
        if name in PATH_FLAGS and isinstance(value, str):
            value = value.rstrip("/") or value
        recorded[name] = str(value) if isinstance(value, Enum) else value
    return recorded


def claim_model_dir(config: TrainConfig, model_dir: str, run: Run | None = None) -> None:
    """Ties `model_dir` to its inputs in `inputs.json` (the config fields of STATE_INPUTS, the
    SHA-256 of the data's manifest, `recorded_flags` and the training process: `owner_record`).
    Refused (a UsageError naming the folder or file): a non-empty folder that is not a model dir
    (no claim, or entries a run does not write: the user's files, a dataset), one that holds a
    symbolic link anywhere, one a live training process writes, and one holding state from other
    inputs, with the first difference named, unless `--overwrite`, which deletes what a run wrote
    (RUN_ENTRIES) and nothing else. The claim decides under an exclusive flock of the folder.
    `run`: the data, opened (by default, opened here)."""
    from model.training.storage import refuse_links
    from pipeline.outputs import claiming

    digest = (run or open_run(config.inputs.data)).sha256
    flags = recorded_flags(config)
    inputs = {**{name: flags[name] for name in STATE_INPUTS}, "manifest_sha256": digest,
              "flags": {name: value for name, value in flags.items() if name not in RESUME_MAY_CHANGE},
              "owner": owner_record()}
    refuse_links(model_dir, "--model-dir")
    with claiming(model_dir):
        leftovers = sorted(name.rstrip("/") for name in os.listdir(model_dir))
        foreign = [name for name in leftovers if name not in RUN_ENTRIES]
        if leftovers and (foreign or CLAIM not in leftovers):
            raise TripletDataError(
                f"--model-dir {config.runtime.model_dir} holds files a training run does not write "
                f"({', '.join((foreign or leftovers)[:3])}); choose an empty or new folder")
        previous = read_json_object(f"{model_dir}/{CLAIM}") if leftovers else {}
        if claim_is_live(previous.get("owner") or {}):
            raise TripletDataError(f"--model-dir {config.runtime.model_dir} is being trained by pid "
                                   f"{previous['owner'].get('pid')} (since {previous['owner'].get('started')}); wait "
                                   "for it, or use another --model-dir")
        if config.runtime.overwrite:
            for name in leftovers:
                entry = f"{model_dir}/{name}"
                shutil.rmtree(entry) if os.path.isdir(entry) else os.remove(entry)
        elif leftovers:
            _refuse_other_inputs(config, inputs, previous)
        write_complete(f"{model_dir}/{CLAIM}", json.dumps(inputs, indent=2).encode())


def _refuse_other_inputs(config: TrainConfig, inputs: dict, previous: dict) -> None:
    """TripletDataError naming the first input or flag in which a resume differs from the run
    its model dir holds (`previous`: that run's inputs.json)."""
    changed = [name for name in STATE_INPUTS + ("manifest_sha256",)
               if recorded_flags(config, {name: previous.get(name)}).get(name) != inputs[name]]
    if changed:
        name = changed[0]
        raise TripletDataError(
            f"--model-dir {config.runtime.model_dir} holds a run on other inputs ({name}: "
            f"{previous.get(name)!r} -> {inputs[name]!r}); pass --overwrite true to start over, or use a new "
            "--model-dir")
    before = recorded_flags(config, previous.get("flags", inputs["flags"]))
    differing = [f"--{name.replace('_', '-')} {before.get(name)} -> {value}" for name, value in
                 inputs["flags"].items()   # a flag the run's version did not have (`--backend`) is its default
                 if name not in STATE_INPUTS and name in before and before[name] != value]
    if differing:
        raise TripletDataError(
            f"--model-dir {config.runtime.model_dir} holds a run with other flags ({', '.join(differing)}); "
            "resuming it so would train another run than its history records: pass the same flags, "
            "--overwrite true to start over, or a new --model-dir")


def check_lost_records(config: TrainConfig, run: Run, counts: dict[str, dict]) -> None:
    """TripletDataLoss when a split lost more than `--max-lost-fraction` of its records; a split
    holding more records than its manifest lists (mixed data), or a shard fewer than allowed, is
    named by `Run.verify` (ShardError naming the shard)."""
    inputs = config.inputs
    for split, count in counts.items():
        lost = count["lost"] + count["unparseable"]
        if count["read"] != count["expected"]:
            run.verify(f"{inputs.dataset}/{split}", inputs.max_lost_fraction)
        if lost > inputs.max_lost_fraction * max(count["expected"], 1):
            raise TripletDataLoss(
                f"{inputs.data}/{inputs.dataset}/{split}: {lost:,} of {count['expected']:,} records lost to corrupt or "
                f"truncated shards or unparseable (> --max-lost-fraction {inputs.max_lost_fraction})")


def build_vocabulary(config: TrainConfig, run: Run, model_dir: str | None = None) -> list[str]:
    """The id space, kept in `<model_dir>/vocabulary.txt` (default: `--model-dir`) so a resumed job
    rebuilds the same one. `--vocabulary embeddings` (default): every word of the vector file
    in its order; with frozen vectors a word unseen in training still has its pre-trained vector
    at no training cost, where the other choice sends it to an OOV bucket that mean-vectors does
    not have. `--vocabulary train`: training-split words seen `min_count` times that have a
    vector, most frequent first."""
    import tensorflow as tf

    from model.net.text import count_words
    from model.training.arrays import split_triplets

    model_dir = model_dir or config.runtime.model_dir
    path = f"{model_dir}/vocabulary.txt"
    if tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as handle:
            return handle.read().splitlines()
    inputs = config.inputs
    if inputs.vocabulary == "embeddings":
        vocabulary = load_word_vectors(inputs.embeddings).words
        LOG.info("vocabulary: all %d words of the word vectors", len(vocabulary))
    else:
        counts = count_words(split_triplets(run, inputs.dataset, "train"))
        frequent = {word for word, n in counts.items() if n >= inputs.min_count}
        with_vectors = set(load_word_vectors(inputs.embeddings, frequent).words)
        vocabulary = sorted(with_vectors, key=lambda word: (-counts[word], word))
        covered = sum(counts[word] for word in vocabulary)
        LOG.info("vocabulary: %d of %d training words have vectors (%.1f%% of %d tokens)",
                 len(vocabulary), len(counts), 100 * covered / max(1, sum(counts.values())), sum(counts.values()))
    tf.io.gfile.makedirs(model_dir)
    with tf.io.gfile.GFile(path + ".partial", "w") as handle:   # a killed run leaves no partial vocabulary
        handle.write("\n".join(vocabulary))
    tf.io.gfile.rename(path + ".partial", path, overwrite=True)
    return vocabulary


def embedding_matrix(vocabulary: list[str], word_ids: WordIds, config: TrainConfig) -> np.ndarray:
    """Rows in id order: zeros for padding, the pre-trained vectors, then small random OOV rows."""
    vectors = load_word_vectors(config.inputs.embeddings, vocabulary)
    scale = float(vectors.matrix.std()) if vectors.matrix.size else 0.1
    oov = np.random.default_rng(config.runtime.seed).normal(0, scale, (config.inputs.num_oov_buckets, vectors.dim))
    # written in place, row block by row block: GloVe's 400 k x 50 floats are copied once, not four times
    matrix = np.zeros((word_ids.num_ids, vectors.dim), np.float32)
    if vectors.words == vocabulary:   # `--vocabulary embeddings`: the file's own order
        matrix[1:1 + len(vocabulary)] = vectors.matrix
    else:
        row_of = vectors.index()
        matrix[1:1 + len(vocabulary)] = vectors.matrix[[row_of[word] for word in vocabulary]]
    matrix[1 + len(vocabulary):] = oov
    return matrix


def build_models(config: TrainConfig, matrix: np.ndarray | None, global_batch: int, teacher_dim: int | None = None,
                 slices: int | None = None, head=None):
    """(sentence encoder, compiled triplet model); call inside the strategy's scope. `matrix`:
    the word vectors of the BiLSTM (None for a transformer checkpoint). With `teacher_dim` (a
    distillation), Net ends in a linear projection to the teacher's size where the sizes differ,
    as sentence-transformers' distillation adds a Dense layer. `slices` (default
    `model.net.network.LENGTH_SLICES`) and `head` are `model.benchmark`'s levers: the length slices
    Net runs on, and another triplet model of Net (`head(Net)`, its three-call baseline)."""
    import keras

    from model.net.network import LENGTH_SLICES, build_net, build_triplet_model, compile_triplet_model

    network, optimizer, static_shapes = config.network, config.optimizer, config.runtime.static_batches
    encoder = build_net(config, matrix)
    if teacher_dim and teacher_dim != encoder.output_shape[-1]:
        encoder = keras.Model(encoder.inputs, keras.layers.Dense(teacher_dim, name="projection")(encoder.outputs[0]),
                              name="student")
    model = head(encoder) if head else build_triplet_model(
        encoder, slices or LENGTH_SLICES, distance=config.resolved("distance"), static_shapes=static_shapes,
        loss=optimizer.loss, teacher_dim=teacher_dim)
    half_life = optimizer.learning_rate_half_life
    part = global_batch // optimizer.gradient_accumulation_steps   # the triplets of one batch the schedule counts
    compile_triplet_model(model, config.resolved("learning_rate"), loss=optimizer.loss, distill=bool(teacher_dim),
                          jit_compile=config.runtime.jit_compile or static_shapes,
                          half_life_steps=half_life / part if half_life else None,
                          warmup_steps=optimizer.warmup_triplets / part,
                          weight_decay=optimizer.weight_decay if network.kind.weight_decay else None,
                          gradient_accumulation_steps=optimizer.gradient_accumulation_steps)
    return encoder, model


def mean_vectors_accuracy(batches: SplitBatches, matrix: np.ndarray, vocabulary_size: int) -> float:
    """Triplet accuracy (cosine) of mean word vectors on the same batches: the baseline the
    network has to beat, as a reference line on the learning curve. Like `mean-vectors` in
    eval/, a sentence averages the vectors of its in-vocabulary tokens (not padding or OOV)."""
    def means(ids: np.ndarray) -> np.ndarray:
        known = ((ids > 0) & (ids <= vocabulary_size))[..., None]
        return (matrix[ids] * known).sum(axis=1) / np.maximum(known.sum(axis=1), 1)

    correct = total = 0.0
    for inputs, _, weights in (batches[index] for index in range(len(batches))):
        for sentences, roles, weight in zip(inputs["sentences"], inputs["roles"],
                                            weights.reshape(len(inputs["roles"]), -1)):
            vectors = means(sentences)
            anchor, positive, negative = (vectors[roles[:, role]] for role in range(3))
            correct += float((Similarity.COSINE.triplet_correct(anchor, positive, negative) * weight).sum())
            total += float(weight.sum())
    return correct / max(total, 1.0)


def restored_state(model, backup_dir: str) -> dict:
    """The state of a killed run's backup (`model.training.callbacks.read_backup_state`: "epoch" completed,
    "step", and the completed epochs' "history", "learning_curve" and "at_epoch_end"), loaded into
    `model` (the weights and the optimizer's state; "step" is the optimizer's step); without one,
    the state of a run at its start. Read before `fit` so the training stream continues at the
    first batch not yet trained on."""
    from model.training.callbacks import BACKUP_WEIGHTS, optimizer_step, read_backup_state, recover_backup

    recover_backup(backup_dir)
    state = read_backup_state(backup_dir)
    if state is None:
        return {"epoch": 0, "step": 0, "history": {}, "learning_curve": [], "at_epoch_end": False}
    model.optimizer.build(model.trainable_variables)
    model.load_weights(f"{backup_dir}/{BACKUP_WEIGHTS}")
    return {**state, "epoch": int(state["epoch"]), "step": optimizer_step(model)}


def train(config: TrainConfig, extra_callbacks: list | None = None) -> dict:
    """Trains, exports `<model_dir>/encoder`, returns the summary also written to history.json."""
    import time

    started = time.monotonic()   # seconds_to_first_step count from here
    refuse_file_as_folder("--model-dir", config.runtime.model_dir)
    use_backend(config)
    refuse_without_tensorflow(config)
    import keras

    keras.utils.set_random_seed(config.runtime.seed)
    run = open_run(config.inputs.data)
    strategy = strategy_of(config)
    chief = is_chief(strategy)
    # A reader's lease on the data for the whole run: no pipeline.run --overwrite replaces it meanwhile.
    with run.reading(), staged(config.runtime.model_dir, push=chief) as (model_dir, mirror):
        if chief:
            return _train(config, run, strategy, model_dir, mirror, extra_callbacks, started)
        with worker_temp_dir(strategy) as own_dir:
            return _train(config, run, strategy, own_dir, None, extra_callbacks, started, resume_from=model_dir)


@dataclass(frozen=True)
class _Job:
    """What every step of `_train` reads: the flags, the data, where it runs and where it writes."""

    config: TrainConfig
    run: Run
    strategy: Strategy
    model_dir: str   # local; `mirror` pushes it to a remote one
    mirror: TreeMirror | None

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def global_batch(self) -> int:
        return self.config.optimizer.batch_size * self.replicas


@dataclass(frozen=True)
class _Data:
    """The data step's result: the id space, the teacher, the input, its validation batches (as
    arrays, and as the backend reads them), and each split's record count, counted in the
    background until the score step needs it."""

    word_ids: WordIds | None       # the BiLSTM's in-graph tokenizer (None for a transformer: its wordpieces)
    vocabulary: list[str] | None   # None for a transformer (its own wordpieces)
    matrix: np.ndarray | None      # the BiLSTM's word vectors
    teacher: SavedModelEncoder | None
    source: TripletInput
    validation: SplitBatches
    record_counts: dict[str, concurrent.futures.Future]

    def evaluation(self, split: str, strategy: Strategy):
        """A split's evaluation batches as the backend reads them: a PyDataset under JAX, a
        tf.data dataset of the same batches under TensorFlow (`model.training.tf_input`)."""
        batches = self.validation if split == "validation" else self.source.evaluation(split)
        if isinstance(strategy, KerasDevices):
            return batches
        from model.training.tf_input import evaluation

        return evaluation(batches, self.source)

    def training(self, strategy: Strategy, resume_at_step: int):
        """The training stream as the backend reads it (`model.training.tf_input.training` under TensorFlow)."""
        if isinstance(strategy, KerasDevices):
            return self.source.training(resume_at_step)
        from model.training.tf_input import training

        return training(self.source, strategy, resume_at_step)


def _train(config: TrainConfig, run: Run, strategy: Strategy, model_dir: str,
           mirror: TreeMirror | None, extra_callbacks: list | None, started: float,
           resume_from: str | None = None) -> dict:
    """`train` with every file in the local dir `model_dir`; `mirror` pushes it to a remote one.
    `resume_from`: a non-chief worker's view of the chief's model dir (RESUME_ENTRIES)."""
    job = _Job(config, run, strategy, model_dir, mirror)
    LOG.info("strategy %s, %d replica(s), global batch %d", type(strategy).__name__,
             strategy.num_replicas_in_sync, job.global_batch)
    teacher = _claim(job, resume_from)
    data = _data(job, teacher)
    encoder, model, initial_weights = _model(job, data)
    fit_record, best = _fit(job, data, model, extra_callbacks, started)
    summary = _score(job, data, model, initial_weights, fit_record, best)
    _export(job, data.word_ids, encoder, model, summary)
    return summary


def _claim(job: _Job, resume_from: str | None) -> SavedModelEncoder | None:
    """Checks the data and loads the teacher (`--teacher`), then claims the model dir (a non-chief
    worker copies the chief's RESUME_ENTRIES into its own): what can be refused is refused before
    anything is written. Returns the teacher, or None."""
    config, run, inputs, optimizer = job.config, job.run, job.config.inputs, job.config.optimizer
    for split in SPLITS:   # every shard there, of the size the run wrote, before the model dir is claimed (seconds)
        triplet_split(run, inputs.dataset, split)
        run.check_sizes(f"{inputs.dataset}/{split}")
    if triplet_split(run, inputs.dataset, "train").order is None and not inputs.shuffle_buffer:
        LOG.warning("%s/%s was written in page order (an older pipeline.run): streamed without a shuffle buffer, "
                    "training would drift with the topics; rerun the pipeline, or pass --shuffle-buffer",
                    inputs.data, inputs.dataset)
    if not triplet_split(run, inputs.dataset, "validation").records:   # refused now, not after training
        raise TripletDataError(f"the validation split of {inputs.data}/{inputs.dataset} holds no triplets")
    # a bad path is refused before the claim; a teacher is a SavedModel (it embeds inside tf.data's input)
    teacher = SavedModelEncoder(optimizer.teacher) if optimizer.teacher else None
    claim_model_dir(config, job.model_dir, run)
    for entry in RESUME_ENTRIES if resume_from else ():
        if resume_from and os.path.isdir(os.path.join(resume_from, entry)):
            shutil.copytree(os.path.join(resume_from, entry), os.path.join(job.model_dir, entry))
    return teacher


def _data(job: _Job, teacher: SavedModelEncoder | None) -> _Data:
    """The id space (the BiLSTM's vocabulary and word vectors, or a transformer's wordpieces), the
    input (`model.training.arrays.TripletInput`) and its validation batches; starts counting every
    split's records."""
    from model.training.arrays import TripletInput

    config, run, inputs, strategy = job.config, job.run, job.config.inputs, job.strategy
    word_ids: WordIds | None = None
    vocabulary, matrix = None, None
    tokenizer: Tokenizer
    if config.network.kind.reads_word_vectors:
        from model.net.text import ArrayIds, WordIds

        vocabulary = build_vocabulary(config, run, job.model_dir)
        word_ids = WordIds(vocabulary, inputs.num_oov_buckets, inputs.max_tokens)
        matrix = embedding_matrix(vocabulary, word_ids, config)
        tokenizer = ArrayIds(word_ids)
    else:   # the checkpoint's own wordpiece vocabulary; no word vectors
        from model.net.wordpieces import wordpieces

        tokenizer = wordpieces(inputs.max_tokens, config.network.encoder, config.network.checkpoint)
    shares = ((strategy.local_replicas, strategy.process_id, strategy.processes)
              if isinstance(strategy, KerasDevices) else (job.replicas, 0, 1))
    source = TripletInput(config, run, tokenizer, teacher.encode if teacher else None,
                          teacher.dim if teacher else None, blocks=shares[0], process=shares[1], processes=shares[2])
    if job.mirror:
        job.mirror.push()
    # The records each split holds are counted beside training, not before it, and checked before
    # the export: no extra pass before the first step.
    counting = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    record_counts = {split: counting.submit(source.count_records, split) for split in SPLITS}
    counting.shutdown(wait=False)   # takes no more work; the counts submitted run on
    return _Data(word_ids, vocabulary, matrix, teacher, source, source.evaluation("validation"), record_counts)


def refuse_without_tensorflow(config: TrainConfig) -> None:
    """A UsageError, before any work, for a run that needs TensorFlow where it is not installed
    (an accelerator image): only a transformer under JAX in article chunks reads without it."""
    from model import tensorflow_installed
    from pipeline.cli import UsageError

    needs = "--backend tensorflow" if config.runtime.backend != "jax" else needs_tensorflow(config)
    if needs and not tensorflow_installed():
        raise UsageError(f"{needs} needs TensorFlow, which is not installed here; under --backend jax a transformer "
                         "trains without it (no --teacher)")


def _model(job: _Job, data: _Data) -> tuple:
    """(sentence encoder, compiled triplet model, its initial weights). The untrained model is
    scored from these weights after training (`_score`), not before it: on a transformer that
    pass (and, under JAX, its compilation) would delay the first step by a minute."""
    with job.strategy.scope():
        encoder, model = build_models(job.config, data.matrix, job.global_batch,
                                      data.teacher.dim if data.teacher else None)
    return encoder, model, [np.array(variable.numpy()) for variable in model.trainable_variables]


def _untrained_scores(job: _Job, model, initial_weights: list[np.ndarray], validation_batches) -> dict:
    """The validation scores of the model with its initial trainable weights (the frozen ones, such
    as the word vectors, never change and are not copied); its own weights are put back. The
    weights are assigned in the strategy's scope, where a tf.distribute strategy's variables live."""
    trained = [np.array(variable.numpy()) for variable in model.trainable_variables]
    with job.strategy.scope():
        for variable, value in zip(model.trainable_variables, initial_weights):
            variable.assign(value)
    untrained = model.evaluate(validation_batches, verbose=0, return_dict=True)
    with job.strategy.scope():
        for variable, value in zip(model.trainable_variables, trained):
            variable.assign(value)
    return untrained


def _fit(job: _Job, data: _Data, model, extra_callbacks: list | None,
         started: float) -> tuple[dict, BestCheckpoint]:
    """(the fit's record: history, learning curve, budget stop, time to the first step; the best
    epoch's checkpoint). A backup that holds a complete fit (FIT_RECORD) is not fitted again.

    Resuming from a backup (`restored_state`): `fit` starts at the epoch after the backup's last
    completed (trained and validated) one, `initial_epoch` = its "epoch", whatever its step: an
    epoch the job was killed in, even in its validation after its last step, is run again, a full
    `--steps` from the stream position the backup's step reached (`TripletInput.training_batches`: no batch
    trained twice or skipped). The backup holds the completed epochs' history and learning-curve
    points (`model.training.callbacks.AtomicBackup`), which the new epochs' follow: the record covers every
    epoch since the first run began. When no epoch is left to fit (a rerun with fewer `--epochs`,
    or a job that failed after its last epoch's backup, e.g. a full disk writing the best
    checkpoint), `fit` is not called and the backup's record is the fit's (`_fitted_before`)."""
    from model.training.callbacks import BestCheckpoint

    backup = f"{job.model_dir}/{BACKUP}"
    with job.strategy.scope():   # the optimizer's variables are built where the model's live
        state = restored_state(model, backup)
    best = BestCheckpoint(f"{job.model_dir}/checkpoints")
    fitted = f"{backup}/{FIT_RECORD}"
    if os.path.exists(fitted):   # a run killed after training, before its export: straight to test and export
        LOG.info("training was complete in the backup (%s); testing and exporting it", fitted)
        with open(fitted) as handle:
            return json.load(handle), best
    if state["epoch"] >= job.config.optimizer.epochs:
        fit_record = _fitted_before(job, model, state, best)
    else:
        fit_record = _fit_epochs(job, data, model, state, best, extra_callbacks, started)
    os.makedirs(backup, exist_ok=True)
    write_complete(fitted, json.dumps(fit_record).encode())
    return fit_record, best


def _fit_epochs(job: _Job, data: _Data, model, state: dict, best: BestCheckpoint, extra_callbacks: list | None,
                started: float) -> dict:
    """`_fit`'s `fit`, from the epoch after the backup's completed ones (`state`) to `--epochs`."""
    from model.training.callbacks import FirstStep, KeepInterrupts, LearningCurve, TimeBudget

    config, optimizer, runtime = job.config, job.config.optimizer, job.config.runtime
    step, epochs_done = state["step"], state["epoch"]
    train_batches = data.training(job.strategy, step)
    # `--steps none`: an epoch is one pass over the train split, by the manifest's count.
    pass_steps = max(1, -(-triplet_split(job.run, config.inputs.dataset, "train").records // job.global_batch))
    first_step = FirstStep(started)
    if step:
        LOG.info("resuming from the backup at step %d: %d epoch(s) completed, epoch %d of %d begins", step,
                 epochs_done, epochs_done + 1, optimizer.epochs)
    curve = LearningCurve(job.global_batch, state["learning_curve"])
    budget = TimeBudget(runtime.budget_minutes) if runtime.budget_minutes else None
    callbacks = _callbacks(job, best, curve, budget, extra_callbacks)
    with KeepInterrupts() as interrupts:   # Ctrl-C, which Keras may swallow under JAX
        fit = model.fit(train_batches, validation_data=data.evaluation("validation", job.strategy),
                        epochs=optimizer.epochs,
                        initial_epoch=epochs_done,   # Keras counts each part of a step's batch as a step
                        steps_per_epoch=(optimizer.steps or pass_steps) * optimizer.gradient_accumulation_steps,
                        callbacks=[*callbacks, first_step, interrupts],
                        verbose=1 if runtime.progress and sys.stdout.isatty() else 2,   # plain lines in a log
                        shuffle=False)   # the stream is in its written order
    earlier = state["history"] or {}   # a backup of an older version has none
    history = {key: [*earlier.get(key, []), *(float(v) for v in values)] for key, values in fit.history.items()}
    return {"history": history, "stopped_by_budget": bool(budget and budget.stopped),
            "learning_curve": curve.points, "seconds_to_first_step": first_step.seconds}


def _fitted_before(job: _Job, model, state: dict, best: BestCheckpoint) -> dict:
    """The fit's record when the backup holds every epoch `--epochs` allows (`_fit`): its history
    and learning curve. A backup written at its last epoch's end holds the weights that epoch's
    validation scored, offered again to `best` (a job that failed writing the best checkpoint
    keeps that epoch). A backup without a history (an older version's) is one clear error."""
    epochs, done, history = job.config.optimizer.epochs, state["epoch"], state["history"]
    if not history or len(history.get("loss", ())) != done:
        raise TripletDataError(
            f"--model-dir {job.config.runtime.model_dir}: its backup holds {done} trained epoch(s) but not their "
            f"history, and --epochs {epochs} leaves none to train; pass --epochs {done + 1} or more to train on, or "
            "--overwrite true to start over")
    LOG.info("the backup holds %d trained epoch(s), --epochs %d: none left to train; testing and exporting it",
             done, epochs)
    if state["at_epoch_end"]:
        best.set_model(model)
        best.on_epoch_end(done - 1, {key: values[-1] for key, values in history.items()})
    return {"history": history, "stopped_by_budget": False, "learning_curve": state["learning_curve"] or [],
            "seconds_to_first_step": None}


def _callbacks(job: _Job, best: BestCheckpoint, curve: LearningCurve, budget: TimeBudget | None,
               extra_callbacks: list | None) -> list:
    """The fit's callbacks: the learning curve (first: an epoch's point goes into its backup),
    backups (mirrored up at once), the best epoch, early stopping, TensorBoard, the time budget,
    and the caller's."""
    import keras

    from model.training.callbacks import AtomicBackup, MirrorBackups, tensorboard_log

    optimizer, runtime, mirror = job.config.optimizer, job.config.runtime, job.mirror
    return [
        curve,   # before the backup: an epoch's learning-curve point is in its epoch-end backup
        # backed up between optimizer steps, never with a step's parts half accumulated
        AtomicBackup(f"{job.model_dir}/{BACKUP}", runtime.checkpoint_every * optimizer.gradient_accumulation_steps,
                     curve),
        *([MirrorBackups(mirror)] if mirror else []),   # right after it: a backup goes up before later callbacks run
        best,
        keras.callbacks.EarlyStopping(monitor="val_triplet_accuracy", mode="max", patience=optimizer.patience),
        # scalars every N steps and per epoch, where TensorFlow runs (Keras writes them with tf.summary)
        tensorboard_log(f"{job.model_dir}/logs", runtime.checkpoint_every),
        *([budget] if budget else []),
        *(extra_callbacks or []),
    ]


def _score(job: _Job, data: _Data, model, initial_weights: list[np.ndarray], fit_record: dict,
           best: BestCheckpoint) -> dict:
    """The best epoch (of this run or a killed one) on the test split, every split's records
    checked (TripletDataLoss past `--max-lost-fraction`), and the summary history.json holds."""
    config, inputs = job.config, job.config.inputs
    if os.path.exists(best.filepath):
        model.load_weights(best.filepath)

    # silent otherwise: the test pass takes a while
    LOG.info("training done; scoring the best epoch on the test split")
    test = model.evaluate(data.evaluation("test", job.strategy), verbose=0, return_dict=True)
    LOG.info("test triplet accuracy %.4f; scoring the untrained model on validation, counting every split's "
             "records", test["triplet_accuracy"])
    untrained = _untrained_scores(job, model, initial_weights, data.evaluation("validation", job.strategy))
    counts = {split: future.result() for split, future in data.record_counts.items()}
    skipped = {split: count["lost"] + count["unparseable"] for split, count in counts.items()}
    if any(skipped.values()):
        LOG.warning("records lost or unparseable per split of %s/%s: %s", inputs.data, inputs.dataset, counts)
    check_lost_records(config, job.run, counts)
    history, matrix, vocabulary = fit_record["history"], data.matrix, data.vocabulary
    return {
        **history,
        "untrained_val_triplet_accuracy": float(untrained["triplet_accuracy"]),
        "untrained_val_loss": float(untrained["loss"]),
        "mean_vectors_val_triplet_accuracy": (mean_vectors_accuracy(data.validation, matrix, len(vocabulary))
                                              if matrix is not None and vocabulary is not None else None),
        "evaluation_triplets": inputs.evaluation_triplets or "all",
        "best_val_triplet_accuracy": float(best.best),
        "test_triplet_accuracy": float(test["triplet_accuracy"]),
        "test_loss": float(test["loss"]),
        "epochs_run": len(history["loss"]),
        "stopped_by_budget": fit_record["stopped_by_budget"],
        "seconds_to_first_step": fit_record.get("seconds_to_first_step"),
        "learning_curve": fit_record["learning_curve"],
        "vocabulary_size": len(vocabulary) if vocabulary else None,
        "skipped_records": skipped,
        "record_counts": counts,
        "trained_on": job.run.provenance(),
        "replicas": job.replicas,
        "processes": processes_of(job.strategy),
        **({"device": device_kind()} if config.runtime.backend == "jax" and device_kind() != "cpu" else {}),
        "global_batch_size": job.global_batch,
        "distance": config.resolved("distance"),
        "learning_rate": config.resolved("learning_rate"),
        "config": config.flags(),   # flat, by flag
    }


def _export(job: _Job, word_ids: WordIds | None, encoder, model, summary: dict) -> None:
    """The chief writes the encoder (and its copies: sentence-transformers, serving, Vertex AI),
    history.json and the curves; then the backup goes: a kill before this point resumes here.
    Under JAX the strings-in SavedModels come from a TensorFlow process (`model.export --format saved-model`) that
    loads the weights tested here."""
    config, runtime, model_dir = job.config, job.config.runtime, job.model_dir
    tested = f"{model_dir}/{BACKUP}/tested.weights.h5"
    if runtime.backend == "jax":   # by every process: under several, Keras' saving runs collectives
        os.makedirs(os.path.dirname(tested), exist_ok=True)
        model.save_weights(tested)
    if is_chief(job.strategy):
        LOG.info("exporting the encoder to %s/encoder and writing history.json and the curves", runtime.model_dir)
        if runtime.backend == "jax":
            export_in_tensorflow(model_dir, tested)
        else:
            from model.formats.saved_model import write_saved_models
            from model.net.transformer import token_ids

            write_saved_models(config, word_ids or token_ids(config.inputs.max_tokens, config.network.encoder,
                                                             config.network.checkpoint), encoder, model_dir)
        if config.network.kind.exports_sentence_transformers:   # the same weights for sentence-transformers / HF users
            export_sentence_transformers(encoder, summary, config, model_dir)
        ModelDir(model_dir).write_history(summary)
        plot_history(summary, f"{model_dir}/training_curve.png")
        plot_learning_curve(summary, f"{model_dir}/learning_curve.png")
    shutil.rmtree(f"{model_dir}/{BACKUP}", ignore_errors=True)   # only now: a kill before this resumes at the export
    LOG.info("validation triplet accuracy %.4f (untrained %.4f), test %.4f; encoder at %s/encoder",
             summary["best_val_triplet_accuracy"], summary["untrained_val_triplet_accuracy"],
             summary["test_triplet_accuracy"], runtime.model_dir)


def export_in_tensorflow(model_dir: str, weights: str) -> None:
    """Runs `python -m model.export --format saved-model` under the TensorFlow backend on the
    weights a JAX run tested: a SavedModel holds TensorFlow functions, which a JAX process cannot
    trace. Where TensorFlow is not installed (an accelerator image), the model dir keeps its
    checkpoints and sentence-transformers folder, and the log says which command writes
    `encoder/` elsewhere."""
    import subprocess

    from model import tensorflow_installed

    if not tensorflow_installed():
        LOG.warning("no TensorFlow here: encoder/ not written; where TensorFlow is installed run: python -m "
                    "model.export --model-dir %s --format saved-model", model_dir)
        return
    command = [sys.executable, "-m", "model.export", "--model-dir", model_dir, "--format", "saved-model",
               "--weights", weights]
    done = subprocess.run(command, env={**os.environ, "KERAS_BACKEND": "tensorflow"}, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}): {done.stderr[-2000:]}")


def export_sentence_transformers(encoder, summary: dict, config: TrainConfig, model_dir: str) -> None:
    """`<model-dir>/sentence-transformers`: the fine-tuned transformer for sentence-transformers
    (`model.formats.hf`)."""
    from model.formats.hf import EXPORT_FOLDER, model_card, write_sentence_transformers
    from model.net.backbone import checkpoint_dir

    similarity, max_tokens = config.resolved("distance"), config.inputs.max_tokens
    card = model_card(summary, os.path.basename(config.runtime.model_dir.rstrip("/")), similarity, max_tokens, [],
                      int(encoder.output_shape[-1]))
    final, partial = f"{model_dir}/{EXPORT_FOLDER}", f"{model_dir}/{EXPORT_FOLDER}.partial"
    shutil.rmtree(partial, ignore_errors=True)   # the trainer's own (RUN_ENTRIES); swapped in whole below
    os.makedirs(partial)
    write_sentence_transformers(encoder, checkpoint_dir(config.network.encoder, config.network.checkpoint), partial,
                                max_tokens=max_tokens, similarity=similarity, card=card)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # JAX logs at INFO that a CPU or GPU machine has no TPU library: not news to anyone there.
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(run_cli(main))
