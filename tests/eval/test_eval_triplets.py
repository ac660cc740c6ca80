"""Triplet accuracy (Table 3) with cosine and L1 for baselines and a tiny trained encoder."""
import json

import numpy as np
import pytest
from model_shards import write_triplet_shards

from core import records
from eval import triplets, triplets_job

ANCHOR = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
POSITIVE = np.array([[2.0, 0.0], [0.0, 1.0], [0.0, 3.0], [1.0, 1.0]])
NEGATIVE = np.array([[0.0, 1.0], [3.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
# cosine: 1>0 yes; 0>1 no; 1>0.71 yes; 1>1 tie -> no        => 2/4
# L1:     1<2 yes; 2<2 tie -> no; 2<1 no; 0<2 yes           => 2/4, but on different triplets


def test_triplet_accuracies_by_hand():
    correct = triplets_job.triplet_correct(ANCHOR, POSITIVE, NEGATIVE)
    assert list(correct) == ["cosine", "l1"]                       # the reports' column order
    assert correct["cosine"].tolist() == [True, False, True, False]
    assert correct["l1"].tolist() == [True, False, False, True]
    result = triplets_job.triplet_accuracies(correct)
    assert [key for key in result] == ["accuracy_cosine", "accuracy_l1", "interval_cosine", "interval_l1"]
    assert (result["accuracy_cosine"], result["accuracy_l1"]) == (0.5, 0.5)
    result = triplets_job.triplet_accuracies(triplets_job.triplet_correct(ANCHOR[:3], POSITIVE[:3], NEGATIVE[:3]))
    assert result["accuracy_cosine"] == pytest.approx(2 / 3) and result["accuracy_l1"] == pytest.approx(1 / 3)
    assert result["interval_cosine"]["low"] < 2 / 3 < result["interval_cosine"]["high"]


def test_sparse_rows_score_as_dense_ones():
    from scipy import sparse

    dense = triplets_job.triplet_correct(ANCHOR, POSITIVE, NEGATIVE)
    kept_sparse = triplets_job.triplet_correct(*map(sparse.csr_matrix, (ANCHOR, POSITIVE, NEGATIVE)))
    assert {key: value.tolist() for key, value in kept_sparse.items()} == {
        key: value.tolist() for key, value in dense.items()}


class _HandMadeEncoder:
    """Each sentence's row of the hand-made vectors above, by its text."""

    name = "by-hand"
    vectors = {f"{role}{row}": vector for role, rows in (("a", ANCHOR), ("p", POSITIVE), ("n", NEGATIVE))
               for row, vector in enumerate(rows)}

    def encode(self, sentences):
        return np.array([self.vectors[sentence] for sentence in sentences])


def test_score_encoder_scores_by_the_tested_accuracies():
    """The production path (encode each distinct sentence once, then score) on the hand-made triplets."""
    roles = {role: [f"{letter}{row}" for row in range(4)] for role, letter in zip(records.ROLES, "apn")}
    accuracies, correct = triplets_job.score_encoder(_HandMadeEncoder(), roles)
    assert accuracies == {"method": "by-hand", **triplets_job.triplet_accuracies(
        triplets_job.triplet_correct(ANCHOR, POSITIVE, NEGATIVE))}
    assert (accuracies["accuracy_cosine"], accuracies["accuracy_l1"]) == (0.5, 0.5)
    assert correct["l1"].tolist() == [True, False, False, True]


@pytest.fixture(scope="module")
def topic_shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("shards")))


@pytest.fixture(scope="module")
def tiny_models(topic_shards, tmp_path_factory):
    """A tiny trained encoder (3 steps), given as both of the paper's models so the sen-titles
    concatenation is exercised too (one training keeps the test short)."""
    from model.config import TrainConfig
    from model.train import train

    model_dir = str(tmp_path_factory.mktemp("models") / "tiny")
    train(TrainConfig.from_flags(data=topic_shards, model_dir=model_dir, epochs=1, steps=3, batch_size=8,
                                 lstm_units=8, attention_size=4, patience=1, progress=False, vocabulary="train"))
    return [f"triplets-sen={model_dir}", f"triplets-titles={model_dir}"]


@pytest.mark.slow   # trains two tiny encoders
def test_triplets_job_scores_baselines_and_trained_encoders(topic_shards, tiny_models, tmp_path):
    result = triplets.main(["--data", topic_shards, "--output", str(tmp_path), "--encoder", "mean-vectors",
                            "--encoder", "tfidf", *sum((["--model-dir", d] for d in tiny_models), [])])
    assert result["triplets"] == 64
    methods = {entry["method"]: entry for entry in result["methods"]}
    assert list(methods) == ["mean-vectors", "tfidf", "triplets-sen", "triplets-titles", "triplets-sen-titles"]
    for entry in methods.values():
        assert 0.0 <= entry["accuracy_cosine"] <= 1.0 and 0.0 <= entry["accuracy_l1"] <= 1.0
    # Anchor and positive share a topic's words, the negative does not: the baselines must see it.
    assert methods["mean-vectors"]["accuracy_cosine"] > 0.8
    assert methods["tfidf"]["accuracy_cosine"] > 0.8
    # The concatenation of an encoder with itself ranks exactly like the encoder.
    for metric in ("accuracy_cosine", "accuracy_l1"):
        assert methods["triplets-sen-titles"][metric] == pytest.approx(methods["triplets-sen"][metric])
    saved = json.loads((tmp_path / "triplets.json").read_text())
    assert saved["methods"] == result["methods"]
    markdown = (tmp_path / "triplets.md").read_text()
    assert "| mean-vectors |" in markdown and "0.650" in markdown  # the paper's reference column
    assert (tmp_path / "triplets_accuracy.png").stat().st_size > 0
    # What triplets_accuracy.png draws: per distance a bar per method at its accuracy, each with its
    # Wilson interval as error bar, and the chance line.
    from matplotlib.container import BarContainer

    from eval.report import triplets_figure

    (axis,) = triplets_figure(result).axes
    bars = [container for container in axis.containers if isinstance(container, BarContainer)]
    assert [container.get_label() for container in bars] == ["cosine", "L1"]
    for container, distance in zip(bars, ("cosine", "l1")):
        assert [bar.get_height() for bar in container] == pytest.approx(
            [methods[method][f"accuracy_{distance}"] for method in methods])
        assert len(container.errorbar.lines[2][0].get_segments()) == len(methods)
    assert [label.get_text() for label in axis.get_xticklabels()] == list(methods)
    assert [text.get_text() for text in axis.get_legend().get_texts()] == ["chance", "cosine", "L1"]
    assert axis.get_ylabel() == "accuracy" and "(64 triplets;" in axis.get_title()


def test_triplets_job_names_missing_shards(tmp_path, topic_shards):
    from model.training.shards import TripletDataError

    with pytest.raises(TripletDataError, match=f"{tmp_path} has no manifest.json"):
        triplets.main(["--data", str(tmp_path), "--output", str(tmp_path / "out")])
    with pytest.raises(TripletDataError, match="lists no triplets-sen-other_article/test"):
        triplets.main(["--data", topic_shards, "--dataset", "triplets-sen-other_article",
                       "--output", str(tmp_path / "out")])


def test_a_seeded_sample_of_triplets_is_the_same_in_every_run(topic_shards):
    whole = triplets_job.read_triplets(topic_shards, "triplets-sen", "test")
    sample = triplets_job.read_triplets(topic_shards, "triplets-sen", "test", max_triplets=20, seed=4)
    again = triplets_job.read_triplets(topic_shards, "triplets-sen", "test", max_triplets=20, seed=4)
    other = triplets_job.read_triplets(topic_shards, "triplets-sen", "test", max_triplets=20, seed=5)
    assert len(sample["anchor"]) == 20 and sample == again and sample != other
    whole_rows = set(zip(*(whole[key] for key in ("anchor", "positive", "negative"))))
    assert set(zip(*(sample[key] for key in ("anchor", "positive", "negative")))) <= whole_rows   # roles aligned


@pytest.mark.slow   # four eval.triplets processes
def test_an_empty_split_or_a_folder_that_is_not_a_report_is_one_error_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    data = write_triplet_shards(str(tmp_path / "data"), sizes={"train": 16, "validation": 0, "test": 16})
    repo = Path(__file__).resolve().parents[2]

    def cli(*flags):
        return subprocess.run([sys.executable, "-m", "eval.triplets", "--data", data, "--encoder", "tfidf", *flags],
                              capture_output=True, text=True, cwd=repo)

    done = cli("--split", "validation", "--output", str(tmp_path / "report"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"error: {data}/triplets-sen/validation holds no triplets to score"
    assert not (tmp_path / "report").exists()
    done = cli("--output", data)                     # the data folder itself: not an eval report's
    assert done.returncode == 2 and "holds files eval does not write" in done.stderr.strip().splitlines()[-1]
    assert cli("--output", str(tmp_path / "report")).returncode == 0
    assert cli("--output", str(tmp_path / "report")).returncode == 0    # its own report: replaced


def _no_google_credentials(home) -> dict:
    """This environment without any Google credentials or emulator: no key file, a HOME and a
    gcloud config without application default credentials, and no metadata server lookup
    (NO_GCE_CHECK), so nothing waits on the network."""
    import os

    gone = ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "CLOUDSDK_CONFIG", "API_ENDPOINT_OVERRIDE")
    return {**{key: value for key, value in os.environ.items() if key not in gone}, "HOME": str(home),
            "CLOUDSDK_CONFIG": str(home / "gcloud"), "NO_GCE_CHECK": "true", "TF_CPP_MIN_LOG_LEVEL": "3"}


def test_a_gs_run_without_credentials_is_one_error_line_naming_it_in_seconds(tmp_path):
    import subprocess
    import sys
    import time
    from pathlib import Path

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "eval.triplets", "--data", "gs://no-such-bucket/run", "--output",
                           str(tmp_path / "report")], capture_output=True, text=True, timeout=240,
                          cwd=Path(__file__).resolve().parents[2], env=_no_google_credentials(tmp_path))
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        "error: gs://no-such-bucket/run/manifest.json: no Google Cloud credentials to read it with (set "
        "GOOGLE_APPLICATION_CREDENTIALS to a service account key, or run gcloud auth application-default login)"]
    assert took < 120 and not (tmp_path / "report").exists()   # was a RetryError traceback after 133 s


def test_a_gs_path_whose_storage_does_not_answer_is_refused_after_a_bounded_wait(tmp_path, monkeypatch):
    import socket
    import time

    from core import published
    from core.cli import UsageError

    with socket.socket() as closed:   # a loopback port nothing listens on: refused at once, no network
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    key = tmp_path / "adc.json"          # credentials whose token endpoint does not answer
    key.write_text(json.dumps({"type": "authorized_user", "client_id": "c", "client_secret": "s",
                               "refresh_token": "r", "token_uri": f"http://127.0.0.1:{port}/token"}))
    for name, value in _no_google_credentials(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    monkeypatch.setattr(published, "STORAGE_WAIT_S", 3.0)
    started = time.monotonic()
    with pytest.raises(UsageError, match=r"^gs://no-such-bucket/run/manifest.json: its storage did not answer "
                                         r"within 3 s or refused it \(RetryError: "):
        published.Run.open("gs://no-such-bucket/run")
    assert time.monotonic() - started < 30 and "no-such-bucket" not in published._REACHED_BUCKETS
