"""`infra/accelerator/quality_run.sh`'s rehearsal (`DRY=1`) on this CPU, as the accelerator's image
runs it: TensorFlow not importable (`model.WITHOUT_TENSORFLOW`), an MPNet teacher (2 layers of
all-mpnet-base-v2) trained in bfloat16 under JAX, a MiniLM student distilled from the teacher's
model dir, its int8 ONNX export, both scored; then `model.soup` without TensorFlow."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.cli import UsageError
from model.checkpoints import CHECKPOINTS
from model.training.model_dir import ENCODER, SENTENCE_TRANSFORMERS

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "accelerator" / "quality_run.sh"
# A process as on the accelerator's image; Keras' backend left to `model` (JAX there), whatever an
# in-process test of this session set.
WITHOUT_TENSORFLOW = {**{key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"},
                      "WIKISIM_WITHOUT_TENSORFLOW": "1", "JAX_PLATFORMS": "cpu"}


def _mpnet_installed() -> bool:
    try:
        CHECKPOINTS["mpnet"].folder()
    except UsageError:   # saying `make mpnet-checkpoint`, which `make test` runs
        return False
    return True


pytestmark = pytest.mark.skipif(not _mpnet_installed(), reason="all-mpnet-base-v2 not installed: make mpnet-checkpoint")


@pytest.fixture(scope="module")
def dry_run(embedded_pipeline_output, tmp_path_factory):
    out = tmp_path_factory.mktemp("quality") / "run"
    done = subprocess.run([str(SCRIPT), str(out)], capture_output=True, text=True, cwd=REPO, timeout=1500,
                          env={**os.environ, "DRY": "1", "DATA": str(embedded_pipeline_output),
                               "PYTHON": sys.executable})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return out, done.stdout


def test_the_rehearsal_writes_a_summary_of_teacher_and_student(dry_run):
    out, stdout = dry_run
    summary = json.loads((out / "summary.json").read_text())
    teacher, student = summary["models"]["teacher"], summary["models"]["student-int8"]
    assert teacher["encoder"] == "mpnet" and teacher["transformer_layers"] == 2 and student["encoder"] == "minilm"
    for model in (teacher, student):
        low, high = model["test_interval"]
        assert 0 <= low <= model["test_accuracy"] <= high <= 1 and model["test_triplets"] == 300
        assert model["precision"] == "bfloat16" and model["ms_a_step"] > 0 and model["triplets_per_second"] > 0
        assert model["mfu_estimate"] is None   # no peak on a CPU
        assert model["scb"]["articles"] == 4 and -1 <= model["scb"]["iclust_ari"] <= 1
    assert set(summary["stage_seconds"]) == {"teacher", "student", "export", "triplets", "scb"}
    assert "teacher" in stdout and "student-int8" in stdout   # the table printed


def test_nothing_of_the_rehearsal_ran_tensorflow(dry_run):
    """Where TensorFlow can be imported, the JAX trainer writes `encoder/` through a TensorFlow
    process: without it, every model dir keeps its weights and sentence-transformers folder alone."""
    out, _ = dry_run
    for name in ("mpnet-sen", "mpnet-distilled"):
        entries = os.listdir(out / "models" / name)
        assert ENCODER not in entries and SENTENCE_TRANSFORMERS in entries


def test_the_student_export_loads_and_agrees_with_its_net(dry_run):
    """The int8 ONNX student (<= 30 MB) encodes as the student's Net does, which reproduces the
    teacher's directions (its projection to the teacher's 768 dimensions)."""
    from model.encoding.encoder import load_encoder
    from model.encoding.trained_net import NetEncoder

    out, _ = dry_run
    export = out / "student-int8"
    assert sum(path.stat().st_size for path in export.iterdir()) <= 30 * 2 ** 20
    sentences = ["The river flows through the city.", "He won the award in 1999.", "Music of the war."]
    onnx = load_encoder(str(export)).encode(sentences)
    net = NetEncoder(str(out / "models" / "mpnet-distilled")).encode(sentences)
    assert onnx.shape == net.shape == (3, 768)
    cosines = (onnx * net).sum(axis=1) / np.linalg.norm(onnx, axis=1) / np.linalg.norm(net, axis=1)
    assert cosines.min() > 0.95, cosines


def test_a_soup_is_made_without_tensorflow(dry_run, tmp_path):
    """`model.soup` under JAX on an image without TensorFlow: the soup of a run and its copy is
    that run, its weights and embeddings; its `encoder/` left to a TensorFlow process, as it says."""
    out, _ = dry_run
    run = out / "models" / "mpnet-sen"
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    done = subprocess.run([sys.executable, "-m", "model.soup", "--model-dir", str(run), "--model-dir", str(copy),
                           "--output", str(tmp_path / "soup")], capture_output=True, text=True, cwd=REPO,
                          timeout=900, env=WITHOUT_TENSORFLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no TensorFlow here" in done.stdout + done.stderr
    assert ENCODER not in os.listdir(tmp_path / "soup")
    code = ("import sys; from model.encoding.trained_net import NetEncoder; import numpy as np; "
            "a, b = (NetEncoder(path).encode(['Rivers flow.', 'A war began.']) for path in sys.argv[1:]); "
            "print(float(np.abs(a - b).max()), 'tensorflow' in sys.modules)")
    checked = subprocess.run([sys.executable, "-c", code, str(run), str(tmp_path / "soup")], capture_output=True,
                             text=True, cwd=REPO, timeout=600,
                             env=WITHOUT_TENSORFLOW)
    assert checked.returncode == 0, checked.stderr[-3000:]
    largest, loaded = checked.stdout.split()
    assert float(largest) < 1e-5 and loaded == "False"


def test_a_sentence_transformers_folder_is_exported_without_tensorflow(dry_run, tmp_path):
    """`model.export --format sentence-transformers` of the student under JAX: its backbone, mean
    pooling of its 384 dimensions, then its projection to the teacher's 768 (a Dense module), so
    the folder's embeddings are the student's Net's."""
    from safetensors.numpy import load_file

    from model.encoding.trained_net import NetEncoder
    from model.net.backbone import build_transformer_encoder
    from model.net.wordpieces import wordpieces

    out, _ = dry_run
    student = out / "models" / "mpnet-distilled"
    done = subprocess.run([sys.executable, "-m", "model.export", "--model-dir", str(student),
                           "--output", str(tmp_path / "st")], capture_output=True, text=True, cwd=REPO, timeout=600,
                          env=WITHOUT_TENSORFLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "st"
    modules = json.loads((folder / "modules.json").read_text())
    assert [module["type"].rsplit(".", 1)[1] for module in modules] == ["Transformer", "Pooling", "Dense"]
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["word_embedding_dimension"] == 384
    dense = json.loads((folder / "2_Dense" / "config.json").read_text())
    assert (dense["in_features"], dense["out_features"]) == (384, 768)
    linear = load_file(str(folder / "2_Dense" / "model.safetensors"))
    sentences = ["The river flows through the city.", "He won the award in 1999."]
    pooled = np.asarray(build_transformer_encoder("minilm", folder=str(folder))(wordpieces(32, "minilm")(sentences)))
    from_folder = pooled @ linear["linear.weight"].T + linear["linear.bias"]
    np.testing.assert_allclose(from_folder, NetEncoder(str(student)).encode(sentences), atol=2e-4)
