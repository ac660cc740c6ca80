"""The training job of `model.train` (`run_job`): Keras loaded first, under the backend the flags
name (TensorFlow's without JAX: `_keras_without_jax`), then the job's steps, which import Keras at
their top (`model.training.steps`: how it trains and resumes)."""
from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from model.config import TrainConfig

if TYPE_CHECKING:
    from model.training.steps import Export, Teacher


def run_job(config: TrainConfig, started: float, extra_callbacks: list | None, load_teacher: Callable[[str], Teacher],
            export: Export) -> dict:
    """Trains under the backend `config` names (set before Keras loads: `model.train.use_backend`),
    writes the model dir, returns the summary also written to its HISTORY. `started`: when the
    command started (`seconds_to_first_step` counts from it)."""
    keras = _keras_without_jax(config.runtime.backend)
    from model.training.steps import train  # the steps load Keras at their import: after the line above

    keras.utils.set_random_seed(config.runtime.seed)
    return train(config, started, extra_callbacks, load_teacher, export)


class _JaxKeptOut(importlib.abc.MetaPathFinder):
    """Answers an import of JAX as where it is not installed (`_keras_without_jax`)."""

    def find_spec(self, name, path=None, target=None):
        if name == "jax" or name.startswith("jax."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def _keras_without_jax(backend: str):
    """Keras, imported under TensorFlow without JAX: TensorFlow's own import (tf.compat.v1.lite)
    loads JAX where it is installed, for TFLite's converter alone: 110 MB of a training run's
    resident memory (docs/results.md, 2026-11-28). A later import of JAX still works."""
    if backend != "tensorflow" or "keras" in sys.modules or "jax" in sys.modules:
        import keras

        return keras
    finder = _JaxKeptOut()
    sys.meta_path.insert(0, finder)
    try:
        import keras
        import tensorflow  # noqa: F401   (the import that would load JAX, whether or not Keras loads it now)
    finally:
        sys.meta_path.remove(finder)
    return keras
