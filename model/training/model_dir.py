"""A model dir: the one hand-off between a trainer (`model.train` under any backend, `model.soup`,
`model.pretrained`) and every reader of it (`eval.all` and its report, `model.export`,
`model.curves`, the model card, `infra.scale_benchmark`). Its files are
named here once; each is written whole (`core.files.write_complete`) and read back by
one typed reader (`read_json_object`), so a truncated or foreign file is one `error:` line naming
it, and a reader never meets a history without a field it relies on.

    MODEL/inputs.json                 what the run was trained on, its flags (`model.train`)
    MODEL/history.json                the run's record: curves, scores, counts (HISTORY_FIELDS)
    MODEL/checkpoints/best.weights.h5 the best validation epoch (Keras weights, any backend)
    MODEL/encoder/                    strings-in SavedModel (`model.formats.saved_model`; `--format saved-model`)
    MODEL/sentence-transformers/      the same weights for sentence-transformers (transformers only)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from core.cli import UsageError
from core.files import exists, read_json_object, write_complete

INPUTS = "inputs.json"
HISTORY = "history.json"
CHECKPOINTS = "checkpoints"
BEST_WEIGHTS = f"{CHECKPOINTS}/best.weights.h5"
BEST_WEIGHTS_PARTIAL = f"{CHECKPOINTS}/best.partial.weights.h5"   # written, then renamed to BEST_WEIGHTS
BEST_SCORE = f"{CHECKPOINTS}/best.json"   # the best epoch's score: a resumed run keeps a better checkpoint
ENCODER = "encoder"
SENTENCE_TRANSFORMERS = "sentence-transformers"
VOCABULARY = "vocabulary.txt"
BACKUP = "backup"
# In the backup (`model.training.callbacks.AtomicBackup`): the last epoch's weights, its state
# ({"epoch": epochs completed, "step": optimizer steps}) and the completed epochs' record
# ({"history": {metric: [one value per completed epoch]}, "learning_curve": [LearningCurve's
# points], "at_epoch_end": whether the backup was written at its last epoch's end}).
BACKUP_WEIGHTS = "latest.weights.h5"
BACKUP_STATE = "training_state.json"
BACKUP_EPOCHS = "epochs.json"
FIT_RECORD = "fit.json"   # in the backup, once `fit` returned: its history, for a rerun that only exports
TESTED_WEIGHTS = "tested.weights.h5"   # in the backup: the weights a JAX run tested, for its TensorFlow export
LOGS = "logs"
SERVING = "serving"        # `--serving-version N`: serving/N, the folder TensorFlow Serving loads
VERTEX_MODEL = "model"     # where Vertex AI looks for the model (AIP_MODEL_DIR)
TRAINING_CURVE = "training_curve.png"
LEARNING_CURVE = "learning_curve.png"
# What a training run writes into its model dir, and only that: `--overwrite` deletes these and
# nothing else. `inputs.json` is the claim: a non-empty folder without it is not a model dir.
CLAIM = INPUTS
RUN_ENTRIES = (CLAIM, VOCABULARY, f"{VOCABULARY}.partial", BACKUP, f"{BACKUP}.partial", f"{BACKUP}.previous",
               CHECKPOINTS, LOGS, HISTORY, TRAINING_CURVE, LEARNING_CURVE, ENCODER, f"{ENCODER}.partial", SERVING,
               VERTEX_MODEL, f"{VERTEX_MODEL}.partial", SENTENCE_TRANSFORMERS, f"{SENTENCE_TRANSFORMERS}.partial")
# What a non-chief worker copies from the chief's model dir into its own before training: a
# restarted job resumes every worker from the chief's backup and best-epoch score.
RESUME_ENTRIES = (BACKUP, CHECKPOINTS)
# history.json, key by key with its type, as its one writer (`ModelDir.write_history`) checks it:
# what every trainer writes (`model.training.steps`, `model.soup`) and its readers rely on, then what
# a run may leave out (None where it does not apply), then Keras' per-epoch lists (`loss`,
# `val_triplet_accuracy`, ... : one float per epoch) and a soup's own keys.
NUMBER = (int, float)
HISTORY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "learning_curve": list, "best_val_triplet_accuracy": NUMBER, "untrained_val_triplet_accuracy": NUMBER,
    "evaluation_triplets": (int, str), "record_counts": dict, "config": dict, "distance": str,
    "global_batch_size": int, "replicas": int,
}
HISTORY_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "untrained_val_loss": NUMBER, "mean_vectors_val_triplet_accuracy": NUMBER, "test_triplet_accuracy": NUMBER,
    "test_loss": NUMBER, "epochs_run": int, "stopped_by_budget": bool, "seconds_to_first_step": NUMBER,
    "vocabulary_size": int, "skipped_records": dict, "trained_on": dict, "processes": int, "device": str,
    "learning_rate": NUMBER, "delta_scale": NUMBER, "soup": dict,
}
EPOCH_KEYS = ("loss", "triplet_accuracy", "val_loss", "val_triplet_accuracy")   # Keras' `fit` history


def _of_type(value: object, kind: type | tuple[type, ...]) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def history_errors(summary: dict) -> list[str]:
    """What in `summary` is not a history.json: a field of HISTORY_FIELDS missing, a field of
    another type than HISTORY_FIELDS, HISTORY_OPTIONAL (or None) or EPOCH_KEYS (lists) say, a key
    none of them defines."""
    errors = [f"lacks {name}" for name in HISTORY_FIELDS if name not in summary]
    for name, value in summary.items():
        kind = HISTORY_FIELDS.get(name) or HISTORY_OPTIONAL.get(name) or (list if name in EPOCH_KEYS else None)
        if kind is None:
            errors.append(f"holds {name}, which history.json does not define")
        elif not (_of_type(value, kind) or (value is None and name in HISTORY_OPTIONAL)):
            errors.append(f"{name} is {type(value).__name__}")
    return errors


@dataclass(frozen=True)
class History:
    """history.json read back, typed: HISTORY_FIELDS and HISTORY_OPTIONAL as attributes (an
    optional one None where the run left it out), Keras' per-epoch lists (EPOCH_KEYS) in `epochs`,
    and `record`, the object as written, which a soup carries forward into its own. Its readers
    (the model card, `eval.all`'s curves, `model.curves`, `model.soup`, `infra.scale_benchmark`)
    read these attributes, never the raw object."""

    learning_curve: list[dict]
    best_val_triplet_accuracy: float
    untrained_val_triplet_accuracy: float
    evaluation_triplets: int | str
    record_counts: dict[str, dict]
    config: dict
    distance: str
    global_batch_size: int
    replicas: int
    untrained_val_loss: float | None
    mean_vectors_val_triplet_accuracy: float | None
    test_triplet_accuracy: float | None
    test_loss: float | None
    epochs_run: int | None
    stopped_by_budget: bool | None
    seconds_to_first_step: float | None
    vocabulary_size: int | None
    skipped_records: dict | None
    trained_on: dict | None
    processes: int | None
    device: str | None
    learning_rate: float | None
    delta_scale: float | None
    soup: dict | None
    epochs: dict[str, list[float]]
    record: dict = field(repr=False, compare=False)

    @classmethod
    def of(cls, record: dict) -> History:
        """The History of `record`, a summary that holds HISTORY_FIELDS (as every reader and the
        writer check it); keys it does not define are kept in `record` alone."""
        known: dict[str, Any] = {name: record.get(name) for name in (*HISTORY_FIELDS, *HISTORY_OPTIONAL)}
        return cls(**known, epochs={name: record[name] for name in EPOCH_KEYS if name in record}, record=record)

    def expected_records(self, split: str) -> int | None:
        """The records `split` was expected to hold (`record_counts`), None where not recorded."""
        return (self.record_counts.get(split) or {}).get("expected")


@dataclass(frozen=True)
class ModelDir:
    """A model dir at `path` (local or gs://): its files' paths, and their typed readers and writer."""

    path: str

    def file(self, name: str) -> str:
        return f"{self.path.rstrip('/')}/{name}"

    @property
    def best_weights(self) -> str:
        return self.file(BEST_WEIGHTS)

    @property
    def encoder(self) -> str:
        return self.file(ENCODER)

    @property
    def sentence_transformers(self) -> str:
        return self.file(SENTENCE_TRANSFORMERS)

    def has(self, name: str) -> bool:
        return exists(self.file(name))

    def history(self) -> History | None:
        """HISTORY, checked to hold HISTORY_FIELDS; None where there is none (an untrained
        export: `model.pretrained`)."""
        return History.of(read_json_object(self.file(HISTORY), HISTORY_FIELDS)) if self.has(HISTORY) else None

    def write_history(self, summary: dict) -> None:
        errors = history_errors(summary)
        if errors:   # a trainer's bug, not an input: every reader would fail on it later
            raise ValueError(f"{self.file(HISTORY)}: the summary {'; '.join(errors)}")
        write_complete(self.file(HISTORY), json.dumps(summary, indent=2).encode())

    def recorded_flags(self) -> dict:
        """The flags `inputs.json` records (`model.training.claim.recorded_flags`); a UsageError naming the
        folder when it has none (not a `model.train` model dir) or the file when it is not one."""
        if not self.has(INPUTS):
            raise UsageError(f"--model-dir {self.path}: no {INPUTS} (not a model.train model dir)")
        return read_json_object(self.file(INPUTS), {"flags": dict})["flags"]
