"""The BiLSTM job's memory (issue 70 item 14, docs/results.md 2026-11-28): the NumPy word vectors
are not held beside the model's variable all through training, and `--vocabulary embeddings`
does not copy the whole GloVe matrix to select every row of it."""
from __future__ import annotations

import gc
import mmap
import weakref

import numpy as np

from model.config import TrainConfig
from model.net.vectors import load_word_vectors
from model.training import job


def _config(tmp_path, **flags) -> TrainConfig:
    return TrainConfig.from_flags(data=str(tmp_path / "data"), model_dir=str(tmp_path / "model"), batch_size=16,
                                  lstm_units=8, attention_size=4, **flags)


def _mapped(array: np.ndarray) -> bool:
    """Whether `array` is a view of a mapped file (not memory of its own)."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, mmap.mmap)


def test_every_embedded_glove_word_is_read_from_the_mapped_file_not_copied():
    everything = load_word_vectors().words
    vectors = load_word_vectors(None, everything)
    assert vectors.words == everything
    assert _mapped(vectors.matrix)   # a view of the mapped .npy: no 80 MB copy
    some = load_word_vectors(None, everything[:5])
    assert some.words == everything[:5] and not _mapped(some.matrix)   # a few rows: copied, the file let go
    np.testing.assert_array_equal(some.matrix, vectors.matrix[:5])


def test_frozen_word_vectors_are_released_once_the_model_holds_them(tmp_path):
    config = _config(tmp_path)
    matrix = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    matrix[0] = 0
    _, model = job.build_models(config, matrix, 16)
    data = job.Data(None, 5, matrix, None, None, None, {})   # type: ignore[arg-type]
    held = weakref.ref(matrix)
    np.testing.assert_array_equal(job.word_vectors(model), matrix)   # what the baseline reads instead
    kept = job.released(config, data)
    del data, matrix
    gc.collect()
    assert kept.matrix is None and kept.vocabulary_size == 5
    assert held() is None   # nothing else (the Keras variable, the Data) kept the NumPy copy


def test_fine_tuned_word_vectors_keep_their_pre_trained_matrix(tmp_path):
    """The mean-vectors baseline averages the pre-trained vectors, which a fine-tuned variable no longer holds."""
    config = _config(tmp_path, fine_tune_embeddings=True)
    matrix = np.ones((7, 5), np.float32)
    data = job.Data(None, 5, matrix, None, None, None, {})   # type: ignore[arg-type]
    assert job.released(config, data).matrix is matrix


def test_keras_under_tensorflow_is_loaded_without_jax():
    """TensorFlow's import loads JAX (for TFLite) where it is installed: 110 MB the trainer never
    uses under TensorFlow. Kept out while Keras loads (a fresh process: Keras loads once), and
    importable afterwards."""
    import os
    import subprocess
    import sys

    code = ("import sys\n"
            "from model.training.job import _keras_without_jax\n"
            "keras = _keras_without_jax('tensorflow')\n"
            "assert keras.backend.backend() == 'tensorflow' and 'tensorflow' in sys.modules\n"
            "assert 'jax' not in sys.modules, 'JAX loaded with Keras'\n"
            "import jax\n")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
