"""The JAX backend's input without TensorFlow (`model.training.arrays`) is tf.data's input
(`model.training.data`), array for array: the training stream (one and two replicas, a resumed
run), the evaluation sample and whole split, the record counts; and a JAX run of a transformer
never imports TensorFlow."""
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from model_shards import write_triplet_shards

from model.config import TrainConfig
from model.net.transformer import token_ids
from model.training.arrays import ArrayInput
from model.training.data import count_records, streamed_triplets, training_batches, triplet_sample, triplet_strings
from model.training.shards import needs_tf_data, open_run

DATASET, MAX_TOKENS, BATCH = "triplets-sen", 32, 8
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("shards")), extra_records=(b"not an Example",))


def _config(data: str, **flags) -> TrainConfig:
    return TrainConfig.from_flags(**{"data": data, "model_dir": "unused", "encoder": "minilm", "backend": "jax",
                                     "max_tokens": MAX_TOKENS, "batch_size": BATCH, **flags})


def _tf_batches(triplets, config: TrainConfig, replicas: int = 1):
    return training_batches(triplets, token_ids(MAX_TOKENS), BATCH, article_chunk=config.inputs.article_chunk,
                            static_shapes=True, replicas=replicas).as_numpy_iterator()


def _assert_equal(expected, got):
    (want_inputs, want_labels, want_weights), (inputs, labels, weights) = expected, got
    assert sorted(inputs) == sorted(want_inputs)
    for name in want_inputs:
        assert inputs[name].dtype == want_inputs[name].dtype, name
        np.testing.assert_array_equal(inputs[name], want_inputs[name], err_msg=name)
    for want, array in ((want_labels, labels), (want_weights, weights)):
        assert array.dtype == want.dtype
        np.testing.assert_array_equal(array, want)


@pytest.mark.parametrize("replicas, resume_at_step", [(1, 0), (2, 0), (1, 5)])
def test_the_training_stream_is_tf_datas_batch_for_batch(shards, replicas, resume_at_step):
    config, run = _config(shards), open_run(shards)
    stream = ArrayInput(config, run, replicas).training(resume_at_step)
    start = resume_at_step * BATCH * replicas
    expected = _tf_batches(streamed_triplets(run, DATASET, "train", config.runtime.seed, start=start), config,
                           replicas)
    for index in range(40):   # past a pass over the 256 triplets: the next pass's shard order too
        _assert_equal(next(expected), stream[index])


def test_the_evaluation_sample_and_the_whole_split_are_tf_datas(shards):
    config, run = _config(shards, evaluation_triplets=20), open_run(shards)
    held = ArrayInput(config, run, 1).evaluation("validation")
    expected = list(_tf_batches(triplet_sample(run, DATASET, "validation", 20, config.runtime.seed), config))
    assert len(held) == len(expected) == 3
    for index, batch in enumerate(expected):
        _assert_equal(batch, held[index])
    whole = list(ArrayInput(_config(shards, evaluation_triplets=None), run, 1).evaluation("test"))
    expected = list(_tf_batches(triplet_strings(run, DATASET, "test"), config))
    assert len(whole) == len(expected) == 8
    for batch, want in zip(whole, expected):
        _assert_equal(want, batch)


def test_the_record_counts_are_tf_datas_for_an_unparseable_record_and_a_truncated_shard(shards, tmp_path):
    data = tmp_path / "run"
    shutil.copytree(shards, data)
    shard = sorted((data / DATASET / "test").iterdir())[0]
    records = gzip.decompress(shard.read_bytes())
    shard.write_bytes(gzip.compress(records[:len(records) // 2]))   # ends inside a record
    run = open_run(str(data))
    arrays = ArrayInput(_config(str(data)), run, 1)
    for split in ("train", "test"):
        assert arrays.count_records(split) == count_records(run, DATASET, split)
    assert arrays.count_records("train")["unparseable"] == 1 and arrays.count_records("test")["lost"] > 0


def test_what_needs_tf_data_is_named():
    assert needs_tf_data(_config("d")) is None
    assert "--encoder bilstm" in needs_tf_data(_config("d", encoder="bilstm"))
    assert needs_tf_data(_config("d", shuffle_buffer=64)) == "--shuffle-buffer"
    assert needs_tf_data(_config("d", article_chunk=0)) == "--article-chunk 0"


@pytest.mark.slow   # a MiniLM trainer process under JAX
def test_a_jax_run_of_a_transformer_never_imports_tensorflow(shards, tmp_path):
    """What an accelerator image without TensorFlow runs: the trainer under JAX, reading arrays, with
    every file of the model dir but `encoder/` (which a TensorFlow process writes after it)."""
    code = ("import runpy, sys, atexit\n"
            "atexit.register(lambda: print('TENSORFLOW', sys.modules.get('tensorflow') is not None, flush=True))\n"
            "sys.argv = ['model.train'] + sys.argv[1:]\n"
            "runpy.run_module('model.train', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code, "--data", shards, "--model-dir", str(tmp_path / "m"),
                           "--backend", "jax", "--encoder", "minilm", "--steps", "2", "--epochs", "1",
                           "--max-tokens", "32", "--evaluation-triplets", "16", "--batch-size", "8",
                           "--progress", "false", "--max-lost-fraction", "0.01"],
                          capture_output=True, text=True, cwd=REPO, timeout=900,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TENSORFLOW False" in done.stdout
    history = json.loads((tmp_path / "m" / "history.json").read_text())
    assert history["record_counts"]["train"]["unparseable"] == 1
    assert sorted(os.listdir(tmp_path / "m" / "logs")) == ["train", "validation"]   # TensorBoard, by tensorboardX


def test_two_processes_read_disjoint_shares_in_equal_steps(shards):
    """A job of 2 processes: each feeds its devices from its own shards, their shares together are
    the split once, and both run as many evaluation steps (a collective waits for every process)."""
    run = open_run(shards)
    for size in (None, 20):
        config = _config(shards, evaluation_triplets=size)
        shares = [ArrayInput(config, run, 1, process, 2).evaluation("validation") for process in (0, 1)]
        assert len(shares[0]) == len(shares[1]) > 0
        whole = ArrayInput(config, run, 1).evaluation("validation")
        weighed = [sum(float(batch[2].sum()) for batch in (share[i] for i in range(len(share)))) for share in shares]
        assert sum(weighed) == sum(float(whole[i][2].sum()) for i in range(len(whole))) == (size or 64)
    config = _config(shards)
    firsts = [ArrayInput(config, run, 1, process, 2).training()[0] for process in (0, 1)]
    assert not np.array_equal(firsts[0][0]["sentences"], firsts[1][0]["sentences"])
