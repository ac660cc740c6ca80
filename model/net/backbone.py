"""A pre-trained transformer as the triplet network's Net, fine-tuned in Keras: the checkpoint's
backbone (keras-hub's `BertBackbone` for all-MiniLM-L6-v2, `model.net.mpnet.MPNetBackbone` for
all-mpnet-base-v2) + masked mean pooling, as sentence-transformers pools both. Keras alone (no
TensorFlow import), so the same Net is built under every Keras backend; its tokenizers are
`model.net.transformer` (in-graph) and `model.net.wordpieces` (NumPy)."""
from __future__ import annotations

import json
import os

import keras

from model.checkpoints import CHECKPOINTS

# The layers `--frozen-layers` freezes besides the lowest transformer layers: the embeddings
# (BERT's segment embedding, MPNet's relative position bias shared by every layer).
EMBEDDING_LAYERS = ("token_embedding", "position_embedding", "segment_embedding", "embeddings_layer_norm",
                    "relative_attention_bias")


def mean_pooled_encoder(backbone: keras.Model, pad_index: int = 0) -> keras.Model:
    """Net: int wordpiece ids [n, t] (0 = padding) -> float32 [n, hidden]: the backbone's token
    states averaged over the non-padding tokens (Keras' masked GlobalAveragePooling1D), as
    sentence-transformers pools its checkpoints. `pad_index`: the padding token's id in the
    checkpoint's own vocabulary; the tokenizers number it 0 (`model.checkpoints.padding_first`),
    so ids 0 and `pad_index` are swapped back here."""
    # The pooler (a dense layer on the first token) feeds nothing here: frozen, so no step looks for
    # its gradients (Keras warned "Gradients do not exist for variables ['pooled_dense/kernel', ...]");
    # its checkpoint weights stay, for the Hugging Face export.
    backbone.get_layer("pooled_dense").trainable = False
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    padding_mask = keras.ops.not_equal(ids, 0)
    token_ids = ids if not pad_index else keras.ops.where(
        padding_mask, keras.ops.where(keras.ops.equal(ids, pad_index), 0, ids), pad_index)
    inputs = {"token_ids": token_ids, "padding_mask": padding_mask, "segment_ids": keras.ops.zeros_like(ids)}
    states = backbone({name: inputs[name] for name in backbone.input})["sequence_output"]
    sentence = keras.layers.GlobalAveragePooling1D(name="mean_pooling")(states, mask=padding_mask)
    return keras.Model(ids, sentence, name="sentence_encoder")


def checkpoint_dir(name: str = "minilm", folder: str | None = None) -> str:
    """The folder of the pre-trained checkpoint (config.json, model.safetensors, vocab.txt):
    `folder` (`--checkpoint`) or the installed one (`model.checkpoints`)."""
    return CHECKPOINTS[name].folder(folder)


def pretrained_backbone(name: str, folder: str | None = None, **overrides) -> keras.Model:
    """The checkpoint's backbone with its weights (`overrides`: num_layers, dropout). keras-hub reads
    BERT checkpoints; MPNet is read by `model.net.mpnet`, loading layers 0..num_layers-1."""
    checkpoint, path = CHECKPOINTS[name], checkpoint_dir(name, folder)
    if checkpoint.architecture == "bert":
        import keras_hub

        return keras_hub.models.BertBackbone.from_preset(path, load_weights=True, **overrides)
    from model.net.mpnet import MPNetBackbone, load_hf_weights

    with open(os.path.join(path, "config.json"), encoding="utf-8") as handle:
        backbone = MPNetBackbone.from_hf_config(json.load(handle), **overrides)
    load_hf_weights(backbone, os.path.join(path, "model.safetensors"))
    return backbone


def build_transformer_encoder(name: str = "minilm", frozen_layers: int = 0, dropout: float | None = None,
                              layers: int | None = None, folder: str | None = None) -> keras.Model:
    """Net: int wordpiece ids [n, t] (0 = padding) -> float32 [n, hidden]: the pre-trained
    backbone, mean-pooled (`model.net.backbone.mean_pooled_encoder`). `frozen_layers`:
    the embeddings and that many lowest transformer layers are not trained (0 = all are).
    `layers`: keep only the checkpoint's lowest that many transformer layers (None = all), the
    layer-reduced student of sentence-transformers' distillation examples: the reader loads
    layers 0..layers-1 and ignores the rest. `folder`: `--checkpoint`, else the installed one."""
    overrides = {"dropout": dropout} if dropout is not None else {}
    if layers is not None:
        overrides["num_layers"] = layers
    backbone = pretrained_backbone(name, folder, **overrides)
    if frozen_layers:
        for layer in backbone.layers:
            if layer.name.startswith(EMBEDDING_LAYERS):
                layer.trainable = False
            elif layer.name.startswith("transformer_layer_") and int(layer.name.rsplit("_", 1)[1]) < frozen_layers:
                layer.trainable = False
    return mean_pooled_encoder(backbone, CHECKPOINTS[name].pad_index)
