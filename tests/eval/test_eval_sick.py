"""SICK relatedness (Tai et al. setup) on a small SICK-format fixture written here."""
import csv

import numpy as np
import pytest
from eval_fixtures import THEMES

from eval import sick

COLUMNS = ["pair_ID", "sentence_A", "sentence_B", "entailment_label", "relatedness_score", "SemEval_set"]


def write_sick_fixture(path, rows_per_split=(("TRAIN", 48), ("TRIAL", 16), ("TEST", 24))):
    """Same-theme pairs are related (4-5), cross-theme pairs unrelated (1-2), like SICK's scale."""
    rng = np.random.default_rng(0)
    themes = sorted(THEMES)
    rows, pair_id = [], 0
    for split, count in rows_per_split:
        for index in range(count):
            first = themes[rng.integers(len(themes))]
            related = index % 2 == 0
            second = first if related else themes[(themes.index(first) + 1 + rng.integers(3)) % len(themes)]
            a, b = rng.choice(len(THEMES[first]), 2, replace=False)
            score = rng.uniform(4.0, 5.0) if related else rng.uniform(1.0, 2.0)
            pair_id += 1
            rows.append([pair_id, THEMES[first][a], THEMES[second][b], "NEUTRAL", f"{score:.1f}", split])
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    return path


def test_score_distribution_matches_tai_et_al():
    target = sick.score_distribution([3.6, 1.0, 5.0, 4.0])
    np.testing.assert_allclose(target[0], [0, 0, 0.4, 0.6, 0])
    np.testing.assert_allclose(target[1], [1, 0, 0, 0, 0])
    np.testing.assert_allclose(target[2], [0, 0, 0, 0, 1])
    np.testing.assert_allclose(target[3], [0, 0, 0, 1, 0])
    np.testing.assert_allclose(target @ sick.CLASSES, [3.6, 1.0, 5.0, 4.0])


