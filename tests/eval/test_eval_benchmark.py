"""eval.benchmark's clustering measurement on a small article: what it times and how it reports it."""
import json
import sys

import numpy as np
import pytest

from core.cli import run_cli
from core.records import ScbRecord
from eval.benchmark import main
from eval.benchmark_job import clustering_markdown, clustering_seconds, matmul_peak_gflops, speed_ratio
from eval.iclust import IclustConfig, iclust_with_updates


def test_clustering_seconds_times_each_variant_the_job_clusters_and_counts_iclusts_products():
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1, 2], [5, 7, 6])
    openers = np.zeros(18, dtype=bool)
    openers[[0, 1, 5, 6, 12]] = True   # openers: sections 0, 1 and 2
    record = ScbRecord(1, "A", ("a", "b", "c"), tuple(f"s{i}" for i in range(18)), tuple(int(x) for x in labels),
                       tuple(bool(x) for x in openers))
    embeddings = rng.normal(size=(3, 8))[labels] * 3 + rng.normal(size=(18, 8))
    spent = clustering_seconds(record, embeddings)
    assert set(spent) == {"kmeans", "iclust", "average-link", "iclust_flops"}
    assert all(spent[algorithm] > 0 for algorithm in ("kmeans", "iclust", "average-link"))
    expected = 0.0
    for subset in (np.arange(18), np.flatnonzero(openers)):
        unit = embeddings[subset] / np.linalg.norm(embeddings[subset], axis=1, keepdims=True)
        _, updates = iclust_with_updates([unit @ unit.T], 3, IclustConfig())
        expected += 2.0 * len(subset) ** 2 * 3 * updates.sum()   # one [N, N] x [N, k] product per update
    assert spent["iclust_flops"] == expected


def test_clustering_table_gives_each_methods_milliseconds_and_iclusts_share_of_the_peak():
    rows = [{"method": "mean-vectors", "kmeans_ms_per_article": 12.5, "iclust_ms_per_article": 140.0,
             "average_link_ms_per_article": 1.25, "iclust_gflops": 9.0, "matmul_peak_gflops": 36.0,
             "iclust_share_of_peak": 0.25}]
    text = clustering_markdown(rows)
    assert text.startswith("## Clustering time per article (float64 matmul peak, one BLAS thread: 36.0 GFLOP/s)")
    assert "| Iclust ms/article |" in text and "| mean-vectors | 12.500 | 140.000 | 1.250 | 9.000 | 0.250 |" in text


def test_the_matmul_peak_is_a_rate():
    assert matmul_peak_gflops(size=64, repeats=2) > 0


@pytest.mark.slow   # the session's pipeline run
def test_encode_only_times_each_method_on_the_sampled_articles(embedded_pipeline_output, tmp_path, capsys):
    rows = main(["--data", str(embedded_pipeline_output), "--encoder", "mean-vectors", "--encoder", "tfidf",
                 "--max-articles", "2", "--encode-only", "true", "--output", str(tmp_path)])
    assert [row["method"] for row in rows] == ["mean-vectors", "tfidf"]
    assert {row["articles"] for row in rows} == {2} and rows[0]["sentences"] == rows[1]["sentences"] > 0
    printed = capsys.readouterr().out
    assert "| x the first method |" in printed and "| 1.000 |" in printed        # the first method against itself
    assert (tmp_path / "encoding.md").read_text().startswith("## Encoding speed")


def test_without_sentence_transformers_the_flag_is_one_error_line_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)   # not installed, as in CI
    status = run_cli(main, ["--data", str(tmp_path / "no-run"), "--model-dir", str(tmp_path / "no-model"),
                            "--encode-only", "true", "--sentence-transformers", "true"])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1   # refused before the missing run or model dir is read
    assert error.startswith("error: --sentence-transformers true needs sentence-transformers")


def test_the_ratio_is_the_keras_exports_sentences_per_second_over_sentence_transformers():
    row = speed_ratio("m", 300, keras_seconds=2.0, sentence_transformers_seconds=3.0,
                      cosines=np.array([0.99, 1.0, 0.999]), threads={"tensorflow": 2, "torch": 2},
                      max_seq_length={"keras": 64, "sentence_transformers": 64})
    assert (row["keras_sentences_per_s"], row["sentence_transformers_sentences_per_s"]) == (150.0, 100.0)
    assert row["keras_over_sentence_transformers"] == 1.5
    assert (row["cosine_min"], row["cosine_median"]) == (0.99, 0.999)


def test_sentence_transformers_is_timed_beside_the_keras_export_on_the_same_sentences(
        fine_tuned, embedded_pipeline_output, tmp_path, capsys):
    pytest.importorskip("sentence_transformers", reason="PyTorch is not installed: docs/export.md runs this")
    model_dir, _ = fine_tuned
    rows = main(["--data", str(embedded_pipeline_output), "--encoder", "mean-vectors", "--model-dir", str(model_dir),
                 "--max-articles", "2", "--encode-only", "true", "--sentence-transformers", "true",
                 "--output", str(tmp_path)])
    [compared] = json.loads((tmp_path / "sentence-transformers.json").read_text())   # mean-vectors has no export
    assert compared["method"] == "minilm-sen" and compared["sentences"] == rows[1]["sentences"] > 0
    keras, theirs = (compared["sentences"] / compared[f"{side}_seconds"] for side in ("keras", "sentence_transformers"))
    assert (compared["keras_sentences_per_s"], compared["sentence_transformers_sentences_per_s"]) == (keras, theirs)
    assert compared["keras_over_sentence_transformers"] == keras / theirs
    assert compared["threads"]["torch"] == compared["threads"]["tensorflow"]
    assert compared["max_seq_length"] == {"keras": 32, "sentence_transformers": 32}
    assert compared["cosine_min"] >= 0.9999   # the same weights: the same embeddings
    assert "| Keras / sentence-transformers |" in capsys.readouterr().out


def test_onnx_exports_are_timed_beside_the_saved_model_on_the_same_sentences(
        fine_tuned, embedded_pipeline_output, tmp_path, capsys):
    model_dir, _ = fine_tuned
    main(["--data", str(embedded_pipeline_output), "--encoder", "mean-vectors", "--model-dir", str(model_dir),
          "--max-articles", "2", "--encode-only", "true", "--onnx", "true", "--batch-size", "64",
          "--output", str(tmp_path)])
    rows = json.loads((tmp_path / "onnx.json").read_text())   # mean-vectors is no transformer: no rows
    timed = [row for row in rows if "absent" not in row]
    assert [row["encoder"] for row in timed[:3]] == ["SavedModel", "ONNX float32", "ONNX int8"]
    assert {row["sentences"] for row in timed} == {timed[0]["sentences"]} and timed[0]["sentences"] > 0
    assert {(row["threads"], row["batch_size"]) for row in timed} == {(timed[0]["threads"], 64)}
    assert timed[0]["x_saved_model"] == 1.0 and timed[0]["cosine_min"] > 0.99999
    assert timed[1]["cosine_min"] > 0.9999 and timed[2]["cosine_median"] >= 0.99
    assert timed[2]["x_saved_model"] == timed[2]["sentences_per_s"] / timed[0]["sentences_per_s"]
    if len(timed) == 3:   # sentence-transformers is not installed: its row says so
        assert rows[-1]["encoder"] == "sentence-transformers ONNX int8" and rows[-1]["absent"].startswith("absent")
    assert "| x the SavedModel |" in capsys.readouterr().out
    assert (tmp_path / "onnx" / "minilm-sen-int8" / "onnx.json").exists()
