"""The written forms of a trained run (`model.train`'s export step, `model.soup`): the
strings-in SavedModels (ENCODER, and SERVING/N, Vertex AI's VERTEX_MODEL) and, for a
transformer, SENTENCE_TRANSFORMERS."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

from model import tensorflow_installed
from model.checkpoints import CHECKPOINTS
from model.config import TrainConfig
from model.formats.hf import model_card, write_sentence_transformers
from model.training.model_dir import ENCODER, SENTENCE_TRANSFORMERS, History

LOG = logging.getLogger(__name__)


def export_run(config: TrainConfig, model_dir: str, word_ids, encoder, tested: str, summary: dict) -> None:
    """The trained Net's forms in the local `model_dir` (`model.training.steps.Export`). Under JAX the
    SavedModels come from a TensorFlow process that loads the weights the run `tested` (into a
    float32 Net: `model.encoding.trained_net.rebuilt`); here they trace a float32 twin of `encoder`
    (`model.formats.saved_model.float32_encoder`). The sentence-transformers folder holds the
    weights alone (float32 variables under either `--precision`)."""
    if config.runtime.backend == "jax":
        export_in_tensorflow(model_dir, tested)
    else:
        from model.formats.saved_model import write_saved_models  # TensorFlow, which a JAX process may lack

        write_saved_models(config, word_ids, encoder, model_dir)
    if config.network.kind.exports_sentence_transformers:   # the same weights for sentence-transformers / HF users
        export_sentence_transformers(encoder, summary, config, model_dir)


def export_in_tensorflow(model_dir: str, weights: str) -> None:
    """Runs `python -m model.export --format saved-model` under the TensorFlow backend on the
    weights a JAX run tested: a SavedModel holds TensorFlow functions, which a JAX process cannot
    trace. Where TensorFlow is not installed (an accelerator image), the model dir keeps its
    checkpoints and sentence-transformers folder, and the log says which command writes
    the ENCODER elsewhere."""
    if not tensorflow_installed():
        LOG.warning("no TensorFlow here: %s/ not written; where TensorFlow is installed run: python -m "
                    "model.export --model-dir %s --format saved-model", ENCODER, model_dir)
        return
    command = [sys.executable, "-m", "model.export", "--model-dir", model_dir, "--format", "saved-model",
               "--weights", weights]
    done = subprocess.run(command, env={**os.environ, "KERAS_BACKEND": "tensorflow"}, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}): {done.stderr[-2000:]}")


def export_sentence_transformers(encoder, summary: dict, config: TrainConfig, model_dir: str) -> None:
    """SENTENCE_TRANSFORMERS in the model dir: the fine-tuned transformer for sentence-transformers
    (`model.formats.hf`)."""
    similarity, max_tokens = config.resolved("distance"), config.inputs.max_tokens
    card = model_card(History.of(summary), summary["config"], os.path.basename(config.runtime.model_dir.rstrip("/")),
                      similarity, max_tokens, [], int(encoder.output_shape[-1]))
    final, partial = f"{model_dir}/{SENTENCE_TRANSFORMERS}", f"{model_dir}/{SENTENCE_TRANSFORMERS}.partial"
    shutil.rmtree(partial, ignore_errors=True)   # the trainer's own (RUN_ENTRIES); swapped in whole below
    os.makedirs(partial)
    write_sentence_transformers(encoder, CHECKPOINTS[config.network.encoder].folder(config.network.checkpoint), partial,
                                max_tokens=max_tokens, similarity=similarity, card=card)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
