"""The triplet network of Ein Dor et al. (ACL 2018, section 4), top to bottom: layers, loss, model.

Net(x): frozen (or fine-tuned) pre-trained word vectors -> BiLSTM (300 per direction) ->
attention pooling (size 200, Yang et al. 2016) -> a 600-d sentence embedding.
Triplet head: d+ = |Net(x) - Net(x+)|_1, d- = |Net(x) - Net(x-)|_1, softmax over (d+, d-),
loss = |p(d+)| + |1 - p(d-)|, trained with Adam (learning rate 0.001).

Net runs once per batch on the three roles stacked ([3n, t]: anchors, positives, negatives,
padded to one width by the input pipeline) rather than three times on [n, t]: the same
weights and result, 1.25x faster on 2 CPU cores (`python -m model.benchmark`).
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras import ops

TRIPLET_KEYS = ("anchor", "positive", "negative")


# ---------------------------------------------------------------------------------- layers
@keras.saving.register_keras_serializable(package="wikisim")
class AttentionPooling(keras.layers.Layer):
    """Word-level attention of Yang et al. (2016), hand-written (no Keras layer implements it):
    u_t = tanh(W h_t + b), a_t = softmax_t(u_t . u_w), s = sum_t a_t h_t.
    Padded time steps (the Keras mask) get zero weight."""

    def __init__(self, size: int, **kwargs):
        super().__init__(**kwargs)
        self.size = size
        self.supports_masking = True

    def build(self, input_shape):
        features = input_shape[-1]
        self.projection = self.add_weight(name="W", shape=(features, self.size), initializer="glorot_uniform")
        self.bias = self.add_weight(name="b", shape=(self.size,), initializer="zeros")
        self.context = self.add_weight(name="u_w", shape=(self.size,), initializer="glorot_uniform")

    def call(self, states, mask=None):
        hidden = ops.tanh(ops.matmul(states, self.projection) + self.bias)   # [n, t, size]
        scores = ops.matmul(hidden, self.context)                              # [n, t]
        if mask is not None:
            scores = ops.where(mask, scores, ops.full_like(scores, -1e9))
        weights = ops.softmax(scores, axis=-1)
        return ops.sum(states * ops.expand_dims(weights, -1), axis=1)

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        return {**super().get_config(), "size": self.size}


@keras.saving.register_keras_serializable(package="wikisim")
class TripletDistances(keras.layers.Layer):
    """[d+, d-]: L1 distances of the anchor embedding to the positive and the negative one,
    from the embeddings of the stacked roles [3n, d] (anchors, positives, negatives)."""

    def call(self, stacked):
        anchor, positive, negative = ops.split(stacked, 3, axis=0)
        return ops.stack([ops.sum(ops.abs(anchor - positive), axis=-1),
                          ops.sum(ops.abs(anchor - negative), axis=-1)], axis=-1)


# ------------------------------------------------------------------------------------ loss
def triplet_loss(positive_is_first, distances):
    """The paper's loss, hand-written (no library has it): with (p+, p-) = softmax(d+, d-),
    loss = |p+| + |1 - p-| (0 when p+ = 0, 2 when p+ = 1). The label is the constant
    index 0 of the positive in `distances` and carries no information."""
    del positive_is_first
    probabilities = ops.softmax(distances, axis=-1)
    return ops.abs(probabilities[:, 0]) + ops.abs(1.0 - probabilities[:, 1])


def triplet_accuracy(positive_is_first, distances):
    """Share of triplets whose positive is nearer to the anchor than the negative (d+ < d-)."""
    del positive_is_first
    return ops.cast(distances[:, 0] < distances[:, 1], "float32")


# ----------------------------------------------------------------------------------- model
def build_sentence_encoder(embedding_matrix: np.ndarray, *, lstm_units: int = 300,
                           attention_size: int = 200, dropout: float = 0.0,
                           fine_tune_embeddings: bool = False) -> keras.Model:
    """Net: int token ids [n, t] (0 = padding) -> float32 [n, 2 * lstm_units].

    `embedding_matrix` row i is the vector of token id i (row 0, padding, is masked). It is
    assigned to the built layer rather than given as a `Constant` initializer, which Keras
    would serialise into the model config (and TensorBoard into its event file) as JSON."""
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    word_vectors = keras.layers.Embedding(
        input_dim=embedding_matrix.shape[0], output_dim=embedding_matrix.shape[1], mask_zero=True,
        embeddings_initializer="zeros", trainable=fine_tune_embeddings, name="word_vectors")
    embeddings = word_vectors(token_ids)
    word_vectors.embeddings.assign(embedding_matrix)
    states = keras.layers.Bidirectional(
        keras.layers.LSTM(lstm_units, return_sequences=True), name="bilstm")(embeddings)
    states = keras.layers.Dropout(dropout, name="dropout")(states)
    sentence = AttentionPooling(attention_size, name="attention")(states)
    return keras.Model(token_ids, sentence, name="sentence_encoder")


def build_triplet_model(sentence_encoder: keras.Model) -> keras.Model:
    """The same Net on (x, x+, x-), one call on the stacked roles -> distances [n, 2] = (d+, d-).

    The three inputs must share their width t (the input pipeline pads them together)."""
    inputs = {key: keras.Input(shape=(None,), dtype="int32", name=key) for key in TRIPLET_KEYS}
    stacked = keras.layers.Concatenate(axis=0, name="stack_roles")([inputs[key] for key in TRIPLET_KEYS])
    distances = TripletDistances(name="distances")(sentence_encoder(stacked))
    return keras.Model(inputs, distances, name="triplet_network")


def compile_triplet_model(model: keras.Model, learning_rate: float = 1e-3, jit_compile: bool = False) -> None:
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=triplet_loss,
                  metrics=[triplet_accuracy], jit_compile=jit_compile)


class ExportableEncoder(tf.Module):
    """Raw strings -> embeddings: the in-graph tokenizer and vocabulary lookup (`word_ids`)
    followed by Net, saved together so clients need only strings."""

    def __init__(self, word_ids, sentence_encoder: keras.Model):
        super().__init__()
        self.word_ids = word_ids
        self.sentence_encoder = sentence_encoder
        self.embedding_dim = tf.Variable(int(sentence_encoder.output_shape[-1]), trainable=False)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="sentences")])
    def serve(self, sentences):
        return {"embeddings": self.sentence_encoder(self.word_ids(sentences), training=False)}

    def export(self, path: str) -> None:
        tf.saved_model.save(self, path, signatures={"serving_default": self.serve})
