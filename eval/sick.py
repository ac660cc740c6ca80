"""SICK relatedness (SemEval-2014 Task 1) in the setup of Tai et al. 2015 / Kiros et al. 2015 (Table 5).

    python -m eval.sick --sick SICK.txt --output EVAL [--encoder SPEC ...] [--model-dir DIR ...]

Each pair (u, v) becomes the features [|u - v|, u * v]. A multinomial logistic regression predicts
the distribution of the relatedness score over the classes 1..5; the target of a score y is
Tai et al.'s sparse distribution (mass y - floor(y) on floor(y) + 1, the rest on floor(y)). Soft
targets are fitted exactly through sample weights: every pair appears once per class with that
class's target probability as its weight, which makes the weighted log-loss the cross-entropy with
the target distribution. Trained on TRAIN, the regularisation C chosen by Pearson r on TRIAL, and
the expected score sum_k k * p(k) on TEST gives Pearson r, Spearman rho and MSE.
Each encoder encodes all unique SICK sentences in one call (so TF-IDF's IDF is fitted on SICK).
"""
from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass

import numpy as np
from apache_beam.io.filesystems import FileSystems
from scipy.stats import pearsonr, spearmanr
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from tqdm import tqdm

from model.encoders import Methods, load_encoders
from eval.report import write_sick_report
from pipeline.cli import UsageError, flag, parse_config, run_cli

CLASSES = np.arange(1, 6)
SICK_SPLITS = ("TRAIN", "TRIAL", "TEST")
REQUIRED_COLUMNS = ("sentence_A", "sentence_B", "relatedness_score", "SemEval_set")
DEFAULT_C_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0)


class SickInputError(UsageError):
    """The SICK file is missing or not the tab-separated SICK format."""


@dataclass(frozen=True)
class SickConfig:
    """Flags of `python -m eval.sick` (and of eval.all's SICK step)."""

    sick: str = flag(help="SICK.txt (tab-separated, with SemEval_set); local or gs://")
    output: str = flag(help="where the results go; local or gs://")
    methods: Methods = Methods()
    c_grid: tuple[float, ...] = flag(DEFAULT_C_GRID, help="inverse regularisation strengths tried, chosen on TRIAL")


def read_sick(path: str) -> dict[str, dict[str, list]]:
    """{split: {"a": [...], "b": [...], "score": [...]}} for TRAIN, TRIAL and TEST.

    A row whose score is not a number in [1, 5] or whose split is unknown is an error naming the
    line: the file is a fixed, published data set, so a bad row means a wrong or damaged file.
    """
    if not FileSystems.match([path])[0].metadata_list:
        raise SickInputError(f"SICK file not found: {path}")
    with FileSystems.open(path) as handle:
        text = handle.read().decode("utf-8")
    reader = csv.DictReader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
    missing = [column for column in REQUIRED_COLUMNS if column not in (reader.fieldnames or [])]
    if missing:
        raise SickInputError(f"{path}: missing columns {missing}; is it the tab-separated SICK.txt?")
    splits = {split: {"a": [], "b": [], "score": []} for split in SICK_SPLITS}
    for line_number, row in enumerate(reader, start=2):
        split = row["SemEval_set"]
        try:
            score = float(row["relatedness_score"])
        except (TypeError, ValueError):
            score = float("nan")
        if split not in splits or not 1.0 <= score <= 5.0:
            raise SickInputError(f"{path}:{line_number}: expected SemEval_set in {SICK_SPLITS} and a score in "
                                 f"[1, 5], got {split!r} and {row['relatedness_score']!r}")
        splits[split]["a"].append(row["sentence_A"])
        splits[split]["b"].append(row["sentence_B"])
        splits[split]["score"].append(score)
    empty = [split for split in SICK_SPLITS if not splits[split]["score"]]
    if empty:
        raise SickInputError(f"{path}: no pairs for {empty}")
    return splits


