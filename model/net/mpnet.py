"""MPNet (Song et al., 2020) written once in `keras.ops`: the backbone of all-mpnet-base-v2, which
keras-hub (0.32) does not have. Written here, in keras-hub's style (a `Backbone` of named layers,
`token_ids` and `padding_mask` in, `sequence_output` out), after Hugging Face's `MPNetModel`:

- embeddings: word + absolute position (positions count the non-padding tokens from
  `PADDING_POSITION` + 1, as `create_position_ids_from_input_ids` does), layer norm, dropout;
- one relative position bias for every layer: the key-minus-query distance in T5-style log
  buckets (`relative_position_buckets`, 32 buckets up to 128 positions), a learned value per
  bucket and head, added to every layer's attention logits;
- post-norm transformer layers with exact (erf) GELU, as the checkpoint's config says.

No library reads MPNet into Keras, so the safetensors names are mapped here once
(`hf_mpnet_variables`): the loader and the sentence-transformers writer share that table.
"""
from __future__ import annotations

import math

import keras
import keras_hub
import numpy as np
from keras import ops

PADDING_POSITION = 1   # Hugging Face's `padding_idx`: the checkpoint's first position row is unused


def relative_position_buckets(query_length: int, key_length: int, buckets: int = 32,
                              max_distance: int = 128) -> np.ndarray:
    """int32 [query, key]: the bucket of each key-minus-query distance, as MPNet's
    `relative_position_bucket`: half the buckets for keys before the query, half after; in each
    half, distances below a quarter of the buckets exactly, farther ones on a log scale up to
    `max_distance` (and beyond it, the last bucket)."""
    distance = np.arange(key_length)[None, :] - np.arange(query_length)[:, None]
    half = buckets // 2
    bucket = (distance > 0).astype(np.int64) * half
    distance = np.abs(distance)
    exact = half // 2
    # log of at least 1: the distances below `exact` take the exact branch below anyway
    far = exact + (np.log(np.maximum(distance, 1) / exact) / math.log(max_distance / exact)
                   * (half - exact)).astype(np.int64)
    far = np.minimum(far, half - 1)
    return (bucket + np.where(distance < exact, distance, far)).astype(np.int32)


@keras.saving.register_keras_serializable(package="wikisim")
class RelativePositionBias(keras.layers.Layer):
    """token states [n, t, d] -> the attention bias [1, heads, t, t] of their relative positions."""

    def __init__(self, heads: int, buckets: int = 32, max_distance: int = 128, max_length: int = 512, **kwargs):
        super().__init__(**kwargs)
        self.heads, self.buckets, self.max_distance, self.max_length = heads, buckets, max_distance, max_length
        # Buckets of every pair up to the longest sequence, sliced per batch: a constant, so every
        # backend traces the same graph for any length.
        self._buckets = relative_position_buckets(max_length, max_length, buckets, max_distance)

    def build(self, input_shape):
        self.embeddings = self.add_weight(shape=(self.buckets, self.heads), name="embeddings",
                                          initializer=keras.initializers.TruncatedNormal(stddev=0.02))

    def call(self, states):
        length = ops.shape(states)[1]
        buckets = ops.convert_to_tensor(self._buckets)[:length, :length]
        bias = ops.take(self.embeddings, buckets, axis=0)   # [t, t, heads]
        return ops.expand_dims(ops.transpose(bias, (2, 0, 1)), 0)

    def get_config(self):
        return {**super().get_config(), "heads": self.heads, "buckets": self.buckets,
                "max_distance": self.max_distance, "max_length": self.max_length}


