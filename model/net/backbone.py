"""The transformer Net around a keras-hub backbone, in Keras alone (no TensorFlow import), so the
same Net is built under every Keras backend (`model.net.transformer`)."""
from __future__ import annotations

import keras


def mean_pooled_encoder(backbone: keras.Model) -> keras.Model:
    """Net: int wordpiece ids [n, t] (0 = padding) -> float32 [n, hidden]: the backbone's token
    states averaged over the non-padding tokens (Keras' masked GlobalAveragePooling1D), as
    sentence-transformers pools all-MiniLM-L6-v2."""
    # BERT's pooler (a dense layer on [CLS]) feeds nothing here: frozen, so no step looks for its
    # gradients (Keras warned "Gradients do not exist for variables ['pooled_dense/kernel', ...]");
    # its checkpoint weights stay, for the Hugging Face export.
    backbone.get_layer("pooled_dense").trainable = False
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    padding_mask = keras.ops.not_equal(ids, 0)
    states = backbone({"token_ids": ids, "padding_mask": padding_mask,
                       "segment_ids": keras.ops.zeros_like(ids)})["sequence_output"]
    sentence = keras.layers.GlobalAveragePooling1D(name="mean_pooling")(states, mask=padding_mask)
    return keras.Model(ids, sentence, name="sentence_encoder")
