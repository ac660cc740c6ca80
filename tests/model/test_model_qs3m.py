"""QS3M: record parsing, the balanced pair sampler, model shapes and loss, clustering, and the
train -> score round trip on a small passages file in the contract format (local and gs://)."""
import gzip
import json
import random

import numpy as np
import pytest
from apache_beam.io.filesystems import FileSystems

from core import published
from core.cli import UsageError, parse_config
from core.records import PassagesRecord, RecordError
from eval import qs3m as qs3m_eval
from model.encoding.encoders import EncoderSpec, load_encoders
from model.qs3m import data as qs3m_data
from model.qs3m import network as qs3m_network
from model.qs3m import train as qs3m
from model.qs3m.pairs import query_from_record, sample_pairs

pytestmark = pytest.mark.slow   # QS3M training

TOPICS = {
    "Climate": "rain snow monsoon humidity temperature winter summer drought",
    "History": "empire king war dynasty treaty revolution battle century",
    "Economy": "trade export industry market currency bank tax agriculture",
    "Culture": "music dance festival painting poetry theatre cuisine film",
}


def synthetic_article(article_id, split, rng, sections=3, paragraphs=4):
    """An article in the passages contract: each top-level section draws words from its own topic,
    and its second half sits under a sub-heading so the hierarchical labels refine the flat ones."""
    chosen = rng.sample(sorted(TOPICS), sections)
    return {
        "article_id": article_id, "title": f"Country {article_id}", "split": split,
        "lead": [f"Country {article_id} is a place with " + " ".join(TOPICS[t].split()[0] for t in chosen)],
        "sections": [{
            "title": topic,
            "paragraphs": [{"text": " ".join(rng.choices(TOPICS[topic].split(), k=12)),
                            "path": [topic] if p < paragraphs // 2 else [topic, f"{topic} today"]}
                           for p in range(paragraphs)],
        } for topic in chosen],
    }


def write_passages(path, records, extra_lines=()):
    with gzip.open(path, "wt") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
        for line in extra_lines:
            handle.write(line + "\n")


@pytest.fixture(scope="module")
def mean_vectors():
    (encoder,) = load_encoders([EncoderSpec.parse("mean-vectors")])
    return encoder


@pytest.fixture
def passages_file(tmp_path):
    rng = random.Random(7)
    splits = ["train"] * 8 + ["validation"] * 2 + ["test"] * 4
    records = [synthetic_article(100 + i, split, rng) for i, split in enumerate(splits)]
    path = tmp_path / "passages-00000-of-00001.jsonl.gz"
    write_passages(path, records, extra_lines=["{not json", json.dumps({"article_id": 9, "title": "x"})])
    return path


# ---------------------------------------------------------------- records and pairs

def test_record_keeps_lead_apart_and_labels_flat_and_hierarchical():
    record = synthetic_article(1, "test", random.Random(0), sections=2, paragraphs=4)
    query = query_from_record(PassagesRecord.from_json(json.dumps(record)))
    assert query.lead == tuple(record["lead"])
    assert record["lead"][0] not in query.passages
    assert len(query.passages) == 8
    assert query.flat_labels == (0, 0, 0, 0, 1, 1, 1, 1)
    assert query.hierarchical_labels == (0, 0, 1, 1, 2, 2, 3, 3)
    assert query.num_clusters("flat") == 2 and query.num_clusters("hierarchical") == 4


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r.pop("split"), "split"),
    (lambda r: r.update(split="dev"), "split"),
    (lambda r: r.update(article_id="7"), "article_id"),
    (lambda r: r["sections"][1]["paragraphs"][0].pop("text"), "sections[1].paragraphs[0]"),
])
def test_bad_record_names_the_field(mutate, field):
    record = synthetic_article(1, "train", random.Random(0))
    mutate(record)
    with pytest.raises(RecordError, match=field.replace("[", r"\[").replace("]", r"\]")):
        PassagesRecord.from_json(json.dumps(record))