def score_distribution(scores) -> np.ndarray:
    """Tai et al.'s target: [n, 5] distributions over 1..5 whose expectation is the score."""
    scores = np.asarray(scores, dtype=np.float64)
    floor = np.clip(np.floor(scores), 1, 4).astype(int)
    upper = scores - floor
    target = np.zeros((len(scores), len(CLASSES)))
    target[np.arange(len(scores)), floor - 1] = 1.0 - upper
    target[np.arange(len(scores)), floor] = upper
    return target


def pair_features(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """[|u - v|, u * v]."""
    return np.hstack([np.abs(left - right), left * right]).astype(np.float32)


def soft_logistic_path(features: np.ndarray, target: np.ndarray, c_grid):
    """Multinomial logistic regressions fitted to soft targets (per-class sample weights), one per
    C of `c_grid` in ascending order, each started from the previous solution (warm start: the
    same optima; on the demo it did not shorten the SICK job, whose time goes elsewhere). Yields
    (C, model); the model is reused, so use it before the next one is yielded.

    Features are standardised first (dense, centred: lbfgs converges in ~10x fewer steps than on
    uncentred features)."""
    n_pairs, n_classes = target.shape
    stacked = np.vstack([features] * n_classes)
    labels = np.repeat(CLASSES, n_pairs)
    weights = target.T.reshape(-1)
    keep = weights > 0
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000, warm_start=True))
    for c in sorted(c_grid):
        model.set_params(logisticregression__C=c)
        model.fit(stacked[keep], labels[keep], logisticregression__sample_weight=weights[keep])
        yield c, model


def expected_score(model, features: np.ndarray) -> np.ndarray:
    probabilities = model.predict_proba(features)
    return probabilities @ model.classes_.astype(np.float64)


def relatedness_metrics(predicted, gold) -> dict[str, float]:
    predicted, gold = np.asarray(predicted), np.asarray(gold)
    return {"pearson": float(pearsonr(predicted, gold)[0]), "spearman": float(spearmanr(predicted, gold)[0]),
            "mse": float(np.mean((predicted - gold) ** 2))}


def score_encoder(encoder, splits: dict, c_grid) -> dict:
    """TRAIN fit per C, C chosen on TRIAL Pearson r, metrics on TEST."""
    unique = list(dict.fromkeys(s for split in SICK_SPLITS for key in ("a", "b") for s in splits[split][key]))
    row_of = {sentence: row for row, sentence in enumerate(unique)}
    embeddings = encoder.encode(unique)

    def features(split):
        left = embeddings[[row_of[s] for s in splits[split]["a"]]]
        right = embeddings[[row_of[s] for s in splits[split]["b"]]]
        return pair_features(left, right)

    train, trial, test = (features(split) for split in SICK_SPLITS)
    target = score_distribution(splits["TRAIN"]["score"])
    best = None
    for c, model in soft_logistic_path(train, target, c_grid):
        trial_r = relatedness_metrics(expected_score(model, trial), splits["TRIAL"]["score"])["pearson"]
        if best is None or trial_r > best[0]:
            best = (trial_r, c, expected_score(model, test))
    trial_r, c, test_scores = best
    return {"method": encoder.name, "C": c, "trial_pearson": trial_r,
            **relatedness_metrics(test_scores, splits["TEST"]["score"])}


def run(config: SickConfig) -> dict:
    splits = read_sick(config.sick)
    encoders = load_encoders(config.methods.specs())
    methods = [score_encoder(encoder, splits, config.c_grid)
               for encoder in tqdm(encoders, desc="SICK relatedness", unit="method")]
    result = {"sick": config.sick, "pairs": {split: len(splits[split]["score"]) for split in SICK_SPLITS},
              "c_grid": list(config.c_grid), "methods": methods}
    write_sick_report(result, config.output)
    return result


def parse_args(argv: list[str] | None) -> SickConfig:
    return parse_config(SickConfig, argv, "python -m eval.sick", __doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> dict:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(run_cli(main))
