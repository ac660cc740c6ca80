"""A JAX transformer training (`model.train --backend jax`, reading NumPy arrays) under the faults
every other command answers in one line (`pipeline.cli.run_cli`): Ctrl-C, a damaged gzip shard, a
full disk. Each runs MiniLM on the tiny shards in its own process, as a user's shell would."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from model_shards import write_triplet_shards

REPO = Path(__file__).resolve().parents[2]
JAX_ENV = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
TINY_MINILM = ["--encoder", "minilm", "--max-tokens", "16", "--batch-size", "8", "--epochs", "1",
               "--evaluation-triplets", "16", "--progress", "false"]

pytest.importorskip("jax")


def _train_jax(data, model_dir, *flags) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "model.train", "--data", str(data), "--model-dir", str(model_dir),
                             "--backend", "jax", *TINY_MINILM, *flags], cwd=REPO, env=JAX_ENV, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("shards")))


@pytest.mark.slow   # two MiniLM trainer processes under JAX
def test_ctrl_c_stops_a_jax_minilm_training_in_one_line_and_releases_its_model_dir(shards, tmp_path):
    """Keras waits for each asynchronous JAX step inside a bare `except:` (`pythonify_logs`): a
    SIGINT during a step was swallowed there, and the run trained on to its export, exit 0. Steps
    of about a second here: one second after the first, the signal lands in such a wait."""
    model_dir = tmp_path / "m"
    training = _train_jax(shards, model_dir, "--steps", "40")
    lines = []
    for line in training.stderr:
        lines.append(line)
        if "first training step" in line:
            time.sleep(1)
            training.send_signal(signal.SIGINT)
            break
    stderr = "".join(lines) + training.stderr.read()
    training.wait(timeout=300)
    assert training.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "interrupted"
    assert not (model_dir / "history.json").exists() and not (model_dir / "encoder").exists()
    rerun = _train_jax(shards, model_dir, "--steps", "2", "--overwrite", "true")   # its claim is not live
    _, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stderr[-3000:]
    assert (model_dir / "history.json").exists()
