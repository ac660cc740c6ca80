"""Iclust: information-based clustering of a similarity matrix (Slonim, Atwal, Tkačik & Bialek, PNAS 2005).

Hand-written from the paper because no library implements it. Items i = 1..N have uniform
P(i) = 1/N and soft assignments P(c|i) to `n_clusters` clusters. With P(i|c) = P(c|i) P(i) / P(c),

    s(c; i) = sum_j P(j|c) s(i, j)          (how similar item i is to cluster c)
    s(c)    = sum_ij P(i|c) P(j|c) s(i, j)  (the cluster's average internal similarity)

Iclust maximises <s> - T * I(C; i), where <s> = sum_c P(c) s(c), through the self-consistent update
(pairwise case, r = 2)

    P(c|i)  ∝  P(c) * exp{ (1/T) [ 2 s(c; i) - s(c) ] }.

Deterministic annealing: start hot from the uniform assignment, cool T geometrically, and at
every temperature perturb the previous solution slightly (so clusters can split once T falls below
a critical value) and iterate the update to a fixed point. At the final, near-zero temperature the
assignments are hard; each item goes to its most probable cluster, and the T -> 0 limit of the
update (item to argmax_c 2 s(c;i) - s(c)) is iterated to a fixed point. If a cluster slot is empty
after annealing (two groups merged into one slot, or the data do not support k groups), first the
least coherent multi-item cluster (lowest s(c)) is bisected by a 2-cluster Iclust into the empty
slot, so the result always has exactly `n_clusters` clusters. (This slot-filling step is ours, not the paper's.)

The similarity matrix is used as given (its diagonal included), as in the paper's definition of
<s> over all pairs. Temperatures are given relative to the spread (standard deviation) of the
off-diagonal similarities, so the schedule means the same for cosine, dot-product or any other scale.
"""
from dataclasses import dataclass, replace

import numba
import numpy as np
import scipy.linalg.cython_blas  # noqa: F401 (the BLAS of numba's np.dot, loaded before threadpool_limits sees the BLAS)
from threadpoolctl import threadpool_limits


@dataclass(frozen=True)
class IclustConfig:
    """Annealing schedule and fixed-point iteration parameters.

    t_start: initial temperature, in units of the similarity spread; annealing starts there from
        the uniform assignment (tried on planted clusters: 1 and 10 recover them alike, 1 is faster).
    t_end: final temperature, same units; low enough that the assignments are hard.
    cooling: T is multiplied by this factor at each annealing step (0 < cooling < 1).
    perturbation: size of the uniform noise (relative to 1/k) added to P(c|i) before each step;
        it breaks the symmetry between identical clusters and revives slots that had emptied.
    max_iter: fixed-point iterations per temperature at most.
    tol: convergence threshold on the largest change of any P(c|i).
    seed: seed of the perturbation noise (the result is deterministic given the seed).
    n_init: annealing runs, with seeds seed, seed + 1, ...; the hard clustering with the highest
        objective <s> is kept (k-means' `n_init`: annealing can settle in a local optimum).
    """

    t_start: float = 1.0
    t_end: float = 1e-2
    cooling: float = 0.8
    perturbation: float = 0.3
    max_iter: int = 200
    tol: float = 1e-5
    seed: int = 0
    n_init: int = 10


