"""The triplet network of Ein Dor et al. (ACL 2018, section 4), top to bottom: layers, loss, model.

Net(x): frozen (or fine-tuned) pre-trained word vectors -> BiLSTM (300 per direction) ->
attention pooling (size 200, Yang et al. 2016) -> a 600-d sentence embedding.
Triplet head: d+ = |Net(x) - Net(x+)|_1, d- = |Net(x) - Net(x-)|_1, softmax over (d+, d-),
loss = |p(d+)| + |1 - p(d-)|, trained with Adam (learning rate 0.001).
Net may instead be a pre-trained transformer (`model.net.transformer`, fine-tuned with AdamW), and
the distances cosine instead of L1: the head, the loss and the batching stay the same.
Beside the paper's loss (`--loss triplet`), `in_batch_loss` scores each anchor against every
distinct sentence of its batch (InfoNCE, sentence-transformers' MultipleNegativesRankingLoss with
the triplet's negative as a hard negative), leaving out the sentences of the anchor's own section;
`--loss sum` adds the two. With a teacher (`model.train --teacher`), `distillation_loss` trains Net
to reproduce another encoder's embeddings of the batch's sentences instead.

The triplet model takes a batch as its *distinct* sentences plus, per triplet, the rows of its
anchor, positive and negative (`model.training.arrays.batch_arrays`): Net runs once on every distinct
sentence, not once per role, so a sentence shared by several triplets of the batch (triplets
of one article share their paragraph openers) is encoded once. The sentences come sorted by
length and Net runs on `LENGTH_SLICES` slices of them, each padded only to its own longest
sentence. Same weights, same loss, same result per triplet as three calls on [n, t]; the
speed-up of each lever is measured by `python -m model.benchmark`.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras
import numpy as np
from keras import ops

from model.config import NetworkKind, TrainConfig
from model.net.backbone import build_transformer_encoder
from model.net.head import (
    LOSSES,
    distillation_distance,
    distillation_loss,
    in_batch_scores,
    triplet_distances,
    triplet_loss,
    unit_rows,
    weighted_scores,
)
from model.similarity import Similarity

# Net runs on the length-sorted distinct sentences of a batch in this many slices, each padded to
# its own longest sentence: fewer padded LSTM steps, at the price of smaller matrix products.
LENGTH_SLICES = 3
# `--precision`: the Keras dtype policy the Net is built under. mixed_bfloat16: each layer computes
# in bfloat16 from float32 variables (read through a cast); the head, the loss and the metrics stay float32.
DTYPE_POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16"}


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
    L1 (the paper's) or `COSINE_SCALE` x (1 - cosine), by `distance` (a `Similarity`'s name);
    the head (`model.net.head`) is Keras ops alone, the same under every backend.

    Inputs carry a leading block axis (`model.training.arrays.batch_arrays` stacks one self-contained
    block per replica: one under `tf.distribute`, which splits a global batch on axis 0; all of
    them under `keras.distribution.DataParallel`, whose one program sees the global batch):
    `sentences` [blocks, s, t] int ids of each block's distinct sentences, shortest first,
    `roles` [blocks, n, 3] the rows of each triplet's anchor, positive and negative in its
    block, and `sections` [blocks, s] each sentence's section key. Output: [blocks * n, 2]
    (labels and sample weights are flat, so Keras weighs every triplet alike); with `in_batch`,
    [blocks * n, 2 + 1 + s]: the distances, then `in_batch_scores`; with `distill`,
    [blocks * n, 3]: the distances, then the block's `distillation_distance` to `teacher`
    [blocks, s, d], the teacher's embeddings of the sentences. With `static_shapes`, Net runs
    once on every block's sentences as given (`model.training.arrays.batch_arrays` padded them to fixed
    shapes): no shape depends on the data, as XLA on a TPU and the JAX backend require.
    Otherwise (TensorFlow, one block) Net runs on `slices` length slices of the sentences, each
    cut to its longest sentence."""

    def __init__(self, sentence_encoder: keras.Model, slices: int = LENGTH_SLICES, distance: str = "l1",
                 static_shapes: bool = False, in_batch: bool = False, distill: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.sentence_encoder = sentence_encoder
        self.slices = slices
        self.distance = Similarity(distance)
        self.static_shapes = static_shapes
        self.in_batch = in_batch
        self.distill = distill

    def embed(self, sentences):
        """[blocks, s, t] ids -> [blocks, s, d] embeddings."""
        if self.static_shapes:
            blocks, rows, width = (ops.shape(sentences)[axis] for axis in range(3))
            embeddings = self.sentence_encoder(ops.reshape(sentences, (-1, width)))
            return ops.reshape(embeddings, (blocks, rows, embeddings.shape[-1]))
        rows = sentences[0]   # one block: each replica of tf.distribute runs its own
        count = ops.shape(rows)[0]
        pieces = []
        for piece in range(self.slices):
            part = rows[count * piece // self.slices: count * (piece + 1) // self.slices]
            width = ops.maximum(1, ops.max(ops.count_nonzero(part, axis=1)))
            pieces.append(self.sentence_encoder(part[:, :width]))
        return ops.expand_dims(ops.concatenate(pieces, axis=0), 0)

    def call(self, inputs):
        roles, sections = inputs["roles"], inputs["sections"]
        # float32 from here, whatever Net computed in (`--precision bfloat16`): the distances, the loss
        # and the triplet accuracy read them
        embeddings = ops.cast(self.embed(inputs["sentences"]), "float32")
        if self.distill:
            taught = distillation_distance(embeddings, inputs["teacher"], sections, roles)
        if self.distance is Similarity.COSINE:
            embeddings = unit_rows(embeddings)
        distances = triplet_distances(embeddings, roles, self.distance)
        if self.distill:
            return ops.concatenate([distances, taught], axis=-1)
        if not self.in_batch:
            return distances
        return ops.concatenate([distances, in_batch_scores(embeddings, roles, sections, self.distance)], axis=-1)

    def compute_output_spec(self, inputs):
        """The output's shape without tracing Net on symbolic shapes (JAX's shape polymorphism
        cannot compare a symbolic sequence length with the position embeddings' size)."""
        sentences = inputs["sentences"].shape[1]
        columns = 3 if self.distill else (2 + 1 + sentences if self.in_batch and sentences else None)
        return keras.KerasTensor((None, columns if self.distill or self.in_batch else 2), dtype="float32")

    def get_config(self):
        return {**super().get_config(), "slices": self.slices, "distance": self.distance.value,
                "static_shapes": self.static_shapes, "in_batch": self.in_batch, "distill": self.distill,
                "sentence_encoder": keras.saving.serialize_keras_object(self.sentence_encoder)}

    @classmethod
    def from_config(cls, config):
        encoder = keras.saving.deserialize_keras_object(config.pop("sentence_encoder"))
        return cls(encoder, **config)


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
    transformer checkpoint (`model.net.transformer`, `matrix` None), sized, regularised and frozen
    as the flags say."""
    network, dropout = config.network, config.resolved("dropout")
    if network.kind is NetworkKind.BILSTM:
        if matrix is None:
            raise ValueError("the BiLSTM Net reads word vectors: build_net needs their matrix")
        return build_sentence_encoder(matrix, lstm_units=network.lstm_units, attention_size=network.attention_size,
                                      dropout=dropout, fine_tune_embeddings=network.fine_tune_embeddings)
    return build_transformer_encoder(network.kind.value, frozen_layers=network.frozen_layers, dropout=dropout,
                                     layers=network.transformer_layers, folder=network.checkpoint)


@contextlib.contextmanager
def dtype_policy(precision: str) -> Iterator[None]:
    """Keras' global dtype policy set to `--precision`'s (`DTYPE_POLICIES`) while the block builds
    layers, the previous one restored after it. Set around the build, not passed as `dtype=` to
    each layer: keras-hub's backbone and its sublayers, MPNet's and the BiLSTM's layers all take
    the global policy where no `dtype` is given, so nothing built is missed; restored (even on an
    error), so no other build of the process (a float32 export's, a teacher's, a test's) inherits
    it. A layer keeps the policy it was built with, so the Net computes in it after the block."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(DTYPE_POLICIES[precision])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def build_encoder(config: TrainConfig, matrix: np.ndarray | None, teacher_dim: int | None = None) -> keras.Model:
    """The sentence encoder the trainer fits: Net (`build_net`), and with `teacher_dim` (a
    distillation) where it differs from Net's size, a linear projection to it, as
    sentence-transformers' distillation adds a Dense layer; built under `--precision`'s dtype
    policy (`dtype_policy`): with bfloat16, its layers compute in bfloat16 and it outputs bfloat16
    (the head casts to float32). `model.formats.saved_model.float32_encoder` builds its float32 twin."""
    with dtype_policy(config.runtime.precision):
        encoder = build_net(config, matrix)
        if teacher_dim and teacher_dim != encoder.output_shape[-1]:
            encoder = keras.Model(encoder.inputs,
                                  keras.layers.Dense(teacher_dim, name="projection")(encoder.outputs[0]),
                                  name="student")
    return encoder


def build_triplet_model(sentence_encoder: keras.Model, slices: int = LENGTH_SLICES,
                        distance: str = "l1", static_shapes: bool = False, loss: str = "triplet",
                        teacher_dim: int | None = None) -> keras.Model:
    """The same Net on (x, x+, x-) -> distances [n, 2] = (d+, d-), from a batch given as its
    distinct sentences, each triplet's rows in them and each sentence's section (see
    `SharedSentenceDistances`); followed by the in-batch scores when `loss` needs them, or, with
    `teacher_dim`, by the distance to a teacher's embeddings (of that size) given with the batch."""
    inputs = {"sentences": keras.Input(shape=(None, None), dtype="int32", name="sentences"),
              "roles": keras.Input(shape=(None, 3), dtype="int32", name="roles"),
              "sections": keras.Input(shape=(None,), dtype="int32", name="sections")}
    if teacher_dim:
        inputs["teacher"] = keras.Input(shape=(None, teacher_dim), dtype="float32", name="teacher")
    # float32 whatever the global dtype policy: the head's inputs (the teacher's embeddings) are not cast
    distances = SharedSentenceDistances(sentence_encoder, slices, distance, static_shapes,
                                        in_batch=not teacher_dim and LOSSES[loss] is not triplet_loss,
                                        distill=bool(teacher_dim), name="distances", dtype="float32")(inputs)
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
                          weight_decay: float | None = None, loss: str = "triplet", distill: bool = False,
                          gradient_accumulation_steps: int = 1) -> None:
    """Adam at `learning_rate` (AdamW when `weight_decay` is given, as transformers are
    fine-tuned, without decay on biases and layer norms), halved every `half_life_steps`
    batches when given, after a linear warmup over `warmup_steps` batches: functions of the step
    alone, so a run resumed from its backup continues the same schedule. It minimises
    `LOSSES[loss]`, or with `distill` the `distillation_loss` (the model must be built alike).
    With `gradient_accumulation_steps` N > 1 the optimizer updates the weights once every N
    batches, with their mean gradient (Keras' own accumulation); the schedule still counts batches."""
    if half_life_steps:
        learning_rate = keras.optimizers.schedules.ExponentialDecay(learning_rate, half_life_steps, 0.5)
    if warmup_steps:
        learning_rate = Warmup(learning_rate, warmup_steps)
    parts = gradient_accumulation_steps
    accumulation = {"gradient_accumulation_steps": parts} if parts > 1 else {}   # Keras refuses 1
    if weight_decay is None:
        optimizer = keras.optimizers.Adam(learning_rate, **accumulation)
    else:
        optimizer = keras.optimizers.AdamW(learning_rate, weight_decay=weight_decay, **accumulation)
        optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta", "layer_norm"])
    minimised = distillation_loss if distill else LOSSES[loss]
    model.compile(optimizer=optimizer, loss=minimised, weighted_metrics=weighted_scores(minimised),
                  jit_compile=jit_compile)


def build_models(config: TrainConfig, matrix: np.ndarray | None, global_batch: int, teacher_dim: int | None = None,
                 slices: int | None = None, head=None):
    """(sentence encoder, compiled triplet model); call inside the strategy's scope. `matrix`:
    the word vectors of the BiLSTM (None for a transformer checkpoint). With `teacher_dim` (a
    distillation), Net ends in a linear projection to the teacher's size where the sizes differ,
    as sentence-transformers' distillation adds a Dense layer. With `--precision bfloat16` the
    encoder computes in bfloat16 (`build_encoder`), the head, loss and metrics in
    float32; variables are float32 either way. `slices` (default
    `LENGTH_SLICES`) and `head` are `model.benchmark`'s levers: the length slices
    Net runs on, and another triplet model of Net (`head(Net)`, its three-call baseline)."""
    network, optimizer, static_shapes = config.network, config.optimizer, config.runtime.static_batches
    encoder = build_encoder(config, matrix, teacher_dim)   # under --precision's dtype policy, restored after
    model = head(encoder) if head else build_triplet_model(
        encoder, slices or LENGTH_SLICES, distance=config.resolved("distance"), static_shapes=static_shapes,
        loss=optimizer.loss, teacher_dim=teacher_dim)
    half_life = optimizer.learning_rate_half_life
    part = global_batch // optimizer.gradient_accumulation_steps   # the triplets of one batch the schedule counts
    compile_triplet_model(model, config.resolved("learning_rate"), loss=optimizer.loss, distill=bool(teacher_dim),
                          jit_compile=config.runtime.jit_compile or static_shapes,
                          half_life_steps=half_life / part if half_life else None,
                          warmup_steps=optimizer.warmup_triplets / part,
                          weight_decay=optimizer.weight_decay if network.kind.weight_decay else None,
                          gradient_accumulation_steps=optimizer.gradient_accumulation_steps)
    return encoder, model
