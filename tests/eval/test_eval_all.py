"""eval.all end to end on the pipeline's real outputs from the embedded Wikipedia excerpt:
baselines and a tiny trained encoder in one table per evaluation, plus SICK on a fixture."""
import gzip
import json


from eval import all as eval_all
from eval.clustering import ALGORITHMS
from test_eval_sick import write_sick_fixture


def test_eval_all_on_the_embedded_pipeline_output(embedded_pipeline_output, tiny_model, tmp_path):
    data = embedded_pipeline_output
    sick_path = write_sick_fixture(tmp_path / "SICK.txt")
    out = tmp_path / "eval"
    report = eval_all.main(["--data", str(data), "--output", str(out), "--encoder", "mean-vectors",
                            "--encoder", "tfidf", "--model-dir", tiny_model, "--sick", str(sick_path),
                            "--runner", "DirectRunner"])
    methods = ["mean-vectors", "tfidf", "triplets-sen"]

    scb_articles = sum(1 for path in (data / "scb").glob("*.jsonl.gz") for _ in gzip.open(path, "rt"))
    scb_result = json.loads((out / "scb.json").read_text())
    assert scb_articles > 0 and scb_result["articles"] == scb_articles
    assert scb_result["counters"]["scb_eval_articles_scored"] == scb_articles
    all_sentences = {(e["method"], e["algorithm"]) for e in report["scb"] if e["variant"] == "all"}
    assert all_sentences == {(m, a) for m in methods for a in ALGORITHMS}

    test_triplets = json.loads((data / "stats.json").read_text())["counters"]["triplets-sen/test"]
    assert report["triplets"]["triplets"] == test_triplets
    assert [e["method"] for e in report["triplets"]["methods"]] == methods
    # Real Wikipedia triplets: the GloVe baseline is clearly better than chance, as in the paper.
    by_method = {e["method"]: e for e in report["triplets"]["methods"]}
    assert by_method["mean-vectors"]["accuracy_cosine"] > 0.55

    assert [e["method"] for e in report["sick"]["methods"]] == methods
    markdown = (out / "report.md").read_text()
    for heading in ("Sentence clustering benchmark", "Triplet accuracy", "SICK relatedness"):
        assert heading in markdown
    for image in ("scb_ari.png", "triplets_accuracy.png", "sick_pearson.png", "learning_curves.png"):
        assert f"]({image})" in markdown and (out / image).stat().st_size > 0
    # Every trained method against mean-vectors, paired over the same triplets and articles.
    assert {(row["method"], row["distance"]) for row in report["triplets"]["differences"]} == {
        (method, distance) for method in methods[1:] for distance in ("cosine", "l1")}
    kmeans = [row for row in json.loads((out / "scb.json").read_text())["differences"]
              if (row["variant"], row["algorithm"], row["method"]) == ("all", "kmeans", "triplets-sen")]
    assert len(kmeans) == 1 and kmeans[0]["n"] == scb_articles and kmeans[0]["low"] <= kmeans[0]["high"]
    assert f"n = {test_triplets} triplets" in markdown and "95 % paired bootstrap" in markdown
