"""One way to encode sentences: objects with `encode(list[str]) -> np.ndarray`.

`SavedModelEncoder` loads the trainer's export (`<model-dir>/encoder`), whose
`serving_default` signature maps a 1-D tf.string tensor of raw sentences to
`{"embeddings": float32 [n, d]}`; tokenisation and the vocabulary live inside the graph.
A remote export (`gs://...`) is first downloaded to a local temporary directory through Beam
FileSystems (`model.storage`: TensorFlow's GCS filesystem cannot reach the test emulator).

A model dir is code, not data: a SavedModel's graph runs whatever ops it holds when it is loaded
and called (it could read or write files: `tf.io.write_file`), so load only exports you trust,
as with a pickle.

`load_encoder(path)` is the standalone entry point: it works in a fresh interpreter because loading
imports `tensorflow_text`, which registers the tokenizer's ops (`CaseFoldUTF8`,
`RegexSplitWithOffsets`) that the SavedModel's graph uses; plain `tf.saved_model.load` of an
export needs `import tensorflow_text` first for the same reason. TensorFlow itself is imported
when an encoder is loaded, not with this module: its `SentenceEncoder` protocol is for every job.
"""
from __future__ import annotations

import os
import tempfile
from typing import Protocol, runtime_checkable

import numpy as np

from model.storage import download_tree, is_remote

SIGNATURE = "serving_default"
OUTPUT_KEY = "embeddings"
INPUT_KEY = "sentences"


@runtime_checkable
class SentenceEncoder(Protocol):
    """Anything that turns sentences into float32 [n, d] vectors."""

    name: str

    def encode(self, sentences: list[str]) -> np.ndarray: ...


def sentence_list(sentences) -> list[str]:
    """The sentences as a list: a list, tuple or any iterable (a generator) of strings. A clear
    TypeError for what is not: None, bytes, numbers, or an iterable holding a non-string."""
    if sentences is None or isinstance(sentences, (bytes, bytearray)) or not hasattr(sentences, "__iter__"):
        raise TypeError(f"encode takes a string or an iterable of strings, got {type(sentences).__name__}")
    listed = list(sentences)
    for index, sentence in enumerate(listed):
        if not isinstance(sentence, str):
            raise TypeError(f"encode takes strings: item {index} is a {type(sentence).__name__} ({sentence!r:.40})")
    return listed


def _encoder_dir(path: str) -> str:
    """Accepts the SavedModel folder itself or the model dir holding `encoder/`, local or remote."""
    path = str(path)
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems

        join, exists = FileSystems.join, FileSystems.exists
    else:
        join, exists = os.path.join, os.path.exists
    if exists(join(path, "saved_model.pb")):
        return path
    nested = join(path, "encoder")
    if exists(join(nested, "saved_model.pb")):
        return nested
    raise FileNotFoundError(f"no SavedModel encoder at {path} (nor at {nested})")


class SavedModelEncoder:
    """Encodes with an exported encoder SavedModel, in batches of `batch_size` sentences."""

    def __init__(self, path: str, name: str | None = None, batch_size: int = 512):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  registers the tokenizer ops the exported graph uses

        self.path = _encoder_dir(path)
        self.name = name or os.path.basename(os.path.dirname(self.path.rstrip("/"))) or "saved"
        self.batch_size = batch_size
        local = self.path
        if is_remote(self.path):   # kept (and removed with the encoder): restored tables may read assets
            self._download = tempfile.TemporaryDirectory(prefix="saved-encoder-")
            local = self._download.name
            download_tree(self.path, local)
        self._module = tf.saved_model.load(local)
        self._serve = self._module.signatures[SIGNATURE]
        self.dim = int(self._module.embedding_dim.numpy())
        # What the embeddings were trained for (exports before it was recorded: cosine, as
        # sentence-transformers assumes).
        recorded = getattr(self._module, "similarity", None)
        self.similarity_fn_name = recorded.numpy().decode() if recorded is not None else "cosine"

    def encode(self, sentences: str | list[str], batch_size: int | None = None,
               normalize_embeddings: bool = False) -> np.ndarray:
        """float32 [n, d] embeddings of a list of sentences, [d] of a single string, as
        sentence-transformers returns them; `normalize_embeddings` scales each row to unit length
        (cosine similarity becomes a dot product)."""
        if isinstance(sentences, str):
            return self.encode([sentences], batch_size, normalize_embeddings)[0]
        sentences = sentence_list(sentences)
        if not sentences:
            return np.zeros((0, self.dim), np.float32)
        import tensorflow as tf

        batch_size = batch_size or self.batch_size
        # Batches of similar length: each is padded to its longest sentence, so a random mix would
        # spend most LSTM steps on padding. The order is undone below; each row is the same.
        order = np.argsort([len(sentence) for sentence in sentences], kind="stable")
        chunks = []
        for start in range(0, len(sentences), batch_size):
            batch = tf.constant([sentences[i] for i in order[start:start + batch_size]], dtype=tf.string)
            chunks.append(self._serve(**{INPUT_KEY: batch})[OUTPUT_KEY].numpy())
        embeddings = np.empty((len(sentences), self.dim), np.float32)
        embeddings[order] = np.concatenate(chunks)
        if normalize_embeddings:
            norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
            embeddings = embeddings / np.where(norms > 0, norms, 1.0)
        return embeddings

    def similarity(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """[n, m] similarities of two sets of embeddings (a single one, [d], counts as [1, d]),
        by the similarity the export records: cosine, or for `l1` the negative L1 distance
        (higher is more similar either way, as sentence-transformers' `similarity`)."""
        left, right = np.atleast_2d(left).astype(np.float32), np.atleast_2d(right).astype(np.float32)
        if self.similarity_fn_name == "l1":
            return -np.abs(left[:, None, :] - right[None, :, :]).sum(axis=-1)
        left = left / np.maximum(np.linalg.norm(left, axis=1, keepdims=True), 1e-12)
        right = right / np.maximum(np.linalg.norm(right, axis=1, keepdims=True), 1e-12)
        return left @ right.T


def load_encoder(path: str, batch_size: int = 512) -> SavedModelEncoder:
    """The trained encoder at `path`: a model dir, its `encoder/`, local or `gs://`. Loading runs
    the export's graph: load only model dirs you trust (see the module docstring)."""
    return SavedModelEncoder(path, batch_size=batch_size)
