"""95 % intervals for every number the reports give (scipy.stats).

A method's own score: its triplet accuracy, a proportion of n triplets, gets the Wilson score
interval (`proportion_interval`); a mean over SCB articles (ARI) a percentile bootstrap over the
articles (`mean_interval`); SICK's Pearson r the Fisher-z interval (eval.sick).

Differences between methods: two methods are scored on the same items (the same triplets, the
same SCB articles), so their difference is bootstrapped *paired*: each resample draws items, not
methods, and the interval is that of the mean per-item difference. Percentile intervals: BCa's
jackknife over 100 k triplets would cost more than the evaluation. A difference is significant
when its interval excludes 0.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

# The methods every other one is compared with, where present: the paper's baseline and the
# off-the-shelf sentence encoder a user would pick instead (its Keras export or its PyTorch one).
REFERENCE_METHODS = ("mean-vectors", "minilm-keras", "minilm")
RESAMPLES = 2000


def proportion_interval(successes: np.ndarray, confidence: float = 0.95) -> dict:
    """The share of true values among n with its Wilson score interval."""
    from scipy import stats  # scipy: loaded by the jobs after their flags parse

    successes = np.asarray(successes, bool)
    interval = stats.binomtest(int(successes.sum()), len(successes)).proportion_ci(confidence, method="wilson")
    return {"mean": float(successes.mean()), "low": float(interval.low), "high": float(interval.high),
            "n": int(len(successes))}


def mean_interval(values: npt.ArrayLike, seed: int = 0, confidence: float = 0.95) -> dict:
    """The mean of per-item values with its percentile bootstrap interval over the items."""
    from scipy import stats

    values = np.asarray(values, np.float64)
    mean = float(np.mean(values))
    if len(values) < 2 or np.all(values == mean):   # no spread to resample
        low = high = mean
    else:
        interval = stats.bootstrap((values,), np.mean, vectorized=True, n_resamples=RESAMPLES,
                                   confidence_level=confidence, method="percentile", batch=100,
                                   random_state=np.random.default_rng(seed)).confidence_interval
        low, high = float(interval.low), float(interval.high)
    return {"mean": mean, "low": low, "high": high, "n": int(len(values))}


def paired_difference(left: np.ndarray, right: np.ndarray, seed: int = 0, confidence: float = 0.95) -> dict:
    """Mean of `left - right` over paired items with its bootstrap interval."""
    from scipy import stats

    left, right = np.asarray(left, np.float64), np.asarray(right, np.float64)
    difference = float(np.mean(left - right))
    if len(left) < 2 or np.all(left - right == difference):   # no spread to resample
        low = high = difference
    else:
        interval = stats.bootstrap((left, right), lambda a, b, axis: np.mean(a - b, axis=axis), paired=True,
                                   vectorized=True, n_resamples=RESAMPLES, confidence_level=confidence,
                                   method="percentile", batch=100, random_state=np.random.default_rng(seed))
        low, high = float(interval.confidence_interval.low), float(interval.confidence_interval.high)
    return {"difference": difference, "low": low, "high": high, "n": int(len(left)),
            "significant": bool(low > 0 or high < 0)}


def comparisons(scores: dict[str, np.ndarray], seed: int = 0) -> list[dict]:
    """Every method against each reference method present (`REFERENCE_METHODS`): `scores` maps a
    method to its per-item scores, all on the same items in the same order."""
    rows = []
    for reference in (name for name in REFERENCE_METHODS if name in scores):
        for method, values in scores.items():
            if method != reference:
                rows.append({"method": method, "reference": reference,
                             **paired_difference(values, scores[reference], seed)})
    return rows


def value_text(row: dict) -> str:
    """'0.702 [0.699, 0.705]': a method's own score with its 95 % interval."""
    return f"{row['mean']:.3f} [{row['low']:.3f}, {row['high']:.3f}]"


def interval_text(row: dict) -> str:
    """'+0.041 [+0.035, +0.047] *': the difference, its 95 % interval, * when significant."""
    return f"{row['difference']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}]{' *' if row['significant'] else ''}"
