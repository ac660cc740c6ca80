"""The evaluation's scoring as it was before the full-size evaluation (commit e85f247): Iclust one
restart at a time, each method's article clustered on its own from dense embeddings, triplets
scored from dense embeddings. Kept only as the oracle of the tests that show the faster code
gives the same labels and metrics."""
from dataclasses import replace

import numpy as np
from sklearn.cluster import AgglomerativeClustering, KMeans
from sklearn.preprocessing import normalize
from threadpoolctl import threadpool_limits

from eval.iclust import IclustConfig


def _cluster_similarities(similarity: np.ndarray, assignment: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """P(c), s(c; i) as an [N, k] matrix and s(c) as a [k] vector for soft assignments P(c|i)."""
    n_items = similarity.shape[0]
    p_cluster = assignment.sum(axis=0) / n_items
    mass = assignment.sum(axis=0)
    p_item_given_cluster = assignment / np.where(mass > 0, mass, 1.0)
    item_to_cluster = similarity @ p_item_given_cluster
    within_cluster = np.einsum("ic,ic->c", p_item_given_cluster, item_to_cluster)
    return p_cluster, item_to_cluster, within_cluster


def _self_consistent_update(similarity: np.ndarray, assignment: np.ndarray, beta: float) -> np.ndarray:
    """One application of P(c|i) ∝ P(c) exp{beta [2 s(c;i) - s(c)]} (beta = 1/T)."""
    p_cluster, item_to_cluster, within_cluster = _cluster_similarities(similarity, assignment)
    with np.errstate(divide="ignore"):
        log_prior = np.log(p_cluster)
    logits = log_prior[None, :] + beta * (2.0 * item_to_cluster - within_cluster[None, :])
    unnormalised = np.exp(logits - logits.max(axis=1, keepdims=True))
    return unnormalised / unnormalised.sum(axis=1, keepdims=True)


def _anneal(similarity: np.ndarray, n_clusters: int, config: IclustConfig) -> np.ndarray:
    """Soft assignments P(c|i) [N, k] after cooling from config.t_start to config.t_end."""
    n_items = similarity.shape[0]
    off_diagonal = similarity[~np.eye(n_items, dtype=bool)]
    spread = float(off_diagonal.std()) if n_items > 1 else 0.0
    spread = spread or 1.0
    rng = np.random.default_rng(config.seed)
    assignment = np.full((n_items, n_clusters), 1.0 / n_clusters)
    temperature = config.t_start
    while temperature >= config.t_end:
        beta = 1.0 / (temperature * spread)
        assignment = assignment + config.perturbation * rng.random(assignment.shape) / n_clusters
        assignment /= assignment.sum(axis=1, keepdims=True)
        for _ in range(config.max_iter):
            updated = _self_consistent_update(similarity, assignment, beta)
            change = np.abs(updated - assignment).max()
            assignment = updated
            if change < config.tol:
                break
        temperature *= config.cooling
    return assignment


def _fill_empty_clusters(
    similarity: np.ndarray, labels: np.ndarray, n_clusters: int, config: IclustConfig
) -> np.ndarray:
    """Fills each empty slot by bisecting (2-cluster Iclust) the least coherent multi-item cluster.

    Falls back to moving that cluster's worst-fitting item when the bisection keeps it whole.
    """
    labels = labels.copy()
    for empty in [c for c in range(n_clusters) if not np.any(labels == c)]:
        _, item_to_cluster, within_cluster = _cluster_similarities(similarity, np.eye(n_clusters)[labels])
        sizes = np.bincount(labels, minlength=n_clusters)
        splittable = np.flatnonzero(sizes > 1)
        target = splittable[np.argmin(within_cluster[splittable])]
        members = np.flatnonzero(labels == target)
        halves = _anneal(similarity[np.ix_(members, members)], 2, config).argmax(axis=1)
        if halves.min() == halves.max():
            fit = 2.0 * item_to_cluster[members, target] - within_cluster[target]
            halves = (np.arange(len(members)) == np.argmin(fit)).astype(np.int64)
        labels[members[halves == 1]] = empty
    return labels


def _refine_hard(similarity: np.ndarray, labels: np.ndarray, n_clusters: int, config: IclustConfig) -> np.ndarray:
    """Empty slots refilled, then the T -> 0 limit of the update (each item to argmax_c 2 s(c;i) - s(c))
    iterated while it keeps all k clusters."""
    labels = _fill_empty_clusters(similarity, labels, n_clusters, config)
    for _ in range(config.max_iter):
        _, item_to_cluster, within_cluster = _cluster_similarities(similarity, np.eye(n_clusters)[labels])
        best = (2.0 * item_to_cluster - within_cluster[None, :]).argmax(axis=1)
        if np.array_equal(best, labels) or len(np.unique(best)) < n_clusters:
            break  # a fixed point, or a step that would empty a slot again
        labels = best
    return labels


def iclust(similarity: np.ndarray, n_clusters: int, config: IclustConfig = IclustConfig()) -> np.ndarray:
    """Hard Iclust labels (ints in [0, n_clusters), all used) for a symmetric [N, N] similarity matrix."""
    similarity = np.asarray(similarity, dtype=np.float64)
    if similarity.ndim != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"iclust needs a square similarity matrix, got shape {similarity.shape}")
    n_items = similarity.shape[0]
    if not 1 <= n_clusters <= n_items:
        raise ValueError(f"iclust needs 1 <= n_clusters <= number of items ({n_items}), got {n_clusters}")
    if n_clusters == 1:
        return np.zeros(n_items, dtype=np.int64)
    best_labels, best_objective = None, -np.inf
    # One BLAS thread: on these small matrices threads cost more than they give (and Beam runs
    # several clusterings side by side).
    with threadpool_limits(limits=1, user_api="blas"):
        for restart in range(config.n_init):
            run = replace(config, seed=config.seed + restart)
            labels = _refine_hard(similarity, _anneal(similarity, n_clusters, run).argmax(axis=1), n_clusters, run)
            objective = hard_objective(similarity, labels, n_clusters)
            if objective > best_objective:
                best_labels, best_objective = labels, objective
    _, compact = np.unique(best_labels, return_inverse=True)
    return compact.astype(np.int64)


