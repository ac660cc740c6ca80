"""One model, one trainer, every backend: the head (`model.net.head`) gives the same loss and
accuracy under TensorFlow and JAX on the same batch and weights; `model.train --backend jax`
trains with Keras `fit` under JAX, resumes after a SIGKILL, and splits a global batch over 2
(virtual CPU) devices with `keras.distribution.DataParallel`. JAX runs in its own processes:
Keras picks its backend once, at import, and this test process runs TensorFlow's."""
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TRAINING_WARNINGS
from model_shards import FILLER, TOPICS, write_triplet_shards

from model.config import TrainConfig
from model.encoding.encoder import SavedModelEncoder
from model.net.head import MASKED_SCORE, in_batch_scores
from model.net.text import ArrayIds, WordIds
from model.training.arrays import batch_arrays, split_triplets
from model.training.model_dir import BACKUP, BACKUP_STATE, BEST_WEIGHTS, ENCODER, HISTORY, INPUTS
from model.training.shards import open_run

REPO = Path(__file__).resolve().parents[2]
JAX_ENV = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}

pytest.importorskip("jax")


def _in_jax(code: str, *, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO,
                          env=env or JAX_ENV, timeout=timeout)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("shards")))


# Five distinct sentences as 2-d unit vectors, their sections (-1: a padding row), and two
# triplets (anchor, positive, negative rows) of section 7: rows 0, 1 and 3 are section 7.
EMBEDDINGS = [[1, 0], [0.6, 0.8], [0, 1], [-1, 0], [0.8, 0.6]]
SECTIONS = [7, 7, 8, 7, -1]
ROLES = [[0, 1, 2], [3, 1, 2]]


@pytest.mark.slow   # a JAX process
def test_the_in_batch_mask_leaves_out_the_anchors_section_on_both_backends():
    under_tf = np.asarray(in_batch_scores(np.array([EMBEDDINGS], np.float32), np.array([ROLES]),
                                          np.array([SECTIONS]), "cosine"))
    done = _in_jax(f"""
        import json, numpy as np, keras
        from model.net.head import in_batch_scores
        assert keras.backend.backend() == "jax"
        scores = in_batch_scores(np.array([{EMBEDDINGS}], np.float32), np.array([{ROLES}]), np.array([{SECTIONS}]),
                                 "cosine")
        print(json.dumps(np.asarray(scores).tolist()))""")
    assert done.returncode == 0, done.stderr[-3000:]
    under_jax = np.array(json.loads(done.stdout.strip().splitlines()[-1]))
    np.testing.assert_allclose(under_jax, under_tf, rtol=1e-6, atol=1e-6)
    # only row 2 (section 8) is a candidate: the anchor's own section and the padding row are left out
    np.testing.assert_array_equal(under_jax[:, 1:] > MASKED_SCORE / 2, [[False, False, True, False, False]] * 2)


