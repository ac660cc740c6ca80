"""eval.all end to end on the pipeline's real outputs from the embedded Wikipedia excerpt:
baselines and a tiny trained encoder in one table per evaluation, plus SICK on a fixture."""
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import reference_scoring
from eval_fixtures import count_scb_opens
from scipy import sparse
from test_eval_sick import write_sick_fixture

from core.cli import parse_config
from core.files import JsonFileError
from eval import all as eval_all
from eval import all_job, scb_job, triplets_job
from eval import readme as eval_readme
from eval.clustering import clustering_metrics
from eval.config import ALGORITHMS, VARIANTS, Qs3mEvalConfig, ReportConfig, SickConfig
from model.encoding.encoders import EncoderSpec, load_encoders
from model.training.model_dir import HISTORY, ModelDir


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
    # make demo prints the summary: the head and each benchmark's main table, short
    summary = (out / "summary.md").read_text()
    assert summary.startswith(markdown.split("\n## ")[0].rstrip()) and "## Triplet accuracy" in summary
    assert "## SCB: mean ARI" in summary and "## SICK relatedness" in summary and len(summary.splitlines()) < 45
    # The head says what the numbers rest on and that demo-size ones are noise.
    assert f"Scale: {test_triplets:,} test triplets, {scb_articles:,} SCB articles, " in markdown
    assert "**Demo-size data**" in markdown and "SICK relatedness: skipped" not in markdown

    # What the figures draw: every bar with its 95 % interval; each curve labelled with its n.
    from eval.report import learning_curves_figure, triplets_figure, validation_n

    axis = triplets_figure(report["triplets"]).axes[0]
    bars = [container for container in axis.containers if hasattr(container, "errorbar")]
    assert [container.get_label() for container in bars] == ["cosine", "L1"]
    for container, distance in zip(bars, ("cosine", "l1")):
        segments = container.errorbar.lines[2][0].get_segments()
        assert [(round(low, 6), round(high, 6)) for (_, low), (_, high) in segments] == [
            (round(e[f"interval_{distance}"]["low"], 6), round(e[f"interval_{distance}"]["high"], 6))
            for e in report["triplets"]["methods"]]
    history = ModelDir(tiny_model).history()
    assert history is not None and history.record == json.loads((Path(tiny_model) / HISTORY).read_text())
    labels = [line.get_label() for line in learning_curves_figure({"triplets-sen": history}).axes[0].lines]
    assert f"triplets-sen ({history.distance}, n = {validation_n(history):,} validation triplets)" in labels
    assert validation_n(history) == history.expected_records("validation")   # "all" -> the split's n

    # The model card of a sentence-transformers export quotes this report, intervals included.
    from model.formats.hf import report_scores

    card_lines = report_scores(str(out), "triplets-sen")
    accuracy = by_method["triplets-sen"]["accuracy_cosine"]
    assert card_lines[0].startswith(f"- triplet accuracy (cosine), triplets-sen test, n = {test_triplets}: "
                                    f"{accuracy:.3f} (95 % interval ")
    assert [line.split(" ARI")[0] for line in card_lines[2:]] == [f"- SCB {a}" for a in ALGORITHMS]

    # The README's results block is regenerated from the report, between its markers only.
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n<!-- results:begin -->\nstale\n<!-- results:end -->\nafter\n")
    eval_readme.main(["--report", str(out), "--readme", str(readme)])
    text = readme.read_text()
    assert text.startswith("# Title\n<!-- results:begin -->\n| method |")
    assert text.endswith("<!-- results:end -->\nafter\n")
    assert "stale" not in text and f"n = {test_triplets} test triplets and {scb_articles} SCB articles" in text
    for method in methods:
        accuracy = by_method[method]["accuracy_cosine"]
        assert f"| {method} | {accuracy:.3f} [" in text


