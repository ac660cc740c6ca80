"""The one tokenizer: in-graph (tensorflow-text), so the exported encoder takes raw strings.

Sentences are NFKC-normalised and case-folded (GloVe 6B is lower-case) and split into words,
numbers and single punctuation marks, with the English clitics `'s`, `'re`, `'ll`, `'ve`,
`'m`, `'d` and `n't` kept as their own tokens, as in the Stanford tokenisation GloVe was
trained on. `tokenize` runs the very same graph code for Python callers (the mean-vectors
baseline), so every consumer tokenises identically.

Core TensorFlow ops alone (`tf.strings.lower`, `regex_replace`, `split`) would free the export
from custom ops, but cannot NFKC-normalise or case-fold: on the excerpt they tokenised 32 of
5,847 texts differently (superscript digits, ellipses, combining accents, final sigma), so the
tokenizer stays on tensorflow-text.
"""
from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from core.records import ROLES

# Kept delimiters: clitics first (leftmost-first matching splits "don't" into "do", "n't"),
# then any single punctuation or symbol character.
_CLITIC_OR_PUNCT = r"n't\b|'(?:s|re|ll|ve|m|d)\b|[\p{P}\p{S}]"
_DELIMITER = r"\s+|" + _CLITIC_OR_PUNCT


def tokenize_graph(sentences: tf.Tensor) -> tf.RaggedTensor:
    """1-D tf.string sentences -> ragged [n, (tokens)] tf.string tokens."""
    folded = tf_text.case_fold_utf8(sentences)
    return tf_text.regex_split(folded, _DELIMITER, keep_delim_regex_pattern=_CLITIC_OR_PUNCT)


def tokenize(sentences: list[str]) -> list[list[str]]:
    """Python convenience over `tokenize_graph` (same code, run eagerly)."""
    if not sentences:
        return []
    tokens = tokenize_graph(tf.constant(sentences, dtype=tf.string))
    return [[token.decode("utf-8") for token in row] for row in tokens.to_list()]


def count_words(triplets: Iterable[dict], batch_size: int = 1024) -> collections.Counter:
    """Token counts over every sentence of the triplets (dicts of `ROLES`: the vocabulary's source)."""
    counts: collections.Counter = collections.Counter()
    iterator = iter(triplets)
    while batch := list(itertools.islice(iterator, batch_size)):
        for role in ROLES:
            sentences = tf.constant([triplet[role] for triplet in batch], tf.string)
            counts.update(tokenize_graph(sentences).flat_values.numpy())
    return collections.Counter({word.decode("utf-8"): n for word, n in counts.items()})


class WordIds(tf.Module):
    """Sentences -> int32 token ids [n, t], t = longest sentence (at most `max_tokens`).

    Id 0 is padding, 1..V the vocabulary in order, V+1..V+B the hashed out-of-vocabulary
    buckets. A `tf.Module`, so the lookup table is saved inside the exported encoder."""

    def __init__(self, vocabulary: list[str], num_oov_buckets: int = 1, max_tokens: int = 64):
        super().__init__()
        self.vocabulary_size = len(vocabulary)
        self.num_oov_buckets = num_oov_buckets
        self.max_tokens = max_tokens
        initializer = tf.lookup.KeyValueTensorInitializer(
            tf.constant(vocabulary, dtype=tf.string),
            tf.range(len(vocabulary), dtype=tf.int64))
        self.table = tf.lookup.StaticVocabularyTable(initializer, num_oov_buckets)

    @property
    def num_ids(self) -> int:
        """Rows an embedding matrix needs: padding + vocabulary + OOV buckets."""
        return 1 + self.vocabulary_size + self.num_oov_buckets

    def ragged(self, sentences: tf.Tensor) -> tf.RaggedTensor:
        """int32 ids [n, (tokens)], no padding: what length-grouped batching reads."""
        tokens = tokenize_graph(sentences)[:, : self.max_tokens]
        # The table gives 0..V-1 to the vocabulary and V..V+B-1 to the buckets; +1 frees 0.
        return tf.cast(tf.ragged.map_flat_values(self.table.lookup, tokens) + 1, tf.int32)

    def __call__(self, sentences: tf.Tensor) -> tf.Tensor:
        return pad_ids(self.ragged(sentences).to_tensor(0))


class ArrayIds:
    """A `WordIds` for the trainer's NumPy input (`model.training.arrays.Tokenizer`): a list of
    sentences -> int32 ids [n, t] as an array, by the same graph (traced once)."""

    def __init__(self, word_ids: WordIds):
        self.max_tokens, self.num_ids = word_ids.max_tokens, word_ids.num_ids
        self._ids = tf.function(word_ids.__call__, input_signature=[tf.TensorSpec([None], tf.string)])

    def __call__(self, sentences: list[str]) -> np.ndarray:
        return self._ids(tf.constant(sentences, tf.string)).numpy()


def pad_ids(ids: tf.Tensor, width: tf.Tensor | int = 1) -> tf.Tensor:
    """Right-pads int ids [n, t] with 0 to at least `width` columns (at least one, so a batch of
    empty sentences still has a time axis)."""
    return tf.pad(ids, [[0, 0], [0, tf.maximum(0, tf.maximum(width, 1) - tf.shape(ids)[1])]])
