"""Clustering one SCB article's sentences and scoring the result against its sections.

All three algorithms see the same cosine geometry: k-means runs on the L2-normalised embeddings
(squared Euclidean distance between unit vectors is 2 - 2 cos), Iclust on the cosine similarity
matrix, and average-link agglomerative clustering on the cosine distance 1 - cos. k-means gets
dense rows even from TF-IDF: one article's vocabulary is small, and scikit-learn's sparse k-means
takes another arithmetic path (its labels could differ from the dense ones by rounding).
"""
import numpy as np
from scipy import sparse
from sklearn.cluster import AgglomerativeClustering, KMeans
from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score, mutual_info_score, rand_score
from sklearn.preprocessing import normalize
from threadpoolctl import threadpool_limits

from core.progress import timed
from eval.config import METRICS
from eval.iclust import IclustConfig, iclust_many


def cosine_geometry(embeddings) -> tuple[np.ndarray, np.ndarray]:
    """(L2-normalised rows, their cosine similarity matrix) of dense or sparse (TF-IDF) embeddings;
    an all-zero row has similarity 0 to everything. The rows stay as sparse as they came."""
    unit = normalize(embeddings.astype(np.float64) if sparse.issparse(embeddings)
                     else np.asarray(embeddings, dtype=np.float64))
    similarity = unit @ unit.T
    return unit, similarity.toarray() if sparse.issparse(similarity) else similarity


def kmeans_labels(unit, n_clusters: int, seed: int = 0) -> np.ndarray:
    """k-means (10 restarts) of L2-normalised rows, densified (see the module docstring), on one
    thread: on an article's few hundred rows scikit-learn's OpenMP threads cost more than they give,
    10x more beside a second Beam worker (docs/results.md, issue 64), and the labels are the same."""
    with threadpool_limits(limits=1):
        return KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit_predict(
            unit.toarray() if sparse.issparse(unit) else unit)


def average_link_labels(similarity: np.ndarray, n_clusters: int) -> np.ndarray:
    """Average-link agglomerative clustering on the cosine distance 1 - cos."""
    distance = np.clip(1.0 - similarity, 0.0, None)
    np.fill_diagonal(distance, 0.0)
    return AgglomerativeClustering(n_clusters=n_clusters, metric="precomputed", linkage="average").fit_predict(distance)


def cluster_embeddings(embeddings_by_method: dict[str, np.ndarray], n_clusters: int, seed: int = 0,
                       seconds: dict[str, float] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """method -> algorithm -> labels, for several methods' embeddings of the same sentences;
    `seconds` (where given) adds each algorithm's time over all the methods (the SCB job's profile).

    Iclust (the slow one: 10 annealing runs) clusters every method's similarity matrix in one
    batched call (`iclust_many`, the same labels as one call each); k-means (10 restarts) and
    average-link run per method."""
    spent: dict[str, float] = {} if seconds is None else seconds
    with timed(spent, "geometry"):
        geometry = {method: cosine_geometry(embeddings) for method, embeddings in embeddings_by_method.items()}
    with timed(spent, "iclust"):
        iclust_labels = iclust_many([similarity for _, similarity in geometry.values()], n_clusters,
                                    IclustConfig(seed=seed))   # 10 restarts, like k-means
    labels: dict[str, dict[str, np.ndarray]] = {}
    for (method, (unit, similarity)), by_iclust in zip(geometry.items(), iclust_labels):
        with timed(spent, "kmeans"):
            by_kmeans = kmeans_labels(unit, n_clusters, seed)
        with timed(spent, "average-link"):
            by_average_link = average_link_labels(similarity, n_clusters)
        labels[method] = {"kmeans": by_kmeans, "iclust": by_iclust, "average-link": by_average_link}
    return labels


def clustering_metrics(true_labels, predicted_labels) -> dict[str, float]:
    """MI (nats), AMI, Rand index and adjusted Rand index of a predicted clustering."""
    return {
        "MI": float(mutual_info_score(true_labels, predicted_labels)),
        "AMI": float(adjusted_mutual_info_score(true_labels, predicted_labels)),
        "RI": float(rand_score(true_labels, predicted_labels)),
        "ARI": float(adjusted_rand_score(true_labels, predicted_labels)),
    }


def macro_average(rows: list[dict]) -> list[dict]:
    """Per (method, algorithm) mean of each metric over articles, with the article count.

    rows: one dict per article x method x algorithm with keys "method", "algorithm" and METRICS.
    """
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["method"], row["algorithm"]), []).append(row)
    return [
        {
            "method": method,
            "algorithm": algorithm,
            "articles": len(members),
            **{metric: float(np.mean([m[metric] for m in members])) for metric in METRICS},
        }
        for (method, algorithm), members in groups.items()
    ]
