"""SICK relatedness (SemEval-2014 Task 1) in the setup of Tai et al. 2015 / Kiros et al. 2015 (Table 5).

    python -m eval.sick --sick SICK.txt --output EVAL [--encoder SPEC ...] [--model-dir DIR ...]

Each pair (u, v) becomes the features [|u - v|, u * v]. A multinomial logistic regression predicts
the distribution of the relatedness score over the classes 1..5; the target of a score y is
Tai et al.'s sparse distribution (mass y - floor(y) on floor(y) + 1, the rest on floor(y)), fitted
as the cross-entropy with that distribution (`soft_logistic_path`: scikit-learn's objective with
scipy's L-BFGS-B, because scikit-learn's classifier takes hard labels only). Trained on TRAIN,
the regularisation C chosen by Pearson r on TRIAL (the grid walked up from the smallest C until
TRIAL r falls), and the expected score sum_k k * p(k) on TEST gives Pearson r, Spearman rho and
MSE.
Each encoder encodes all unique SICK sentences in one call (so TF-IDF's IDF is fitted on SICK).
"""
from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass

import numpy as np

from core.cli import UsageError, parse_config, run_cli
from core.folders import claim_folder
from core.progress import progress_bar
from eval.config import SickConfig
from eval.evaluator import EvalResult, Figure, Inputs
from eval.report import REPORT_WRITES, sick_figure, sick_markdown, write_result
from model.encoding.encoders import load_encoders

NAME = "sick"
CLASSES = np.arange(1, 6)
SICK_SPLITS = ("TRAIN", "TRIAL", "TEST")
REQUIRED_COLUMNS = ("sentence_A", "sentence_B", "relatedness_score", "SemEval_set")


class SickInputError(UsageError):
    """The SICK file is missing or not the tab-separated SICK format."""


def read_sick(path: str) -> dict[str, dict[str, list]]:
    """{split: {"a": [...], "b": [...], "score": [...]}} for TRAIN, TRIAL and TEST.

    A row whose score is not a number in [1, 5] or whose split is unknown is an error naming the
    line: the file is a fixed, published data set, so a bad row means a wrong or damaged file.
    """
    from apache_beam.io.filesystems import FileSystems

    if not FileSystems.match([path])[0].metadata_list:
        raise SickInputError(f"SICK file not found: {path}")
    with FileSystems.open(path) as handle:
        text = handle.read().decode("utf-8")
    reader = csv.DictReader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
    missing = [column for column in REQUIRED_COLUMNS if column not in (reader.fieldnames or [])]
    if missing:
        raise SickInputError(f"{path}: missing columns {missing}; is it the tab-separated SICK.txt?")
    splits: dict[str, dict[str, list]] = {split: {"a": [], "b": [], "score": []} for split in SICK_SPLITS}
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


