"""Clustering one SCB article's sentences and scoring the result against its sections.

All three algorithms see the same cosine geometry: k-means runs on the L2-normalised embeddings
(squared Euclidean distance between unit vectors is 2 - 2 cos), Iclust on the cosine similarity
matrix, and average-link agglomerative clustering on the cosine distance 1 - cos.
"""
import numpy as np
from sklearn.cluster import AgglomerativeClustering, KMeans
from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score, mutual_info_score, rand_score
from sklearn.preprocessing import normalize

from eval.iclust import IclustConfig, iclust

ALGORITHMS = ("kmeans", "iclust", "average-link")
METRICS = ("MI", "AMI", "RI", "ARI")


def cosine_similarity_matrix(unit_embeddings: np.ndarray) -> np.ndarray:
    """Cosine similarities of L2-normalised rows (an all-zero row has similarity 0 to everything)."""
    return unit_embeddings @ unit_embeddings.T


def cluster_embeddings(embeddings: np.ndarray, n_clusters: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Labels from each algorithm in ALGORITHMS for one article's sentence embeddings."""
    unit = normalize(np.asarray(embeddings, dtype=np.float64))
    similarity = cosine_similarity_matrix(unit)
    distance = np.clip(1.0 - similarity, 0.0, None)
    np.fill_diagonal(distance, 0.0)
    return {
        "kmeans": KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit_predict(unit),
        "iclust": iclust(similarity, n_clusters, IclustConfig(seed=seed)),   # 10 restarts, like k-means
        "average-link": AgglomerativeClustering(
            n_clusters=n_clusters, metric="precomputed", linkage="average"
        ).fit_predict(distance),
    }


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
