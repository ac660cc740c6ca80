"""The BiLSTM's id space: its vocabulary (kept in the model dir, so a resumed run rebuilds the
same) and the word vectors of each id."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from core.published import Run
from model.config import TrainConfig
from model.net.vectors import load_word_vectors
from model.training.arrays import split_triplets
from model.training.model_dir import VOCABULARY

if TYPE_CHECKING:
    from model.net.text import WordIds

LOG = logging.getLogger(__name__)


def build_vocabulary(config: TrainConfig, run: Run, model_dir: str | None = None) -> list[str]:
    """The id space, kept in the model dir's VOCABULARY (default: `--model-dir`) so a resumed job
    rebuilds the same one. `--vocabulary embeddings` (default): every word of the vector file
    in its order; with frozen vectors a word unseen in training still has its pre-trained vector
    at no training cost, where the other choice sends it to an OOV bucket that mean-vectors does
    not have. `--vocabulary train`: training-split words seen `min_count` times that have a
    vector, most frequent first."""
    import tensorflow as tf

    from model.net.text import count_words  # TensorFlow's tokenizer, which a JAX run of a transformer may not load

    model_dir = model_dir or config.runtime.model_dir
    path = f"{model_dir}/{VOCABULARY}"
    if tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as handle:
            return handle.read().splitlines()
    inputs = config.inputs
    if inputs.vocabulary == "embeddings":
        vocabulary = load_word_vectors(inputs.embeddings).words
        LOG.info("vocabulary: all %d words of the word vectors", len(vocabulary))
    else:
        counts = count_words(split_triplets(run, inputs.dataset, "train"))
        frequent = {word for word, n in counts.items() if n >= inputs.min_count}
        with_vectors = set(load_word_vectors(inputs.embeddings, frequent).words)
        vocabulary = sorted(with_vectors, key=lambda word: (-counts[word], word))
        covered = sum(counts[word] for word in vocabulary)
        LOG.info("vocabulary: %d of %d training words have vectors (%.1f%% of %d tokens)",
                 len(vocabulary), len(counts), 100 * covered / max(1, sum(counts.values())), sum(counts.values()))
    tf.io.gfile.makedirs(model_dir)
    with tf.io.gfile.GFile(path + ".partial", "w") as handle:   # a killed run leaves no partial vocabulary
        handle.write("\n".join(vocabulary))
    tf.io.gfile.rename(path + ".partial", path, overwrite=True)
    return vocabulary


def embedding_matrix(vocabulary: list[str], word_ids: WordIds, config: TrainConfig) -> np.ndarray:
    """Rows in id order: zeros for padding, the pre-trained vectors, then small random OOV rows."""
    vectors = load_word_vectors(config.inputs.embeddings, vocabulary)
    scale = float(vectors.matrix.std()) if vectors.matrix.size else 0.1
    oov = np.random.default_rng(config.runtime.seed).normal(0, scale, (config.inputs.num_oov_buckets, vectors.dim))
    # written in place, row block by row block: GloVe's 400 k x 50 floats are copied once, not four times
    matrix = np.zeros((word_ids.num_ids, vectors.dim), np.float32)
    if vectors.words == vocabulary:   # `--vocabulary embeddings`: the file's own order
        matrix[1:1 + len(vocabulary)] = vectors.matrix
    else:
        row_of = vectors.index()
        matrix[1:1 + len(vocabulary)] = vectors.matrix[[row_of[word] for word in vocabulary]]
    matrix[1 + len(vocabulary):] = oov
    return matrix
