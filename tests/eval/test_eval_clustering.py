"""This project's clustering: its cosine geometry and linkage, Iclust on inputs of known structure
(and against the numpy reference), and one article's scoring per variant."""
import math

import numpy as np
import pytest
import reference_scoring
from scipy import sparse
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from eval.clustering import (
    average_link_labels,
    cluster_embeddings,
    clustering_metrics,
    cosine_geometry,
    macro_average,
)
from eval.config import ALGORITHMS, METRICS
from eval.iclust import IclustConfig, hard_objective, iclust, iclust_many


def test_each_metric_name_is_its_measure():
    """The names map to the right measures (not their wiring to scikit-learn's formulas): by hand,
    a crossed clustering of 4 items has RI 2/6, ARI -1/2 and no information shared, in nats."""
    crossed = clustering_metrics([0, 0, 1, 1], [0, 1, 0, 1])
    assert list(crossed) == list(METRICS) and all(type(value) is float for value in crossed.values())
    assert crossed["RI"] == pytest.approx(1 / 3) and crossed["ARI"] == pytest.approx(-0.5)
    assert crossed["MI"] == pytest.approx(0.0, abs=1e-12) and crossed["AMI"] <= 0.0
    assert clustering_metrics([0, 0, 1, 1], [1, 1, 0, 0])["MI"] == pytest.approx(math.log(2))


def test_cosine_geometry_is_unit_rows_and_their_cosines_dense_or_sparse():
    embeddings = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0], [6.0, 8.0, 0.0]])
    unit, similarity = cosine_geometry(embeddings)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), [1, 1, 0, 1])
    np.testing.assert_allclose(similarity, [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 1]], atol=1e-12)
    sparse_unit, sparse_similarity = cosine_geometry(sparse.csr_matrix(embeddings, dtype=np.float32))
    assert sparse.issparse(sparse_unit) and sparse_unit.dtype == np.float64   # rows stay sparse, in float64
    np.testing.assert_allclose(sparse_similarity, similarity)


def _directions_with_norms(seed=0):
    """Three groups of sentences by direction (the themes), each with norms from 0.1 to 100: by
    Euclidean distance on the raw rows the norms would dominate."""
    rng = np.random.default_rng(seed)
    directions = np.eye(8)[:3] + 0.05 * rng.standard_normal((3, 8))
    labels = np.repeat(np.arange(3), 6)
    norms = np.tile([0.1, 1.0, 10.0, 100.0, 0.5, 50.0], 3)
    rows = directions[labels] + 0.05 * rng.standard_normal((len(labels), 8))
    return labels, rows / np.linalg.norm(rows, axis=1, keepdims=True) * norms[:, None]


def test_every_algorithm_clusters_by_direction_not_by_norm():
    """The module's one geometry: k-means on unit rows, Iclust and average-link on cosines."""
    labels, embeddings = _directions_with_norms()
    for algorithm, predicted in cluster_embeddings({"m": embeddings}, 3)["m"].items():
        assert adjusted_rand_score(labels, predicted) == 1.0, algorithm
    by_norm = KMeans(n_clusters=3, n_init=10, random_state=0).fit_predict(embeddings)   # the geometry not chosen
    assert adjusted_rand_score(labels, by_norm) < 0.5


def test_average_link_merges_by_the_mean_cosine_distance():
    """Items 0-1 and 2-3 are tight pairs; item 4 is nearest to item 0, yet nearer on average to 2
    and 3: average linkage puts it with them (single linkage would put it with 0 and 1)."""
    distance = np.array([[0.0, 0.1, 0.8, 0.8, 0.2],
                         [0.1, 0.0, 0.8, 0.8, 0.9],
                         [0.8, 0.8, 0.0, 0.1, 0.5],
                         [0.8, 0.8, 0.1, 0.0, 0.5],
                         [0.2, 0.9, 0.5, 0.5, 0.0]])
    assert adjusted_rand_score(average_link_labels(1.0 - distance, 2), [0, 0, 1, 1, 1]) == 1.0