def test_eval_all_gives_the_metrics_of_the_unbatched_dense_scoring(embedded_pipeline_output, tiny_model, tmp_path,
                                                                   monkeypatch):
    """The cache, sparse TF-IDF, batched Iclust and the SCB job as the SCB's only reader change no
    number: each method's triplet accuracies and every SCB row equal what the scoring before them
    (`reference_scoring`: dense vectors encoded per set, one clustering call per method and
    algorithm) gives; each SCB file is opened once."""
    data, out = embedded_pipeline_output, tmp_path / "eval"
    specs = [EncoderSpec.parse(text) for text in ("mean-vectors", "tfidf", f"saved:triplets-sen={tiny_model}")]
    opens = count_scb_opens(monkeypatch)
    report = eval_all.main(["--data", str(data), "--output", str(out), "--encoder", "mean-vectors",
                            "--encoder", "tfidf", "--model-dir", tiny_model, "--runner", "DirectRunner"])
    assert dict(opens) == {str(path): 1 for path in (data / "scb").glob("part-*")}
    encoders = load_encoders(specs)

    def dense(embeddings):
        return embeddings.toarray() if sparse.issparse(embeddings) else embeddings

    test_triplets = triplets_job.read_triplets(str(data), "triplets-sen", "test")
    unique = triplets_job.distinct_sentences(test_triplets)
    row_of = {sentence: row for row, sentence in enumerate(unique)}
    scored = {entry["method"]: entry for entry in report["triplets"]["methods"]}
    for encoder in encoders:
        embeddings = dense(encoder.encode(unique))
        correct = reference_scoring.triplet_correct(
            *(embeddings[[row_of[s] for s in test_triplets[key]]] for key in ("anchor", "positive", "negative")))
        for distance in ("cosine", "l1"):
            assert scored[encoder.name][f"accuracy_{distance}"] == float(np.mean(correct[distance])), encoder.name

    rows = {(row["article_id"], row["method"], row["variant"], row["algorithm"]): row
            for row in json.loads((out / "scb.json").read_text())["rows"]}
    expected = 0
    for record in scb_job.read_articles(str(data)):
        labels = np.asarray(record.labels)
        for encoder in encoders:
            embeddings = dense(encoder.encode(list(record.sentences)))
            for variant in VARIANTS:
                subset = scb_job.variant_subset(record, variant)
                k = len(np.unique(labels[subset]))
                if k < 2:
                    continue
                for algorithm, predicted in reference_scoring.cluster_embeddings(embeddings[subset], k).items():
                    row = rows[(record.article_id, encoder.name, variant, algorithm)]
                    assert row["ARI"] == clustering_metrics(labels[subset], predicted)["ARI"], (
                        record.title, encoder.name, variant, algorithm)
                    expected += 1
    assert expected == len(rows) > 0


def test_the_report_head_says_when_sick_was_skipped_and_where_to_get_it():
    head = all_job.scale_lines(50_000, 800, None)
    assert head.startswith("Scale: 50,000 test triplets, 800 SCB articles.\n") and "Demo-size" not in head
    assert "SICK relatedness: skipped: pass SICK=path" in head and "SemEval 2014 task 1" in head


def test_eval_all_composes_each_evaluation_whose_inputs_are_given():
    """The registry's evaluations in the report's order; SICK with --sick, QS3M with --qs3m (on
    --data's passages), each with eval.all's output, methods and seed."""
    flags = ["--data", "run", "--output", "eval", "--encoder", "tfidf", "--seed", "3"]
    assert list(all_job.EVALUATORS) == ["scb", "triplets", "sick", "qs3m"]
    assert list(all_job.evaluation_configs(parse_config(ReportConfig, flags, "p", ""))) == ["scb", "triplets"]
    configs = all_job.evaluation_configs(parse_config(ReportConfig, [*flags, "--sick", "SICK.txt", "--qs3m", "q"],
                                                      "p", ""))
    assert configs["qs3m"] == Qs3mEvalConfig(passages="run", model_dir="q", output="eval", seed=3)
    assert configs["sick"] == SickConfig(sick="SICK.txt", output="eval", methods=configs["scb"].methods)
    assert configs["scb"].seed == configs["triplets"].seed == 3


def test_trained_histories_name_each_model_dir_as_its_specs_do(tmp_path):
    """`DIR` is named by its basename and `NAME=DIR` by NAME, as the methods' rows are; a model dir
    without history.json (an untrained export) has no curve."""
    written = {}
    for folder, curve in (("sen", [0.5]), ("titles", [0.7])):
        (tmp_path / folder).mkdir()
        written[folder] = {"learning_curve": curve, "best_val_triplet_accuracy": curve[0],
                           "untrained_val_triplet_accuracy": 0.5, "evaluation_triplets": 100, "record_counts": {},
                           "config": {}, "distance": "l1", "global_batch_size": 8, "replicas": 1}
        (tmp_path / folder / HISTORY).write_text(json.dumps(written[folder]))
    (tmp_path / "untrained").mkdir()
    histories = all_job.trained_histories((f"{tmp_path}/sen/", f"triplets-titles={tmp_path}/titles",
                                            str(tmp_path / "untrained")))
    assert {name: history.record for name, history in histories.items()} == {
        "sen": written["sen"], "triplets-titles": written["titles"]}
    (tmp_path / "sen" / HISTORY).write_text(json.dumps({"learning_curve": [0.5]}))   # not a trainer's
    with pytest.raises(JsonFileError, match=f"{HISTORY}: field best_val_triplet_accuracy is missing"):
        all_job.trained_histories((str(tmp_path / "sen"),))


