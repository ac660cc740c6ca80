"""The triplet network's head, written once in Keras ops, so every backend (TensorFlow, JAX) runs
the same code: the distances, the paper's triplet loss, the section-masked in-batch loss, the
distillation distance and triplet accuracy. `model.net.network.SharedSentenceDistances` calls it on
a batch's blocks; `model.similarity.Similarity` scores NumPy matrices by the same names.

A batch comes as `blocks` self-contained blocks (one per replica, `model.training.arrays.batch_arrays`):
embeddings [blocks, s, d] of each block's distinct sentences, `roles` [blocks, n, 3] each
triplet's anchor, positive and negative rows in its block, `sections` [blocks, s] each sentence's
section key (negative on padding rows). Outputs are per triplet, flat ([blocks * n, ...]), as
labels and sample weights are.
"""
from __future__ import annotations

import keras
from keras import ops

from model.similarity import Similarity

# Cosine distances lie in [0, 2]: scaled so that the softmax over (d+, d-) is not stuck near
# 1/2 (the loss is 2 * sigmoid(scale * (cos- - cos+))), as sentence-transformers scales cosine
# similarities by 20 in its ranking losses.
COSINE_SCALE = 20.0
# The score of a left-out candidate: exp() of it is 0 next to any real score.
MASKED_SCORE = -1e9


def unit_rows(embeddings):
    """Rows scaled to unit length (a zero row stays zero), in float32."""
    embeddings = ops.cast(embeddings, "float32")
    return embeddings / ops.sqrt(ops.maximum(ops.sum(embeddings * embeddings, axis=-1, keepdims=True), 1e-12))


def candidate_distances(anchors, candidates, distance: str):
    """[..., n, s]: the distance of each of `anchors` [..., n, d] to each of `candidates` [..., s, d]:
    L1, or `COSINE_SCALE` x (1 - cosine) of rows already of unit length."""
    if Similarity(distance) is Similarity.COSINE:
        return COSINE_SCALE * (1.0 - ops.matmul(anchors, ops.swapaxes(candidates, -1, -2)))
    return ops.sum(ops.abs(ops.expand_dims(anchors, -2) - ops.expand_dims(candidates, -3)), axis=-1)


def pair_distances(left, right, distance: str):
    """[...]: the distance of each row of `left` to the same row of `right` (`candidate_distances`
    of one candidate each)."""
    return candidate_distances(ops.expand_dims(left, -2), ops.expand_dims(right, -2), distance)[..., 0, 0]


def _rows_of(values, roles):
    """values [blocks, s, ...] (the trailing axes of known size) gathered at each block's own
    `roles` [blocks, n] -> [blocks, n, ...]: the blocks laid end to end, each role offset by its
    block's start."""
    rows = ops.shape(values)[1]
    offsets = ops.expand_dims(ops.arange(ops.shape(values)[0], dtype="int32") * ops.cast(rows, "int32"), -1)
    return ops.take(ops.reshape(values, (-1, *values.shape[2:])), ops.cast(roles, "int32") + offsets, axis=0)


def triplet_distances(embeddings, roles, distance: str):
    """[blocks * n, 2]: (d+, d-) of each triplet (embeddings of unit length for cosine)."""
    anchor, positive, negative = (_rows_of(embeddings, roles[..., role]) for role in range(3))
    pairs = ops.stack([pair_distances(anchor, positive, distance), pair_distances(anchor, negative, distance)], -1)
    return ops.reshape(pairs, (-1, 2))


def in_batch_scores(embeddings, roles, sections, distance: str):
    """[blocks * n, 1 + s]: per triplet, minus the anchor's distance to its positive, then to each
    of its block's `s` distinct sentences, where a sentence of the anchor's own section (its
    positive and itself among them) or a padding row (a negative section key) gets
    `MASKED_SCORE`. Other sections' sentences, of the anchor's article (the triplet's negative)
    or of the block's other articles, are its negatives."""
    anchors, positives = _rows_of(embeddings, roles[..., 0]), _rows_of(embeddings, roles[..., 1])
    candidates = candidate_distances(anchors, embeddings, distance)                   # [blocks, n, s]
    own_section = _rows_of(ops.expand_dims(sections, -1), roles[..., 0])              # [blocks, n, 1]
    others = ops.expand_dims(sections, 1)                                              # [blocks, 1, s]
    masked = ops.logical_or(ops.equal(others, own_section), ops.less(others, 0))
    scores = ops.where(masked, ops.cast(MASKED_SCORE, candidates.dtype), -candidates)
    positive = -ops.expand_dims(pair_distances(anchors, positives, distance), -1)
    return ops.reshape(ops.concatenate([positive, scores], axis=-1), (-1, 1 + ops.shape(embeddings)[1]))