def test_an_article_is_scored_per_variant_on_its_own_sentences_and_sections():
    """All sentences: k = 3 sections; openers only: the 4 openers, from 2 sections, so k = 2. The
    direction-true method recovers both; one that puts every sentence in one direction does not."""
    from core.records import ScbRecord
    from eval.scb_job import score_article

    labels, embeddings = _directions_with_norms()
    openers = np.isin(np.arange(len(labels)), [0, 1, 6, 7])   # sections 0 and 1 only
    record = ScbRecord(article_id=7, title="T", sections=("a", "b", "c"), sentences=tuple(map(str, labels)),
                       labels=tuple(int(label) for label in labels), openers=tuple(bool(o) for o in openers))
    blind = np.ones_like(embeddings) + 1e-3 * np.random.default_rng(0).standard_normal(embeddings.shape)
    rows = score_article(record, {"direction": embeddings, "blind": blind}, seed=0)
    assert {(row["variant"], row["sentences"], row["k"]) for row in rows} == {("all", 18, 3), ("openers", 4, 2)}
    assert len(rows) == 2 * 2 * len(ALGORITHMS)
    for row in rows:
        if row["method"] == "direction":
            assert (row["ARI"], row["AMI"], row["RI"]) == pytest.approx((1.0, 1.0, 1.0)), row
        elif row["variant"] == "all":
            assert row["ARI"] < 0.5, row


def test_macro_average_is_the_mean_per_method_and_algorithm():
    rows = [
        {"method": "a", "algorithm": "kmeans", "MI": 1.0, "AMI": 0.5, "RI": 0.9, "ARI": 0.2},
        {"method": "a", "algorithm": "kmeans", "MI": 0.0, "AMI": 0.1, "RI": 0.5, "ARI": 0.4},
        {"method": "b", "algorithm": "kmeans", "MI": 2.0, "AMI": 1.0, "RI": 1.0, "ARI": 1.0},
    ]
    summary = {(s["method"], s["algorithm"]): s for s in macro_average(rows)}
    assert summary[("a", "kmeans")]["articles"] == 2
    assert summary[("a", "kmeans")]["ARI"] == pytest.approx(0.3)
    assert summary[("a", "kmeans")]["MI"] == pytest.approx(0.5)
    assert summary[("b", "kmeans")]["AMI"] == pytest.approx(1.0)


def planted(sizes, within=0.9, between=0.1, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    similarity = np.where(labels[:, None] == labels[None, :], within, between)
    if noise:
        jitter = noise * rng.standard_normal(similarity.shape)
        similarity = similarity + (jitter + jitter.T) / 2
    return labels, similarity


@pytest.mark.parametrize("sizes", [[5, 5, 5], [3, 8, 12, 6, 20], [2, 2, 30, 30, 5], [1, 1, 1, 10, 40], [10] * 12])
def test_iclust_recovers_clean_planted_clusters(sizes):
    labels, similarity = planted(sizes)
    predicted = iclust(similarity, len(sizes))
    assert adjusted_rand_score(labels, predicted) == 1.0
    assert sorted(np.bincount(predicted)) == sorted(sizes)


def test_iclust_recovers_noisy_planted_clusters():
    labels, similarity = planted([15, 10, 20, 8], within=0.7, between=0.2, noise=0.15, seed=3)
    assert adjusted_rand_score(labels, iclust(similarity, 4)) == 1.0


def test_iclust_always_returns_exactly_k_clusters_even_without_structure():
    similarity = np.ones((9, 9))
    predicted = iclust(similarity, 4)
    assert len(np.unique(predicted)) == 4


def test_iclust_is_deterministic_for_a_seed():
    _, similarity = planted([6, 7, 8], within=0.6, between=0.3, noise=0.2, seed=5)
    config = IclustConfig(seed=11)
    assert np.array_equal(iclust(similarity, 3, config), iclust(similarity, 3, config))


def test_iclust_restarts_keep_the_run_with_the_best_objective():
    """n_init runs with seeds seed..seed+n_init-1; the result is the best of them by <s>."""
    for data_seed in range(30):   # data on which single runs disagree, so the restarts matter
        _, similarity = planted([12, 9, 15, 7, 11], within=0.45, between=0.3, noise=0.35, seed=data_seed)
        single = [iclust(similarity, 5, IclustConfig(seed=seed, n_init=1)) for seed in range(4)]
        objectives = [hard_objective(similarity, labels, 5) for labels in single]
        if len(set(np.round(objectives, 12))) > 1:
            break
    else:
        pytest.fail("no test matrix on which annealing runs disagree")
    best = iclust(similarity, 5, IclustConfig(seed=0, n_init=4))
    assert hard_objective(similarity, best, 5) == pytest.approx(max(objectives))
    assert hard_objective(similarity, best, 5) > min(objectives)


def test_iclust_rejects_bad_arguments():
    with pytest.raises(ValueError, match="square"):
        iclust(np.ones((3, 4)), 2)
    with pytest.raises(ValueError, match="n_clusters"):
        iclust(np.ones((3, 3)), 4)


def test_every_algorithm_recovers_well_separated_embeddings():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 16)) * 4
    labels = np.repeat(np.arange(4), [6, 9, 5, 7])
    embeddings = centres[labels] + rng.normal(size=(len(labels), 16))
    predictions = cluster_embeddings({"dense": embeddings, "sparse": sparse.csr_matrix(embeddings)}, 4)
    for method in ("dense", "sparse"):
        assert set(predictions[method]) == set(ALGORITHMS)
        for algorithm, predicted in predictions[method].items():
            assert adjusted_rand_score(labels, predicted) == 1.0, algorithm


