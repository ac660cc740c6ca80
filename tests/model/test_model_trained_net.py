"""`model.encoding.trained_net`: which form of a trained encoder a process runs (its SavedModel or
its Net in Keras), and the size of a model dir's embeddings read without building it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.cli import UsageError
from model.training.model_dir import ENCODER, INPUTS, ModelDir

REPO = Path(__file__).resolve().parents[2]


def _model_dir(path: Path, saved_model: bool, **flags) -> str:
    """A model dir's files as `runs_as_net` looks for them (their contents are not read)."""
    (path / INPUTS).parent.mkdir(parents=True, exist_ok=True)
    (path / INPUTS).write_text(json.dumps({"flags": {"data": "d", "model_dir": str(path), **flags}}))
    best = Path(ModelDir(str(path)).best_weights)
    best.parent.mkdir(parents=True, exist_ok=True)
    best.write_bytes(b"")
    if saved_model:
        (path / ENCODER).mkdir()
        (path / ENCODER / "saved_model.pb").write_bytes(b"")
    return str(path)


def test_a_process_that_keeps_tensorflow_out_runs_a_model_dirs_net_even_beside_its_saved_model(tmp_path):
    """`model.train --backend jax --teacher DIR` keeps TensorFlow out of its process: a teacher with
    an `encoder/` (a soup's, written by a TensorFlow process) must run as its Net there, not fail
    importing TensorFlow; elsewhere the SavedModel is what runs."""
    with_export = _model_dir(tmp_path / "with", saved_model=True)
    without = _model_dir(tmp_path / "without", saved_model=False)
    code = ("import sys; from model import keep_tensorflow_out; from model.encoding.trained_net import runs_as_net\n"
            "before = [runs_as_net(path) for path in sys.argv[1:]]\n"
            "keep_tensorflow_out()\n"
            "print(before, [runs_as_net(path) for path in sys.argv[1:]])\n")
    done = subprocess.run([sys.executable, "-c", code, with_export, without], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={key: value for key, value in os.environ.items()
                                                      if key != "WIKISIM_WITHOUT_TENSORFLOW"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "[False, True] [True, True]"


def test_a_folder_with_no_trained_encoder_is_one_usage_error(tmp_path):
    from model.encoding.trained_net import load_trained

    with pytest.raises(UsageError, match="no trained encoder there"):
        load_trained(str(tmp_path))


def test_a_distilled_students_size_is_its_teachers_read_from_the_model_dirs(tmp_path):
    from model.encoding.trained_net import output_dim

    teacher = _model_dir(tmp_path / "teacher", saved_model=False, encoder="minilm")
    student = _model_dir(tmp_path / "student", saved_model=False, encoder="minilm", teacher=teacher)
    assert output_dim(teacher) == output_dim(student) == 384   # all-MiniLM-L6-v2's hidden size


def test_a_process_whose_keras_is_loaded_keeps_its_environment(monkeypatch):
    """Choosing the backend where Keras is loaded already answers with Keras' own and changes no
    variable: a subprocess started later (`model.train --backend jax`) inherits none it did not set."""
    import keras

    from model import keras_backend_here

    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    assert keras_backend_here() == keras.backend.backend()
    assert "KERAS_BACKEND" not in os.environ
