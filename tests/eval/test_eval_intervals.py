"""Paired bootstrap intervals of the differences the reports claim."""
import numpy as np

from eval.intervals import comparisons, interval_text, paired_difference


def test_a_real_difference_is_significant_and_noise_is_not():
    rng = np.random.default_rng(0)
    better = rng.random(4000) < 0.72
    worse = np.where(rng.random(4000) < 0.9, better, ~better) & (rng.random(4000) < 0.93)   # paired, lower
    row = paired_difference(better, worse)
    assert row["significant"] and row["low"] < row["difference"] < row["high"] and row["low"] > 0
    assert abs(row["difference"] - (better.mean() - worse.mean())) < 1e-12 and row["n"] == 4000
    coin = rng.random(4000) < 0.5
    noise = paired_difference(coin, rng.permutation(coin))                 # the same accuracy, shuffled
    assert noise["low"] < 0 < noise["high"] and not noise["significant"]


def test_pairing_narrows_the_interval_of_correlated_scores():
    rng = np.random.default_rng(1)
    per_article = rng.normal(0.15, 0.1, 60)                               # articles differ a lot
    row = paired_difference(per_article + 0.02 + rng.normal(0, 0.005, 60), per_article)
    assert row["significant"] and row["high"] - row["low"] < 0.01         # unpaired, it would span ~0.07


def test_every_method_is_compared_with_each_reference_present():
    scores = {"mean-vectors": np.array([1, 0, 1, 0]), "minilm-keras": np.array([1, 1, 0, 0]),
              "minilm-sen": np.array([1, 1, 1, 0])}
    rows = comparisons(scores)
    assert [(row["method"], row["reference"]) for row in rows] == [
        ("minilm-keras", "mean-vectors"), ("minilm-sen", "mean-vectors"),
        ("mean-vectors", "minilm-keras"), ("minilm-sen", "minilm-keras")]
    assert rows[1]["difference"] == 0.25 and interval_text(rows[1]).startswith("+0.250 [")
