"""The trained encoder as a TensorFlow SavedModel that takes raw strings: what `model.encoder`
loads, TF Serving serves and Vertex AI deploys. TensorFlow alone (the in-graph tokenizer is
tensorflow-text), so it sits apart from the network, which every Keras backend builds.

    python -m model.saved_model --model-dir MODEL --weights WEIGHTS.h5

writes a model dir's `encoder/` (and `serving/N`, Vertex AI's `model/`, as its flags say) from
weights of its network: what `model.train --backend jax` runs in a TensorFlow process once it has
tested them, and what a run trained where TensorFlow is absent runs later, where it is.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from pipeline.cli import UsageError, flag, parse_config, parse_first, run_cli


@dataclass(frozen=True, kw_only=True)
class SavedModelConfig:
    model_dir: str = flag(help="a model.train model dir (its inputs.json names the network)")
    weights: str = flag(help="the network's weights (.weights.h5), e.g. MODEL/checkpoints/best.weights.h5")


def parse_args(argv: list[str] | None = None) -> SavedModelConfig:
    return parse_config(SavedModelConfig, argv, "python -m model.saved_model", __doc__.split("\n\n")[0])


if __name__ == "__main__":   # the flags first: --help and a bad flag answer before TensorFlow loads
    parse_first(parse_args)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from model.similarity import Similarity  # noqa: E402


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


def main(argv: list[str] | None = None) -> str:
    """Rebuilds the model dir's network from its recorded flags under TensorFlow, loads `--weights`
    and writes its strings-in SavedModels (`model.train.write_saved_models`)."""
    from model.encoder import load_encoder
    from model.export import recorded_config
    from model.text import WordIds
    from model.train import build_models, embedding_matrix, write_saved_models

    config = parse_args(argv)
    if keras.backend.backend() != "tensorflow":
        raise UsageError(f"KERAS_BACKEND={keras.backend.backend()}: a SavedModel needs the tensorflow backend")
    if not os.path.exists(config.weights):
        raise UsageError(f"--weights {config.weights}: no such file")
    _, train_config = recorded_config(config.model_dir)
    train_config = train_config.with_flags(backend="tensorflow", distribution_strategy="auto")
    inputs, optimizer = train_config.inputs, train_config.optimizer
    if train_config.network.kind.reads_word_vectors:
        with open(os.path.join(config.model_dir, "vocabulary.txt"), encoding="utf-8") as handle:
            vocabulary = handle.read().splitlines()
        word_ids = WordIds(vocabulary, inputs.num_oov_buckets, inputs.max_tokens)
        matrix = embedding_matrix(vocabulary, word_ids, train_config)
    else:
        from model.transformer import token_ids

        word_ids, matrix = token_ids(inputs.max_tokens, train_config.network.encoder), None
    teacher_dim = load_encoder(optimizer.teacher).dim if optimizer.teacher else None
    encoder, model = build_models(train_config, matrix, global_batch=optimizer.batch_size, teacher_dim=teacher_dim)
    model.load_weights(config.weights)
    write_saved_models(train_config, word_ids, encoder, config.model_dir)
    print(f"strings-in SavedModel at {config.model_dir}/encoder")
    return f"{config.model_dir}/encoder"


if __name__ == "__main__":
    sys.exit(run_cli(main))
