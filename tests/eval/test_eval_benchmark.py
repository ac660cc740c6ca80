"""eval.benchmark's clustering measurement on a small article: what it times and how it reports it."""
import numpy as np
import pytest

from eval.benchmark import clustering_markdown, clustering_seconds, matmul_peak_gflops
from eval.iclust import IclustConfig, iclust_with_updates
from pipeline.records import ScbRecord


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
    from eval.benchmark import main

    rows = main(["--data", str(embedded_pipeline_output), "--encoder", "mean-vectors", "--encoder", "tfidf",
                 "--max-articles", "2", "--encode-only", "true", "--output", str(tmp_path)])
    assert [row["method"] for row in rows] == ["mean-vectors", "tfidf"]
    assert {row["articles"] for row in rows} == {2} and rows[0]["sentences"] == rows[1]["sentences"] > 0
    printed = capsys.readouterr().out
    assert "| x the first method |" in printed and "| 1.000 |" in printed        # the first method against itself
    assert (tmp_path / "encoding.md").read_text().startswith("## Encoding speed")
