"""`model.train --precision bfloat16` (Keras' mixed_bfloat16 policy): the Net computes in bfloat16
from float32 variables, the head, the loss and the metrics stay float32, the policy does not
outlive the build, and every export computes in float32 from the float32 weights, equal to a
float32 Net rebuilt from them. MiniLM is trained for 2 steps under TensorFlow (in this process)
and under JAX (a process of its own: Keras picks its backend once); the BiLSTM and MPNet (one
layer) take a step under each backend, cheaper."""
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
from model_shards import write_triplet_shards

from model.checkpoints import CHECKPOINTS
from model.config import TrainConfig
from model.net.network import build_encoder, build_triplet_model, dtype_policy
from model.training.model_dir import BEST_WEIGHTS, ENCODER, HISTORY

REPO = Path(__file__).resolve().parents[2]
SENTENCES = ["The river flows through the city.", "Music of the war", "a", "On and on it was, for the city."]
TINY_RUN = ["--steps", "2", "--epochs", "1", "--max-tokens", "32", "--evaluation-triplets", "16", "--batch-size", "8",
            "--progress", "false", "--max-lost-fraction", "0.01", "--precision", "bfloat16"]

# A callback that records, after the first training step, what the step computed in: the global
# policy, the Net's layers' policies, the dtype of an embedding the Net computes (an intermediate of
# the triplet model), the head's compute dtype and output, the loss on that output, the variables.
# Run as source in this process (TensorFlow) and in the JAX one.
RECORDER = """
import json, keras, numpy as np
from model.net.head import LOSSES

class Recorder(keras.callbacks.Callback):
    seen = None

    def on_train_batch_end(self, batch, logs=None):
        if self.seen is not None:
            return
        head = self.model.get_layer("distances")
        net = head.sentence_encoder
        embedding = net(np.array([[5, 6, 7, 0]], np.int32))
        self.seen = {
            "global_policy": keras.config.dtype_policy().name,
            "net_policies": sorted({layer.dtype_policy.name for layer in net._flatten_layers() if layer.weights}),
            "embedding": keras.backend.standardize_dtype(embedding.dtype),
            "head": head.compute_dtype,
            "output": keras.backend.standardize_dtype(self.model.outputs[0].dtype),
            "loss_dtype": keras.backend.standardize_dtype(LOSSES["triplet"](None, self.model.outputs[0]).dtype),
            "variables": sorted({keras.backend.standardize_dtype(v.dtype) for v in self.model.trainable_variables}),
            "step_loss": float(logs["loss"]),
        }
"""


def recorder():
    namespace: dict = {}
    exec(RECORDER, namespace)
    return namespace["Recorder"]()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("shards")),
                                sizes={"train": 64, "validation": 32, "test": 32})


def _config(**flags) -> TrainConfig:
    return TrainConfig.from_flags(data="data", model_dir="model", **flags)


def test_precision_is_a_runtime_flag_float32_by_default():
    assert _config().runtime.precision == "float32"
    assert _config(precision="bfloat16").flags()["precision"] == "bfloat16"
    with pytest.raises(ValueError, match="--precision must be one of float32, bfloat16"):
        _config(precision="float16")


def test_the_policy_is_set_for_the_build_only_and_restored_after_an_error():
    before = keras.config.dtype_policy().name
    with dtype_policy("bfloat16"):
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == before
    with pytest.raises(RuntimeError), dtype_policy("bfloat16"):
        raise RuntimeError("a failed build")
    assert keras.config.dtype_policy().name == before


def _tiny_bilstm(precision: str):
    matrix = np.random.default_rng(0).normal(size=(20, 6)).astype(np.float32)
    config = _config(precision=precision, lstm_units=4, attention_size=3)
    return build_encoder(config, matrix)


