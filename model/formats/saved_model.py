"""The trained encoder as a TensorFlow SavedModel that takes raw strings: what `model.encoding.encoder`
loads, TF Serving serves and Vertex AI deploys. TensorFlow alone (the in-graph tokenizer is
tensorflow-text), so it sits apart from the network, which every Keras backend builds. A run
trained under JAX gets it from `python -m model.export --format saved-model`, in a TensorFlow
process (`model.train` runs it when TensorFlow is installed)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import keras
import numpy as np
import tensorflow as tf

from model.config import vertex_model_dir
from model.net.backbone import build_transformer_encoder
from model.net.network import build_encoder
from model.net.transformer import token_ids
from model.similarity import Similarity
from model.training.model_dir import ENCODER, SERVING, VERTEX_MODEL

if TYPE_CHECKING:
    from model.config import TrainConfig


class ExportableEncoder(tf.Module):
    """Raw strings -> embeddings: the in-graph tokenizer and vocabulary lookup (`word_ids`)
    followed by Net, saved together so clients need only strings. The export records the
    similarity its embeddings were trained for, by sentence-transformers' name (`cosine`, or
    `manhattan` for the `l1` distance), which `model.encoding.encoder.SavedModelEncoder.similarity` uses,
    and the tokens kept per sentence (its `max_seq_length`); `model.pretrained`'s export also the
    `--encoder` checkpoint it is (`checkpoint`), which `model.export` rebuilds it from."""

    def __init__(self, word_ids, sentence_encoder: keras.Model, similarity: str = "cosine",
                 checkpoint: str | None = None):
        super().__init__()
        self.word_ids = word_ids
        self.sentence_encoder = sentence_encoder
        self.embedding_dim = tf.Variable(int(sentence_encoder.output_shape[-1]), trainable=False)
        self.similarity = tf.Variable(Similarity(similarity).fn_name, trainable=False)
        self.max_seq_length = tf.Variable(int(word_ids.max_tokens), trainable=False)
        if checkpoint:
            self.checkpoint = tf.Variable(checkpoint, trainable=False)

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


def export_checkpoint(name: str, folder: str | None, max_tokens: int, path: str) -> None:
    """`model.pretrained`'s export: the checkpoint `name` (from `folder`, else the installed one),
    untrained, as the strings-in SavedModel at `path`, which records the checkpoint it is."""
    ExportableEncoder(token_ids(max_tokens, name, folder), build_transformer_encoder(name, folder=folder),
                      similarity="cosine", checkpoint=name).export(path)


def float32_encoder(config: TrainConfig, encoder):
    """`encoder` itself, or, trained under `--precision bfloat16`, a float32 twin holding its
    weights: the same Net built under the float32 policy (`model.net.network.build_encoder`),
    the trained variables (float32 under either policy) copied in order. So the SavedModels
    compute in float32 from the float32 weights, as a Net rebuilt from them does, and output float32."""
    if config.runtime.precision == "float32":
        return encoder
    matrix = None
    if config.network.kind.reads_word_vectors:   # overwritten below by the trained vectors: zeros of their shape
        matrix = np.zeros(encoder.get_layer("word_vectors").embeddings.shape, np.float32)
    teacher_dim = int(encoder.output_shape[-1]) if config.optimizer.teacher else None
    twin = build_encoder(config.with_flags(precision="float32"), matrix, teacher_dim)
    twin.set_weights(encoder.get_weights())
    return twin


def write_saved_models(config: TrainConfig, word_ids, encoder, model_dir: str) -> None:
    """ENCODER (and SERVING/N, and Vertex AI's VERTEX_MODEL): the strings-in SavedModel, each
    written whole (`ExportableEncoder.export`), computing in float32 whatever `--precision` the Net
    was built in (`float32_encoder`). `word_ids`: the in-graph tokenizer, or None for a transformer's
    (its checkpoint's `token_ids`). TensorFlow backend only."""
    runtime = config.runtime
    encoder = float32_encoder(config, encoder)
    word_ids = word_ids or token_ids(config.inputs.max_tokens, config.network.encoder, config.network.checkpoint)
    exportable = ExportableEncoder(word_ids, encoder, similarity=config.resolved("distance"))
    exportable.export(f"{model_dir}/{ENCODER}")
    if runtime.serving_version is not None:
        exportable.export(f"{model_dir}/{SERVING}/{runtime.serving_version}")
    if vertex_model_dir() == runtime.model_dir.rstrip("/"):   # AIP_MODEL_DIR, where Vertex AI looks for the model
        exportable.export(f"{model_dir}/{VERTEX_MODEL}")
