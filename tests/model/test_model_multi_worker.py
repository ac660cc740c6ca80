"""MultiWorkerMirroredStrategy for real: 2 worker processes on loopback (TF_CONFIG), training the BiLSTM
(the transformer under a tf.distribute strategy: test_model_train's mirrored test, one process).

Each worker streams its own shards of the train split (FILE sharding: disjoint shards, every
triplet read once per pass across the workers); the workers must end with identical weights
(all-reduced updates); only the chief writes into the model dir (the other worker writes to its
own temporary folder, Keras' multi-worker rule); a job whose worker was killed resumes on both
workers from the chief's backup.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import pytest
from model_shards import write_triplet_shards

from model.training.model_dir import BACKUP, BACKUP_STATE, BACKUP_WEIGHTS, ENCODER, HISTORY

pytestmark = pytest.mark.slow   # TensorFlow worker processes

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 900   # on 2 busy cores: minutes (TensorFlow's start, a SavedModel export)
# Per-replica batch 4 (global 8 with two workers). The BiLSTM runs one pass (`--steps none`: 96
# train triplets in 2 shards, 12 steps of 8), so each worker reads exactly its own shard once.
BILSTM = dict(lstm_units=8, attention_size=4, vocabulary="train", epochs=1, steps=None)
COMMON = dict(batch_size=4, epochs=2, steps=3, checkpoint_every=2, dropout=0.0, progress=False,
              evaluation_triplets=8, article_chunk=2)

WORKER_SCRIPT = textwrap.dedent("""
    import json, logging, os, sys
    logging.basicConfig(level=logging.INFO)   # as `python -m model.train` logs: the shards each worker opens
    import numpy as np
    import keras
    from model.config import TrainConfig
    from model.train import train

    args = json.loads(sys.argv[1])

    class Probe(keras.callbacks.Callback):
        '''Records the step training starts at and the weights it ends with; dies at `kill_at`.'''
        def on_train_begin(self, logs=None):
            with open(args["probe"], "w") as handle:
                json.dump({"iterations": int(self.model.optimizer.iterations.numpy())}, handle)
        def on_train_batch_end(self, batch, logs=None):
            if args["kill_at"] and int(self.model.optimizer.iterations.numpy()) >= args["kill_at"]:
                os._exit(17)
        def on_train_end(self, logs=None):
            np.savez(args["weights"], *self.model.get_weights())

    summary = train(TrainConfig.from_flags(**args["config"]), extra_callbacks=[Probe()])
    print("SUMMARY" + json.dumps({k: v for k, v in summary.items() if k != "config"}))
""")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def _start(config: dict, run: Path, task: int | None, kill_at: int = 0, workers: int = 2,
           ports: list[int] | None = None) -> subprocess.Popen:
    """One trainer process; `task` None: alone, otherwise worker `task` of a TF_CONFIG cluster."""
    run.mkdir(parents=True, exist_ok=True)
    (run / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "TF_CPP_MIN_LOG_LEVEL": "2",
           "TMPDIR": str(run / "tmp")}
    env.pop("TF_CONFIG", None)
    if task is not None:
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                                       "task": {"type": "worker", "index": task}})
    args = {"config": config, "probe": str(run / "probe.json"), "weights": str(run / "weights.npz"),
            "kill_at": kill_at}
    return subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, json.dumps(args)], cwd=REPO, env=env,
                            stdout=open(run / "stdout", "w"), stderr=open(run / "stderr", "w"))


def _wait(processes: list[subprocess.Popen], timeout: float = TIMEOUT_S) -> list[int]:
    """Exit codes; every process still running at the deadline is killed (no test hangs)."""
    deadline = time.monotonic() + timeout
    try:
        return [process.wait(timeout=max(1.0, deadline - time.monotonic())) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def _summary(run: Path, code: int) -> dict:
    assert code == 0, (run / "stderr").read_text()[-4000:]
    line = next(line for line in (run / "stdout").read_text().splitlines() if line.startswith("SUMMARY"))
    return json.loads(line[len("SUMMARY"):])


def _weights(run: Path) -> list[np.ndarray]:
    with np.load(run / "weights.npz") as stored:
        return [stored[f"arr_{i}"] for i in range(len(stored.files))]


def _cluster(config: dict, root: Path, kill_at: int = 0) -> list[subprocess.Popen]:
    ports = _free_ports(2)
    return [_start(config, root / f"worker{task}", task, kill_at=kill_at if task == 1 else 0, ports=ports)
            for task in range(2)]


@pytest.fixture(scope="module")
def small_shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("mw-shards")),
                                sizes={"train": 96, "validation": 16, "test": 16})


def _shards_read(run: Path) -> list[tuple[int, str, int]]:
    """(pass, shard, first record) of every train shard a worker's input pipeline opened (its log)."""
    import re

    return [(int(passes), shard, int(start)) for passes, shard, start in re.findall(
        r"input pipeline \d+ of \d+, pass (\d+): (\S+/train/\S+) from record (\d+)", (run / "stderr").read_text())]