def _data_with_more_scb_articles(data: Path, copy: Path, copies: int) -> int:
    """A copy of the run whose SCB holds its real articles `copies` times over, each copy under
    new ids (so an SCB job lasts long enough to be killed in its middle); returns their number."""
    import shutil

    shutil.copytree(data, copy)
    articles = [json.loads(line) for path in sorted((copy / "scb").glob("part-*")) for line in gzip.open(path, "rt")]
    for path in (copy / "scb").glob("part-*"):
        path.unlink()
    shard = copy / "scb" / "part-00000-of-00001.jsonl.gz"
    with gzip.open(shard, "wt", encoding="utf-8") as handle:
        for copy_number in range(copies):
            for article in articles:
                handle.write(json.dumps({**article, "article_id": article["article_id"] + 10**7 * copy_number}) + "\n")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["outputs"]["scb"].update(records=len(articles) * copies, shards=[f"scb/{shard.name}"],
                                      shard_bytes=[shard.stat().st_size], shard_records=[len(articles) * copies])
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return len(articles) * copies


def test_a_killed_eval_all_resumes_where_it_stopped(embedded_pipeline_output, tiny_model, tmp_path):
    """SIGKILL in the middle of the SCB job; the rerun into the same --output embeds and clusters
    only the (method, article) pairs without kept rows, and its report is an uninterrupted run's."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from eval.kept import ROWS_FOLDER

    data = tmp_path / "data"
    articles = _data_with_more_scb_articles(embedded_pipeline_output, data, copies=3)
    methods = ["mean-vectors", "triplets-sen"]
    flags = ["--data", str(data), "--encoder", "mean-vectors", "--model-dir", tiny_model,
             "--max-triplets", "300", "--keep-seconds", "0", "--runner", "DirectRunner"]
    killed = tmp_path / "killed"
    job = subprocess.Popen([sys.executable, "-m", "eval.all", "--output", str(killed), *flags],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while job.poll() is None and not list((killed / ROWS_FOLDER).glob("*/part-*.jsonl")):
            time.sleep(0.02)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    kept = {(path.parent.name, json.loads(line)["article_id"])
            for path in (killed / ROWS_FOLDER).glob("*/part-*.jsonl") for line in path.read_text().splitlines()}
    assert 0 < len(kept) < articles * len(methods) and not (killed / "report.json").exists()
    assert list(killed.glob("scb/beam-temp-*")), "the killed job's sinks left their temporary folders"

    resumed = eval_all.main(["--output", str(killed), *flags])
    assert not list(killed.rglob("beam-temp-*"))
    counters = json.loads((killed / "scb.json").read_text())["counters"]
    assert counters[scb_job.METHODS_KEPT] == len(kept)
    assert counters[scb_job.METHODS_SCORED] == articles * len(methods) - len(kept)

    # The wall time of both runs, the killed one's as its last heartbeat left it.
    assert [run["finished"] for run in resumed["runs"]] == [False, True]
    assert resumed["runs"][1]["seconds"] == round(sum(resumed["seconds"].values()), 1)

    whole = eval_all.main(["--output", str(tmp_path / "whole"), *flags])
    assert resumed["scb"] == whole["scb"] and resumed["triplets"] == whole["triplets"]
    assert [run["finished"] for run in whole["runs"]] == [True]
    assert (json.loads((killed / "scb.json").read_text())["rows"]
            == json.loads((tmp_path / "whole" / "scb.json").read_text())["rows"])


def test_int8_scores_a_transformer_model_dir_through_its_int8_export(embedded_pipeline_output, fine_tuned,
                                                                     tiny_model, tmp_path):
    """`--int8 true`: the MiniLM model dir is exported once into the report folder and every step
    encodes with the export; the BiLSTM stays a SavedModel, the learning curves are the model
    dirs', and a rerun reuses the export and every kept row."""
    from eval.kept import ROWS_FOLDER

    model_dir, _ = fine_tuned
    out = tmp_path / "eval"
    flags = ["--data", str(embedded_pipeline_output), "--output", str(out), "--encoder", "mean-vectors",
             "--model-dir", f"minilm-sen={model_dir}", "--model-dir", tiny_model, "--int8", "true",
             "--max-triplets", "200", "--max-scb-articles", "2", "--runner", "DirectRunner"]
    report = eval_all.main(flags)
    export = out / all_job.ONNX_FOLDER / "minilm-sen"
    assert json.loads((export / "onnx.json").read_text())["quantization"]["type"] == "int8"
    assert report["methods"] == ["mean-vectors", f"onnx:{export}", f"saved:triplets-sen={tiny_model}"]
    assert [entry["method"] for entry in report["triplets"]["methods"]] == ["mean-vectors", "minilm-sen",
                                                                           "triplets-sen"]
    markdown = (out / "report.md").read_text()
    assert "int8 ONNX exports (`--int8 true`" in markdown and "![learning curves](learning_curves.png)" in markdown

    written = (export / "model.onnx").stat().st_mtime_ns
    rerun = eval_all.main(flags)
    assert (export / "model.onnx").stat().st_mtime_ns == written
    counters = json.loads((out / "scb.json").read_text())["counters"]
    assert counters.get(scb_job.METHODS_SCORED, 0) == 0 and counters[scb_job.METHODS_KEPT] == 2 * 3
    assert rerun["scb"] == report["scb"] and rerun["triplets"] == report["triplets"]
    assert {path.name for path in (out / ROWS_FOLDER).iterdir()} == {"mean-vectors", "minilm-sen", "triplets-sen"}

    # Another model dir under the kept name: refused before the claim and any export, the report as it was.
    other = shutil.copytree(model_dir, tmp_path / "other-minilm-sen")
    before = _files(out)
    refused = _eval_all_process([flag if flag != f"minilm-sen={model_dir}" else f"minilm-sen={other}"
                                 for flag in flags])
    assert refused.returncode == 2
    assert _one_error_line(refused.stderr).startswith(
        f"error: --output {out}: {export}.source.json keeps results of another encoder spec")
    assert _files(out) == before