def test_a_bfloat16_net_feeds_a_float32_head_and_leaves_no_policy_behind():
    before = keras.config.dtype_policy().name
    net = _tiny_bilstm("bfloat16")
    assert keras.config.dtype_policy().name == before   # the next build is float32
    assert {layer.dtype_policy.name for layer in net._flatten_layers() if layer.weights} == {"mixed_bfloat16"}
    assert {v.dtype for v in net.trainable_variables} == {"float32"}
    ids = np.array([[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]], np.int32)
    assert keras.backend.standardize_dtype(net(ids).dtype) == "bfloat16"
    model = build_triplet_model(net, static_shapes=True)
    assert model.get_layer("distances").compute_dtype == "float32"
    distances = model({"sentences": ids[None], "roles": np.array([[[0, 1, 2]]], np.int32),
                       "sections": np.array([[0, 1, 2]], np.int32)})
    assert keras.backend.standardize_dtype(distances.dtype) == "float32"
    assert _tiny_bilstm("float32").layers[-1].dtype_policy.name == "float32"


def test_the_saved_model_of_a_bfloat16_net_computes_in_float32():
    """`write_saved_models`' encoder: a float32 twin with the trained weights, not the bfloat16 Net."""
    from model.formats.saved_model import float32_encoder

    config = _config(precision="bfloat16", lstm_units=4, attention_size=3)
    net = _tiny_bilstm("bfloat16")
    twin = float32_encoder(config, net)
    assert twin is not net and {layer.dtype_policy.name for layer in twin._flatten_layers()} == {"float32"}
    float32_net = _tiny_bilstm("float32")
    float32_net.set_weights(net.get_weights())
    ids = np.array([[1, 2, 3, 0], [4, 5, 0, 0]], np.int32)
    np.testing.assert_allclose(twin(ids).numpy(), float32_net(ids).numpy(), rtol=1e-6, atol=1e-6)
    assert twin(ids).dtype == "float32"
    assert float32_encoder(_config(), net) is net   # a float32 run's is its own


def _assert_trained_in_bfloat16(seen: dict, summary: dict) -> None:
    assert seen["global_policy"] == "float32"   # set around the build only
    assert seen["net_policies"] == ["mixed_bfloat16"]
    assert seen["embedding"] == "bfloat16"
    assert seen["head"] == seen["output"] == seen["loss_dtype"] == "float32"
    assert seen["variables"] == ["float32"]
    assert math.isfinite(seen["step_loss"])
    assert summary["config"]["precision"] == "bfloat16"
    assert all(math.isfinite(value) for value in summary["loss"] + [summary["test_loss"]])


def _assert_exports_float32(model_dir: Path) -> None:
    """The strings-in SavedModel computes float32 embeddings, equal to a float32 Net rebuilt from
    the run's best weights; the bfloat16 Net's embeddings differ from them (bfloat16 rounding)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401   the exported tokenizer's ops

    from model.encoding.trained_net import rebuilt

    served = tf.saved_model.load(str(model_dir / ENCODER)).signatures["serving_default"]
    embeddings = served(sentences=tf.constant(SENTENCES))["embeddings"]
    assert embeddings.dtype == tf.float32
    _, config, word_ids, net, _ = rebuilt(str(model_dir), str(model_dir / BEST_WEIGHTS))
    assert config.runtime.precision == "float32"
    ids = word_ids(tf.constant(SENTENCES))
    np.testing.assert_allclose(embeddings.numpy(), net(ids).numpy(), rtol=1e-5, atol=1e-5)
    bfloat16_net = build_encoder(config.with_flags(precision="bfloat16"), None)
    bfloat16_net.set_weights(net.get_weights())
    assert not np.allclose(embeddings.numpy(), np.asarray(bfloat16_net(ids), np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.slow   # a training run
def test_minilm_trains_in_bfloat16_under_tensorflow_and_exports_float32(shards, tmp_path):
    from model.config import parse_args
    from model.train import train

    seen = recorder()
    config = parse_args(["--data", shards, "--model-dir", str(tmp_path / "m"), "--encoder", "minilm", *TINY_RUN])
    summary = train(config, extra_callbacks=[seen])
    _assert_trained_in_bfloat16(seen.seen, summary)
    _assert_exports_float32(tmp_path / "m")


@pytest.mark.slow   # a JAX training process, and the TensorFlow process that writes its encoder/
def test_minilm_trains_in_bfloat16_under_jax_and_exports_float32(shards, tmp_path):
    pytest.importorskip("jax")
    code = RECORDER + textwrap.dedent("""
        import sys
        from model.config import parse_args
        from model.train import train
        assert keras.backend.backend() == "jax"
        seen = Recorder()
        train(parse_args(sys.argv[1:]), extra_callbacks=[seen])
        print("SEEN", json.dumps(seen.seen), flush=True)""")
    done = subprocess.run([sys.executable, "-c", code, "--data", shards, "--model-dir", str(tmp_path / "m"),
                           "--backend", "jax", "--encoder", "minilm", *TINY_RUN],
                          capture_output=True, text=True, cwd=REPO, timeout=900,
                          env={**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("SEEN "))[5:])
    _assert_trained_in_bfloat16(seen, json.loads((tmp_path / "m" / HISTORY).read_text()))
    _assert_exports_float32(tmp_path / "m")


# One training step of the BiLSTM and of one layer of MPNet in bfloat16: (its policies, the dtype of
# its embeddings, the loss and its dtype, its variables' dtypes) per encoder, as JSON.
ONE_STEP = """
import itertools, json, keras, numpy as np
from model.config import TrainConfig
from model.net.text import ArrayIds, WordIds
from model.net.wordpieces import wordpieces
from model.training.arrays import ROLES, batch_arrays, split_triplets
from model.net.network import build_models
from model.training.shards import open_run

