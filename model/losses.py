"""The paper's triplet loss, the in-batch loss and their sum, with the cosine scale, in Keras ops
alone: `model.network` trains with them under TensorFlow and `model.jax_train` under JAX, where
TensorFlow is not installed. Each takes the head's outputs: (d+, d-) per triplet, then for the
in-batch loss the anchor's scores, its positive's first (`model.network.in_batch_scores`)."""
from __future__ import annotations

import keras
from keras import ops

# Cosine distances lie in [0, 2]: scaled so that the softmax over (d+, d-) is not stuck near
# 1/2 (the loss is 2 * sigmoid(scale * (cos- - cos+))), as sentence-transformers scales cosine
# similarities by 20 in its ranking losses.
COSINE_SCALE = 20.0
# The score of a left-out candidate: exp() of it is 0 next to any real score.
MASKED_SCORE = -1e9


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
