"""`--gradient-accumulation-steps`: a step's batch fed in parts whose mean gradient Keras'
optimizer applies once, so a step needs the activation memory of a part, not of the batch."""
import numpy as np
import pytest
from model_shards import written_train_triplets

from model.config import TrainConfig

BATCH = 8


@pytest.fixture(scope="module")
def triplets(tmp_path_factory):
    return written_train_triplets(str(tmp_path_factory.mktemp("accumulation-shards")),
                                  sizes={"train": 4 * BATCH, "validation": BATCH, "test": BATCH})


@pytest.mark.slow   # trains two networks
def test_a_batch_fed_in_parts_updates_the_weights_as_the_whole_batch_does(triplets):
    """Four steps of 8 triplets against eight parts of 4 with 2 accumulated per update, from the
    same weights, with the same warmup (counted in batches): the same weights after each update,
    and none changed by a step's first part."""
    import keras

    from model.net.network import build_sentence_encoder, build_triplet_model, compile_triplet_model
    from model.net.text import ArrayIds, WordIds, count_words
    from model.training.arrays import batch_arrays, batched

    word_ids = WordIds(sorted(count_words(triplets)), num_oov_buckets=1, max_tokens=40)
    matrix = np.random.default_rng(0).normal(0, 0.3, (word_ids.num_ids, 8)).astype(np.float32)

    def model(parts: int):
        keras.utils.set_random_seed(0)   # the same initial weights for both
        network = build_triplet_model(build_sentence_encoder(matrix, lstm_units=6, attention_size=4))
        compile_triplet_model(network, 1e-2, warmup_steps=2 * parts, gradient_accumulation_steps=parts)
        return network

    def batches(size: int):   # the same triplets in the same order
        return [batch_arrays(group, ArrayIds(word_ids), size, static=False) for group in batched(triplets, size)]

    whole, in_parts = model(1), model(2)
    initial = in_parts.get_weights()
    halves = batches(BATCH // 2)
    assert len(halves) == 2 * len(batches(BATCH)) == 8
    for step, (inputs, labels, weights) in enumerate(batches(BATCH)):
        whole.train_on_batch(inputs, labels, sample_weight=weights)
        first, second = halves[2 * step], halves[2 * step + 1]
        before = in_parts.get_weights()
        in_parts.train_on_batch(first[0], first[1], sample_weight=first[2])
        for unchanged, earlier in zip(in_parts.get_weights(), before):   # a first part only accumulates
            np.testing.assert_array_equal(unchanged, earlier)
        in_parts.train_on_batch(second[0], second[1], sample_weight=second[2])
        for mine, theirs in zip(in_parts.get_weights(), whole.get_weights()):
            np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
        assert int(keras.ops.convert_to_numpy(in_parts.optimizer.iterations)) == step + 1
    assert not np.allclose(in_parts.get_weights()[1], initial[1])   # it did train


def _config(**flags) -> TrainConfig:
    return TrainConfig.from_flags(data="d", model_dir="m", **flags)


def test_the_batch_is_split_into_equal_parts_of_the_triplet_loss():
    assert _config(batch_size=64, gradient_accumulation_steps=4).optimizer.part_size == 16
    assert _config(batch_size=64).optimizer.part_size == 64
    with pytest.raises(ValueError, match="--batch-size 64 is not a multiple of --gradient-accumulation-steps 5"):
        _config(batch_size=64, gradient_accumulation_steps=5)
    with pytest.raises(ValueError, match="--loss in-batch .* use --loss triplet"):
        _config(batch_size=64, gradient_accumulation_steps=2, loss="in-batch")
    with pytest.raises(ValueError, match="--gradient-accumulation-steps must be >= 1"):
        _config(gradient_accumulation_steps=0)