def hard_objective(similarity: np.ndarray, labels: np.ndarray, n_clusters: int) -> float:
    """<s> = sum_c P(c) s(c) of a hard clustering: Iclust's objective at T -> 0."""
    p_cluster, _, within_cluster = _cluster_similarities(np.asarray(similarity, dtype=np.float64),
                                                         np.eye(n_clusters)[labels])
    return float(p_cluster @ within_cluster)


def cluster_embeddings(embeddings: np.ndarray, n_clusters: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Labels from k-means, Iclust and average-link for one method's dense embeddings of one article."""
    unit = normalize(np.asarray(embeddings, dtype=np.float64))
    similarity = unit @ unit.T
    distance = np.clip(1.0 - similarity, 0.0, None)
    np.fill_diagonal(distance, 0.0)
    return {
        "kmeans": KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit_predict(unit),
        "iclust": iclust(similarity, n_clusters, IclustConfig(seed=seed)),
        "average-link": AgglomerativeClustering(
            n_clusters=n_clusters, metric="precomputed", linkage="average"
        ).fit_predict(distance),
    }


def triplet_correct(anchor: np.ndarray, positive: np.ndarray, negative: np.ndarray) -> dict[str, np.ndarray]:
    """Per triplet, whether its positive is strictly closer, by cosine and by L1 distance (dense)."""
    def cosine(left, right):
        norms = np.linalg.norm(left, axis=1) * np.linalg.norm(right, axis=1)
        return np.einsum("ij,ij->i", left, right) / np.where(norms > 0, norms, 1.0)

    l1_positive = np.abs(anchor - positive).sum(axis=1)
    l1_negative = np.abs(anchor - negative).sum(axis=1)
    return {"cosine": cosine(anchor, positive) > cosine(anchor, negative), "l1": l1_positive < l1_negative}