@keras.saving.register_keras_serializable(package="wikisim")
class MPNetLayer(keras.layers.Layer):
    """One post-norm transformer layer whose attention logits take an additive bias: [n, t, d]
    states, a [n, t] padding mask and the [1, heads, t, t] relative position bias -> [n, t, d]."""

    def __init__(self, heads: int, intermediate_dim: int, dropout: float = 0.1, epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.heads, self.intermediate_dim, self.dropout, self.epsilon = heads, intermediate_dim, dropout, epsilon

    def build(self, input_shape):
        hidden = input_shape[-1]
        self.head_dim = hidden // self.heads
        for part in ("query", "key", "value", "output"):
            dense = keras.layers.Dense(hidden, name=f"{part}_dense", dtype=self.dtype_policy)
            dense.build((None, None, hidden))
            setattr(self, f"{part}_dense", dense)
        self.attention_layer_norm = keras.layers.LayerNormalization(epsilon=self.epsilon, name="attention_layer_norm",
                                                                    dtype=self.dtype_policy)
        self.attention_layer_norm.build((None, None, hidden))
        self.intermediate_dense = keras.layers.Dense(self.intermediate_dim, name="intermediate_dense",
                                                     dtype=self.dtype_policy)
        self.intermediate_dense.build((None, None, hidden))
        self.feedforward_dense = keras.layers.Dense(hidden, name="feedforward_dense", dtype=self.dtype_policy)
        self.feedforward_dense.build((None, None, self.intermediate_dim))
        self.feedforward_layer_norm = keras.layers.LayerNormalization(epsilon=self.epsilon,
                                                                      name="feedforward_layer_norm",
                                                                      dtype=self.dtype_policy)
        self.feedforward_layer_norm.build((None, None, hidden))
        self.attention_dropout = keras.layers.Dropout(self.dropout)
        self.output_dropout = keras.layers.Dropout(self.dropout)

    def _heads(self, states):
        batch, length = ops.shape(states)[0], ops.shape(states)[1]
        return ops.transpose(ops.reshape(states, (batch, length, self.heads, self.head_dim)), (0, 2, 1, 3))

    def call(self, states, padding_mask, position_bias, training=None):
        query, key, value = (self._heads(dense(states)) for dense in (self.query_dense, self.key_dense,
                                                                        self.value_dense))
        logits = ops.matmul(query, ops.transpose(key, (0, 1, 3, 2))) / math.sqrt(self.head_dim)
        keys = ops.cast(ops.expand_dims(ops.expand_dims(padding_mask, 1), 1), logits.dtype)   # [n, 1, 1, t]
        logits = logits + position_bias + (1.0 - keys) * ops.cast(-1e9, logits.dtype)
        weights = self.attention_dropout(ops.softmax(logits, axis=-1), training=training)
        context = ops.transpose(ops.matmul(weights, value), (0, 2, 1, 3))
        context = ops.reshape(context, ops.shape(states))
        attended = self.attention_layer_norm(
            states + self.output_dropout(self.output_dense(context), training=training))
        inner = keras.activations.gelu(self.intermediate_dense(attended), approximate=False)
        return self.feedforward_layer_norm(
            attended + self.output_dropout(self.feedforward_dense(inner), training=training))

    def get_config(self):
        return {**super().get_config(), "heads": self.heads, "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout, "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="wikisim")
class MPNetBackbone(keras_hub.models.Backbone):
    """MPNet's encoder: {"token_ids": int [n, t] (the checkpoint's ids), "padding_mask": [n, t]} ->
    {"sequence_output": [n, t, hidden], "pooled_output": [n, hidden]} (the pooler, tanh of a dense
    layer on the first token, is kept for the checkpoint's files; mean pooling does not use it)."""

    def __init__(self, vocabulary_size: int, num_layers: int, num_heads: int, hidden_dim: int,
                 intermediate_dim: int, dropout: float = 0.1, max_sequence_length: int = 514,
                 relative_buckets: int = 32, layer_norm_epsilon: float = 1e-5, dtype=None, **kwargs):
        self.token_embedding = keras.layers.Embedding(vocabulary_size, hidden_dim, dtype=dtype,
                                                      name="token_embedding")
        self.position_embedding = keras.layers.Embedding(max_sequence_length, hidden_dim, dtype=dtype,
                                                         name="position_embedding")
        self.embeddings_layer_norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype,
                                                                     name="embeddings_layer_norm")
        self.embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        self.relative_attention_bias = RelativePositionBias(num_heads, relative_buckets,
                                                            max_length=max_sequence_length - PADDING_POSITION - 1,
                                                            dtype=dtype, name="relative_attention_bias")
        self.transformer_layers = [MPNetLayer(num_heads, intermediate_dim, dropout, layer_norm_epsilon, dtype=dtype,
                                              name=f"transformer_layer_{index}") for index in range(num_layers)]
        self.pooled_dense = keras.layers.Dense(hidden_dim, activation="tanh", dtype=dtype, name="pooled_dense")

        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        mask = ops.cast(padding_mask, "int32")
        positions = ops.cumsum(mask, axis=1) * mask + PADDING_POSITION
        states = self.token_embedding(token_ids) + self.position_embedding(positions)
        states = self.embeddings_dropout(self.embeddings_layer_norm(states))
        bias = self.relative_attention_bias(states)
        for layer in self.transformer_layers:
            states = layer(states, padding_mask=mask, position_bias=bias)
        super().__init__(inputs={"token_ids": token_ids, "padding_mask": padding_mask},
                         outputs={"sequence_output": states, "pooled_output": self.pooled_dense(states[:, 0, :])},
                         dtype=dtype, **kwargs)
        self.vocabulary_size, self.num_layers, self.num_heads = vocabulary_size, num_layers, num_heads
        self.hidden_dim, self.intermediate_dim, self.dropout = hidden_dim, intermediate_dim, dropout
        self.max_sequence_length, self.relative_buckets = max_sequence_length, relative_buckets
        self.layer_norm_epsilon = layer_norm_epsilon

    def get_config(self):
        return {**super().get_config(), "vocabulary_size": self.vocabulary_size, "num_layers": self.num_layers,
                "num_heads": self.num_heads, "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim, "dropout": self.dropout,
                "max_sequence_length": self.max_sequence_length, "relative_buckets": self.relative_buckets,
                "layer_norm_epsilon": self.layer_norm_epsilon}

    @classmethod
    def from_hf_config(cls, config: dict, **overrides) -> MPNetBackbone:
        """The backbone a Hugging Face MPNet `config.json` describes (`overrides`: num_layers, dropout)."""
        settings = {"vocabulary_size": config["vocab_size"], "num_layers": config["num_hidden_layers"],
                    "num_heads": config["num_attention_heads"], "hidden_dim": config["hidden_size"],
                    "intermediate_dim": config["intermediate_size"], "dropout": config["hidden_dropout_prob"],
                    "max_sequence_length": config["max_position_embeddings"],
                    "relative_buckets": config["relative_attention_num_buckets"],
                    "layer_norm_epsilon": config["layer_norm_eps"]}
        return cls(**{**settings, **overrides})


