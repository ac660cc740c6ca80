"""The triplet network of Ein Dor et al. (ACL 2018, section 4), top to bottom: layers, loss, model.

Net(x): frozen (or fine-tuned) pre-trained word vectors -> BiLSTM (300 per direction) ->
attention pooling (size 200, Yang et al. 2016) -> a 600-d sentence embedding.
Triplet head: d+ = |Net(x) - Net(x+)|_1, d- = |Net(x) - Net(x-)|_1, softmax over (d+, d-),
loss = |p(d+)| + |1 - p(d-)|, trained with Adam (learning rate 0.001).
Net may instead be a pre-trained transformer (`model.transformer`, fine-tuned with AdamW), and
the distances cosine instead of L1: the head, the loss and the batching stay the same.
Beside the paper's loss (`--loss triplet`), `in_batch_loss` scores each anchor against every
distinct sentence of its batch (InfoNCE, sentence-transformers' MultipleNegativesRankingLoss with
the triplet's negative as a hard negative), leaving out the sentences of the anchor's own section;
`--loss sum` adds the two. With a teacher (`model.train --teacher`), `distillation_loss` trains Net
to reproduce another encoder's embeddings of the batch's sentences instead.

The triplet model takes a batch as its *distinct* sentences plus, per triplet, the rows of its
anchor, positive and negative (`model.data.shared_sentences`): Net runs once on every distinct
sentence, not once per role, so a sentence shared by several triplets of the batch (triplets
of one article share their paragraph openers) is encoded once. The sentences come sorted by
length and Net runs on `LENGTH_SLICES` slices of them, each padded only to its own longest
sentence. Same weights, same loss, same result per triplet as three calls on [n, t]; the
speed-up of each lever is measured by `python -m model.benchmark`.
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from model.config import LOSS_NAMES, NetworkKind, TrainConfig
from model.losses import COSINE_SCALE, MASKED_SCORE, in_batch_loss, triplet_and_in_batch_loss, triplet_loss
from model.similarity import Similarity

# Net runs on the length-sorted distinct sentences of a batch in this many slices, each padded to
# its own longest sentence: fewer padded LSTM steps, at the price of smaller matrix products.
LENGTH_SLICES = 3


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
class SharedSentenceDistances(keras.layers.Layer):
    """[d+, d-] per triplet: distances of the anchor embedding to the positive and the negative,
    L1 (the paper's) or `COSINE_SCALE` x (1 - cosine), by `distance` (a `Similarity`'s name).

    Inputs carry a leading replica axis of size 1 (`model.data.shared_sentences` stacks one
    self-contained block per replica, so `tf.distribute` can split a global batch on axis 0):
    `sentences` [1, s, t] int ids of the batch's distinct sentences, shortest first, and
    `roles` [1, n, 3] the rows of each triplet's anchor, positive and negative, and `sections`
    [1, s] each sentence's section key. Net runs on `slices` length slices of the sentences,
    each cut to its longest sentence. Output: [n, 2] (labels and sample weights are flat,
    [replicas * n], so Keras weighs every triplet alike); with `in_batch`, [n, 2 + 1 + s]: the
    distances, then `in_batch_scores`; with `distill`, [n, 3]: the distances, then the block's
    `distillation_distance` to `teacher` [1, s, d], the teacher's embeddings of the sentences.
    With `static_shapes`, Net runs once on the sentences as given (`model.data.static_batch`
    padded them to fixed shapes): no shape depends on the data, as XLA on a TPU requires."""

    def __init__(self, sentence_encoder: keras.Model, slices: int = LENGTH_SLICES, distance: str = "l1",
                 static_shapes: bool = False, in_batch: bool = False, distill: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.sentence_encoder = sentence_encoder
        self.slices = slices
        self.distance = Similarity(distance)
        self.static_shapes = static_shapes
        self.in_batch = in_batch
        self.distill = distill

    def call(self, inputs):
        sentences, roles = inputs["sentences"][0], inputs["roles"][0]
        if self.static_shapes:
            embeddings = self.sentence_encoder(sentences)
        else:
            count = tf.shape(sentences)[0]
            pieces = []
            for piece in range(self.slices):
                rows = sentences[count * piece // self.slices: count * (piece + 1) // self.slices]
                width = tf.maximum(1, tf.reduce_max(tf.math.count_nonzero(rows, axis=1, dtype=tf.int32)))
                pieces.append(self.sentence_encoder(rows[:, :width]))
            embeddings = tf.concat(pieces, axis=0)
        if self.distill:
            taught = distillation_distance(embeddings, inputs["teacher"][0], inputs["sections"][0])
        if self.distance is Similarity.COSINE:
            embeddings = tf.math.l2_normalize(embeddings, axis=-1)
        anchor, positive, negative = (tf.gather(embeddings, roles[:, role]) for role in range(3))
        distances = tf.stack([pair_distances(anchor, positive, self.distance),
                              pair_distances(anchor, negative, self.distance)], axis=-1)
        if self.distill:
            return tf.concat([distances, tf.fill([tf.shape(roles)[0], 1], taught)], axis=-1)
        if not self.in_batch:
            return distances
        return tf.concat([distances, in_batch_scores(embeddings, roles, inputs["sections"][0], self.distance)], axis=-1)

    def get_config(self):
        return {**super().get_config(), "slices": self.slices, "distance": self.distance.value,
                "static_shapes": self.static_shapes, "in_batch": self.in_batch, "distill": self.distill,
                "sentence_encoder": keras.saving.serialize_keras_object(self.sentence_encoder)}

    @classmethod
    def from_config(cls, config):
        encoder = keras.saving.deserialize_keras_object(config.pop("sentence_encoder"))
        return cls(encoder, **config)


def pair_distances(left: tf.Tensor, right: tf.Tensor, distance: str) -> tf.Tensor:
    """[n]: the distance of each row of `left` to the same row of `right`: L1, or
    `COSINE_SCALE` x (1 - cosine) of rows already of unit length. In the graph, so not
    `Similarity.pairwise` (NumPy), but the same similarities by the same names."""
    if Similarity(distance) is Similarity.COSINE:
        return COSINE_SCALE * (1.0 - tf.reduce_sum(left * right, axis=-1))
    return tf.reduce_sum(tf.abs(left - right), axis=-1)


def in_batch_scores(embeddings: tf.Tensor, roles: tf.Tensor, sections: tf.Tensor, distance: str) -> tf.Tensor:
    """[n, 1 + s]: per triplet, minus the anchor's distance to its positive, then to each of the
    block's `s` distinct sentences (`embeddings` [s, d], rows of unit length for cosine), where a
    sentence of the anchor's own section (its positive and itself among them) or a padding row
    (a negative section key) gets `MASKED_SCORE`. Other sections' sentences, of the anchor's
    article (the triplet's negative) or of the batch's other articles, are its negatives."""
    anchors = tf.gather(embeddings, roles[:, 0])
    positives = tf.gather(embeddings, roles[:, 1])
    if Similarity(distance) is Similarity.COSINE:
        candidates = COSINE_SCALE * (1.0 - tf.matmul(anchors, embeddings, transpose_b=True))
    else:
        candidates = tf.reduce_sum(tf.abs(anchors[:, None, :] - embeddings[None, :, :]), axis=-1)
    own_section = tf.gather(sections, roles[:, 0])[:, None]
    masked = (sections[None, :] == own_section) | (sections[None, :] < 0)
    scores = tf.where(masked, tf.cast(MASKED_SCORE, candidates.dtype), -candidates)
    return tf.concat([-pair_distances(anchors, positives, distance)[:, None], scores], axis=-1)


def distillation_distance(embeddings: tf.Tensor, teacher: tf.Tensor, sections: tf.Tensor) -> tf.Tensor:
    """The mean cosine distance (1 - cosine) of each sentence's embedding [s, d] to the teacher's
    [s, d], over the block's real sentences (padding rows, of a negative section key, left out):
    each distinct sentence counts once, however many triplets share it."""
    cosines = tf.reduce_sum(tf.math.l2_normalize(embeddings, axis=-1) * tf.math.l2_normalize(teacher, axis=-1), axis=-1)
    real = tf.cast(sections >= 0, cosines.dtype)
    return tf.reduce_sum((1.0 - cosines) * real) / tf.maximum(tf.reduce_sum(real), 1.0)


# ------------------------------------------------------------------------------------ loss
# The paper's loss and the in-batch loss (and their sum) are in `model.losses`, in Keras ops alone,
# so the JAX trainer `model.jax_train` shares them.


@keras.saving.register_keras_serializable(package="wikisim")
def distillation_loss(positive_is_first, outputs):
    """`--teacher`: the block's `distillation_distance` (outputs[..., 2]), as sentence-transformers'
    distillation examples fit a student to a teacher's embeddings (with cosine, so the student's
    norms are free, as cosine similarity ignores them)."""
    del positive_is_first
    return outputs[..., 2]


# `--loss`: the training loss by name.
LOSSES = dict(zip(LOSS_NAMES, (triplet_loss, in_batch_loss, triplet_and_in_batch_loss)))


def triplet_accuracy(positive_is_first, outputs):
    """Share of triplets whose positive is nearer to the anchor than the negative (d+ < d-)."""
    del positive_is_first
    return ops.cast(outputs[..., 0] < outputs[..., 1], "float32")


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


def build_net(config: TrainConfig, matrix: np.ndarray | None) -> keras.Model:
    """Net of `config`'s kind (`--encoder`): the BiLSTM over the word vectors `matrix`, or the
    transformer checkpoint (`model.transformer`, `matrix` None), sized, regularised and frozen
    as the flags say."""
    network, dropout = config.network, config.resolved("dropout")
    if network.kind is NetworkKind.BILSTM:
        if matrix is None:
            raise ValueError("the BiLSTM Net reads word vectors: build_net needs their matrix")
        return build_sentence_encoder(matrix, lstm_units=network.lstm_units, attention_size=network.attention_size,
                                      dropout=dropout, fine_tune_embeddings=network.fine_tune_embeddings)
    from model.transformer import build_transformer_encoder

    return build_transformer_encoder(network.kind.value, frozen_layers=network.frozen_layers, dropout=dropout,
                                     layers=network.transformer_layers)


def build_triplet_model(sentence_encoder: keras.Model, slices: int = LENGTH_SLICES,
                        distance: str = "l1", static_shapes: bool = False, loss: str = "triplet",
                        teacher_dim: int | None = None) -> keras.Model:
    """The same Net on (x, x+, x-) -> distances [n, 2] = (d+, d-), from a batch given as its
    distinct sentences, each triplet's rows in them and each sentence's section (see
    `SharedSentenceDistances`); followed by the in-batch scores when `loss` needs them, or, with
    `teacher_dim`, by the distance to a teacher's embeddings (of that size) given with the batch."""
    inputs = {"sentences": keras.Input(shape=(None, None), dtype="int32", name="sentences"),
              "roles": keras.Input(shape=(None, 3), dtype="int32", name="roles"),
              "sections": keras.Input(shape=(None,), dtype="int64", name="sections")}
    if teacher_dim:
        inputs["teacher"] = keras.Input(shape=(None, teacher_dim), dtype="float32", name="teacher")
    distances = SharedSentenceDistances(sentence_encoder, slices, distance, static_shapes,
                                        in_batch=not teacher_dim and LOSSES[loss] is not triplet_loss,
                                        distill=bool(teacher_dim), name="distances")(inputs)
    return keras.Model(inputs, distances, name="triplet_network")