def distillation_distance(embeddings, teacher, sections, roles):
    """[blocks * n, 1]: for each triplet, its block's mean cosine distance (1 - cosine) of each
    sentence's embedding [blocks, s, d] to the teacher's [blocks, s, d'=d], over the block's
    real sentences (padding rows, of a negative section key, left out): each distinct sentence
    counts once, however many triplets share it."""
    cosines = ops.sum(unit_rows(embeddings) * unit_rows(teacher), axis=-1)             # [blocks, s]
    real = ops.cast(ops.greater_equal(sections, 0), cosines.dtype)
    per_block = ops.sum((1.0 - cosines) * real, axis=-1) / ops.maximum(ops.sum(real, axis=-1), 1.0)
    per_triplet = ops.ones_like(ops.cast(roles[..., 0], per_block.dtype)) * ops.expand_dims(per_block, -1)
    return ops.reshape(per_triplet, (-1, 1))


# ------------------------------------------------------------------------------------ losses
@keras.saving.register_keras_serializable(package="wikisim")
def triplet_loss(positive_is_first, outputs):
    """The paper's loss, hand-written (no library has it): with (p+, p-) = softmax(d+, d-),
    loss = |p+| + |1 - p-| (0 when p+ = 0, 2 when p+ = 1). The label is the constant
    index 0 of the positive in `outputs` (its first two columns are d+, d-) and carries no
    information."""
    del positive_is_first
    probabilities = ops.softmax(outputs[..., :2], axis=-1)
    return ops.abs(probabilities[..., 0]) + ops.abs(1.0 - probabilities[..., 1])


@keras.saving.register_keras_serializable(package="wikisim")
def in_batch_loss(positive_is_first, outputs):
    """InfoNCE over `in_batch_scores` (outputs[..., 2:], the positive's score first): minus the
    log of the positive's softmax probability among the anchor's candidates. Written here
    because the masking needs the batch's section keys, which sentence-transformers'
    MultipleNegativesRankingLoss (the same loss, without a mask) has no place for."""
    del positive_is_first
    scores = outputs[..., 2:]
    return ops.logsumexp(scores, axis=-1) - scores[..., 0]


@keras.saving.register_keras_serializable(package="wikisim")
def triplet_and_in_batch_loss(positive_is_first, outputs):
    """`--loss sum`: the paper's loss plus the in-batch loss."""
    return triplet_loss(positive_is_first, outputs) + in_batch_loss(positive_is_first, outputs)


@keras.saving.register_keras_serializable(package="wikisim")
def distillation_loss(positive_is_first, outputs):
    """`--teacher`: the block's `distillation_distance` (outputs[..., 2]), as sentence-transformers'
    distillation examples fit a student to a teacher's embeddings (with cosine, so the student's
    norms are free, as cosine similarity ignores them)."""
    del positive_is_first
    return outputs[..., 2]


# `--loss`: the training loss by name (`model.config.LOSS_NAMES`).
LOSSES = {"triplet": triplet_loss, "in-batch": in_batch_loss, "sum": triplet_and_in_batch_loss}


def triplet_accuracy(positive_is_first, outputs):
    """Share of triplets whose positive is nearer to the anchor than the negative (d+ < d-)."""
    del positive_is_first
    return ops.cast(ops.less(outputs[..., 0], outputs[..., 1]), "float32")


def weighted_scores(loss) -> list[keras.metrics.Metric]:
    """The compiled model's `weighted_metrics`: `loss` (the function the model minimises) and
    `triplet_accuracy`, each sum(w * x) / sum(w) over a pass's triplets. Keras updates its plain
    `metrics` without the sample weights, and its own `loss` is a mean over steps of each step's
    sum(w * loss) / rows, so padding triplets (a short last batch under static shapes, the weight-0
    batches of a process's smaller or empty share) counted as triplets wrong, at loss 0. This
    `loss` comes after Keras' own in `Model.metrics`, so it is the one the logs report."""
    return [keras.metrics.MeanMetricWrapper(loss, name="loss"),
            keras.metrics.MeanMetricWrapper(triplet_accuracy, name="triplet_accuracy")]