def test_relatedness_metrics_by_hand():
    metrics = sick.relatedness_metrics([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    assert metrics["pearson"] == pytest.approx(1.0)
    assert metrics["spearman"] == pytest.approx(1.0)
    assert metrics["mse"] == pytest.approx((1 + 4 + 9) / 3)


def test_soft_logistic_regression_learns_the_expected_score():
    rng = np.random.default_rng(0)
    scores = rng.uniform(1, 5, 300)
    features = np.column_stack([scores + rng.normal(0, 0.1, 300), rng.normal(size=300)])
    [(c, model)] = sick.soft_logistic_path(features, sick.score_distribution(scores), [10.0])
    predicted = sick.expected_score(model, features)
    assert c == 10.0 and sick.relatedness_metrics(predicted, scores)["pearson"] > 0.95


def test_the_warm_started_path_finds_the_same_optima_as_separate_fits():
    """Warm starts change where lbfgs begins, not the (convex) optimum it reaches."""
    rng = np.random.default_rng(1)
    scores = rng.uniform(1, 5, 400)
    features = np.column_stack([scores + rng.normal(0, 0.8, 400), rng.normal(size=(400, 6))])
    target = sick.score_distribution(scores)
    path = {c: sick.expected_score(model, features)
            for c, model in sick.soft_logistic_path(features, target, [1e-2, 1e-1, 1.0, 10.0])}
    for c, warm in path.items():
        [(_, alone)] = sick.soft_logistic_path(features, target, [c])
        np.testing.assert_allclose(warm, sick.expected_score(alone, features), atol=2e-3)


def test_the_soft_target_fit_is_scikit_learns_weighted_fit():
    """The direct cross-entropy with the target distribution has the optimum of scikit-learn's
    LogisticRegression fitted on every (pair, class) row weighted by its target probability."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(2)
    scores = rng.uniform(1, 5, 300)
    features = np.column_stack([scores + rng.normal(0, 0.8, 300), rng.normal(size=(300, 4))])
    target = sick.score_distribution(scores)
    [(_, model)] = sick.soft_logistic_path(features, target, [0.5])
    standardised = (features - model.mean) / model.scale
    rows, classes = np.nonzero(target)
    reference = LogisticRegression(C=0.5, max_iter=1000, tol=1e-8).fit(
        standardised[rows], sick.CLASSES[classes], sample_weight=target[rows, classes])
    np.testing.assert_allclose(model.predict_proba(features), reference.predict_proba(standardised), atol=1e-3)


class FixedVectors:
    """An encoder with given vectors (the SICK job needs only `encode` and `name`)."""

    name = "fixed"

    def __init__(self, vectors):
        self.vectors = vectors

    def encode(self, sentences):
        return self.vectors[: len(sentences)]


def test_the_c_path_stops_where_trial_r_falls_and_chooses_what_the_full_grid_chooses(tmp_path, monkeypatch):
    splits = sick.read_sick(str(write_sick_fixture(tmp_path / "SICK.txt")))
    n_sentences = len({s for split in sick.SICK_SPLITS for key in ("a", "b") for s in splits[split][key]})
    vectors = np.random.default_rng(3).normal(size=(n_sentences, 8))
    grid = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
    fitted = []
    path = sick.soft_logistic_path

    def counting_path(features, target, c_grid):
        for c, model in path(features, target, c_grid):
            fitted.append(c)
            yield c, model

    monkeypatch.setattr(sick, "soft_logistic_path", counting_path)
    stopped = sick.score_encoder(FixedVectors(vectors), splits, grid)
    n_stopped = len(fitted)
    full = sick.score_encoder(FixedVectors(vectors), splits, grid, full_c_grid=True)
    assert len(fitted) - n_stopped == len(grid) and n_stopped < len(grid)
    assert stopped == full


def test_sick_job_on_a_fixture(tmp_path):
    path = write_sick_fixture(tmp_path / "SICK.txt")
    result = sick.main(["--sick", str(path), "--output", str(tmp_path / "out"),
                        "--encoder", "mean-vectors", "--encoder", "tfidf", "--c-grid", "0.1,1"])
    assert result["pairs"] == {"TRAIN": 48, "TRIAL": 16, "TEST": 24}
    methods = {entry["method"]: entry for entry in result["methods"]}
    assert set(methods) == {"mean-vectors", "tfidf"}
    assert methods["mean-vectors"]["C"] in (0.1, 1.0)
    assert methods["mean-vectors"]["pearson"] > 0.5  # related pairs are same-theme sentences
    for name in ("sick.json", "sick.md", "sick_pearson.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    # What sick_pearson.png draws: a bar per method at its Pearson r, its 95 % interval as error bar.
    from matplotlib.container import BarContainer

    from eval.report import sick_figure

    (axis,) = sick_figure(result).axes
    (bars,) = [container for container in axis.containers if isinstance(container, BarContainer)]
    assert [label.get_text() for label in axis.get_xticklabels()] == ["mean-vectors", "tfidf"]
    assert [bar.get_height() for bar in bars] == pytest.approx([entry["pearson"] for entry in result["methods"]])
    assert [bound for (_, low), (_, high) in bars.errorbar.lines[2][0].get_segments() for bound in (low, high)] == (
        pytest.approx([entry[bound] for entry in result["methods"] for bound in ("pearson_low", "pearson_high")]))
    assert axis.get_ylabel() == "Pearson r on TEST" and "(n = 24 TEST pairs;" in axis.get_title()


def test_sick_input_errors_name_the_problem(tmp_path):
    with pytest.raises(sick.SickInputError, match="not found"):
        sick.read_sick(str(tmp_path / "missing.txt"))
    (tmp_path / "wrong.txt").write_text("a\tb\n1\t2\n")
    with pytest.raises(sick.SickInputError, match="missing columns"):
        sick.read_sick(str(tmp_path / "wrong.txt"))
    bad = tmp_path / "bad.txt"
    write_sick_fixture(bad)
    lines = bad.read_text().splitlines()
    lines[3] = lines[3].replace("\tTRAIN", "\tDEV")
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(sick.SickInputError, match=r"bad.txt:4"):
        sick.read_sick(str(bad))