@dataclass(frozen=True)
class SoftmaxRegression:
    """A fitted multinomial logistic regression over standardised pair features."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray  # [classes, features]
    bias: np.ndarray  # [classes]

    def predict_proba(self, features: np.ndarray) -> np.ndarray:
        from scipy.special import softmax

        return softmax(self.logits(features), axis=1)

    def logits(self, features: np.ndarray) -> np.ndarray:
        return ((features - self.mean) / self.scale) @ self.weights.T + self.bias


def soft_logistic_path(features: np.ndarray, target: np.ndarray, c_grid):
    """Multinomial logistic regressions fitted to soft targets, one per C of `c_grid` in ascending
    order, each started from the previous solution (warm start: the same optima, fewer steps).
    Yields (C, SoftmaxRegression).

    The objective is scikit-learn's `LogisticRegression(C)` with lbfgs (mean cross-entropy plus
    ||W||^2 / (2 C n), intercept not penalised, L-BFGS-B with its tolerances), but with the target
    *distribution* in the cross-entropy: scikit-learn takes only hard labels, and fitting soft
    targets through per-class sample weights stacked every pair twice and spent most of the time
    in a slow orientation of OpenBLAS' product (K x n) @ (n x d). Features are standardised
    first (lbfgs converges in ~10x fewer steps than on uncentred features). The two products with
    the [n, d] feature matrix, nearly all of the time, run in float32 (the loss, gradient and
    optimiser stay float64; the chosen C and the metrics agree to 4 decimals); a feature constant
    on TRAIN (a TF-IDF word absent from it) is left out of the fit, its weight 0 as at the
    optimum."""
    from scipy.optimize import minimize  # scipy: after the flags parse
    from scipy.special import logsumexp
    from threadpoolctl import threadpool_limits

    features = np.asarray(features, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    n_pairs = features.shape[0]
    n_classes = target.shape[1]
    mean = features.mean(axis=0)
    scale = features.std(axis=0)
    varying = scale > 0
    scale[~varying] = 1.0  # a constant feature stays 0, as StandardScaler leaves it
    standardised = ((features[:, varying] - mean[varying]) / scale[varying]).astype(np.float32)
    n_fitted = standardised.shape[1]
    parameters = np.zeros(n_classes * (n_fitted + 1))

    def unpack(theta):
        return theta[: n_classes * n_fitted].reshape(n_classes, n_fitted), theta[n_classes * n_fitted:]

    def loss_and_gradient(theta, l2_strength):
        weights, bias = unpack(theta)
        logits = standardised @ weights.T.astype(np.float32) + bias
        log_normaliser = logsumexp(logits, axis=1, keepdims=True)
        loss = -np.sum(target * (logits - log_normaliser)) / n_pairs + 0.5 * l2_strength * np.sum(weights**2)
        residual = (np.exp(logits - log_normaliser) - target) / n_pairs
        weights_gradient = (standardised.T @ residual.astype(np.float32)).T + l2_strength * weights
        return loss, np.concatenate([weights_gradient.ravel(), residual.sum(axis=0)])

    for c in sorted(c_grid):
        # One BLAS thread: products with 5 columns and L-BFGS's vector updates are too small for
        # threads, whose hand-offs made the fit 2.5x slower on 2 cores.
        with threadpool_limits(limits=1, user_api="blas"):
            result = minimize(loss_and_gradient, parameters, args=(1.0 / (c * n_pairs),), method="L-BFGS-B",
                              jac=True, options={"maxiter": 1000, "maxls": 50, "gtol": 1e-4,
                                                 "ftol": 64 * np.finfo(float).eps})
        parameters = result.x
        fitted_weights, bias = unpack(parameters)
        weights = np.zeros((n_classes, len(mean)))
        weights[:, varying] = fitted_weights
        yield c, SoftmaxRegression(mean, scale, weights, bias.copy())


def expected_score(model: SoftmaxRegression, features: np.ndarray) -> np.ndarray:
    return model.predict_proba(features) @ CLASSES.astype(np.float64)


def relatedness_metrics(predicted, gold) -> dict[str, float]:
    """Pearson r (with its 95 % Fisher-z interval), Spearman rho and MSE against the gold scores."""
    from scipy.stats import pearsonr, spearmanr

    predicted, gold = np.asarray(predicted), np.asarray(gold)
    pearson = pearsonr(predicted, gold)
    interval = pearson.confidence_interval(0.95)
    return {"pearson": float(pearson.statistic), "pearson_low": float(interval.low),
            "pearson_high": float(interval.high), "spearman": float(spearmanr(predicted, gold)[0]),
            "mse": float(np.mean((predicted - gold) ** 2))}


def score_encoder(encoder, splits: dict, c_grid, full_c_grid: bool = False) -> dict:
    """TRAIN fit per C, C chosen on TRIAL Pearson r, metrics on TEST.

    TRIAL r rises with C to one peak and falls after it (on every method measured), and a fit
    takes longer the larger C is, so the path stops at the first fall unless `full_c_grid`."""
    unique = sick_sentences(splits)
    row_of = {sentence: row for row, sentence in enumerate(unique)}
    embeddings = encoder.encode(unique)
    if hasattr(embeddings, "toarray"):   # TF-IDF's sparse rows: SICK's vocabulary is small enough to be dense
        embeddings = embeddings.toarray()

    def features(split):
        left = embeddings[[row_of[s] for s in splits[split]["a"]]]
        right = embeddings[[row_of[s] for s in splits[split]["b"]]]
        return pair_features(left, right)

    train, trial, test = (features(split) for split in SICK_SPLITS)
    target = score_distribution(splits["TRAIN"]["score"])
    best: tuple[float, float, np.ndarray] | None = None   # (TRIAL r, C, TEST scores)
    for c, model in soft_logistic_path(train, target, c_grid):
        trial_r = relatedness_metrics(expected_score(model, trial), splits["TRIAL"]["score"])["pearson"]
        if best is None or trial_r > best[0]:
            best = (trial_r, c, expected_score(model, test))
        elif not full_c_grid:
            break
    if best is None:
        raise ValueError("no C to fit: the C grid is empty")
    trial_r, c, test_scores = best
    return {"method": encoder.name, "C": c, "trial_pearson": trial_r,
            **relatedness_metrics(test_scores, splits["TEST"]["score"])}


def sick_sentences(splits: dict) -> list[str]:
    """Every sentence of every split once, in order of first appearance."""
    return list(dict.fromkeys(s for split in SICK_SPLITS for key in ("a", "b") for s in splits[split][key]))


def run(config: SickConfig, inputs: Inputs) -> EvalResult:
    """Scores every method (`inputs.specs`: eval.all's cached embeddings; default: the config's
    encoders): the result, its table and its plot."""
    splits = read_sick(config.sick)
    encoders = load_encoders(config.methods.specs() if inputs.specs is None else inputs.specs)
    methods = [score_encoder(encoder, splits, config.c_grid, config.full_c_grid)
               for encoder in progress_bar(encoders, desc="SICK relatedness", unit="method")]
    result = {"sick": config.sick, "pairs": {split: len(splits[split]["score"]) for split in SICK_SPLITS},
              "c_grid": list(config.c_grid), "methods": methods}
    markdown = sick_markdown(result)
    return EvalResult(NAME, result, markdown, (Figure("sick_pearson.png", "SICK Pearson r", sick_figure(result)),),
                      markdown)


def parse_args(argv: list[str] | None) -> SickConfig:
    return parse_config(SickConfig, argv, "python -m eval.sick", __doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> dict:
    config = parse_args(argv)
    claim_folder(config.output, "eval", REPORT_WRITES, "--output", None)
    evaluation = run(config, Inputs())
    write_result(evaluation, config.output)

    print(evaluation.markdown)
    print(f"SICK results in {config.output}")
    return evaluation.result


if __name__ == "__main__":
    sys.exit(run_cli(main))
