"""QS3M end to end on the pipeline's passages from the embedded real Wikipedia excerpt."""
import pytest

from eval import qs3m as qs3m_eval
from model.encoding.encoders import EncoderSpec, load_encoders
from model.qs3m import data as qs3m_data
from model.qs3m import train as qs3m


@pytest.fixture(scope="module")
def mean_vectors():
    (encoder,) = load_encoders([EncoderSpec.parse("mean-vectors")])
    return encoder


def test_the_helps_hurts_figure_draws_each_methods_sorted_differences_to_the_reference():
    from matplotlib.colors import to_hex

    per_query = {qs3m_eval.REFERENCE: [0.5, 0.5, 0.5, 0.5], "QS3M (P)": [0.9, 0.1, 0.5, 0.6],
                 "QSS (P)": [0.2, 0.5, 0.4, 0.5]}
    figure = qs3m_eval.helps_hurts_figure(per_query, "flat benchmark")
    visible = [axis for axis in figure.axes if axis.get_visible()]
    assert [axis.get_title() for axis in visible] == ["QS3M (P): 2 helps, 1 hurts", "QSS (P): 0 helps, 2 hurts"]
    (first,), (second,) = (axis.containers for axis in visible)
    assert [bar.get_height() for bar in first] == pytest.approx([-0.4, 0.0, 0.1, 0.4])   # sorted
    assert [bar.get_height() for bar in second] == pytest.approx([-0.3, -0.1, 0.0, 0.0])
    assert [to_hex(bar.get_facecolor()) for bar in first] == [  # red hurts, green helps
        to_hex(colour) for colour in ("tab:red", "tab:gray", "tab:green", "tab:green")]
    assert visible[0].get_ylabel() == f"ARI − {qs3m_eval.REFERENCE}" and figure.get_suptitle() == "flat benchmark"


def test_end_to_end_on_the_embedded_wikipedia_excerpt(embedded_pipeline_output, tmp_path, mean_vectors):
    """Pipeline passages -> QS3M training -> clustering scores, on real articles."""
    passages = str(embedded_pipeline_output / "passages" / "*.jsonl.gz")
    queries, dead_letters = qs3m_data.read_queries(passages)
    assert queries and not dead_letters
    by_split = {split: [q for q in queries if q.split == split] for split in ("train", "validation", "test")}
    train_config = qs3m.Qs3mConfig(passages=passages, output=str(tmp_path / "model"), queries=("P",),
                                    nn1_units=(16,), nn2_units=(8,), epochs=2, max_pairs_per_query=40)
    summary = qs3m.train(train_config, mean_vectors)
    counts = summary["counts"]
    assert counts["articles_train"] == len(by_split["train"]) > 0
    assert counts["pairs_train"] == 2 * counts["positive_pairs_train"] <= 40 * len(by_split["train"])
    eval_config = qs3m_eval.Qs3mEvalConfig(passages=passages, model_dir=str(tmp_path / "model"),
                                       output=str(tmp_path / "eval"), lda_topics=5)
    results = qs3m_eval.evaluate(eval_config, mean_vectors)
    assert results["articles_per_split"] == {split: len(chosen) for split, chosen in by_split.items()}
    for labeling in ("flat", "hierarchical"):
        benchmark = results["benchmarks"][labeling]
        assert benchmark["queries"] == sum(1 for q in by_split["test"] if q.num_clusters(labeling) >= 2)
        assert set(benchmark["methods"]) >= {qs3m_eval.REFERENCE, "QS3M (P)", "QSS (P)", "QS3M-no-q"}
        assert all(-1 <= row["ari"] <= 1 for row in benchmark["methods"].values())
    assert (tmp_path / "eval" / "qs3m-flat.png").read_bytes()[:4] == b"\x89PNG"
