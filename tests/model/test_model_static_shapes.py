"""`--static-shapes`: batches of a few fixed shapes, the step XLA-compiled (what a TPU runs),
trained on CPU beside the dynamic path from the same weights on the same triplets."""
import numpy as np
import pytest
from model_shards import written_train_triplets

from model.config import TrainConfig

pytestmark = pytest.mark.slow   # XLA compilation and training

BATCH = 8


@pytest.fixture(scope="module")
def triplets(tmp_path_factory):
    return written_train_triplets(str(tmp_path_factory.mktemp("static-shards")),
                                  sizes={"train": 4 * BATCH, "validation": BATCH, "test": BATCH})


@pytest.mark.parametrize("loss", ["triplet", "in-batch", "teacher"])
def test_the_static_xla_step_trains_like_the_dynamic_one(triplets, loss):
    """With each loss: the paper's, the in-batch one (padding rows are no candidates) and a
    distillation (padding rows are not taught)."""
    import zlib

    import keras

    from model.net.network import build_sentence_encoder, build_triplet_model, compile_triplet_model
    from model.net.text import ArrayIds, WordIds, count_words
    from model.training.arrays import batch_arrays, batched

    vocabulary = sorted(count_words(triplets))
    word_ids = WordIds(vocabulary, num_oov_buckets=1, max_tokens=40)
    matrix = np.random.default_rng(0).normal(0, 0.3, (word_ids.num_ids, 8)).astype(np.float32)

    def teacher(sentences):   # a fixed 12-d embedding per sentence: the size of the BiLSTM's (2 x 6)
        return np.eye(12, dtype=np.float32)[[zlib.crc32(sentence.encode()) % 12 for sentence in sentences]] + 0.1

    def model(static_shapes: bool):
        keras.utils.set_random_seed(0)   # the same initial weights for both
        network = build_triplet_model(build_sentence_encoder(matrix, lstm_units=6, attention_size=4),
                                      static_shapes=static_shapes, loss="triplet" if loss == "teacher" else loss,
                                      teacher_dim=12 if loss == "teacher" else None)
        compile_triplet_model(network, 1e-2, jit_compile=static_shapes, loss="triplet" if loss == "teacher" else loss,
                              distill=loss == "teacher")
        return network

    def batches(static_shapes: bool):   # the same triplets in the same order; full batches
        return [batch_arrays(group, ArrayIds(word_ids), BATCH, static=static_shapes,
                             teacher=teacher if loss == "teacher" else None) for group in batched(triplets, BATCH)]

    dynamic, static = model(False), model(True)
    assert static.jit_compile is True and dynamic.jit_compile is False   # Keras kept XLA on
    dynamic_batches, static_batches = batches(False), batches(True)
    assert len(dynamic_batches) == len(static_batches) == 4
    for inputs, labels, weights in static_batches:     # shapes from a fixed set, none from the data
        rows, width = inputs["sentences"].shape[1:]
        assert rows % BATCH == 0 and rows <= 3 * BATCH and width in (16, 32, 40)
        assert inputs["roles"].shape == (1, BATCH, 3) and labels.shape == weights.shape == (BATCH,)
    assert any(inputs["sentences"].shape[2] < 16 for inputs, _, _ in dynamic_batches)   # padding did happen

    for (dynamic_inputs, labels, weights), (static_inputs, static_labels, static_weights) in zip(
            dynamic_batches, static_batches):
        dynamic_loss = dynamic.train_on_batch(dynamic_inputs, labels, sample_weight=weights)[0]
        static_loss = static.train_on_batch(static_inputs, static_labels, sample_weight=static_weights)[0]
        assert static_loss == pytest.approx(dynamic_loss, rel=1e-4)
    for mine, theirs in zip(static.get_weights(), dynamic.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    assert not np.allclose(dynamic.get_weights()[1], model(False).get_weights()[1])   # it did train


def test_a_tpu_run_needs_static_shapes():
    with pytest.raises(ValueError, match="--static-shapes"):
        TrainConfig.from_flags(data="d", model_dir="m", distribution_strategy="tpu")
    config = TrainConfig.from_flags(data="d", model_dir="m", distribution_strategy="tpu", static_shapes=True)
    assert config.runtime.static_shapes