def _cluster_similarities(similarity: np.ndarray, assignment: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """P(c), s(c; i) and s(c) of soft assignments P(c|i) [N, k] (P(c) [k], s(c; i) [N, k], s(c) [k])."""
    mass = assignment.sum(axis=0)
    p_item_given_cluster = assignment / np.where(mass > 0, mass, 1.0)
    item_to_cluster = similarity @ p_item_given_cluster
    within_cluster = np.einsum("ic,ic->c", p_item_given_cluster, item_to_cluster)
    return mass / assignment.shape[0], item_to_cluster, within_cluster


@numba.njit(cache=True, inline="always")
def _block_sum(values: np.ndarray, start: int, stop: int) -> float:
    """sum(values[start:stop]) of at most 128 items, added in numpy's order (one by one up to 7,
    else 8 partial sums)."""
    n = stop - start
    if n < 8:
        total = 0.0
        for i in range(start, stop):
            total += values[i]
        return total
    r0, r1, r2, r3 = values[start], values[start + 1], values[start + 2], values[start + 3]
    r4, r5, r6, r7 = values[start + 4], values[start + 5], values[start + 6], values[start + 7]
    i = start + 8
    while i < stop - n % 8:
        r0 += values[i]
        r1 += values[i + 1]
        r2 += values[i + 2]
        r3 += values[i + 3]
        r4 += values[i + 4]
        r5 += values[i + 5]
        r6 += values[i + 6]
        r7 += values[i + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for j in range(i, stop):
        total += values[j]
    return total


@numba.njit(cache=True, inline="always")
def _pairwise_sum(values: np.ndarray) -> float:
    """sum(values) added in numpy's order, so the normalisation rounds exactly as numpy's
    `sum(axis=-1)`: blocks of at most 128 items (`_block_sum`), longer rows halved at a multiple
    of 8 and the halves' sums added. The halving walks an explicit stack: numba cannot cache a
    recursive function."""
    if len(values) <= 128:
        return _block_sum(values, 0, len(values))
    starts, stops = np.empty(192, np.int64), np.empty(192, np.int64)   # stop -1: add the last two sums
    sums = np.empty(64)
    starts[0], stops[0], pending, done = 0, len(values), 1, 0
    while pending:
        pending -= 1
        start, stop = starts[pending], stops[pending]
        if stop < 0:
            done -= 1
            sums[done - 1] += sums[done]
        elif stop - start <= 128:
            sums[done] = _block_sum(values, start, stop)
            done += 1
        else:
            half = (stop - start) // 2
            half -= half % 8
            starts[pending], stops[pending] = 0, -1
            starts[pending + 1], stops[pending + 1] = start + half, stop
            starts[pending + 2], stops[pending + 2] = start, start + half
            pending += 3
    return sums[0]


@numba.njit(cache=True, inline="always")
def _posteriors_side_by_side(assignment: np.ndarray, runs: np.ndarray,
                             mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P(i|c) of each of `runs` side by side [N, len(runs) * k], log P(c) of each [len(runs), k]):
    the right-hand side of the one product all these runs share. `mass`: a [k] scratch row."""
    _, n_items, n_clusters = assignment.shape
    side_by_side = np.empty((n_items, len(runs) * n_clusters))
    log_prior = np.empty((len(runs), n_clusters))
    for slot, run in enumerate(runs):
        first = slot * n_clusters
        mass[:] = 0.0
        for i in range(n_items):
            for c in range(n_clusters):
                mass[c] += assignment[run, i, c]
        for c in range(n_clusters):
            log_prior[slot, c] = np.log(mass[c] / n_items)
            if not mass[c] > 0:
                mass[c] = 1.0
        for i in range(n_items):
            for c in range(n_clusters):
                side_by_side[i, first + c] = assignment[run, i, c] / mass[c]
    return side_by_side, log_prior


@numba.njit(cache=True, inline="always")
def _update_run(assignment: np.ndarray, run: int | np.integer, first: int, side_by_side: np.ndarray,
                product: np.ndarray, log_prior: np.ndarray, beta: float, within_cluster: np.ndarray,
                unnormalised: np.ndarray) -> float:
    """One update of run `run`'s P(c|i) in place, from its columns `first`.. of P(i|c) and of the
    product s(c; i); returns the largest change. `within_cluster`, `unnormalised`: [k] scratch rows."""
    _, n_items, n_clusters = assignment.shape
    within_cluster[:] = 0.0
    for i in range(n_items):
        for c in range(n_clusters):
            within_cluster[c] += side_by_side[i, first + c] * product[i, first + c]
    change = 0.0
    for i in range(n_items):
        largest = -np.inf
        for c in range(n_clusters):
            logit = log_prior[c] + beta * (2.0 * product[i, first + c] - within_cluster[c])
            unnormalised[c] = logit
            largest = max(largest, logit)
        for c in range(n_clusters):
            unnormalised[c] = np.exp(unnormalised[c] - largest)
        norm = _pairwise_sum(unnormalised)
        for c in range(n_clusters):
            updated = unnormalised[c] / norm
            change = max(change, abs(updated - assignment[run, i, c]))
            assignment[run, i, c] = updated
    return change


@numba.njit(cache=True, nogil=True)
def _settle(similarities: np.ndarray, assignment: np.ndarray, matrix_of_run: np.ndarray, beta: np.ndarray,
            tol: float, max_iter: int) -> np.ndarray:
    """Iterates P(c|i) ∝ P(c) exp{beta [2 s(c;i) - s(c)]} on each run's assignments [R, N, k] (in
    place; run r on `similarities[matrix_of_run[r]]`, [M, N, N], at its beta) until the run's
    largest change is below `tol`, or `max_iter` times. Returns each run's number of updates.

    Compiled because at these sizes (N ~ 20-800 items, k ~ 5-12) numpy's element-wise steps cost
    more than the product: each is a pass over the [R, N, k] arrays plus a call, a dozen per
    update, thousands of updates per article. Here an update is the product and one pass over each
    run. Every run on the same matrix still meets it in one product, S @ [P(i|c) of run 1 | ... |
    run R], and every sum adds in numpy's order, so the result is the numpy formulation's to the
    last bit (where numpy's exp is the C library's, as on x86 without AVX-512)."""
    n_runs, _, n_clusters = assignment.shape
    active = np.ones(n_runs, dtype=np.bool_)
    updates = np.zeros(n_runs, dtype=np.int64)
    mass = np.empty(n_clusters)
    within_cluster = np.empty(n_clusters)
    unnormalised = np.empty(n_clusters)
    for _ in range(max_iter):
        for matrix in range(similarities.shape[0]):
            runs = np.flatnonzero(active & (matrix_of_run == matrix))
            if len(runs) == 0:
                continue
            side_by_side, log_prior = _posteriors_side_by_side(assignment, runs, mass)
            product = np.dot(similarities[matrix], side_by_side)   # s(c; i) of each run
            for slot, run in enumerate(runs):
                change = _update_run(assignment, run, slot * n_clusters, side_by_side, product, log_prior[slot],
                                     beta[run], within_cluster, unnormalised)
                updates[run] += 1
                if not change >= tol:
                    active[run] = False
        if not active.any():
            break
    return updates


def _anneal(similarities: list[np.ndarray], n_clusters: int, config: IclustConfig,
            seeds: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Soft assignments P(c|i) [M, R, N, k] after cooling from config.t_start to config.t_end: R
    annealing runs (one per seed) on each of M similarity matrices of the same N items, all
    cooled together; and each run's number of updates at each temperature [T, M, R]. Each run
    draws its seed's noise and stops iterating at its own fixed point, exactly as if it ran
    alone; only the products are shared."""
    n_items = similarities[0].shape[0]
    off_diagonal = ~np.eye(n_items, dtype=bool)
    spreads = np.array([float(similarity[off_diagonal].std()) if n_items > 1 else 0.0 for similarity in similarities])
    spreads[spreads == 0] = 1.0
    matrix_of_run = np.repeat(np.arange(len(similarities)), len(seeds))
    spread_of_run = spreads[matrix_of_run]
    stacked = np.stack(similarities)
    generators = [np.random.default_rng(seed) for seed in seeds]
    assignment = np.full((len(matrix_of_run), n_items, n_clusters), 1.0 / n_clusters)
    updates = []
    temperature = config.t_start
    while temperature >= config.t_end:
        beta = 1.0 / (temperature * spread_of_run)
        noise = np.stack([generator.random((n_items, n_clusters)) for generator in generators])
        assignment = assignment + config.perturbation * np.tile(noise, (len(similarities), 1, 1)) / n_clusters
        assignment /= assignment.sum(axis=2, keepdims=True)
        updates.append(_settle(stacked, assignment, matrix_of_run, beta, config.tol, config.max_iter))
        temperature *= config.cooling
    return (assignment.reshape(len(similarities), len(seeds), n_items, n_clusters),
            np.reshape(updates, (len(updates), len(similarities), len(seeds))))


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
        halves = _anneal([similarity[np.ix_(members, members)]], 2, config, [config.seed])[0][0, 0].argmax(axis=1)
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
    return iclust_many([similarity], n_clusters, config)[0]


def iclust_many(similarities: list[np.ndarray], n_clusters: int,
                config: IclustConfig = IclustConfig()) -> list[np.ndarray]:
    """`iclust` of each of several [N, N] similarity matrices of the same N items (one article's
    sentences by several methods), with the same labels as one call each, in a fraction of the time:
    all their restarts anneal together."""
    return iclust_with_updates(similarities, n_clusters, config)[0]


def iclust_with_updates(similarities: list[np.ndarray], n_clusters: int,
                        config: IclustConfig = IclustConfig()) -> tuple[list[np.ndarray], np.ndarray]:
    """`iclust_many`'s labels, and how many self-consistent updates each annealing run made at each
    temperature [T, M, R] (R = config.n_init; none when n_clusters is 1): the measure of its work,
    one [N, N] x [N, k] product per update (eval.benchmark). A bisection's updates are not counted."""
    similarities = [np.asarray(similarity, dtype=np.float64) for similarity in similarities]
    for similarity in similarities:
        if similarity.ndim != 2 or similarity.shape[0] != similarity.shape[1]:
            raise ValueError(f"iclust needs a square similarity matrix, got shape {similarity.shape}")
        if similarity.shape != similarities[0].shape:
            raise ValueError(f"iclust_many needs matrices of one shape, got {similarity.shape} "
                             f"and {similarities[0].shape}")
    n_items = similarities[0].shape[0]
    if not 1 <= n_clusters <= n_items:
        raise ValueError(f"iclust needs 1 <= n_clusters <= number of items ({n_items}), got {n_clusters}")
    if n_clusters == 1:
        return ([np.zeros(n_items, dtype=np.int64) for _ in similarities],
                np.zeros((0, len(similarities), config.n_init), dtype=np.int64))
    seeds = [config.seed + restart for restart in range(config.n_init)]
    labelled = []
    # One BLAS thread: on these small matrices threads cost more than they give (and Beam runs
    # several articles side by side).
    with threadpool_limits(limits=1, user_api="blas"):
        annealed, updates = _anneal(similarities, n_clusters, config, seeds)
        for similarity, runs in zip(similarities, annealed):
            best_labels, best_objective = None, -np.inf
            for seed, assignment in zip(seeds, runs):   # the restart with the best objective wins
                labels = _refine_hard(similarity, assignment.argmax(axis=1), n_clusters, replace(config, seed=seed))
                objective = hard_objective(similarity, labels, n_clusters)
                if objective > best_objective:
                    best_labels, best_objective = labels, objective
            assert best_labels is not None, "no restart's objective was finite"
            labelled.append(np.unique(best_labels, return_inverse=True)[1].astype(np.int64))
    return labelled, updates


def hard_objective(similarity: np.ndarray, labels: np.ndarray, n_clusters: int) -> float:
    """<s> = sum_c P(c) s(c) of a hard clustering: Iclust's objective at T -> 0."""
    p_cluster, _, within_cluster = _cluster_similarities(np.asarray(similarity, dtype=np.float64),
                                                         np.eye(n_clusters)[labels])
    return float(p_cluster @ within_cluster)
