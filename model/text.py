"""The one tokenizer: in-graph (tensorflow-text), so the exported encoder takes raw strings.

Sentences are NFKC-normalised and case-folded (GloVe 6B is lower-case) and split into words,
numbers and single punctuation marks, with the English clitics `'s`, `'re`, `'ll`, `'ve`,
`'m`, `'d` and `n't` kept as their own tokens, as in the Stanford tokenisation GloVe was
trained on. `tokenize` runs the very same graph code for Python callers (the mean-vectors
baseline), so every consumer tokenises identically.
"""
from __future__ import annotations

import tensorflow as tf
import tensorflow_text as tf_text

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
