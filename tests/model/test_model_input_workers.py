"""`--input-workers`: the training stream's batches made in worker processes are the serial
stream's, in its order (determinism and resume depend on it); a worker's failure or death is an
error in the trainer, not a hang; the workers end with the stream and with the trainer; and
`python -m model.benchmark --measure input` prints the input path's triplets/s side by side."""
import itertools
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from model_shards import write_triplet_shards

from model.config import TrainConfig
from model.net.wordpieces import wordpieces
from model.training.arrays import TripletInput, in_workers
from model.training.shards import open_run

DATASET, MAX_TOKENS, BATCH = "triplets-sen", 32, 8
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("shards")), extra_records=(b"not an Example",))


def _input(data: str, blocks: int = 1, teacher=None, **flags) -> TripletInput:
    config = TrainConfig.from_flags(**{"data": data, "model_dir": "unused", "encoder": "minilm", "backend": "jax",
                                       "max_tokens": MAX_TOKENS, "batch_size": BATCH, **flags})
    return TripletInput(config, open_run(data), wordpieces(MAX_TOKENS), teacher, blocks=blocks)


def _assert_equal(expected, got):
    (want_inputs, want_labels, want_weights), (inputs, labels, weights) = expected, got
    assert sorted(inputs) == sorted(want_inputs)
    for name in want_inputs:
        assert inputs[name].dtype == want_inputs[name].dtype, name
        assert np.array_equal(inputs[name], want_inputs[name]), name
    for want, array in ((want_labels, labels), (want_weights, weights)):
        assert array.dtype == want.dtype and np.array_equal(array, want)


def _workers_alive() -> list:
    return [process for process in multiprocessing.active_children() if process.name.startswith("input-worker-")]


@pytest.mark.slow   # worker processes
@pytest.mark.parametrize("blocks, resume_at_step, flags", [(1, 0, {}), (2, 3, {"shuffle_buffer": 64})])
def test_workers_make_the_serial_streams_batches_in_its_order(shards, blocks, resume_at_step, flags):
    """40 batches: past a pass over the 256 triplets (and its unparseable record), into the next
    pass's shard order; every array equal, dtype and all, to the in-thread stream's."""
    serial = _input(shards, blocks, **flags).training_batches(resume_at_step)
    parallel = _input(shards, blocks, input_workers=2, **flags).training_batches(resume_at_step)
    try:
        pairs = list(itertools.islice(zip(serial, parallel), 40))
        for expected, got in pairs:
            _assert_equal(expected, got)
        assert len(pairs) == 40 and len(_workers_alive()) == 2
    finally:
        parallel.close()
    assert not _workers_alive()   # closing the stream ends its workers


@pytest.mark.slow   # worker processes
def test_a_workers_exception_is_raised_in_the_trainer_with_its_traceback():
    stream = in_workers(int, [("1",), ("2",), ("three",), ("4",)], 2)
    assert next(stream) == 1 and next(stream) == 2
    with pytest.raises(ValueError, match="three") as raised:
        next(stream)
    assert any("raised in input worker 0" in note for note in raised.value.__notes__)
    assert not _workers_alive()


@pytest.mark.slow   # worker processes
def test_a_worker_that_dies_is_an_error_not_a_hang():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="input worker 0 ended \\(exit code 3\\) without its batch"):
        list(in_workers(os._exit, [(3,)] * 4, 2))
    assert time.monotonic() - start < 60 and not _workers_alive()


@pytest.mark.slow   # a trainer process killed
def test_the_workers_die_with_a_killed_trainer(tmp_path):
    script = textwrap.dedent("""
        import multiprocessing, threading, time
        from model.training.arrays import in_workers
        if __name__ == "__main__":
            threading.Thread(target=lambda: next(in_workers(time.sleep, [(600,)] * 4, 2)), daemon=True).start()
            while len(multiprocessing.active_children()) < 2:
                time.sleep(0.1)
            time.sleep(1)
            print(" ".join(str(process.pid) for process in multiprocessing.active_children()), flush=True)
            time.sleep(600)
    """)
    trainer = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in trainer.stdout.readline().split()]
        assert len(pids) == 2
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(map(_running, pids)):
            time.sleep(0.2)
        assert not any(map(_running, pids))
    finally:
        trainer.kill()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_a_teacher_keeps_the_batches_in_the_trainers_process(shards, caplog):
    def teacher(sentences):   # a model, as a --teacher is: not sent to a worker
        return np.ones((len(sentences), 4), np.float32)

    batch = next(_input(shards, teacher=teacher, input_workers=2).training_batches())
    assert batch[0]["teacher"].shape[-1] == 4 and not _workers_alive()
    assert "a --teacher runs in the trainer's process" in caplog.text


def test_negative_input_workers_are_refused_with_the_flags(shards):
    with pytest.raises(ValueError, match="--input-workers must be >= 0"):
        _input(shards, input_workers=-1)


@pytest.mark.slow   # worker processes
def test_the_benchmark_times_the_input_path_in_the_thread_and_in_workers(shards, tmp_path, capsys):
    from model.benchmark import main

    results = main(["--measure", "input", "--data", shards, "--triplets", "64", "--batch-size", str(BATCH),
                    "--max-tokens", str(MAX_TOKENS), "--input-encoders", "minilm", "--input-workers", "0,1,2",
                    "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "calling thread" in printed and "1 worker" in printed and "2 workers" in printed
    assert set(results["triplets_per_s"]["minilm"]) == {"0", "1", "2"}
    assert all(rate > 0 for rate in results["triplets_per_s"]["minilm"].values())
    assert results["ratio"]["minilm"]["1"] == 1.0
    assert (tmp_path / "input_benchmark.json").exists() and (tmp_path / "input_benchmark.png").exists()


@pytest.mark.slow   # a worker process
def test_a_worker_runs_in_its_own_environment_and_leaves_the_trainers_alone(monkeypatch):
    """Keras under NumPy and no device in the worker (set there, before Keras loads), while the
    trainer's environment, which its other threads read, is never changed."""
    from model.training.arrays import in_workers
    from model.training.input_worker import WORKER_ENVIRONMENT

    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    names = sorted(WORKER_ENVIRONMENT)
    seen = list(in_workers(os.getenv, [(name,) for name in names], 1))
    assert seen == [WORKER_ENVIRONMENT[name] for name in names]
    assert (os.environ["KERAS_BACKEND"], os.environ["JAX_PLATFORMS"]) == ("jax", "cuda")
