"""The trainer's input: length-grouped batches keep every triplet once per pass, roles aligned."""
import collections
import random

import tensorflow as tf

from model.data import LENGTH_BOUNDARIES, training_batches, with_known_length
from model.network import TRIPLET_KEYS
from model.text import WordIds

WORDS = [f"w{i}" for i in range(40)]


def _triplets(n: int, seed: int = 0) -> list[dict]:
    """Triplet k's sentences start with the marker word `k{k}` and differ in length (2..60 tokens)."""
    rng = random.Random(seed)
    return [{key: " ".join([f"k{k}"] + rng.choices(WORDS, k=rng.randint(1, 59))) for key in TRIPLET_KEYS}
            for k in range(n)]


def _dataset(triplets):
    return tf.data.Dataset.from_tensor_slices({key: [t[key] for t in triplets] for key in TRIPLET_KEYS})


def test_length_groups_give_every_triplet_once_per_pass_with_its_roles_together():
    triplets = _triplets(500)
    word_ids = WordIds([f"k{k}" for k in range(500)] + WORDS, num_oov_buckets=1, max_tokens=64)
    lengths = {k: max(len(t[key].split()) for key in TRIPLET_KEYS) for k, t in enumerate(triplets)}
    seen = collections.Counter()
    batches = training_batches(_dataset(triplets), word_ids, batch_size=16, shuffle_buffer=100, seed=3)
    for inputs, labels in batches:
        ids = {key: inputs[key].numpy() for key in TRIPLET_KEYS}
        widths = {key: ids[key].shape[1] for key in TRIPLET_KEYS}
        assert len(set(widths.values())) == 1            # one width for the stacked encoder call
        assert labels.shape[0] == ids["anchor"].shape[0] <= 16
        markers = ids["anchor"][:, 0] - 1                # id k + 1 is the marker word k{k}
        for key in TRIPLET_KEYS:                          # the positive and negative of row i belong to triplet i
            assert (ids[key][:, 0] - 1 == markers).all()
        groups = {sum(lengths[k] >= bound for bound in LENGTH_BOUNDARIES) for k in markers}
        assert len(groups) == 1                           # a batch holds one length group
        assert widths["anchor"] == max(lengths[k] for k in markers)   # padded only to its longest sentence
        seen.update(markers.tolist())
    assert seen == collections.Counter(range(500))        # each triplet exactly once


def test_random_order_batches_and_known_length_match_the_pass():
    triplets = _triplets(70)
    word_ids = WordIds([f"k{k}" for k in range(70)] + WORDS)
    batches = with_known_length(training_batches(_dataset(triplets), word_ids, 16, group_by_length=False))
    assert int(batches.cardinality()) == 5
    markers = sorted(int(k) - 1 for inputs, _ in batches for k in inputs["negative"][:, 0].numpy())
    assert markers == list(range(70))
