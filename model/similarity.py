"""How two embeddings are compared: the one definition of each similarity, for training
(`model.train`'s `--distance`, the triplet head of `model.net.network`), evaluation (`eval.triplets`)
and the exported encoder (`model.encoding.encoder.SavedModelEncoder.similarity`), after
sentence-transformers' `SimilarityFunction` and its `util/similarity.py`.

Every similarity is higher for more similar rows: cosine, or minus the L1 (Manhattan) distance.
A triplet counts as correct when its positive is strictly more similar to the anchor than its
negative (ties count as wrong). NumPy here; the triplet head (`model.net.head`) computes the
same in keras.ops, for every backend (tests/model/test_model_similarity.py holds them equal).
"""
from __future__ import annotations

from enum import StrEnum

import numpy as np


class Similarity(StrEnum):
    """A similarity by the trainer's name (`--distance`, a model dir's history's `distance`): `l1`, the
    paper's distance first, then `cosine`."""

    L1 = "l1"
    COSINE = "cosine"

    @classmethod
    def named(cls, name: str) -> Similarity:
        """The similarity by the trainer's name or by sentence-transformers' (`manhattan`)."""
        for member in cls:
            if name in (member.value, member.fn_name):
                return member
        raise ValueError(f"unknown similarity {name!r}: one of {', '.join(cls)} (or {Similarity.L1.fn_name})")

    @property
    def fn_name(self) -> str:
        """sentence-transformers' name (its `similarity_fn_name`), what an export records."""
        return "manhattan" if self is Similarity.L1 else self.value

    def pairwise(self, left, right) -> np.ndarray:
        """[n]: the similarity of row i of `left` with row i of `right`, dense arrays or SciPy
        sparse matrices (TF-IDF, kept sparse); a zero row has cosine 0 to everything."""
        if self is Similarity.L1:
            return -_row_sums(abs(left - right))
        from scipy import sparse

        if sparse.issparse(left):
            dots = _row_sums(left.multiply(right))
            norms = np.sqrt(_row_sums(left.multiply(left)) * _row_sums(right.multiply(right)))
        else:
            dots = np.einsum("ij,ij->i", left, right)
            norms = np.linalg.norm(left, axis=1) * np.linalg.norm(right, axis=1)
        return dots / np.where(norms > 0, norms, 1.0)

    def triplet_correct(self, anchor, positive, negative) -> np.ndarray:
        """[n] bool: whether each triplet's positive is strictly more similar to its anchor than
        its negative (a tie is wrong), rows as `pairwise` takes them."""
        return self.pairwise(anchor, positive) > self.pairwise(anchor, negative)

    def matrix(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """[n, m]: the similarity of every row of `left` [n, d] with every row of `right` [m, d]."""
        if self is Similarity.L1:
            return -np.abs(left[:, None, :] - right[None, :, :]).sum(axis=-1)
        return unit_rows(left) @ unit_rows(right).T


# The order reports give them in (eval's tables, columns and model cards): cosine first, how the
# paper scores its baselines, then L1, the trained network's own.
REPORTED = (Similarity.COSINE, Similarity.L1)


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """The rows scaled to length 1 (a zero row stays zero)."""
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


def _row_sums(matrix) -> np.ndarray:
    """Per-row sums of a dense array or a SciPy sparse matrix, as a flat array."""
    return np.asarray(matrix.sum(axis=1)).ravel()