def test_sampler_is_balanced_within_articles_and_seeded():
    label_lists = [(0, 0, 0, 1, 1, 2, 2, 2, 2), (0, 1, 1, 1), (0, 0, 0), (5,), (0, 1, 0, 1, 2, 2)]
    pairs = sample_pairs(label_lists, seed=3)
    assert pairs == sample_pairs(label_lists, seed=3)
    assert pairs != sample_pairs(label_lists, seed=4)
    for query_index, labels in enumerate(label_lists):
        mine = [p for p in pairs if p.query_index == query_index]
        positives = sum(p.same_cluster for p in mine)
        assert positives == len(mine) - positives, f"query {query_index} is unbalanced"
        for pair in mine:
            assert 0 <= pair.first < len(labels) and 0 <= pair.second < len(labels) and pair.first != pair.second
            assert pair.same_cluster == float(labels[pair.first] == labels[pair.second])
        assert len({frozenset((p.first, p.second)) for p in mine}) == len(mine), "duplicate pair"
    counts = {q: sum(1 for p in pairs if p.query_index == q) for q in range(len(label_lists))}
    assert counts[2] == 0 and counts[3] == 0  # one cluster: no negatives to balance with
    assert counts[0] == 2 * 10  # 10 positive pairs (3+1+6), 26 negatives -> 10 of each
    assert counts[1] == 2 * 3
    assert {(p.first < p.second) for p in pairs} == {True, False}  # pair order is randomised


def test_sampler_cap_per_query():
    pairs = sample_pairs([(0,) * 10 + (1,) * 10], seed=0, max_pairs_per_query=12)
    assert len(pairs) == 12 and sum(p.same_cluster for p in pairs) == 6


def test_read_queries_sets_bad_lines_aside(passages_file, tmp_path):
    queries, dead_letters = qs3m_data.read_queries(str(tmp_path / "*.jsonl.gz"))
    assert len(queries) == 14
    assert [d["source"].rsplit(":", 1)[1] for d in dead_letters] == ["15", "16"]
    assert "not JSON" in dead_letters[0]["detail"] and "missing field 'split'" in dead_letters[1]["detail"]
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        qs3m_data.read_queries(str(tmp_path / "nothing-here*.jsonl.gz"))


def test_read_queries_from_a_run_folder_streams_a_seeded_sample_of_a_split(passages_file, tmp_path):
    from core.folders import write_manifest

    run = tmp_path / "run"
    (run / "passages").mkdir(parents=True)
    (run / "passages" / "part-00000-of-00001.jsonl.gz").write_bytes(passages_file.read_bytes())
    passages_file.rename(tmp_path / "stray.jsonl.gz.bak")            # only what the manifest lists is read
    write_manifest(str(run), {"passages": 16})
    every, _ = qs3m_data.read_queries(str(run))
    per_split = {}
    train, dead_letters = qs3m_data.read_queries(str(run), ("train",), articles_per_split=per_split)
    assert len(every) == 14 and per_split == {"train": 8, "validation": 2, "test": 4} and len(dead_letters) == 2
    assert [q.article_id for q in train] == [q.article_id for q in every if q.split == "train"]
    samples = [[q.article_id for q in qs3m_data.read_queries(str(run), ("train",), 3, seed)[0]]
               for seed in (0, 0, 1, 2)]
    assert samples[0] == samples[1] and len(samples[0]) == 3                  # same seed, same sample
    assert set(samples[0]) <= {q.article_id for q in train}
    assert len({tuple(sample) for sample in samples}) > 1                     # the seed chooses it
    assert all(sample == sorted(sample, key=[q.article_id for q in train].index) for sample in samples)  # file order
    with pytest.raises(FileNotFoundError, match="neither a run folder"):
        qs3m_data.read_queries(str(tmp_path / "no-run"))


# ---------------------------------------------------------------- models