triplets = list(itertools.islice(split_triplets(open_run(DATA), "triplets-sen", "train"), 8))
words = sorted({word for t in triplets for key in ROLES for word in t[key].lower().split()})
results = {}
for encoder in ENCODERS:
    config = TrainConfig.from_flags(data=DATA, model_dir="m", encoder=encoder, precision="bfloat16", lstm_units=4,
                                    attention_size=3, static_shapes=True,
                                    **({"transformer_layers": 1} if encoder == "mpnet" else {}))
    if encoder == "bilstm":
        word_ids = WordIds(words, 1, 16)
        tokenizer, matrix = ArrayIds(word_ids), np.random.default_rng(0).normal(size=(word_ids.num_ids, 6))
    else:
        tokenizer, matrix = wordpieces(16, encoder), None
    net, model = build_models(config, matrix.astype(np.float32) if matrix is not None else None, 8)
    inputs, labels, weights = batch_arrays(triplets, tokenizer, 8)
    loss = model.train_on_batch(inputs, labels, weights, return_dict=True)["loss"]
    outputs = model(inputs)
    results[encoder] = {
        "policies": sorted({layer.dtype_policy.name for layer in net._flatten_layers() if layer.weights}),
        "embedding": keras.backend.standardize_dtype(net(inputs["sentences"][0]).dtype),
        "loss": float(loss), "loss_dtype": keras.backend.standardize_dtype(model.loss(labels, outputs).dtype),
        "variables": sorted({keras.backend.standardize_dtype(v.dtype) for v in model.trainable_variables}),
        "global_policy": keras.config.dtype_policy().name}
print("STEPS", json.dumps(results), flush=True)
"""


def _cheap_encoders() -> list[str]:
    try:
        CHECKPOINTS["mpnet"].folder(None)
    except Exception:   # not installed (make mpnet-checkpoint): the BiLSTM alone
        return ["bilstm"]
    return ["bilstm", "mpnet"]


@pytest.mark.slow   # a training step of each encoder, under each backend (JAX in a process of its own)
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_the_bilstm_and_mpnet_take_a_bfloat16_step(shards, backend):
    if backend == "jax":
        pytest.importorskip("jax")
    encoders = _cheap_encoders()
    if backend == "tensorflow":   # this process's backend
        namespace = {"DATA": shards, "ENCODERS": encoders}
        exec(ONE_STEP, namespace)
        results = namespace["results"]
    else:
        code = f"DATA, ENCODERS = {shards!r}, {encoders!r}\n" + ONE_STEP
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=900,
                              env={**os.environ, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu"})
        assert done.returncode == 0, done.stderr[-3000:]
        results = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("STEPS "))[6:])
    assert sorted(results) == encoders
    for encoder, seen in results.items():
        assert seen["policies"] == ["mixed_bfloat16"], encoder
        assert seen["embedding"] == "bfloat16", encoder
        assert seen["loss_dtype"] == "float32" and math.isfinite(seen["loss"]), encoder
        assert seen["variables"] == ["float32"], encoder
        assert seen["global_policy"] == "float32", encoder