def test_batched_iclust_gives_the_labels_of_one_restart_at_a_time(embedded_pipeline_output):
    """Iclust's restarts (and several methods' matrices) anneal together in `iclust_many`; on the
    real excerpt's SCB articles every label equals the unbatched implementation's."""
    from eval.scb_job import read_articles
    from model.encoding.encoders import MeanVectorsEncoder, TfidfEncoder

    compared = 0
    for record in sorted(read_articles(str(embedded_pipeline_output)), key=lambda r: len(r.sentences))[:4]:
        k = len(set(record.labels))
        similarities = [cosine_geometry(encoder.encode(list(record.sentences)))[1]
                        for encoder in (MeanVectorsEncoder(), TfidfEncoder())]
        for batched, similarity in zip(iclust_many(similarities, k), similarities):
            np.testing.assert_array_equal(batched, reference_scoring.iclust(similarity, k), err_msg=record.title)
            compared += 1
    assert compared == 8


def test_pairwise_sum_adds_in_numpys_order():
    """The compiled normalisation sums each row as numpy's `sum(axis=-1)` does (8 partial sums,
    halves past 128 items), so it rounds the same: equal to the last bit at every length."""
    from eval.iclust import _pairwise_sum

    rng = np.random.default_rng(0)
    for n in [*range(1, 140), 255, 256, 300, 1031]:
        row = rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 8, n)
        assert _pairwise_sum(row) == np.stack([row, row]).sum(axis=-1)[0], n


def test_compiled_fixed_point_iteration_is_the_numpy_update_per_run():
    """`_settle` (all runs of two matrices side by side, compiled) against the numpy update of
    `reference_scoring` applied to each run alone: the same number of updates before each run's
    largest change falls below tol, and the same assignments (to the last bit where numpy's exp is
    the C library's; numpy's own AVX-512 exp may differ in the last bit)."""
    from eval.iclust import _settle

    rng = np.random.default_rng(4)
    similarities = [planted([6, 9, 5], within=0.6, between=0.3, noise=0.2, seed=seed)[1] for seed in (1, 2)]
    start = rng.random((6, 20, 3))
    start /= start.sum(axis=2, keepdims=True)
    matrix_of_run = np.repeat([0, 1], 3)
    beta = np.array([2.0, 5.0, 20.0, 2.0, 5.0, 20.0]) / 0.2
    settled = start.copy()
    updates = _settle(np.stack(similarities), settled, matrix_of_run, beta, 1e-5, 200)
    for run in range(6):
        assignment, count = start[run], 0
        while count < 200:
            updated = reference_scoring._self_consistent_update(similarities[matrix_of_run[run]], assignment, beta[run])
            change, assignment, count = np.abs(updated - assignment).max(), updated, count + 1
            if change < 1e-5:
                break
        assert updates[run] == count
        np.testing.assert_allclose(settled[run], assignment, rtol=1e-12, atol=1e-300)


def test_iclust_gives_the_reference_labels_on_edge_cases():
    """Labels equal the numpy implementation's (`reference_scoring.iclust`, one restart at a time)
    on small and degenerate inputs: k = N, two items, identical items (empty slots after annealing,
    so the bisection fills them), low-rank similarities, and two matrices clustered together."""
    from eval.iclust import _anneal

    rng = np.random.default_rng(5)
    unit = rng.standard_normal((24, 3))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    cases = [
        ([planted([4, 6, 5, 7], within=0.55, between=0.3, noise=0.25, seed=2)[1]], 4),
        ([planted([1, 1, 1], within=0.6, between=0.3, noise=0.2, seed=3)[1]], 3),   # k = N
        ([np.array([[1.0, 0.2], [0.2, 1.0]])], 2),
        ([np.ones((9, 9))], 4),
        ([unit @ unit.T], 7),
        ([planted([5, 8, 6], within=0.6, between=0.3, noise=0.3, seed=seed)[1] for seed in (6, 7)], 3),
    ]
    config = IclustConfig(n_init=3)
    for similarities, k in cases:
        for labels, similarity in zip(iclust_many(similarities, k, config), similarities):
            np.testing.assert_array_equal(labels, reference_scoring.iclust(similarity, k, config), err_msg=str(k))
    annealed = _anneal([np.ones((9, 9))], 4, config, [0, 1, 2])[0][0]
    assert any(len(np.unique(run.argmax(axis=1))) < 4 for run in annealed)   # the bisection path ran
