"""The BiLSTM job's memory (issue 70 item 14, docs/results.md 2026-11-28): the NumPy word vectors
are not held beside the model's variable all through training, and `--vocabulary embeddings`
does not copy the whole GloVe matrix to select every row of it."""
from __future__ import annotations

import gc
import mmap
import weakref

import numpy as np

from model.config import TrainConfig
from model.net.network import build_models
from model.net.vectors import load_word_vectors
from model.training import steps


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
    _, model = build_models(config, matrix, 16)
    data = steps.Data(None, 5, matrix, None, None, None, {})   # type: ignore[arg-type]
    held = weakref.ref(matrix)
    np.testing.assert_array_equal(steps.word_vectors(model), matrix)   # what the baseline reads instead
    kept = steps.released(config, data)
    del data, matrix
    gc.collect()
    assert kept.matrix is None and kept.vocabulary_size == 5
    assert held() is None   # nothing else (the Keras variable, the Data) kept the NumPy copy


def test_fine_tuned_word_vectors_keep_their_pre_trained_matrix(tmp_path):
    """The mean-vectors baseline averages the pre-trained vectors, which a fine-tuned variable no longer holds."""
    config = _config(tmp_path, fine_tune_embeddings=True)
    matrix = np.ones((7, 5), np.float32)
    data = steps.Data(None, 5, matrix, None, None, None, {})   # type: ignore[arg-type]
    assert steps.released(config, data).matrix is matrix


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


def _trained_state(model, seed: int) -> None:
    """Every variable of `model` and its optimizer given values of `seed`, as a training would."""
    import keras

    model.optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(seed)
    for variable in [*model.weights, *model.optimizer.variables]:
        if variable is model.optimizer.iterations:
            variable.assign(7 + seed)
        elif "float" in str(variable.dtype):
            variable.assign(rng.normal(size=tuple(variable.shape)).astype(keras.backend.standardize_dtype(variable.dtype)))


def _values(model) -> list[np.ndarray]:
    import keras

    return [keras.ops.convert_to_numpy(v) for v in [*model.weights, *model.optimizer.variables]]


def _datasets(path) -> dict:
    """Every group and dataset of a `.weights.h5` file: its attributes and (datasets) shape, dtype and bytes."""
    import h5py

    found: dict = {}

    def visit(name, item):
        value = (item.shape, item.dtype.str, item[()].tobytes()) if isinstance(item, h5py.Dataset) else None
        found[name] = (value, {key: str(item.attrs[key]) for key in item.attrs})

    with h5py.File(path, "r") as handle:
        handle.visititems(visit)
    return found


def test_a_backup_and_the_best_checkpoint_copy_no_large_frozen_embedding_whole(tmp_path):
    """Keras' save_weights converted each variable to NumPy before writing it: two copies at once
    of the BiLSTM's frozen 400,002 x 50 word vectors (+152 MiB at every backup, 2019 run). A
    backup and the best checkpoint write it a slice at a time; the resumed model and
    `model.load_weights` get every variable and the optimizer's step back, bit for bit."""
    import tracemalloc

    from model.training.callbacks import AtomicBackup, BestCheckpoint, read_backup_state

    config = _config(tmp_path)
    matrix = np.random.default_rng(1).normal(size=(100_002, 50)).astype(np.float32)   # 19 MiB
    matrix[0] = 0
    _, model = build_models(config, matrix, 16)
    _trained_state(model, 1)
    backup, best = AtomicBackup(str(tmp_path / "backup"), every=50), BestCheckpoint(str(tmp_path / "checkpoints"))
    backup.set_model(model)
    best.set_model(model)
    tracemalloc.start()
    try:
        backup.back_up()
        _, backup_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        best.on_epoch_end(0, {"val_triplet_accuracy": 0.5})
        _, best_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert backup_peak < matrix.nbytes / 3 and best_peak < matrix.nbytes / 3, (backup_peak, best_peak)

    wanted = _values(model)
    for load in ("resume", "load_weights"):
        _, restored = build_models(config, matrix, 16)
        if load == "resume":
            state = steps.restored_state(restored, str(tmp_path / "backup"))
            assert state["step"] == 8 and state == {**read_backup_state(str(tmp_path / "backup")), "step": 8}
        else:
            restored.optimizer.build(restored.trainable_variables)
            restored.load_weights(best.filepath)
        got = _values(restored)
        assert len(got) == len(wanted)
        for have, want in zip(got, wanted):
            assert have.dtype == want.dtype and have.tobytes() == want.tobytes()


def test_weights_written_in_slices_are_keras_own_file(tmp_path, monkeypatch):
    """`save_weights` writes Keras' layout (groups, names, attributes, dtypes and bytes), whatever
    the slices: here every variable over 256 bytes goes in slices, ending in a short one."""
    from model.training import callbacks

    config = _config(tmp_path)
    matrix = np.random.default_rng(2).normal(size=(1_001, 5)).astype(np.float32)
    _, model = build_models(config, matrix, 16)
    _trained_state(model, 2)
    monkeypatch.setattr(callbacks, "SLICE_BYTES", 256)
    callbacks.save_weights(model, str(tmp_path / "sliced.weights.h5"))
    model.save_weights(str(tmp_path / "keras.weights.h5"))
    assert _datasets(tmp_path / "sliced.weights.h5") == _datasets(tmp_path / "keras.weights.h5")


def test_the_best_checkpoint_is_loaded_again_only_into_a_model_that_does_not_hold_it(tmp_path, monkeypatch):
    """Scoring the best epoch loaded BEST_WEIGHTS into the model that had just written them (the last
    epoch the best): two more copies of the frozen word vectors at the 2019 run's peak. Loaded
    once a step has trained since, and into any other model, after the heap's free memory went back."""
    config = _config(tmp_path)
    matrix = np.random.default_rng(3).normal(size=(1_001, 5)).astype(np.float32)
    _, model = build_models(config, matrix, 16)
    _trained_state(model, 3)
    from model.training.callbacks import BestCheckpoint

    best = BestCheckpoint(str(tmp_path / "checkpoints"))
    best.set_model(model)
    best.on_epoch_end(0, {"val_triplet_accuracy": 0.5})
    wanted = _values(model)
    loads: list = []
    original = type(model).load_weights
    monkeypatch.setattr(type(model), "load_weights", lambda self, path, **kw: (loads.append(self),
                                                                             original(self, path, **kw)))
    from model.training import callbacks

    monkeypatch.setattr(callbacks, "release_free_heap", lambda: loads.append("trimmed"))
    best.restore(model)
    assert loads == []   # the model holds them
    _, other = build_models(config, matrix, 16)
    other.optimizer.build(other.trainable_variables)
    best.restore(other)
    assert loads == ["trimmed", other] and all(a.tobytes() == b.tobytes() for a, b in zip(_values(other), wanted))
    best.on_train_batch_begin(0)   # a step trains: the model's weights move away from the file's
    _trained_state(model, 4)
    best.restore(model)
    assert loads == ["trimmed", other, "trimmed", model]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(_values(model), wanted))