@keras.saving.register_keras_serializable(package="wikisim")
class Warmup(keras.optimizers.schedules.LearningRateSchedule):
    """A linear rise from 0 over `warmup_steps`, then `schedule` (a number or a schedule of the
    step). Keras' CosineDecay has a warmup but needs the run's length, which a time budget leaves
    open; this pairs a warmup with the half-life decay, a function of the step alone."""

    def __init__(self, schedule, warmup_steps: float):
        self.schedule = schedule
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        step = ops.cast(step, "float32")
        after = self.schedule(step) if callable(self.schedule) else ops.convert_to_tensor(self.schedule, "float32")
        return ops.where(step < self.warmup_steps, after * (step + 1.0) / self.warmup_steps, after)

    def get_config(self):
        schedule = (keras.saving.serialize_keras_object(self.schedule) if callable(self.schedule)
                    else self.schedule)
        return {"schedule": schedule, "warmup_steps": self.warmup_steps}

    @classmethod
    def from_config(cls, config):
        schedule = config["schedule"]
        if isinstance(schedule, dict):
            schedule = keras.saving.deserialize_keras_object(schedule)
        return cls(schedule, config["warmup_steps"])


def compile_triplet_model(model: keras.Model, learning_rate: float = 1e-3, jit_compile: bool = False,
                          half_life_steps: float | None = None, warmup_steps: float = 0,
                          weight_decay: float | None = None, loss: str = "triplet", distill: bool = False) -> None:
    """Adam at `learning_rate` (AdamW when `weight_decay` is given, as transformers are
    fine-tuned, without decay on biases and layer norms), halved every `half_life_steps`
    optimizer steps when given, after a linear warmup over `warmup_steps`: functions of the step
    alone, so a run resumed from its backup continues the same schedule. It minimises
    `LOSSES[loss]`, or with `distill` the `distillation_loss` (the model must be built alike)."""
    if half_life_steps:
        learning_rate = keras.optimizers.schedules.ExponentialDecay(learning_rate, half_life_steps, 0.5)
    if warmup_steps:
        learning_rate = Warmup(learning_rate, warmup_steps)
    if weight_decay is None:
        optimizer = keras.optimizers.Adam(learning_rate)
    else:
        optimizer = keras.optimizers.AdamW(learning_rate, weight_decay=weight_decay)
        optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta", "layer_norm"])
    model.compile(optimizer=optimizer, loss=distillation_loss if distill else LOSSES[loss], metrics=[triplet_accuracy],
                  jit_compile=jit_compile)


