"""A JAX transformer training (`model.train --backend jax`, reading NumPy arrays) under the faults
every other command answers in one line (`pipeline.cli.run_cli`): Ctrl-C, a damaged gzip shard, a
full disk. Each runs MiniLM on the tiny shards in its own process, as a user's shell would."""
import gzip
import os
import resource
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from model_shards import write_triplet_shards

from model.training.model_dir import BACKUP, ENCODER, HISTORY

REPO = Path(__file__).resolve().parents[2]
JAX_ENV = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
TINY_MINILM = ["--encoder", "minilm", "--max-tokens", "16", "--batch-size", "8", "--epochs", "1",
               "--evaluation-triplets", "16", "--progress", "false"]

pytest.importorskip("jax")


def _train_jax(data, model_dir, *flags, preexec_fn=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "model.train", "--data", str(data), "--model-dir", str(model_dir),
                             "--backend", "jax", *TINY_MINILM, *flags], cwd=REPO, env=JAX_ENV, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=preexec_fn)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("shards")))


@pytest.mark.slow   # two MiniLM trainer processes under JAX
def test_ctrl_c_stops_a_jax_minilm_training_in_one_line_and_releases_its_model_dir(shards, tmp_path):
    """Keras waits for each asynchronous JAX step inside a bare `except:` (`pythonify_logs`): a
    SIGINT during a step was swallowed there, and the run trained on to its export, exit 0. Steps
    of about a second here: one second after the first, the signal lands in such a wait."""
    model_dir = tmp_path / "m"
    # Ctrl-C's disposition as in a terminal, also where this test runs in the background (which
    # starts every child with SIGINT ignored: Python then never raises KeyboardInterrupt)
    training = _train_jax(shards, model_dir, "--steps", "40",
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
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
    assert not (model_dir / HISTORY).exists() and not (model_dir / ENCODER).exists()
    rerun = _train_jax(shards, model_dir, "--steps", "2", "--overwrite", "true")   # its claim is not live
    _, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stderr[-3000:]
    assert (model_dir / HISTORY).exists()


@pytest.mark.slow   # a MiniLM trainer process under JAX
def test_a_gzip_shard_damaged_at_its_size_is_one_error_line_naming_the_split(tmp_path):
    """Damaged deflate data raises `zlib.error`, which is not an OSError: the JAX reader let it
    out as a traceback from its worker thread. It reads up to the damage, as tf.data does, and the
    loss is named as under TensorFlow: the split, past --max-lost-fraction, exit 1."""
    data = write_triplet_shards(str(tmp_path / "data"))
    shard = Path(data) / "triplets-sen" / "train" / "part-00000-of-00002.tfrecord.gz"
    content = bytearray(shard.read_bytes())
    middle = len(content) * 3 // 10
    content[middle:middle + 256] = bytes(256)   # the same size: Run.check_sizes lets it through
    shard.write_bytes(bytes(content))
    with pytest.raises(zlib.error), gzip.open(shard) as handle:
        handle.read()
    training = _train_jax(data, tmp_path / "m", "--steps", "2")
    _, stderr = training.communicate(timeout=600)
    assert training.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {data}/triplets-sen/train: ") and "lost > --max-lost-fraction 0.001" in last
    assert f"{shard}: read up to a damaged record" in stderr
    assert not (tmp_path / "m" / ENCODER).exists()


def _file_size_limit(max_bytes: int):
    """A preexec_fn: a write past `max_bytes` fails with EFBIG, as one on a full disk fails with
    ENOSPC (tests/pipeline/test_run_safety.py's full disks)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))


@pytest.mark.slow   # a MiniLM trainer process under JAX
def test_a_full_disk_writing_a_jax_backup_is_one_error_line_naming_the_folder(shards, tmp_path):
    """The backup's weights (MiniLM's, with the optimizer's state: hundreds of MB) do not fit,
    the claim and the small files do: h5py's OSError was a traceback; now one line naming the
    backup folder, exit 1, and no half-written copy left taking the room."""
    model_dir = tmp_path / "m"
    training = _train_jax(shards, model_dir, "--steps", "2", preexec_fn=_file_size_limit(16 << 20))
    _, stderr = training.communicate(timeout=600)
    assert training.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith(f"error: writing {model_dir}/{BACKUP} failed: File too large; ")
    assert not (model_dir / BACKUP).exists() and not (model_dir / f"{BACKUP}.partial").exists()
