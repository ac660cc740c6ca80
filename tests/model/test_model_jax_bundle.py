"""The accelerator path without TensorFlow: the bundle's NumPy batches and schedule
(`model.jax_train`), its weight deltas written in pieces and added back (`model.jax_bundle`), and
a real bundle of the excerpt packed and unpacked into an export that encodes as its weights say."""
import json
import os

import numpy as np
import pytest

from model import jax_train
from model.jax_bundle import WEIGHTS, trained_weights


def test_importing_the_jax_trainer_leaves_the_keras_backend_alone():
    assert os.environ.get("KERAS_BACKEND") != "jax"   # only its main() picks JAX, for its own process


def test_padded_sentences_and_triplet_rows_come_from_the_flat_ids():
    split = {"ids": np.array([101, 7, 102, 101, 8, 9, 102, 101, 102], np.uint16),
             "starts": np.array([0, 3, 7, 9])}
    padded = jax_train.padded_sentences(split)
    assert padded.shape == (3, jax_train.MAX_TOKENS) and padded.dtype == np.int32
    np.testing.assert_array_equal(padded[1, :5], [101, 8, 9, 102, 0])
    np.testing.assert_array_equal(padded[2, :3], [101, 102, 0])
    rows = jax_train.triplet_ids(padded, np.array([[0, 1, 2], [2, 0, 1]]))
    # the anchors, then the positives, then the negatives
    np.testing.assert_array_equal(rows[:, 1], [7, 102, 8, 7, 102, 8])


def test_the_learning_rate_warms_up_then_falls_to_zero_at_the_runs_end():
    total, peak = 200, 1e-4
    rates = [jax_train.learning_rate_at(step, total, peak) for step in range(total + 1)]
    warmup = int(jax_train.WARMUP_SHARE * total)
    assert rates[0] == pytest.approx(peak / warmup) and rates[warmup - 1] == pytest.approx(peak)
    assert all(later < earlier for earlier, later in zip(rates[warmup:], rates[warmup + 1:]))
    assert rates[total] == 0.0


def test_deltas_written_in_pieces_add_back_to_the_trained_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(jax_train, "DELTA_FILE_BYTES", 1024)   # files of 1 KiB: the big weight splits by rows
    rng = np.random.default_rng(0)
    start = [rng.standard_normal((100, 16)).astype(np.float16), rng.standard_normal(7).astype(np.float16)]
    np.savez(tmp_path / WEIGHTS, **{f"w{index:04d}": weight for index, weight in enumerate(start)})
    (tmp_path / "backbone.json").write_text(json.dumps({"weights": ["big/kernel", "small/bias"]}))
    deltas = [rng.standard_normal(weight.shape).astype(np.float32) * 1e-3 for weight in start]
    files = jax_train.write_deltas(str(tmp_path / "trained"), deltas)
    assert len(files) > 1 and all((tmp_path / "trained" / name).stat().st_size <= 1024 + 1024
                                  for name in [f.rsplit("/", 1)[1] for f in files])
    weights = trained_weights(str(tmp_path), str(tmp_path / "trained"), ["big/kernel", "small/bias"])
    for got, begun, delta in zip(weights, start, deltas):
        assert got.dtype == np.float32 and got.shape == begun.shape
        np.testing.assert_allclose(got, begun.astype(np.float32) + delta, rtol=0, atol=1e-6)
    # a student with the second weight alone: its delta 0 is added to the bundle's weight of that path
    (tmp_path / "student").mkdir()
    jax_train.write_deltas(str(tmp_path / "student"), [deltas[1]])
    [student] = trained_weights(str(tmp_path), str(tmp_path / "student"), ["small/bias"])
    np.testing.assert_allclose(student, start[1].astype(np.float32) + deltas[1], rtol=0, atol=1e-6)

    # WiSE-FT: half the run's delta
    halfway = trained_weights(str(tmp_path), str(tmp_path / "trained"), ["big/kernel", "small/bias"], scale=0.5)
    np.testing.assert_allclose(halfway[1], start[1].astype(np.float32) + 0.5 * deltas[1], rtol=0, atol=1e-6)


def test_a_soup_is_the_mean_of_its_runs_deltas_and_refuses_runs_of_other_weights():
    from model.jax_soup import mean_deltas
    from pipeline.cli import UsageError

    rng = np.random.default_rng(1)
    runs = [{0: rng.standard_normal((3, 2)).astype(np.float16), 1: rng.standard_normal(4).astype(np.float16)}
            for _ in range(3)]
    soup = mean_deltas(runs)
    assert [delta.dtype for delta in soup] == [np.float32, np.float32]
    for index, delta in enumerate(soup):
        np.testing.assert_allclose(delta, sum(run[index].astype(np.float32) for run in runs) / 3, rtol=1e-6)
    with pytest.raises(UsageError, match="different weights"):
        mean_deltas([runs[0], {0: runs[1][0]}])