class ExportableEncoder(tf.Module):
    """Raw strings -> embeddings: the in-graph tokenizer and vocabulary lookup (`word_ids`)
    followed by Net, saved together so clients need only strings. The export records the
    similarity its embeddings were trained for, by sentence-transformers' name (`cosine`, or
    `manhattan` for the `l1` distance), which `model.encoder.SavedModelEncoder.similarity` uses,
    and the tokens kept per sentence (its `max_seq_length`)."""

    def __init__(self, word_ids, sentence_encoder: keras.Model, similarity: str = "cosine"):
        super().__init__()
        self.word_ids = word_ids
        self.sentence_encoder = sentence_encoder
        self.embedding_dim = tf.Variable(int(sentence_encoder.output_shape[-1]), trainable=False)
        self.similarity = tf.Variable(Similarity(similarity).fn_name, trainable=False)
        self.max_seq_length = tf.Variable(int(word_ids.max_tokens), trainable=False)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="sentences")])
    def serve(self, sentences):
        return {"embeddings": self.sentence_encoder(self.word_ids(sentences), training=False)}

    def export(self, path: str) -> None:
        """Saves the SavedModel to `path` whole or not at all: written to `<path>.partial`, then
        renamed into place, so a kill mid-export leaves the previous export (or none), never a
        half-written one."""
        partial = f"{path}.partial"
        if tf.io.gfile.exists(partial):
            tf.io.gfile.rmtree(partial)
        tf.saved_model.save(self, partial, signatures={"serving_default": self.serve})
        if tf.io.gfile.exists(path):
            tf.io.gfile.rmtree(path)
        tf.io.gfile.rename(partial, path)
