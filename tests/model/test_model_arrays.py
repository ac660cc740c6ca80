"""The trainer's one input (`model.training.arrays`) on real shards: a resumed stream is the
unbroken one from its step (article chunks, a shuffle buffer, length groups), the evaluation
sample is held and the whole split streamed again at each pass, the record counts name what
reading lost, TensorFlow reads the same batches (`model.training.tf_input`), and a JAX run of a
transformer never imports TensorFlow."""
import gzip
import itertools
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
from model.net.wordpieces import wordpieces
from model.training.arrays import TripletInput, split_triplets
from model.training.model_dir import HISTORY, LOGS
from model.training.shards import needs_tensorflow, open_run

DATASET, MAX_TOKENS, BATCH = "triplets-sen", 32, 8
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("shards")), extra_records=(b"not an Example",))


def _config(data: str, **flags) -> TrainConfig:
    return TrainConfig.from_flags(**{"data": data, "model_dir": "unused", "encoder": "minilm", "backend": "jax",
                                     "max_tokens": MAX_TOKENS, "batch_size": BATCH, **flags})


def _input(data: str, blocks: int = 1, process: int = 0, processes: int = 1, **flags) -> TripletInput:
    config = _config(data, **flags)
    return TripletInput(config, open_run(data), wordpieces(MAX_TOKENS), blocks=blocks, process=process,
                        processes=processes)


def _assert_equal(expected, got):
    (want_inputs, want_labels, want_weights), (inputs, labels, weights) = expected, got
    assert sorted(inputs) == sorted(want_inputs)
    for name in want_inputs:
        assert inputs[name].dtype == want_inputs[name].dtype, name
        np.testing.assert_array_equal(inputs[name], want_inputs[name], err_msg=name)
    for want, array in ((want_labels, labels), (want_weights, weights)):
        assert array.dtype == want.dtype
        np.testing.assert_array_equal(array, want)


@pytest.mark.parametrize("blocks, resume_at_step, flags", [
    (1, 5, {}), (2, 3, {}), (1, 7, {"shuffle_buffer": 64}), (1, 4, {"article_chunk": 0, "backend": "tensorflow"})])
def test_a_resumed_training_stream_is_the_unbroken_one_from_its_step(shards, blocks, resume_at_step, flags):
    """Past a pass over the 256 triplets (the next pass's shard order too): where batches are
    consecutive records the stream starts at its record, otherwise its trained batches are dropped."""
    unbroken = _input(shards, blocks, **flags).training_batches()
    resumed = _input(shards, blocks, **flags).training_batches(resume_at_step)
    for batch in itertools.islice(unbroken, resume_at_step):
        assert batch[2].sum() == BATCH * blocks   # every training batch full (an endless stream)
    for expected, got in itertools.islice(zip(unbroken, resumed), 40):
        _assert_equal(expected, got)


def test_the_shuffle_buffer_reorders_the_stream_and_holds_back_at_most_its_size(shards):
    def anchors(batches, count):   # each real triplet's anchor, as its wordpiece ids
        rows = []
        for inputs, _, weights in itertools.islice(batches, count):
            sentences = inputs["sentences"][0]
            rows += [tuple(sentences[roles[0]][sentences[roles[0]] > 0])
                     for roles, weight in zip(inputs["roles"][0], weights) if weight]
        return rows
    in_order = anchors(_input(shards).training_batches(), 40)
    shuffled = anchors(_input(shards, shuffle_buffer=64).training_batches(), 32)
    assert len(shuffled) == 256 and shuffled != in_order[:256]
    assert set(shuffled) <= set(in_order[:256 + 64])              # nothing from further on than the buffer holds
    assert len(set(in_order[:256]) - set(shuffled)) <= 64         # nothing held back longer


