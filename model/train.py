"""Trains the triplet network on the pipeline's shards and exports the strings-in encoder.

    python -m model.train --data DIR_OR_GS --model-dir DIR [--dataset triplets-sen]
        [--embeddings GLOVE.txt] [--epochs N] [--steps N] [--batch-size N]
        [--distribution-strategy auto|one_device|mirrored|multi_worker|tpu] ...   (flags = TrainConfig)

Writes into the model dir (its entries named in `model.training.model_dir`): the vocabulary
(VOCABULARY), the backup (BACKUP: `model.training.callbacks.AtomicBackup`, replaced whole every
`--checkpoint-every` steps: a killed job resumes from its last backup, at the step it holds; it is
deleted once the export is complete, so a job killed between training and export resumes at the
export), the best checkpoint (BEST_WEIGHTS and BEST_SCORE: the best validation epoch, which is
tested and exported), TensorBoard's LOGS, the HISTORY, the TRAINING_CURVE and the ENCODER
(SavedModel: 1-D tf.string -> {"embeddings": [n, d]}); for a transformer also SENTENCE_TRANSFORMERS
(`model.export`: the same weights for sentence-transformers and Hugging Face users).

How it trains and resumes: `model.training.steps`.
"""
from __future__ import annotations

import logging
import os
import sys
import time

from core.cli import UsageError, refuse_file_as_folder, run_cli
from model import KERAS_BACKEND_DEFAULTED, keep_tensorflow_out, tensorflow_installed
from model.config import TrainConfig, parse_args
from model.encoding.trained_net import load_trained
from model.formats.trained import export_run
from model.training.job import run_job
from model.training.shards import needs_tensorflow


def use_backend(config: TrainConfig) -> None:
    """Sets KERAS_BACKEND to `--backend` before Keras loads (Keras reads it once, at its import).
    A UsageError where another backend was chosen: KERAS_BACKEND set otherwise, or Keras
    already loaded under another backend (an in-process caller)."""
    backend = config.runtime.backend
    if "keras" in sys.modules:
        loaded = sys.modules["keras"].backend.backend()
        if loaded != backend:
            raise UsageError(f"--backend {backend}: Keras is already loaded in this process under {loaded}; run "
                             "python -m model.train in its own process")
        return
    chosen = os.environ.get("KERAS_BACKEND")
    if chosen and chosen != backend and not KERAS_BACKEND_DEFAULTED:
        raise UsageError(f"KERAS_BACKEND={chosen} but --backend {backend}: pass --backend {chosen}, or unset "
                         "KERAS_BACKEND")
    os.environ["KERAS_BACKEND"] = backend
    if backend == "jax" and needs_tensorflow(config) is None:   # nothing of this run needs it
        keep_tensorflow_out()


def refuse_without_tensorflow(config: TrainConfig) -> None:
    """A UsageError, before any work, for a run that needs TensorFlow where it is not installed
    (an accelerator image): a transformer under JAX trains without it, taught by a model dir too."""
    needs = "--backend tensorflow" if config.runtime.backend != "jax" else needs_tensorflow(config)
    if needs and not tensorflow_installed():
        raise UsageError(f"{needs} needs TensorFlow, which is not installed here; under --backend jax a transformer "
                         "trains without it (its --teacher a model dir)")


def train(config: TrainConfig, extra_callbacks: list | None = None) -> dict:
    """Trains, exports the model dir's encoder, returns the summary also written to its history:
    checks what can be checked before Keras loads, picks the backend, and hands the job over
    (`model.training.job.run_job`) with the doors to the rooms above training: the teacher's
    loader (`model.encoding`) and the export (`model.formats.trained`)."""
    started = time.monotonic()   # seconds_to_first_step count from here
    refuse_file_as_folder("--model-dir", config.runtime.model_dir)
    use_backend(config)
    refuse_without_tensorflow(config)
    return run_job(config, started, extra_callbacks, load_teacher=load_trained, export=export_run)


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # JAX logs at INFO that a CPU or GPU machine has no TPU library: not news to anyone there.
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(run_cli(main))
