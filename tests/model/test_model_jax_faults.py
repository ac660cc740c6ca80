"""A JAX transformer training (`model.train --backend jax`, reading NumPy arrays) under the faults
every other command answers in one line (`core.cli.run_cli`): Ctrl-C, a damaged gzip shard, a
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


@pytest.fixture
def full_disk(tmp_path):
    """A 120 MB tmpfs (MiniLM's claim and small files fit, its backup does not): a real ENOSPC, which
    a file size limit (EFBIG) does not give at the same place. Needs mount (root); skipped without."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"no tmpfs to fill here (mount: {made.stderr.decode().strip()[:100]})")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.slow   # a MiniLM trainer process under JAX
def test_a_full_disk_under_jax_ends_at_the_error_line_with_exit_1(shards, full_disk):
    """After the right line, h5py's "Exception ignored" tracebacks and a segfault (rc 139): Keras'
    store of the backup's weights, left open by the failed write, was flushed at the interpreter's exit."""
    training = _train_jax(shards, full_disk / "m", "--steps", "2")
    _, stderr = training.communicate(timeout=600)
    assert training.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert stderr.strip().splitlines()[-1].startswith(f"error: writing {full_disk}/m/{BACKUP} failed: "
                                                      "No space left on device; ")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def _process_of_two(data, model_dir, index: int, port: int, *flags, wait_s: int = 60, peer_s: int = 60,
                    stderr=subprocess.PIPE) -> subprocess.Popen:
    """Process `index` of a job of 2 (`KERAS_DISTRIBUTION_*`, docs/distributed.md) on loopback."""
    env = {**JAX_ENV, "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"localhost:{port}", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
           "KERAS_DISTRIBUTION_PROCESS_ID": str(index), "WIKISIM_PROCESSES_WAIT_SECONDS": str(wait_s),
           "WIKISIM_PEER_TIMEOUT_SECONDS": str(peer_s)}
    return subprocess.Popen([sys.executable, "-m", "model.train", "--data", str(data), "--model-dir", str(model_dir),
                             "--backend", "jax", "--distribution-strategy", "data-parallel", *TINY_MINILM, "--steps",
                             "1", *flags], cwd=REPO, env=env, text=True, stdout=subprocess.DEVNULL, stderr=stderr)


@pytest.mark.slow   # a MiniLM trainer process under JAX (its imports)
def test_a_process_whose_peers_never_start_says_where_it_waits_and_ends_in_one_error_line(shards, tmp_path):
    """JAX waited 5 minutes without a word, then aborted in C++ (SIGABRT, rc 134)."""
    port = _free_port()
    alone = _process_of_two(shards, tmp_path / "m", 0, port, wait_s=3)
    try:
        _, stderr = alone.communicate(timeout=120)
    finally:
        alone.kill()
    assert alone.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert f"waiting up to 3 s for the other processes at localhost:{port}" in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: process 0 of 2: the other processes did not join at ") and "within 3 s" in last
    assert not (tmp_path / "m").exists()   # nothing claimed


@pytest.mark.slow   # two MiniLM trainer processes under JAX (their imports)
def test_processes_given_different_flags_each_end_in_one_error_line_naming_them(shards, tmp_path):
    """A batch of 8 in one process and 4 in the other aborted on a gloo collective's mismatch."""
    port = _free_port()
    processes = [_process_of_two(shards, tmp_path / "m", index, port, "--batch-size", size, "--seed", seed)
                 for index, size, seed in ((0, "8", "1"), (1, "4", "1"))]
    try:
        stderrs = [process.communicate(timeout=180)[1] for process in processes]
    finally:
        for process in processes:
            process.kill()
    for index, (process, stderr) in enumerate(zip(processes, stderrs)):
        assert process.returncode == 2 and "Traceback" not in stderr, stderr[-3000:]
        last = stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: process {index} of 2: the processes run different flags (--batch-size ")
        assert "--seed" not in last and "--max-tokens" not in last
    assert not (tmp_path / "m").exists()


@pytest.mark.slow   # two MiniLM trainer processes under JAX, training
def test_a_process_killed_mid_run_ends_its_peer_in_one_error_line(shards, tmp_path):
    """Process 1 SIGKILLed after training started: process 0 waited in its collective, then in JAX's
    shutdown barrier, and aborted in C++ minutes later (SIGABRT, a stack). Now a failed collective
    or `WIKISIM_PEER_TIMEOUT_SECONDS` without a sign of life (`devices.watch_peers`) ends it in one
    `error:` line naming the lost process and the job's address, exit 1."""
    port = _free_port()
    survivor = _process_of_two(shards, tmp_path / "m", 0, port, "--steps", "1000", peer_s=20)
    victim = _process_of_two(shards, tmp_path / "m", 1, port, "--steps", "1000", peer_s=20, stderr=subprocess.DEVNULL)
    try:
        lines = []
        for line in survivor.stderr:
            lines.append(line)
            if "first training step" in line:
                time.sleep(2)
                victim.send_signal(signal.SIGKILL)
                break
        killed = time.monotonic()
        stderr = "".join(lines) + survivor.communicate(timeout=240)[1]   # JAX alone: 100 s, then an abort
        took = time.monotonic() - killed
    finally:
        for process in (survivor, victim):
            process.kill()
    assert victim.returncode == -signal.SIGKILL, "process 1 ended before it was killed"
    assert survivor.returncode == 1 and "Traceback" not in stderr and "Check failure" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == stderr.strip().splitlines()[-1], stderr[-3000:]
    assert errors[0].startswith(f"error: process 0 of 2: process 1 of the job (coordinator localhost:{port}) ")
    assert "start the same command in every process again" in errors[0]
    assert took < 60, f"process 0 ended {took:.0f} s after process 1 was killed"   # WIKISIM_PEER_TIMEOUT_SECONDS: 20
    assert not (tmp_path / "m" / ENCODER).exists()