def hf_mpnet_variables(backbone: MPNetBackbone) -> dict[str, tuple[keras.Variable, bool]]:
    """Hugging Face `MPNetModel`'s weight names -> (the backbone's variable, stored transposed):
    torch's Linear keeps [out, in] where Keras' Dense keeps [in, out]."""
    def norm(layer, prefix):
        return {f"{prefix}.weight": (layer.gamma, False), f"{prefix}.bias": (layer.beta, False)}

    def dense(layer, prefix):
        return {f"{prefix}.weight": (layer.kernel, True), f"{prefix}.bias": (layer.bias, False)}

    names = {"embeddings.word_embeddings.weight": (backbone.token_embedding.embeddings, False),
             "embeddings.position_embeddings.weight": (backbone.position_embedding.embeddings, False),
             **norm(backbone.embeddings_layer_norm, "embeddings.LayerNorm"),
             "encoder.relative_attention_bias.weight": (backbone.relative_attention_bias.embeddings, False),
             **dense(backbone.pooled_dense, "pooler.dense")}
    for index, layer in enumerate(backbone.transformer_layers):
        prefix = f"encoder.layer.{index}"
        for part, short in (("query", "q"), ("key", "k"), ("value", "v"), ("output", "o")):
            names.update(dense(getattr(layer, f"{part}_dense"), f"{prefix}.attention.attn.{short}"))
        names.update(norm(layer.attention_layer_norm, f"{prefix}.attention.LayerNorm"))
        names.update(dense(layer.intermediate_dense, f"{prefix}.intermediate.dense"))
        names.update(dense(layer.feedforward_dense, f"{prefix}.output.dense"))
        names.update(norm(layer.feedforward_layer_norm, f"{prefix}.output.LayerNorm"))
    return names


def load_hf_weights(backbone: MPNetBackbone, safetensors_path: str) -> None:
    """Assigns the checkpoint's weights; layers the backbone does not have (a layer-reduced student
    keeps the lowest N) are skipped, a weight the backbone needs but the file lacks is a KeyError."""
    from safetensors import safe_open

    with safe_open(safetensors_path, "np") as stored:
        for name, (variable, transposed) in hf_mpnet_variables(backbone).items():
            value = stored.get_tensor(name)
            if value.dtype == np.float16:   # a float16 copy (infra.accelerator.kit): read as float32
                value = value.astype(np.float32)
            variable.assign(value.T if transposed else value)


def hf_mpnet_weights(backbone: MPNetBackbone) -> dict[str, np.ndarray]:
    """The backbone's weights under Hugging Face's names and layouts (`load_hf_weights`' inverse)."""
    return {name: np.ascontiguousarray(np.asarray(variable.numpy()).T if transposed else variable.numpy(),
                                       dtype=np.float32)
            for name, (variable, transposed) in hf_mpnet_variables(backbone).items()}