@pytest.mark.slow
def test_a_packed_bundle_holds_the_tokenized_triplets_and_unpacks_to_its_weights(embedded_pipeline_output, tmp_path):
    """pack: every triplet's rows decode to its own sentences' wordpieces, and the checkpoint's
    weights are there in float16; unpack: the export encodes with start + delta (a delta on the
    last layer norm's bias moves every embedding by exactly that vector)."""
    import tensorflow as tf

    from model.data import open_run, triplet_strings
    from model.encoder import SavedModelEncoder
    from model.jax_bundle import PackConfig, pack
    from model.jax_unpack import UnpackConfig, unpack
    from model.transformer import build_transformer_encoder, token_ids

    bundle = tmp_path / "bundle"
    counts = pack(PackConfig(data=str(embedded_pipeline_output), output=str(bundle), max_triplets=40,
                             validation_triplets=10))
    assert counts["train"]["triplets"] == 40 and counts["validation"]["triplets"] == 10
    train = np.load(bundle / "train.npz")
    triplets = list(triplet_strings(open_run(str(embedded_pipeline_output)), "triplets-sen", "train").take(40))
    word_ids = token_ids()
    for triplet, rows in zip(triplets, train["triplets"]):
        for role, row in zip(("anchor", "positive", "negative"), rows):
            expected = word_ids.ragged(tf.constant([triplet[role].numpy()]))[0].numpy()
            np.testing.assert_array_equal(train["ids"][train["starts"][row]:train["starts"][row + 1]], expected)
    described = json.loads((bundle / "backbone.json").read_text())
    encoder = build_transformer_encoder()
    assert described["weights"] == [weight.path for weight in encoder.weights]

    last_bias = max(index for index, path in enumerate(described["weights"])
                    if path.endswith("feedforward_layer_norm/beta"))
    shift = np.linspace(-0.5, 0.5, encoder.weights[last_bias].shape[0]).astype(np.float32)
    deltas = [np.zeros(weight.shape, np.float32) for weight in encoder.weights]
    deltas[last_bias] = shift
    trained = tmp_path / "trained"
    jax_train.write_deltas(str(trained), deltas)
    (trained / "history.json").write_text(json.dumps(jax_train.history(
        jax_train.JaxTrainConfig(bundle=str(bundle), output=str(trained)),
        [{"step": 1, "triplets_seen": 128, "wall_seconds": 1.0, "cpu_seconds": 1.0, "loss": 0.5,
          "train_batch_accuracy": 0.7, "val_triplet_accuracy": 0.7}], 0.68, "cpu", 10)))
    unpack(UnpackConfig(bundle=str(bundle), trained=str(trained), model_dir=str(tmp_path / "model")))

    sentences = ["The cathedral was rebuilt after the fire.", "Its population grew in the 1990s."]
    start = build_transformer_encoder()
    start.set_weights([np.load(bundle / WEIGHTS)[f"w{index:04d}"].astype(np.float32)
                       for index in range(len(encoder.weights))])
    before = start(word_ids(tf.constant(sentences))).numpy()
    after = SavedModelEncoder(str(tmp_path / "model" / "encoder")).encode(sentences)
    sent = shift.astype(np.float16).astype(np.float32)   # a delta travels as float16
    np.testing.assert_allclose(after - before, np.broadcast_to(sent, before.shape), atol=2e-5)
    assert (tmp_path / "model" / "sentence-transformers" / "model.safetensors").exists()
    assert (tmp_path / "model" / "learning_curve.png").exists()



def test_unpack_refuses_a_scale_outside_0_1_before_any_work(tmp_path):
    from model.jax_unpack import main
    from pipeline.cli import UsageError

    (tmp_path / WEIGHTS).write_bytes(b"")
    (tmp_path / "trained").mkdir()
    (tmp_path / "trained" / "history.json").write_text("{}")
    with pytest.raises(UsageError, match="--scale must be within"):
        main(["--bundle", str(tmp_path), "--trained", str(tmp_path / "trained"), "--model-dir",
              str(tmp_path / "model"), "--scale", "1.5"])
    assert not (tmp_path / "model").exists()
