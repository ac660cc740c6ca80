"""The one definition of each similarity, checked by hand, dense and sparse, pairwise and as a matrix."""
import numpy as np
import pytest
from scipy import sparse

from model.similarity import REPORTED, Similarity

LEFT = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]])
RIGHT = np.array([[4.0, 3.0], [-2.0, 0.0], [1.0, 1.0]])


def test_pairwise_by_hand():
    np.testing.assert_allclose(Similarity.COSINE.pairwise(LEFT, RIGHT), [24 / 25, -1.0, 0.0])   # a zero row: 0
    np.testing.assert_allclose(Similarity.L1.pairwise(LEFT, RIGHT), [-2.0, -3.0, -2.0])   # minus L1: higher is nearer


@pytest.mark.parametrize("similarity", list(Similarity))
def test_sparse_rows_and_the_matrix_agree_with_pairwise(similarity):
    pairwise = similarity.pairwise(LEFT, RIGHT)
    np.testing.assert_allclose(similarity.pairwise(sparse.csr_matrix(LEFT), sparse.csr_matrix(RIGHT)), pairwise)
    matrix = similarity.matrix(LEFT, RIGHT)
    assert matrix.shape == (3, 3)
    np.testing.assert_allclose(np.diag(matrix), pairwise)


def test_a_triplet_is_correct_only_when_its_positive_is_strictly_nearer():
    anchor, positive, negative = LEFT[:2], RIGHT[:2], np.array([[0.0, 5.0], [-2.0, 0.0]])   # second: a tie
    assert Similarity.COSINE.triplet_correct(anchor, positive, negative).tolist() == [True, False]
    assert Similarity.L1.triplet_correct(anchor, positive, negative).tolist() == [True, False]


def test_names_the_trainer_and_sentence_transformers_use():
    assert [similarity.value for similarity in Similarity] == ["l1", "cosine"]      # `--distance`'s error lists them so
    assert [similarity.value for similarity in REPORTED] == ["cosine", "l1"]        # eval's columns
    assert (Similarity.L1.fn_name, Similarity.COSINE.fn_name) == ("manhattan", "cosine")
    assert Similarity.named("manhattan") is Similarity.named("l1") is Similarity.L1
    assert Similarity.named("cosine") is Similarity.COSINE
    with pytest.raises(ValueError, match="dot"):
        Similarity.named("dot")