@pytest.mark.slow   # a JAX process each
@pytest.mark.parametrize("loss, distance", [("triplet", "l1"), ("sum", "cosine")])
def test_both_backends_give_the_same_loss_and_accuracy_on_the_same_batch_and_weights(shards, tmp_path, loss,
                                                                                      distance):
    from model.net.head import LOSSES, triplet_accuracy
    from model.net.network import build_sentence_encoder, build_triplet_model

    run = open_run(shards)
    word_ids = WordIds(sorted({word for words in TOPICS.values() for word in words} | set(FILLER)), 1, 16)
    inputs, labels, weights = batch_arrays(list(itertools.islice(split_triplets(run, "triplets-sen", "train"), 8)),
                                           ArrayIds(word_ids), 8)
    matrix = np.random.default_rng(0).normal(size=(word_ids.num_ids, 6)).astype(np.float32)
    model = build_triplet_model(build_sentence_encoder(matrix, lstm_units=4, attention_size=3), distance=distance,
                                static_shapes=True, loss=loss)
    outputs = model(inputs)
    np.savez(tmp_path / "batch.npz", matrix=matrix, labels=labels, weights=weights,
             **{f"in_{key}": value for key, value in inputs.items()})
    model.save_weights(tmp_path / "model.weights.h5")
    done = _in_jax(f"""
        import json, numpy as np, keras
        from model.net.head import LOSSES, triplet_accuracy
        from model.net.network import build_sentence_encoder, build_triplet_model
        batch = np.load("{tmp_path}/batch.npz")
        model = build_triplet_model(build_sentence_encoder(batch["matrix"], lstm_units=4, attention_size=3),
                                    distance="{distance}", static_shapes=True, loss="{loss}")
        model.load_weights("{tmp_path}/model.weights.h5")
        outputs = model({{key[3:]: batch[key] for key in batch.files if key.startswith("in_")}})
        print(json.dumps({{"outputs": np.asarray(outputs).tolist(),
                          "loss": np.asarray(LOSSES["{loss}"](batch["labels"], outputs)).tolist(),
                          "accuracy": np.asarray(triplet_accuracy(batch["labels"], outputs)).tolist()}}))""")
    assert done.returncode == 0, done.stderr[-3000:]
    under_jax = json.loads(done.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(under_jax["outputs"], outputs.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(under_jax["loss"], LOSSES[loss](labels, outputs).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(under_jax["accuracy"], triplet_accuracy(labels, outputs).numpy())


TINY = ["--vocabulary", "train", "--lstm-units", "8", "--attention-size", "4", "--batch-size", "8",
        "--progress", "false"]


def _train_jax(data, model_dir, *flags, env=None):
    return subprocess.Popen([sys.executable, "-m", "model.train", "--data", str(data), "--model-dir", str(model_dir),
                             "--backend", "jax", *TINY, *flags], cwd=REPO, env=env or JAX_ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow   # two JAX trainer processes
@pytest.mark.parametrize("parts", [1, 2])
def test_a_jax_run_killed_by_sigkill_resumes_from_its_backup(shards, tmp_path, parts):
    """Also with each batch fed in 2 parts (`--gradient-accumulation-steps`): backups between
    updates, and steps counted as updates, not parts."""
    flags = ["--epochs", "3", "--steps", "4", "--checkpoint-every", "2", "--gradient-accumulation-steps", str(parts)]
    killed = _train_jax(shards, tmp_path / "m", *flags)
    state = tmp_path / "m" / BACKUP / BACKUP_STATE
    deadline = time.time() + 300
    while not (state.exists() and json.loads(state.read_text())["step"] >= 4) and killed.poll() is None:
        assert time.time() < deadline
        time.sleep(0.2)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    backed_up = json.loads(state.read_text())   # the epochs completed and the updates made
    resumed = _train_jax(shards, tmp_path / "m", *flags)
    _, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stderr[-3000:]
    assert "resuming from the backup at step" in stderr
    history = json.loads((tmp_path / "m" / HISTORY).read_text())
    assert history["epochs_run"] == 3 and history["config"]["backend"] == "jax"
    # the epochs left, 4 updates of 8 triplets each, after the backup's updates
    updates = backed_up["step"] + (3 - backed_up["epoch"]) * 4
    assert history["learning_curve"][-1]["triplets_seen"] == updates * 8
    assert (tmp_path / "m" / ENCODER / "saved_model.pb").exists()   # written by a TensorFlow process


CHECK_REPLICAS = """
    import json, sys, keras
    import numpy as np
    from model.config import TrainConfig
    from model.train import train

    class Replicated(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            values = [variable.value for variable in self.model.trainable_variables]
            self.devices = {device.id for value in values for device in value.sharding.device_set}
            self.equal = all(value.sharding.is_fully_replicated and all(
                np.array_equal(np.asarray(shard.data), np.asarray(value.addressable_shards[0].data))
                for shard in value.addressable_shards)
                for value in values)

    check = Replicated()
    summary = train(TrainConfig.from_flags(**json.loads(sys.argv[1])), extra_callbacks=[check])
    print(json.dumps({"replicas": summary["replicas"], "devices": len(check.devices), "equal": check.equal}))
"""


@pytest.mark.slow   # a JAX trainer process on 2 virtual devices
def test_data_parallel_trains_on_two_replicas_whose_weights_stay_equal(shards, tmp_path):
    config = dict(data=shards, model_dir=str(tmp_path / "m"), backend="jax", distribution_strategy="data-parallel",
                  epochs=1, steps=2, batch_size=8, lstm_units=8, attention_size=4, vocabulary="train", progress=False)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHECK_REPLICAS), json.dumps(config)],
                          capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**JAX_ENV, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"replicas": 2, "devices": 2, "equal": True}
    history = json.loads((tmp_path / "m" / HISTORY).read_text())
    assert history["replicas"] == 2 and history["global_batch_size"] == 16


# Warnings that read like bugs, gone by fixing their causes (BERT's unused pooler is frozen; a
# checkpoint is loaded into a built optimizer).
MISLEADING = ("Gradients do not exist for variables", "Skipping variable loading for optimizer")


@pytest.mark.slow   # a MiniLM trainer process under JAX, then eval.all and model.export on its model dir
def test_a_jax_trained_minilm_model_dir_is_the_tf_trainers(embedded_pipeline_output, fine_tuned, tmp_path):
    model_dir = tmp_path / "minilm-jax"
    trained = _train_jax(embedded_pipeline_output, model_dir, "--encoder", "minilm", "--steps", "2", "--epochs", "1",
                         "--max-tokens", "32", "--evaluation-triplets", "16")
    _, stderr = trained.communicate(timeout=900)
    assert trained.returncode == 0, stderr[-3000:]
    tf_dir, _ = fine_tuned   # the same 2-step MiniLM run under TensorFlow (tests/conftest.py)
    assert sorted(os.listdir(model_dir)) == sorted(os.listdir(tf_dir))
    for log in (stderr, (tf_dir.parent / TRAINING_WARNINGS).read_text()):
        assert not [warning for warning in MISLEADING if warning in log], log[-3000:]
    # encoder/ (written by a TensorFlow process) embeds as the JAX-trained Net does
    sentences = ["The striker scored twice in the final.", "Bake the bread in a hot oven.", "Café au lait."]
    done = _in_jax(f"""
        import json, numpy as np, keras
        from model.encoding.trained_net import recorded_config
        from model.net.network import build_models
        from model.net.transformer import token_ids
        _, config = recorded_config("{model_dir}")
        encoder, model = build_models(config, None, global_batch=8)
        model.optimizer.build(model.trainable_variables)
        model.load_weights("{model_dir}/{BEST_WEIGHTS}")
        ids = token_ids(32)(np.array({sentences!r})).numpy()
        print(json.dumps(np.asarray(encoder(ids)).tolist()))""")
    assert done.returncode == 0, done.stderr[-3000:]
    under_jax = np.array(json.loads(done.stdout.strip().splitlines()[-1]))
    exported = SavedModelEncoder(str(model_dir)).encode(sentences)
    cosines = (under_jax * exported).sum(1) / np.linalg.norm(under_jax, axis=1) / np.linalg.norm(exported, axis=1)
    assert cosines.min() > 0.9999, cosines
    report = subprocess.run([sys.executable, "-m", "eval.all", "--data", str(embedded_pipeline_output), "--model-dir",
                             str(model_dir), "--output", str(tmp_path / "report"), "--max-scb-articles", "1",
                             "--max-triplets", "50"], capture_output=True, text=True, cwd=REPO, timeout=900)
    assert report.returncode == 0, report.stderr[-3000:]
    rows = json.loads((tmp_path / "report" / "triplets.json").read_text())["methods"]
    assert "minilm-jax" in [row["method"] for row in rows]
    exported = subprocess.run([sys.executable, "-m", "model.export", "--model-dir", str(model_dir), "--output",
                               str(tmp_path / "st")], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert exported.returncode == 0, exported.stderr[-3000:]


def test_a_keras_backend_other_than_the_flag_is_one_error_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "model.train", "--data", str(tmp_path), "--model-dir",
                           str(tmp_path / "m")], capture_output=True, text=True, cwd=REPO, env=JAX_ENV, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("error: KERAS_BACKEND=jax but --backend tensorflow: pass "
                                                    "--backend jax, or unset KERAS_BACKEND")
    assert not (tmp_path / "m").exists()


def test_the_backend_and_its_strategies_are_checked_with_the_flags():
    with pytest.raises(ValueError, match="--distribution-strategy mirrored is not one of --backend jax's"):
        TrainConfig.from_flags(data="d", model_dir="m", backend="jax", distribution_strategy="mirrored")
    with pytest.raises(ValueError, match="--distribution-strategy data-parallel is not one of --backend tensorflow"):
        TrainConfig.from_flags(data="d", model_dir="m", distribution_strategy="data-parallel")
    assert TrainConfig.from_flags(data="d", model_dir="m", backend="jax").runtime.static_batches


@pytest.mark.parametrize("command", ["model.pretrained", "model.export --format saved-model"])
def test_a_command_that_needs_tensorflow_keras_refuses_another_backend_in_one_line(tmp_path, command):
    """A SavedModel holds TensorFlow functions: the commands that write one refuse JAX's Keras
    (model.export's onnx and sentence-transformers formats run under it: tests/infra/test_quality_run.py)."""
    done = subprocess.run([sys.executable, "-m", *command.split(), "--model-dir", str(tmp_path / "m")],
                          capture_output=True, text=True, cwd=REPO, env=JAX_ENV, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: KERAS_BACKEND=jax: {command} runs Keras under "
                                                           "TensorFlow")
    assert not (tmp_path / "m").exists()


@pytest.mark.slow   # a MiniLM trainer process under JAX, on 1 and on 2 virtual devices
@pytest.mark.parametrize("devices", [1, 2])
def test_minilm_under_jax_on_its_defaults_scores_the_whole_validation_split_every_pass(shards, tmp_path, devices):
    """No `--evaluation-triplets`: the validation split is streamed at every pass (each epoch's
    validation, then the untrained model's), and on 2 devices each runs the same number of steps."""
    strategy = ["--distribution-strategy", "data-parallel"] if devices == 2 else []
    env = {**JAX_ENV, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    trained = subprocess.run([sys.executable, "-m", "model.train", "--data", str(shards), "--model-dir",
                              str(tmp_path / "m"), "--backend", "jax", "--encoder", "minilm", "--steps", "2",
                              "--epochs", "2", "--batch-size", "8", "--max-tokens", "16", "--progress", "false",
                              *strategy], capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    assert trained.returncode == 0, trained.stderr[-3000:]
    history = json.loads((tmp_path / "m" / HISTORY).read_text())
    assert history["replicas"] == devices and history["evaluation_triplets"] == "all"
    assert len(history["val_triplet_accuracy"]) == 2
    assert 0 < history["untrained_val_triplet_accuracy"] <= 1
    exported = subprocess.run([sys.executable, "-m", "model.export", "--model-dir", str(tmp_path / "m"), "--format",
                               "onnx", "--output", str(tmp_path / "onnx")], capture_output=True, text=True, cwd=REPO,
                              timeout=600)
    assert exported.returncode == 0, exported.stderr[-3000:]


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


@pytest.mark.slow   # two MiniLM trainer processes under JAX, then eval.all and model.export on their model dir
def test_two_processes_train_one_model_dir_that_eval_and_export_accept(embedded_pipeline_output, tmp_path):
    """Several hosts as Keras documents them: the same command in every process, told the job by
    `KERAS_DISTRIBUTION_*` (here 2 processes over loopback, JAX's CPU collectives through gloo)."""
    model_dir, port = tmp_path / "m", _free_port()
    processes = [subprocess.Popen(
        [sys.executable, "-m", "model.train", "--data", str(embedded_pipeline_output), "--model-dir", str(model_dir),
         "--backend", "jax", "--encoder", "minilm", "--distribution-strategy", "data-parallel", "--steps", "2",
         "--epochs", "1", "--batch-size", "8", "--max-tokens", "16", "--evaluation-triplets", "16", "--progress",
         "false"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**JAX_ENV, "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"localhost:{port}",
             "KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": str(index)})
        for index in (0, 1)]
    for process in processes:
        _, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, stderr[-3000:]
    history = json.loads((model_dir / HISTORY).read_text())
    assert history["processes"] == 2 and history["replicas"] == 2 and history["global_batch_size"] == 16
    # one writer: process 0 claimed the model dir (the other wrote to a folder of its own)
    assert json.loads((model_dir / INPUTS).read_text())["owner"]["pid"] == processes[0].pid
    report = subprocess.run([sys.executable, "-m", "eval.all", "--data", str(embedded_pipeline_output), "--model-dir",
                             f"two={model_dir}", "--encoder", "mean-vectors", "--output", str(tmp_path / "report"),
                             "--max-scb-articles", "1", "--max-triplets", "50"],
                            capture_output=True, text=True, cwd=REPO, timeout=900)
    assert report.returncode == 0, report.stderr[-3000:]
    rows = json.loads((tmp_path / "report" / "triplets.json").read_text())["methods"]
    assert "two" in [row["method"] for row in rows]
    exported = subprocess.run([sys.executable, "-m", "model.export", "--model-dir", str(model_dir), "--format", "onnx",
                               "--output", str(tmp_path / "onnx")], capture_output=True, text=True, cwd=REPO,
                              timeout=600)
    assert exported.returncode == 0, exported.stderr[-3000:]


ONE_LAYER_MINILM = ["--backend", "jax", "--encoder", "minilm", "--transformer-layers", "1", "--max-tokens", "16",
                    "--steps", "1", "--epochs", "1", "--progress", "false"]


@pytest.mark.slow   # two MiniLM trainer processes under JAX, then one alone
def test_two_processes_score_the_real_triplets_of_a_split_one_of_them_holds(tmp_path):
    """The 1-shard validation split is process 0's; process 1 runs as many steps weighing 0, and
    process 0's last batch is part padding. The untrained scores were the 20 triplets' sums over
    every row of the 3 global batches (accuracy 20/48 for 20 right); they are one process's over
    one batch of exactly the 20."""
    from test_model_arrays import one_shard_evaluation

    data, port = one_shard_evaluation(str(tmp_path / "data")), _free_port()
    processes = [subprocess.Popen(
        [sys.executable, "-m", "model.train", "--data", data, "--model-dir", str(tmp_path / "two"), *ONE_LAYER_MINILM,
         "--batch-size", "8", "--distribution-strategy", "data-parallel"], cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
        env={**JAX_ENV, "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"localhost:{port}",
             "KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": str(index)})
        for index in (0, 1)]
    try:
        for process in processes:
            _, stderr = process.communicate(timeout=900)
            assert process.returncode == 0, stderr[-3000:]
    finally:
        for process in processes:
            process.kill()
    alone = subprocess.run([sys.executable, "-m", "model.train", "--data", data, "--model-dir", str(tmp_path / "one"),
                            *ONE_LAYER_MINILM, "--batch-size", "20"], capture_output=True, text=True, cwd=REPO,
                           env=JAX_ENV, timeout=900)
    assert alone.returncode == 0, alone.stderr[-3000:]
    two, one = (json.loads((tmp_path / name / HISTORY).read_text()) for name in ("two", "one"))
    assert two["processes"] == 2 and two["global_batch_size"] == 16
    assert two["untrained_val_triplet_accuracy"] == pytest.approx(one["untrained_val_triplet_accuracy"])
    assert two["untrained_val_loss"] == pytest.approx(one["untrained_val_loss"], rel=1e-3)
