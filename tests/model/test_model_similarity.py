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


@pytest.mark.parametrize("similarity", list(Similarity))
def test_the_heads_keras_distances_are_numpys_similarities(similarity):
    """`model.net.head` (keras.ops, every backend) and `Similarity` (NumPy) define the same
    comparison: L1 is minus the head's distance; the head's cosine distance is `COSINE_SCALE` x
    (1 - cosine) of unit rows."""
    from keras import ops

    from model.net.head import COSINE_SCALE, candidate_distances, pair_distances, unit_rows

    rng = np.random.default_rng(0)
    left, right = rng.normal(size=(5, 8)).astype(np.float32), rng.normal(size=(7, 8)).astype(np.float32)

    def as_similarity(distances):
        distances = ops.convert_to_numpy(distances)
        return -distances if similarity is Similarity.L1 else 1.0 - distances / COSINE_SCALE

    def rows(matrix):
        return ops.convert_to_numpy(unit_rows(matrix)) if similarity is Similarity.COSINE else matrix

    np.testing.assert_allclose(as_similarity(candidate_distances(rows(left), rows(right), similarity.value)),
                               similarity.matrix(left, right), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(as_similarity(pair_distances(rows(left), rows(right[:5]), similarity.value)),
                               similarity.pairwise(left, right[:5]), rtol=1e-5, atol=1e-5)