def test_model_shapes_query_use_and_mse_loss():
    rng = np.random.default_rng(0)
    dim, batch = 12, 5
    inputs = {name: rng.normal(size=(batch, dim)).astype(np.float32) for name in ("query", "passage1", "passage2")}
    labels = rng.integers(0, 2, size=(batch, 1)).astype(np.float32)
    for kind in qs3m_network.MODEL_KINDS:
        model = qs3m_network.build_model(kind, dim, nn1_units=(8,), nn2_units=(4,), learning_rate=1e-3)
        feed = {name: inputs[name] for name in qs3m_network.model_inputs(kind)}
        predicted = model.predict(feed, verbose=0)
        assert predicted.shape == (batch, 1) and np.all((predicted >= 0) & (predicted <= 1))
        assert model.loss == "mean_squared_error"
        loss = model.evaluate(feed, labels, verbose=0, return_dict=True)["loss"]
        assert loss == pytest.approx(float(np.mean((predicted - labels) ** 2)), rel=1e-4)
        if kind != "qs3m-noq":
            moved = model.predict({**feed, "query": feed["query"] + 1.0}, verbose=0)
            assert not np.allclose(moved, predicted), f"{kind} ignores the query"
    with_query = qs3m_network.build_qs3m(dim, (8,), (4,), use_query=True)
    without_query = qs3m_network.build_qs3m(dim, (8,), (4,), use_query=False)
    assert with_query.get_layer("z").output.shape[-1] == 5 * 8  # [p1'-q', p2'-q', p1'-p2', p1', p2']
    assert without_query.get_layer("z").output.shape[-1] == 3 * 8
    assert sorted(without_query.input.keys()) == ["passage1", "passage2"]
    train_passages = 3.0 + 2.0 * rng.normal(size=(200, dim)).astype(np.float32)
    standardized = qs3m_network.build_model("qss", dim, (8,), (4,), 1e-3, train_passages=train_passages)
    centred = np.asarray(standardized.get_layer("standardize")(train_passages))
    np.testing.assert_allclose(centred.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(centred.std(axis=0), 1.0, atol=1e-3)


def test_similarity_matrix_is_symmetric_probability():
    rng = np.random.default_rng(1)
    model = qs3m_network.build_model("qs3m", 6, (8,), (4,), 1e-3)
    passages = rng.normal(size=(5, 6)).astype(np.float32)
    scores = qs3m_network.similarity_matrix(model, "qs3m", passages, rng.normal(size=6).astype(np.float32))
    assert scores.shape == (5, 5)
    np.testing.assert_allclose(scores, scores.T)
    np.testing.assert_allclose(np.diag(scores), 1.0)
    assert np.all((scores > 0) & (scores <= 1))


# ---------------------------------------------------------------- clustering and statistics

def test_average_link_recovers_blocks_and_js_divergence_bounds():
    from sklearn.metrics import adjusted_rand_score
    from sklearn.metrics.pairwise import euclidean_distances

    points = np.array([[0, 0], [0, 1], [10, 10], [10, 11], [30, 0]], dtype=float)
    labels = qs3m_eval.cluster(euclidean_distances(points), 3)
    assert adjusted_rand_score([0, 0, 1, 1, 2], labels) == 1.0
    mixtures = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    divergences = qs3m_eval.jensen_shannon_divergences(mixtures)
    assert divergences[0, 1] == pytest.approx(1.0) and divergences[0, 0] == 0.0
    assert 0 < divergences[0, 2] < 1


def test_compare_with_reference_counts_helps_and_hurts():
    summary = qs3m_eval.compare_with_reference({
        qs3m_eval.REFERENCE: [0.1, 0.5, 0.2, 0.4],
        "better": [0.3, 0.6, 0.2, 0.9],
    })
    assert summary[qs3m_eval.REFERENCE]["p"] is None
    better = summary["better"]
    assert (better["helps"], better["hurts"], better["ties"]) == (3, 0, 1)
    assert better["delta"] == pytest.approx(0.2) and 0 < better["p"] < 1 and better["t"] > 0


# ---------------------------------------------------------------- train and score

SMALL_TRAINING = ["--queries", "D", "--nn1-units", "16", "--nn2-units", "8", "--epochs", "3", "--batch-size", "32"]


def _check_outputs(summary, results, eval_dir):
    counts = summary["counts"]
    assert counts["articles_train"] == 8 and counts["articles_validation"] == 2 and counts["dead_letters"] == 2
    assert counts["pairs_train"] == 2 * counts["positive_pairs_train"] > 0
    assert set(summary["models"]) == {"qs3m-D", "qss-D", "qs3m-noq"}
    assert all(len(history["loss"]) >= 1 for history in summary["history"].values())
    assert results["articles_per_split"] == {"train": 8, "validation": 2, "test": 4}
    expected = {qs3m_eval.REFERENCE, "embedding cosine", "TF-IDF cosine", "LDA + JS divergence",
                "QS3M (D)", "QSS (D)", "QS3M-no-q"}
    for labeling in ("flat", "hierarchical"):
        benchmark = results["benchmarks"][labeling]
        assert benchmark["queries"] == 4 and set(benchmark["methods"]) == expected
        assert all(len(values) == 4 and all(-1 <= v <= 1 for v in values)
                   for values in benchmark["per_query_ari"].values())
    # Sections use disjoint vocabularies, so TF-IDF cosine must find the flat sections exactly.
    assert results["benchmarks"]["flat"]["methods"]["TF-IDF cosine"]["ari"] == pytest.approx(1.0)
    markdown = FileSystems.open(f"{eval_dir}/qs3m.md").read().decode()
    assert "| QS3M (D) |" in markdown and "flat ARI (n=4)" in markdown and "hierarchical ARI (n=4)" in markdown
    assert json.loads(FileSystems.open(f"{eval_dir}/qs3m.json").read())["split"] == "test"
    for name in ("qs3m-flat.png", "qs3m-hierarchical.png"):
        assert FileSystems.open(f"{eval_dir}/{name}").read(8) == b"\x89PNG\r\n\x1a\n"


def test_train_and_score_local(passages_file, tmp_path, mean_vectors):
    train_config = qs3m.Qs3mConfig(passages=str(passages_file), output=str(tmp_path / "model"), queries=("D",),
                                    nn1_units=(16,), nn2_units=(8,), epochs=3, batch_size=32)
    summary = qs3m.train(train_config, mean_vectors)
    eval_config = qs3m_eval.Qs3mEvalConfig(passages=str(passages_file), model_dir=str(tmp_path / "model"),
                                       output=str(tmp_path / "eval"), lda_topics=4)
    results = qs3m_eval.evaluate(eval_config, mean_vectors)
    _check_outputs(summary, results, str(tmp_path / "eval"))
    assert (tmp_path / "model" / "qs3m-D.keras").exists() and (tmp_path / "model" / "training.png").exists()


def test_train_and_score_gcs_through_the_entry_points(passages_file, gcs_emulator):
    prefix = gcs_emulator()
    with FileSystems.create(f"{prefix}/passages/{passages_file.name}", compression_type="uncompressed") as handle:
        handle.write(passages_file.read_bytes())
    passages = f"{prefix}/passages/*.jsonl.gz"
    summary = qs3m.main(["--passages", passages, "--output", f"{prefix}/model", *SMALL_TRAINING])
    results = qs3m_eval.main(["--passages", passages, "--model-dir", f"{prefix}/model", "--output", f"{prefix}/eval",
                              "--lda-topics", "4"])
    assert results["encoder"] == "mean-vectors"
    _check_outputs(summary, results, f"{prefix}/eval")


def test_flags_mirror_the_config_and_bad_values_name_the_flag():
    config = parse_config(qs3m.Qs3mConfig, ["--passages", "p/*.jsonl.gz", "--output", "m", "--models", "qs3m,qss",
                                            "--queries", "T,P", "--nn1-units", "32,16", "--learning-rate", "0.01"],
                          "python -m model.qs3m", "")
    assert config.models == ("qs3m", "qss") and config.queries == ("T", "P")
    assert config.nn1_units == (32, 16) and config.learning_rate == 0.01 and config.epochs == 10
    with pytest.raises(UsageError, match="--passages"):
        parse_config(qs3m.Qs3mConfig, ["--output", "m"], "python -m model.qs3m", "")   # --passages is required
    with pytest.raises(ValueError, match="--queries"):
        qs3m.Qs3mConfig(passages="p", output="m", queries=("X",))
    with pytest.raises(ValueError, match="--split"):
        qs3m_eval.Qs3mEvalConfig(passages="p", model_dir="m", output="o", split="dev")



def test_a_truncated_passages_file_fails_instead_of_training_on_part_of_it(passages_file, tmp_path):
    import gzip

    from core.folders import write_manifest

    run = tmp_path / "run"
    (run / "passages").mkdir(parents=True)
    shard = run / "passages" / "part-00000-of-00001.jsonl.gz"
    shard.write_bytes(passages_file.read_bytes())
    write_manifest(str(run), {"passages": 16})
    lines = gzip.decompress(shard.read_bytes()).splitlines(keepends=True)
    shard.write_bytes(gzip.compress(b"".join(lines[:5])))          # 5 of 16 articles, a valid gzip file
    with pytest.raises(published.ShardError, match=f"{shard}: "):
        qs3m_data.read_queries(str(run), ("train",))


def test_the_training_figure_draws_each_models_train_and_validation_loss():
    histories = {"QS3M (D)": {"loss": [0.3, 0.2, 0.1], "val_loss": [0.35, 0.3, 0.32]},
                 "QS3M-no-q": {"loss": [0.4, 0.3]}}
    (axis,) = qs3m.training_figure(histories).axes
    assert [(line.get_label(), list(line.get_ydata())) for line in axis.lines] == [
        ("QS3M (D) train", [0.3, 0.2, 0.1]), ("QS3M (D) validation", [0.35, 0.3, 0.32]),
        ("QS3M-no-q train", [0.4, 0.3])]
    assert list(axis.lines[2].get_xdata()) == [1, 2]   # epochs count from 1
    assert axis.lines[0].get_color() == axis.lines[1].get_color() != axis.lines[2].get_color()   # a colour per model
    assert axis.lines[1].get_linestyle() == "--"
    assert [text.get_text() for text in axis.get_legend().get_texts()] == [line.get_label() for line in axis.lines]
    assert (axis.get_xlabel(), axis.get_ylabel(), axis.get_title()) == ("epoch", "MSE loss", "QS3M training")
    assert qs3m.training_plot(histories)[:8] == b"\x89PNG\r\n\x1a\n"
