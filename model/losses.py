"""The paper's triplet loss and its cosine scale, in Keras ops alone: `model.network` trains with
them under TensorFlow and `model.jax_train` under JAX, where TensorFlow is not installed."""
from __future__ import annotations

import keras
from keras import ops

# Cosine distances lie in [0, 2]: scaled so that the softmax over (d+, d-) is not stuck near
# 1/2 (the loss is 2 * sigmoid(scale * (cos- - cos+))), as sentence-transformers scales cosine
# similarities by 20 in its ranking losses.
COSINE_SCALE = 20.0


@keras.saving.register_keras_serializable(package="wikisim")
def triplet_loss(positive_is_first, outputs):
    """The paper's loss, hand-written (no library has it): with (p+, p-) = softmax(d+, d-),
    loss = |p+| + |1 - p-| (0 when p+ = 0, 2 when p+ = 1). The label is the constant
    index 0 of the positive in `outputs` (its first two columns are d+, d-) and carries no
    information."""
    del positive_is_first
    probabilities = ops.softmax(outputs[..., :2], axis=-1)
    return ops.abs(probabilities[..., 0]) + ops.abs(1.0 - probabilities[..., 1])