def test_the_evaluation_sample_is_held_and_the_whole_split_streamed_at_every_pass(shards):
    config = _config(shards, evaluation_triplets=20)
    held = _input(shards, evaluation_triplets=20).evaluation("validation")
    sample = list(itertools.islice(split_triplets(open_run(shards), DATASET, "validation", config.runtime.seed), 20))
    assert len(held) == 3 and sum(float(held[i][2].sum()) for i in range(3)) == 20
    first = [held[i] for i in range(3)]
    for index in range(3):   # a second pass: the same arrays
        _assert_equal(first[index], held[index])
    tokens = wordpieces(MAX_TOKENS)
    assert {tuple(row[row > 0]) for row in first[0][0]["sentences"][0]} == {
        tuple(ids[ids > 0]) for ids in tokens([t[role] for t in sample[:BATCH] for role in ("anchor", "positive",
                                                                                              "negative")])}
    whole = _input(shards).evaluation("test")
    assert len(whole) == 8 and sum(float(whole[i][2].sum()) for i in range(8)) == 64
    again = [whole[i] for i in range(8)]
    for index in range(8):
        _assert_equal(again[index], whole[index])


def test_the_record_counts_name_an_unparseable_record_and_a_truncated_shard(shards, tmp_path):
    data = tmp_path / "run"
    shutil.copytree(shards, data)
    shard = sorted((data / DATASET / "test").iterdir())[0]
    records = gzip.decompress(shard.read_bytes())
    shard.write_bytes(gzip.compress(records[:len(records) // 2]))   # ends inside a record
    source = _input(str(data))
    assert source.count_records("train") == {"expected": 257, "read": 257, "lost": 0, "unparseable": 1}
    test = source.count_records("test")
    assert test["expected"] == 64 and 0 < test["lost"] < 32 and test["read"] + test["lost"] == 64


def test_what_needs_tensorflow_is_named():
    assert needs_tensorflow(_config("d")) is None
    assert needs_tensorflow(_config("d", shuffle_buffer=64, article_chunk=0)) is None
    assert "--encoder bilstm" in needs_tensorflow(_config("d", encoder="bilstm"))
    assert needs_tensorflow(_config("d", teacher="t")).startswith("--teacher")


@pytest.mark.slow   # tf.data
def test_tensorflow_reads_the_same_batches(shards):
    """What a TensorFlow run reads (`tf_input`): the stream's and an evaluation's arrays, the
    evaluation's length known to Keras."""
    import tensorflow as tf

    from model.training import tf_input

    source = _input(shards, backend="tensorflow")
    fed = tf_input.training(source, tf.distribute.get_strategy())
    for expected, got in zip(itertools.islice(source.training_batches(), 40), fed.take(40).as_numpy_iterator()):
        _assert_equal(expected, got)
    split = source.evaluation("test")
    fed = tf_input.dataset(lambda: (split[i] for i in range(len(split))), length=len(split))
    assert int(fed.cardinality()) == len(split) == 8
    for index, got in enumerate(fed.as_numpy_iterator()):
        _assert_equal(split[index], got)


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
    history = json.loads((tmp_path / "m" / HISTORY).read_text())
    assert history["record_counts"]["train"]["unparseable"] == 1
    assert sorted(os.listdir(tmp_path / "m" / LOGS)) == ["train", "validation"]   # TensorBoard, by tensorboardX


def test_two_processes_read_disjoint_shares_in_equal_steps(shards):
    """A job of 2 processes: each feeds its devices from its own shards, their shares together are
    the split once, and both run as many evaluation steps (a collective waits for every process)."""
    for size in (None, 20):
        shares = [_input(shards, 1, process, 2, evaluation_triplets=size).evaluation("validation")
                  for process in (0, 1)]
        assert len(shares[0]) == len(shares[1]) > 0
        whole = _input(shards, evaluation_triplets=size).evaluation("validation")
        weighed = [sum(float(batch[2].sum()) for batch in (share[i] for i in range(len(share)))) for share in shares]
        assert sum(weighed) == sum(float(whole[i][2].sum()) for i in range(len(whole))) == (size or 64)
    firsts = [_input(shards, 1, process, 2).training()[0] for process in (0, 1)]
    assert not np.array_equal(firsts[0][0]["sentences"], firsts[1][0]["sentences"])


def one_shard_evaluation(out: str) -> str:
    """A run whose train split has 2 shards and whose validation and test splits have 1 each:
    fewer than the 2 processes of a job, so one process's evaluation share is empty."""
    write_triplet_shards(out, sizes={"validation": 20, "test": 20}, shards=1)
    return write_triplet_shards(out, sizes={"train": 64}, shards=2)


@pytest.mark.parametrize("size", [None, 1])
def test_an_empty_evaluation_share_runs_as_many_steps_weighing_0(tmp_path, size):
    """Fewer shards (or sample triplets) than processes: a process with none of them ran no step
    (IndexError), and the process with them waited for it in a collective. Its share is as many
    batches of the same shapes, weighing 0, so the shares together weigh the split once."""
    data = one_shard_evaluation(str(tmp_path / "data"))
    shares = [_input(data, 1, process, 2, evaluation_triplets=size).evaluation("validation") for process in (0, 1)]
    assert len(shares[0]) == len(shares[1]) == (1 if size else 3)
    for _ in range(2):   # the stream starts again at every pass
        batches = [[share[i] for i in range(len(share))] for share in shares]
        for full, empty in zip(*batches):
            assert {name: array.shape for name, array in full[0].items()} == {
                name: array.shape for name, array in empty[0].items()}
            assert not empty[2].any() and (empty[0]["sentences"] != 0).any(axis=-1).all()   # no all-padding row
        assert sum(float(batch[2].sum()) for batch in batches[0]) == (size or 20)


@pytest.mark.slow   # Keras evaluate
@pytest.mark.parametrize("loss", ["triplet", "sum"])
def test_evaluate_scores_each_real_triplet_once_whatever_the_padding(tmp_path, loss):
    """A job of 2 processes over a 1-shard split: one process's 20 triplets in 3 static batches of
    8 (4 padding triplets), the other's share 3 batches weighing 0, as one global pass sees them.
    Keras' plain metrics ignore sample weights and its loss tracker divides by rows: the accuracy
    and loss counted all 48 rows, padding too; they are means over the 20 triplets."""
    from model.net.head import LOSSES
    from model.net.network import build_sentence_encoder, build_triplet_model, compile_triplet_model
    from model.training.tf_input import dataset

    data = one_shard_evaluation(str(tmp_path / "data"))
    shares = [_input(data, 1, process, 2, backend="tensorflow").evaluation("validation") for process in (0, 1)]
    batches = [share[i] for share in shares for i in range(len(share))]
    matrix = np.random.default_rng(0).normal(size=(len(wordpieces(MAX_TOKENS).vocabulary), 6)).astype(np.float32)
    model = build_triplet_model(build_sentence_encoder(matrix, lstm_units=4, attention_size=3), static_shapes=True,
                                loss=loss)
    compile_triplet_model(model, loss=loss)
    right = losses = 0.0
    for inputs, labels, weights in batches:
        outputs = model(inputs)
        right += float(np.sum(weights * (np.asarray(outputs)[:, 0] < np.asarray(outputs)[:, 1])))
        losses += float(np.sum(weights * np.asarray(LOSSES[loss](labels, outputs))))
    assert sum(float(weights.sum()) for *_, weights in batches) == 20 < sum(len(weights) for *_, weights in batches)
    scores = model.evaluate(dataset(lambda: iter(batches), length=len(batches)), verbose=0, return_dict=True)
    assert scores["triplet_accuracy"] == pytest.approx(right / 20)
    assert scores["loss"] == pytest.approx(losses / 20, rel=1e-5)


@pytest.mark.slow   # two Python processes that load Keras
@pytest.mark.parametrize("backend, kept_out", [("jax", True), ("tensorflow", False)])
def test_tensorflow_is_kept_out_of_a_jax_transformer_run_only(backend, kept_out):
    code = ("import sys\nfrom model.config import TrainConfig\nfrom model.train import use_backend\n"
            f"use_backend(TrainConfig.from_flags(data='d', model_dir='m', encoder='minilm', backend='{backend}'))\n"
            "import keras, keras_hub\n"
            "try:\n    import tensorflow\n    print('TENSORFLOW', True)\n"
            "except ImportError:\n    print('TENSORFLOW', False)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"TENSORFLOW {not kept_out}" in done.stdout