def _files(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under `folder`: relative path -> (mtime_ns, bytes)."""
    return {str(path.relative_to(folder)): (path.stat().st_mtime_ns, path.read_bytes())
            for path in sorted(folder.rglob("*")) if path.is_file()}


def _eval_all_process(flags: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eval.all", *flags], capture_output=True, text=True, timeout=600)


def _one_error_line(stderr: str) -> str:
    """The one `error:` line a refused command prints, last, with no traceback."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in stderr and errors == stderr.strip().splitlines()[-1:], stderr
    return errors[0]


def test_a_damaged_kept_file_is_one_error_line_naming_it_and_scored_again_once_deleted(embedded_pipeline_output,
                                                                                       tmp_path):
    """A kept SCB rows file cut short, then a kept embeddings file cut short (its Parquet footer
    gone): each rerun is refused in one line naming the file; deleted, as the line says, the files'
    articles and sentences are scored again, into the report an intact folder gives."""
    from eval.kept import ROWS_FOLDER
    from model.encoding.embedding_cache import EMBEDDINGS_FOLDER

    out = tmp_path / "eval"
    flags = ["--data", str(embedded_pipeline_output), "--output", str(out), "--encoder", "mean-vectors",
             "--max-triplets", "200", "--max-scb-articles", "2", "--runner", "DirectRunner"]
    assert _eval_all_process(flags).returncode == 0   # in a process: this one's claim would be live
    report = json.loads((out / "report.json").read_text())
    [rows] = (out / ROWS_FOLDER / "mean-vectors").glob("part-*.jsonl")
    embeddings = out / EMBEDDINGS_FOLDER / "mean-vectors.parquet"
    for damaged, why, kept in ((rows, f"line {len(rows.read_text().splitlines())} is not an SCB row", "articles"),
                               (embeddings, "not a whole Parquet file", "sentences")):
        whole = damaged.read_bytes()
        damaged.write_bytes(whole[:-5])   # the last line cut short; the Parquet footer's magic gone
        refused = _eval_all_process(flags)
        assert refused.returncode == 2
        line = _one_error_line(refused.stderr)
        assert line.startswith(f"error: --output {out}: the kept file {damaged} is damaged ({why}"), line
        assert line.endswith(f"; delete that file and rerun: its {kept} are scored again"), line
        if damaged == rows:
            damaged.write_bytes(whole)
    rows.unlink(), embeddings.unlink()
    eval_all.main(flags)
    assert json.loads((out / "scb.json").read_text())["counters"][scb_job.METHODS_SCORED] == 2
    rescored = json.loads((out / "report.json").read_text())
    assert rescored["scb"] == report["scb"] and rescored["triplets"] == report["triplets"]
