"""The steps of `model.train`'s training job (`model.training.job.run_job` imports them once Keras is
loaded): claim the model dir, read the data, build the model, fit it (resuming from a backup),
score it and write the model dir (`train`).

Resuming: the training stream is the same seeded stream in every run (shards read in a fixed
order), so a resumed run starts it at the backup's optimizer step: no batch is trained twice, none
is skipped, and the epoch count goes on from the backup's epoch. The epoch the job was killed in
then runs a full `--steps` from that step (Keras cannot run a shorter first epoch), so a resumed
run of N epochs trains at most one epoch's steps more than an unbroken one. With pass-long
epochs (`--steps none`) the interrupted pass restarts. The time budget counts from each start.

A remote model dir (`gs://...`, any Beam FileSystems scheme) is staged in a local directory
(`core.storage`): its contents are downloaded first, so a preempted job resumes from its
backup; every new backup is mirrored up as soon as it is written (with the previous epoch's
checkpoint and logs); everything is uploaded at the end.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import keras
import numpy as np

from core.files import recover_folder, write_complete
from core.folders import reading
from core.published import Run
from core.splits import SPLITS
from core.storage import TreeMirror, staged
from model.checkpoints import CHECKPOINTS as PRETRAINED
from model.config import TrainConfig
from model.net.network import build_models
from model.net.wordpieces import wordpieces
from model.similarity import Similarity
from model.training.arrays import SplitBatches, Tokenizer, TripletInput
from model.training.callbacks import (
    AtomicBackup,
    BestCheckpoint,
    FirstStep,
    KeepInterrupts,
    LearningCurve,
    MirrorBackups,
    TimeBudget,
    optimizer_step,
    read_backup_state,
    tensorboard_log,
)
from model.training.claim import check_lost_records, claim_model_dir
from model.training.devices import (
    KerasDevices,
    Strategy,
    device_kind,
    is_chief,
    processes_of,
    strategy_of,
    worker_temp_dir,
)
from model.training.model_dir import (
    BACKUP,
    BACKUP_WEIGHTS,
    CHECKPOINTS,
    ENCODER,
    FIT_RECORD,
    HISTORY,
    LEARNING_CURVE,
    LOGS,
    RESUME_ENTRIES,
    TESTED_WEIGHTS,
    TRAINING_CURVE,
    ModelDir,
)
from model.training.plots import plot_history, plot_learning_curve
from model.training.shards import TripletDataError, open_run, triplet_split
from model.training.vocabulary import build_vocabulary, embedding_matrix

if TYPE_CHECKING:   # annotations only: the BiLSTM's tokenizer is TensorFlow's, which a JAX run may not load
    from model.net.text import WordIds

LOG = logging.getLogger(__name__)


class Teacher(Protocol):
    """`--teacher`: a trained encoder (`model.encoding.trained_net.load_trained`)."""

    dim: int

    def encode(self, sentences: list[str]) -> np.ndarray: ...


# (config, local model dir, the BiLSTM's word ids or None, Net, the tested weights under JAX, the
# summary) -> None: writes the trained encoder's forms (`model.formats.trained.export_run`).
Export = Callable[[TrainConfig, str, "WordIds | None", object, str, dict], None]


def train(config: TrainConfig, started: float, extra_callbacks: list | None, load_teacher: Callable[[str], Teacher],
          export: Export) -> dict:
    """`model.training.job.run_job` once Keras is loaded: trains, writes the model dir, returns the
    summary also written to its HISTORY. `started`: when the command started (`seconds_to_first_step`
    counts from it)."""
    run = open_run(config.inputs.data)
    strategy = strategy_of(config)
    chief = is_chief(strategy)
    # A reader's lease on the data for the whole run: no pipeline.run --overwrite replaces it meanwhile.
    with reading(run), staged(config.runtime.model_dir, push=chief) as (model_dir, mirror):
        if chief:
            return _train(Job(config, run, strategy, model_dir, mirror, load_teacher, export), extra_callbacks,
                          started)
        with worker_temp_dir(strategy) as own_dir:
            return _train(Job(config, run, strategy, own_dir, None, load_teacher, export), extra_callbacks, started,
                          resume_from=model_dir)


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
    recover_folder(backup_dir)
    state = read_backup_state(backup_dir)
    if state is None:
        return {"epoch": 0, "step": 0, "history": {}, "learning_curve": [], "at_epoch_end": False}
    model.optimizer.build(model.trainable_variables)
    model.load_weights(f"{backup_dir}/{BACKUP_WEIGHTS}")
    return {**state, "epoch": int(state["epoch"]), "step": optimizer_step(model)}



@dataclass(frozen=True)
class Job:
    """What every step of `_train` reads: the flags, the data, where it runs and where it writes,
    and the entry point's doors to the rooms above training: `load_teacher` (`--teacher`: a
    path -> a `Teacher`) and `export` (the trained encoder's written forms, `model.formats`)."""

    config: TrainConfig
    run: Run
    strategy: Strategy
    model_dir: str   # local; `mirror` pushes it to a remote one
    mirror: TreeMirror | None
    load_teacher: Callable[[str], Teacher]
    export: Export

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def global_batch(self) -> int:
        return self.config.optimizer.batch_size * self.replicas


@dataclass(frozen=True)
class Data:
    """The data step's result: the id space, the teacher, the input, its validation batches (as
    arrays, and as the backend reads them), and each split's record count, counted in the
    background until the score step needs it."""

    word_ids: WordIds | None       # the BiLSTM's in-graph tokenizer (None for a transformer: its wordpieces)
    vocabulary_size: int | None    # None for a transformer (its own wordpieces)
    # The BiLSTM's word vectors, until the model holds them (`released`): 80 MB of GloVe 6B beside
    # the variable's own copy all through training otherwise.
    matrix: np.ndarray | None
    teacher: Teacher | None
    source: TripletInput
    validation: SplitBatches
    record_counts: dict[str, concurrent.futures.Future]

    def evaluation(self, split: str, strategy: Strategy):
        """A split's evaluation batches as the backend reads them: a PyDataset under JAX, a
        tf.data dataset of the same batches under TensorFlow (`model.training.tf_input`)."""
        batches = self.validation if split == "validation" else self.source.evaluation(split)
        if isinstance(strategy, KerasDevices):
            return batches
        from model.training.tf_input import evaluation  # TensorFlow, which a JAX run may not load

        return evaluation(batches, self.source)

    def training(self, strategy: Strategy, resume_at_step: int):
        """The training stream as the backend reads it (`model.training.tf_input.training` under TensorFlow)."""
        if isinstance(strategy, KerasDevices):
            return self.source.training(resume_at_step)
        from model.training.tf_input import training  # TensorFlow, which a JAX run may not load

        return training(self.source, strategy, resume_at_step)


def _train(job: Job, extra_callbacks: list | None, started: float, resume_from: str | None = None) -> dict:
    """`train` with every file in the local dir `job.model_dir`; `job.mirror` pushes it to a
    remote one. `resume_from`: a non-chief worker's view of the chief's model dir (RESUME_ENTRIES)."""
    LOG.info("strategy %s, %d replica(s), global batch %d", type(job.strategy).__name__, job.replicas,
             job.global_batch)
    teacher = _prepare(job, resume_from)
    data = _data(job, teacher)
    encoder, model, initial_weights = _model(job, data)
    data = released(job.config, data)
    fit_record, best = _fit(job, data, model, extra_callbacks, started)
    summary = _score(job, data, model, initial_weights, fit_record, best)
    _export(job, data.word_ids, encoder, model, summary)
    return summary


def _prepare(job: Job, resume_from: str | None) -> Teacher | None:
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
    # a bad path is refused before the claim; a teacher is an encoder of sentences (`load_trained`)
    teacher = job.load_teacher(optimizer.teacher) if optimizer.teacher else None
    if config.network.kind.pretrained:   # an absent, truncated or other checkpoint too: no INPUTS left behind
        PRETRAINED[config.network.encoder].folder(config.network.checkpoint)
    claim_model_dir(config, job.model_dir, run)
    for entry in RESUME_ENTRIES if resume_from else ():
        if resume_from and os.path.isdir(os.path.join(resume_from, entry)):
            shutil.copytree(os.path.join(resume_from, entry), os.path.join(job.model_dir, entry))
    return teacher


def _data(job: Job, teacher: Teacher | None) -> Data:
    """The id space (the BiLSTM's vocabulary and word vectors, or a transformer's wordpieces), the
    input (`model.training.arrays.TripletInput`) and its validation batches; starts counting every
    split's records."""
    config, run, inputs, strategy = job.config, job.run, job.config.inputs, job.strategy
    word_ids: WordIds | None = None
    vocabulary, matrix = None, None
    tokenizer: Tokenizer
    if config.network.kind.reads_word_vectors:
        from model.net.text import ArrayIds, WordIds  # TensorFlow's tokenizer: the BiLSTM's alone

        vocabulary = build_vocabulary(config, run, job.model_dir)
        word_ids = WordIds(vocabulary, inputs.num_oov_buckets, inputs.max_tokens)
        matrix = embedding_matrix(vocabulary, word_ids, config)
        tokenizer = ArrayIds(word_ids)
    else:   # the checkpoint's own wordpiece vocabulary; no word vectors
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
    return Data(word_ids, len(vocabulary) if vocabulary is not None else None, matrix, teacher, source,
                source.evaluation("validation"), record_counts)


def released(config: TrainConfig, data: Data) -> Data:
    """`data` without its NumPy word vectors once the model's variable holds them: frozen vectors
    (the paper's) are read back from the variable for the mean-vectors baseline (`word_vectors`);
    fine-tuned ones are kept, as the baseline averages the pre-trained vectors."""
    return data if config.network.fine_tune_embeddings else dataclasses.replace(data, matrix=None)


def word_vectors(model) -> np.ndarray:
    """The BiLSTM's frozen word vectors, as its Embedding variable (`word_vectors`) holds them."""
    (variable,) = (variable for variable in model.variables if variable.path.endswith("word_vectors/embeddings"))
    return np.asarray(variable.numpy())



def _model(job: Job, data: Data) -> tuple:
    """(sentence encoder, compiled triplet model, its initial weights). The untrained model is
    scored from these weights after training (`_score`), not before it: on a transformer that
    pass (and, under JAX, its compilation) would delay the first step by a minute."""
    with job.strategy.scope():
        encoder, model = build_models(job.config, data.matrix, job.global_batch,
                                      data.teacher.dim if data.teacher else None)
    return encoder, model, [np.array(variable.numpy()) for variable in model.trainable_variables]


def _untrained_scores(job: Job, model, initial_weights: list[np.ndarray], validation_batches) -> dict:
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


def _fit(job: Job, data: Data, model, extra_callbacks: list | None,
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
    backup = f"{job.model_dir}/{BACKUP}"
    with job.strategy.scope():   # the optimizer's variables are built where the model's live
        state = restored_state(model, backup)
    best = BestCheckpoint(f"{job.model_dir}/{CHECKPOINTS}")
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


def _fit_epochs(job: Job, data: Data, model, state: dict, best: BestCheckpoint, extra_callbacks: list | None,
                started: float) -> dict:
    """`_fit`'s `fit`, from the epoch after the backup's completed ones (`state`) to `--epochs`."""
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
    earlier = state["history"]   # the backup's completed epochs
    history = {key: [*earlier.get(key, []), *(float(v) for v in values)] for key, values in fit.history.items()}
    return {"history": history, "stopped_by_budget": bool(budget and budget.stopped),
            "learning_curve": curve.points, "seconds_to_first_step": first_step.seconds}


def _fitted_before(job: Job, model, state: dict, best: BestCheckpoint) -> dict:
    """The fit's record when the backup holds every epoch `--epochs` allows (`_fit`): its history
    and learning curve. A backup written at its last epoch's end holds the weights that epoch's
    validation scored, offered again to `best` (a job that failed writing the best checkpoint
    keeps that epoch). A backup without its epochs' history is one clear error."""
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
    return {"history": history, "stopped_by_budget": False, "learning_curve": state["learning_curve"],
            "seconds_to_first_step": None}


def _callbacks(job: Job, best: BestCheckpoint, curve: LearningCurve, budget: TimeBudget | None,
               extra_callbacks: list | None) -> list:
    """The fit's callbacks: the learning curve (first: an epoch's point goes into its backup),
    backups (mirrored up at once), the best epoch, early stopping, TensorBoard, the time budget,
    and the caller's."""
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
        tensorboard_log(f"{job.model_dir}/{LOGS}", runtime.checkpoint_every),
        *([budget] if budget else []),
        *(extra_callbacks or []),
    ]


def _score(job: Job, data: Data, model, initial_weights: list[np.ndarray], fit_record: dict,
           best: BestCheckpoint) -> dict:
    """The best epoch (of this run or a killed one) on the test split, every split's records
    checked (TripletDataLoss past `--max-lost-fraction`), and the summary HISTORY holds."""
    config, inputs = job.config, job.config.inputs
    best.restore(model)   # the best epoch's weights, unless the model holds them (the last epoch)

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
    history, vocabulary_size = fit_record["history"], data.vocabulary_size
    matrix = data.matrix if data.matrix is not None or vocabulary_size is None else word_vectors(model)
    return {
        **history,
        "untrained_val_triplet_accuracy": float(untrained["triplet_accuracy"]),
        "untrained_val_loss": float(untrained["loss"]),
        "mean_vectors_val_triplet_accuracy": (mean_vectors_accuracy(data.validation, matrix, vocabulary_size)
                                              if matrix is not None and vocabulary_size is not None else None),
        "evaluation_triplets": inputs.evaluation_triplets or "all",
        "best_val_triplet_accuracy": float(best.best),
        "test_triplet_accuracy": float(test["triplet_accuracy"]),
        "test_loss": float(test["loss"]),
        "epochs_run": len(history["loss"]),
        "stopped_by_budget": fit_record["stopped_by_budget"],
        "seconds_to_first_step": fit_record.get("seconds_to_first_step"),
        "learning_curve": fit_record["learning_curve"],
        "vocabulary_size": vocabulary_size or None,
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


def _export(job: Job, word_ids: WordIds | None, encoder, model, summary: dict) -> None:
    """The chief writes the encoder and its copies (`job.export`: sentence-transformers, serving,
    Vertex AI), the HISTORY and the curves; then the backup goes: a kill before this point
    resumes here. Under JAX the weights tested here are saved first (by every process: under
    several, Keras' saving runs collectives), for the TensorFlow process that writes the SavedModels."""
    config, runtime, model_dir = job.config, job.config.runtime, job.model_dir
    tested = f"{model_dir}/{BACKUP}/{TESTED_WEIGHTS}"
    if runtime.backend == "jax":   # by every process: under several, Keras' saving runs collectives
        os.makedirs(os.path.dirname(tested), exist_ok=True)
        model.save_weights(tested)
    if is_chief(job.strategy):
        LOG.info("exporting the encoder to %s/%s and writing %s and the curves", runtime.model_dir, ENCODER, HISTORY)
        job.export(config, model_dir, word_ids, encoder, tested, summary)
        ModelDir(model_dir).write_history(summary)
        plot_history(summary, f"{model_dir}/{TRAINING_CURVE}")
        plot_learning_curve(summary, f"{model_dir}/{LEARNING_CURVE}")
    shutil.rmtree(f"{model_dir}/{BACKUP}", ignore_errors=True)   # only now: a kill before this resumes at the export
    written = f"encoder at {runtime.model_dir}/{ENCODER}" if os.path.isdir(f"{model_dir}/{ENCODER}") else (
        f"model dir at {runtime.model_dir} (no {ENCODER}/: see above)")
    LOG.info("validation triplet accuracy %.4f (untrained %.4f), test %.4f; %s", summary["best_val_triplet_accuracy"],
             summary["untrained_val_triplet_accuracy"], summary["test_triplet_accuracy"], written)