def test_two_workers_read_their_own_shards_and_keep_equal_weights(small_shards, tmp_path):
    model_dir = tmp_path / "model"
    config = {**COMMON, **BILSTM, "data": small_shards, "model_dir": str(model_dir),
              "distribution_strategy": "multi_worker"}
    codes = _wait(_cluster(config, tmp_path))
    chief, other = (_summary(tmp_path / f"worker{task}", code) for task, code in enumerate(codes))

    assert chief["replicas"] == other["replicas"] == 2 and chief["global_batch_size"] == 2 * COMMON["batch_size"]
    for mine, theirs in zip(_weights(tmp_path / "worker0"), _weights(tmp_path / "worker1")):   # all-reduced updates
        np.testing.assert_array_equal(mine, theirs)
    first_pass = [{shard for passes, shard, _ in _shards_read(tmp_path / f"worker{task}") if passes == 0}
                  for task in range(2)]
    assert all(first_pass) and not first_pass[0] & first_pass[1]         # disjoint shards
    # one pass: together, every train shard (so every triplet) once
    train_shards = {str(path) for path in Path(small_shards).glob("triplets-sen/train/*.tfrecord.gz")}
    assert first_pass[0] | first_pass[1] == train_shards
    assert chief["learning_curve"][-1]["triplets_seen"] == 96

    # The chief exports and writes the history; the other worker's folder was its own and is gone.
    assert (model_dir / ENCODER / "saved_model.pb").is_file() and (model_dir / HISTORY).is_file()
    assert json.loads((model_dir / HISTORY).read_text())["replicas"] == 2
    assert not any(name.startswith("workertemp") for name in os.listdir(model_dir))
    assert os.listdir(tmp_path / "worker1" / "tmp") == []


def test_a_killed_worker_and_a_restart_resume_both_from_the_chiefs_backup(small_shards, tmp_path):
    model_dir = tmp_path / "model"
    config = {**COMMON, **BILSTM, "data": small_shards, "model_dir": str(model_dir),
              "distribution_strategy": "multi_worker", "epochs": COMMON["epochs"], "steps": COMMON["steps"]}
    killed = _cluster(config, tmp_path / "killed", kill_at=4)   # 3 steps per epoch, a backup every 2
    chief, worker = killed
    assert _wait([worker]) == [17], (tmp_path / "killed" / "worker1" / "stderr").read_text()[-4000:]
    metadata = model_dir / BACKUP / BACKUP_STATE
    deadline = time.monotonic() + 120     # the chief backs up epoch 1's end (step 3), then waits for the dead worker
    while time.monotonic() < deadline and chief.poll() is None and not (
            metadata.is_file() and json.loads(metadata.read_text() or "{}") == {"epoch": 1, "step": 3}):
        time.sleep(0.5)
    if chief.poll() is None:
        chief.send_signal(signal.SIGKILL)
    _wait([chief])
    assert json.loads(metadata.read_text()) == {"epoch": 1, "step": 3}
    assert not (model_dir / ENCODER).exists()
    # The dead worker's backups went to its own temporary folder, never into the model dir.
    (own,) = (tmp_path / "killed" / "worker1" / "tmp").glob("workertemp_1-*")
    assert (own / BACKUP / BACKUP_WEIGHTS).is_file()

    resumed = _cluster(config, tmp_path / "resumed")
    summaries = [_summary(tmp_path / "resumed" / f"worker{task}", code) for task, code in enumerate(_wait(resumed))]
    for task in range(2):   # both continue at the backup's step, each in its own stream where it was
        assert json.loads((tmp_path / "resumed" / f"worker{task}" / "probe.json").read_text()) == {"iterations": 3}
        (first,) = [entry for entry in _shards_read(tmp_path / "resumed" / f"worker{task}")][:1]
        assert first[2] == 3 * COMMON["batch_size"]          # 3 steps of 4 of this worker's records: not read again
    assert [s["epochs_run"] for s in summaries] == [2, 2]   # epoch 1 from the chief's backup, then epoch 2
    assert summaries[0]["learning_curve"][-1]["triplets_seen"] == 6 * 2 * COMMON["batch_size"]
    for mine, theirs in zip(*(_weights(tmp_path / "resumed" / f"worker{task}") for task in range(2))):
        np.testing.assert_array_equal(mine, theirs)
    assert (model_dir / ENCODER / "saved_model.pb").is_file()
    assert os.listdir(tmp_path / "resumed" / "worker1" / "tmp") == []


HOLD_WORKER_DIR = textwrap.dedent("""
    import sys, time, types
    from model.training.devices import worker_temp_dir

    strategy = types.SimpleNamespace(cluster_resolver=types.SimpleNamespace(task_id=1))
    with worker_temp_dir(strategy) as folder:
        open(folder + "/backup.h5", "wb").write(b"weights")
        print(folder, flush=True)
        time.sleep(600)
""")


def test_a_killed_workers_temporary_folder_goes_when_the_next_worker_starts(tmp_path):
    """A killed worker's `workertemp_1-*` (MiniLM's backups: 519 MB) stayed in TMPDIR for ever;
    the next worker starting there deletes it, and leaves a living worker's alone."""
    from model.training.devices import worker_temp_dir

    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    holders = [subprocess.Popen([sys.executable, "-c", HOLD_WORKER_DIR], cwd=REPO, env=env, text=True,
                                stdout=subprocess.PIPE) for _ in range(2)]
    try:
        killed, living = (Path(holder.stdout.readline().strip()) for holder in holders)
        holders[0].send_signal(signal.SIGKILL)
        holders[0].wait()
        assert (killed / "backup.h5").is_file()   # nobody deleted it on the way out
        import tempfile

        tempfile.tempdir = str(tmp_path)
        try:
            with worker_temp_dir(types.SimpleNamespace(cluster_resolver=types.SimpleNamespace(task_id=1))) as own:
                assert not killed.exists() and (living / "backup.h5").is_file()
                assert os.listdir(own) == []   # the worker's model dir: nothing but what training writes
        finally:
            tempfile.tempdir = None
        assert not Path(own).exists()
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
