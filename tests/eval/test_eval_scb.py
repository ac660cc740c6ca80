"""The SCB scoring Beam job end to end (DirectRunner) on small SCB files in the contract format."""
import json
from pathlib import Path

import numpy as np
import pytest
from eval_fixtures import count_scb_opens, scb_article, write_scb

from core import published, records
from core.cli import UsageError
from core.counters import NAMESPACE
from core.folders import write_manifest
from eval import scb, scb_job
from eval.config import ALGORITHMS, METRICS, VARIANTS
from model.training.model_dir import ENCODER


def _check_scb_figure(result, n_articles):
    """What scb_ari.png draws: a panel per variant and algorithm, in each a box per method (in the
    order given) whose mean marker is the mean of that method's per-article ARIs there."""
    from eval.report import scb_ari_figure

    figure = scb_ari_figure(result)
    panels = [(variant, algorithm) for variant in VARIANTS for algorithm in ALGORITHMS]
    assert [axis.get_title() for axis in figure.axes] == [
        f"{algorithm}, {'all sentences' if variant == 'all' else 'paragraph openers'}" for variant, algorithm in panels]
    for axis, (variant, algorithm) in zip(figure.axes, panels):
        assert [label.get_text() for label in axis.get_xticklabels()] == result["methods"]
        means = [float(line.get_ydata()[0]) for line in axis.lines if line.get_marker() == "^"]
        assert means == pytest.approx([np.mean([row["ARI"] for row in result["rows"] if (
            row["variant"], row["algorithm"], row["method"]) == (variant, algorithm, method)])
            for method in result["methods"]])
    assert [axis.get_ylabel() for axis in figure.axes] == ["per-article ARI", "", ""] * len(VARIANTS)
    legends = [axis.get_legend() for axis in figure.axes]
    assert [text.get_text() for text in legends[len(ALGORITHMS) - 1].get_texts()] == [
        "median", "mean", "outlier (beyond 1.5 IQR)"]
    assert sum(legend is not None for legend in legends) == 1
    assert f"({n_articles} articles;" in figure.get_suptitle()


def test_score_article_skips_a_variant_without_two_sections():
    record = records.ScbRecord(article_id=5, title="T", sections=("a", "b"), sentences=("w", "x", "y", "z"),
                               labels=(0, 0, 1, 1), openers=(True, False, False, False))
    embeddings = np.eye(4, dtype=np.float32)
    rows = scb_job.score_article(record, {"m": embeddings, "n": embeddings[:, ::-1]}, seed=0)
    assert [(row["method"], row["algorithm"]) for row in rows if row["variant"] == "all"] == [
        (method, algorithm) for method in "mn" for algorithm in ALGORITHMS]
    skipped = [row for row in rows if row["variant"] == "openers"]
    assert [row["method"] for row in skipped] == ["m", "n"] and all("skipped" in row for row in skipped)


@pytest.mark.slow   # seconds of real work: the fast tier stays under 3 minutes
def test_ari_differences_pass_over_a_skipped_article_variant():
    """A whole SCB run has articles whose openers span fewer than 2 sections: their skipped rows
    carry no algorithm, and the paired differences are of the articles every method scored."""
    from eval.intervals import REFERENCE_METHODS

    reference = REFERENCE_METHODS[0]
    rows = [{"article_id": article, "method": method, "variant": "all", "algorithm": "iclust", "ARI": ari}
            for article, (ours, theirs) in enumerate([(0.5, 0.25), (0.75, 0.25), (0.25, 0.0)])
            for method, ari in (("ours", ours), (reference, theirs))]
    rows.append({"article_id": 3, "method": "ours", "variant": "openers", "skipped": "1 section(s) with openers"})
    [difference] = scb_job.ari_differences(rows)
    assert (difference["variant"], difference["algorithm"], difference["method"], difference["reference"]) == (
        "all", "iclust", "ours", reference)
    assert (difference["difference"], difference["n"]) == (pytest.approx(1 / 3), 3)


@pytest.mark.slow   # seconds of a real Beam or tf.data run: the full tier
def test_scb_job_scores_every_article_method_algorithm_and_variant(tmp_path):
    articles = write_scb(tmp_path / "data", extra_lines=("not json", json.dumps({"article_id": 99})))
    result = scb.main(["--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"),
                       "--encoder", "tfidf", "--encoder", "mean-vectors", "--runner", "DirectRunner"])
    assert result["articles"] == len(articles)
    assert result["dead_letters"] == 2
    counters = result["counters"]
    assert counters["scb_eval_articles_read"] == len(articles) + 2
    assert counters["scb_eval_articles_malformed"] == 2
    assert counters["scb_eval_articles_scored"] == len(articles)
    assert counters["scb_eval_sentences_scored"] == sum(len(a["sentences"]) for a in articles)
    # The job's workers embed the articles they score: the driver caches no SCB embedding.
    assert not (tmp_path / "out" / "embeddings").exists()
    dead = [json.loads(line) for path in (tmp_path / "out" / "scb").glob("dead_letters-*")
            for line in path.read_text().splitlines()]
    assert {d["reason"] for d in dead} == {"malformed_scb_record"} and all(d["stage"] == "eval-scb" for d in dead)
    assert len(result["rows"]) == len(articles) * 2 * len(ALGORITHMS) * len(VARIANTS)
    by_article = {a["article_id"]: a for a in articles}
    for row in result["rows"]:
        article = by_article[row["article_id"]]
        assert row["k"] == len(article["sections"])
        expected_sentences = len(article["sentences"]) if row["variant"] == "all" else sum(article["openers"])
        assert row["sentences"] == expected_sentences
        assert 0.0 <= row["RI"] <= 1.0 and -1.0 <= row["ARI"] <= 1.0
    summary = {(s["variant"], s["method"], s["algorithm"]): s for s in result["summary"]}
    assert len(summary) == 2 * len(ALGORITHMS) * len(VARIANTS)
    for (variant, method, algorithm), entry in summary.items():
        matching = [r for r in result["rows"]
                    if (r["variant"], r["method"], r["algorithm"]) == (variant, method, algorithm)]
        assert entry["articles"] == len(articles)
        for metric in METRICS:
            assert entry[metric] == pytest.approx(np.mean([r[metric] for r in matching]))
    # The fixture's sections are about unrelated themes (few shared words, so TF-IDF has little to
    # go on): GloVe means must find them with every algorithm.
    for algorithm in ALGORITHMS:
        assert summary[("all", "mean-vectors", algorithm)]["ARI"] > 0.9, algorithm
    for name in ("scb.json", "scb.md", "scb_ari.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    _check_scb_figure(result, len(articles))
    markdown = (tmp_path / "out" / "scb.md").read_text()
    assert "paragraph openers only" in markdown and "| mean-vectors |" in markdown
    assert result["methods"] == ["tfidf", "mean-vectors"]   # rows in the order the methods were given
    assert markdown.index("| tfidf |") < markdown.index("| mean-vectors |")


@pytest.mark.slow   # seconds: the full tier (the fast tier stays under 3 minutes)
def test_scb_job_rerun_reuses_its_rows_and_ignores_a_previous_runs_sample(tmp_path):
    articles = write_scb(tmp_path / "data")
    first = scb.main(["--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"), "--encoder", "tfidf"])
    assert first["counters"][scb_job.METHODS_SCORED] == len(articles)
    stale = tmp_path / "out" / "scb" / "sample-00001-of-00002.jsonl"   # as a run with more shards left it
    stale.write_text(json.dumps({"article_id": 77}) + "\n")
    (tmp_path / "out" / "scb" / "rows" / "tfidf" / "part-old.jsonl").write_text(json.dumps(
        {"article_id": 77, "method": "tfidf", "variant": "all", "algorithm": "kmeans",
         "MI": 0.0, "AMI": 0.0, "RI": 0.0, "ARI": 0.0}) + "\n")
    result = scb.main(["--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"), "--encoder", "tfidf"])
    assert not stale.exists()
    assert {row["article_id"] for row in result["rows"]} == {a["article_id"] for a in articles}
    # Every article's rows were kept by the first run: none is embedded or clustered again.
    assert result["counters"].get(scb_job.METHODS_SCORED, 0) == 0
    assert result["counters"][scb_job.METHODS_KEPT] == len(articles)
    assert result["summary"] == first["summary"] and result["rows"] == first["rows"]
    # Kept rows of another seed, or of another run's data: one line naming the key, before any work.
    rows_files = sorted((tmp_path / "out" / "scb" / "rows").rglob("*"))
    with pytest.raises(UsageError, match=r"rows/tfidf/key.json keeps results of another --seed; .*another --output"):
        scb.main(["--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"), "--encoder", "tfidf",
                  "--seed", "1"])
    write_scb(tmp_path / "data", extra_lines=(json.dumps(scb_article(14, ["Music", "Cooking"])),))
    with pytest.raises(UsageError, match=r"another pipeline run \(another manifest\)"):
        scb.main(["--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"), "--encoder", "tfidf"])
    assert sorted((tmp_path / "out" / "scb" / "rows").rglob("*")) == rows_files
    # A key without rows (a job that failed before scoring) keeps nothing, and refuses nothing.
    for path in (tmp_path / "out" / "scb" / "rows" / "tfidf").glob("part-*"):
        path.unlink()
    reseeded = scb.main(["--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"), "--encoder", "tfidf",
                         "--seed", "1"])
    assert reseeded["counters"][scb_job.METHODS_SCORED] == len(articles) + 1
    assert json.loads((tmp_path / "out" / "scb" / "rows" / "tfidf" / "key.json").read_text())["seed"] == 1


def test_scb_job_reads_and_writes_gcs(tmp_path, gcs_emulator):
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    local = tmp_path / "data"
    write_scb(local)
    data, out = gcs_emulator(), gcs_emulator()
    source = local / "scb" / "part-00000-of-00001.jsonl.gz"
    with FileSystems.create(f"{data}/scb/{source.name}", compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(source.read_bytes())
    write_manifest(data, {"scb": 3})                     # the run is published where it was copied
    result = scb.main(["--data", data, "--output", out, "--encoder", "tfidf", "--runner", "DirectRunner"])
    assert result["articles"] == 3
    assert FileSystems.exists(f"{out}/scb.md") and FileSystems.exists(f"{out}/scb_ari.png")


@pytest.mark.slow   # a whole SCB job: seconds of real work
def test_scb_job_reads_each_scb_file_once_and_samples_as_the_drivers_reading_would(tmp_path, monkeypatch):
    """The job is the SCB files' only reader: the driver's checks read no record, and the seeded
    sample is the one a whole reading of the files gives (`read_articles`, the benchmark's)."""
    write_scb(tmp_path / "data")
    opens = count_scb_opens(monkeypatch)
    result = scb.main(["--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"), "--encoder", "tfidf",
                       "--max-articles", "2", "--seed", "3", "--runner", "DirectRunner"])
    assert dict(opens) == {str(tmp_path / "data" / "scb" / "part-00000-of-00001.jsonl.gz"): 1}
    assert result["counters"]["scb_eval_articles_read"] == 3
    assert {row["article_id"] for row in result["rows"]} == {
        record.article_id for record in scb_job.read_articles(str(tmp_path / "data"), 2, seed=3)}


def test_records_the_job_read_are_checked_against_the_manifest(tmp_path):
    """What the size check before the job cannot see (a shard replaced by one of the same size)
    is refused after it, from the job's own count, before any report."""
    write_scb(tmp_path / "data")
    scb_job.check_scb_read(str(tmp_path / "data"), {"scb_eval_articles_read": 3})
    for read in (2, 4):
        with pytest.raises(published.ShardError, match=f"{tmp_path / 'data' / 'scb'}: {read} "):
            scb_job.check_scb_read(str(tmp_path / "data"), {"scb_eval_articles_read": read})


def test_scb_job_names_the_missing_input(tmp_path):
    with pytest.raises(published.ManifestError, match=f"{tmp_path / 'nothing'} has no manifest.json"):
        scb.main(["--data", str(tmp_path / "nothing"), "--output", str(tmp_path / "out")])


@pytest.mark.slow   # a second whole SCB job (the one above stays in the fast tier)
def test_scb_job_scores_a_seeded_sample_of_articles(tmp_path):
    articles = write_scb(tmp_path / "data")
    runs = [scb.main(["--data", str(tmp_path / "data"), "--output", str(tmp_path / f"out{run}"), "--encoder", "tfidf",
                      "--max-articles", "2", "--seed", str(seed)])
            for run, seed in enumerate((0, 0, 1, 2, 3))]
    sampled = [frozenset(row["article_id"] for row in result["rows"]) for result in runs]
    assert all(len(ids) == 2 and ids <= {a["article_id"] for a in articles} for ids in sampled)
    assert sampled[0] == sampled[1]                 # same seed, same articles
    assert len(set(sampled)) > 1                    # the seed chooses them


@pytest.mark.slow   # seconds: the full tier (the fast tier stays under 3 minutes)
def test_a_missing_model_dir_is_one_error_line_before_any_work(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    write_scb(tmp_path / "data")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "eval.scb", "--data", str(tmp_path / "data"), "--output", str(out),
                           "--model-dir", f"triplets-sen={tmp_path / 'no-such-model'}"],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: --model-dir {tmp_path / 'no-such-model'}: no trained encoder ({tmp_path / 'no-such-model'}/{ENCODER}/"
        "saved_model.pb does not exist; python -m model.train writes it)")
    assert not out.exists()


def test_a_truncated_scb_file_fails_the_job_instead_of_scoring_part_of_it(tmp_path):
    import gzip

    write_scb(tmp_path / "data")
    shard = tmp_path / "data" / "scb" / "part-00000-of-00001.jsonl.gz"
    lines = gzip.decompress(shard.read_bytes()).splitlines(keepends=True)
    shard.write_bytes(gzip.compress(b"".join(lines[:1])))        # one article of three, a valid gzip file
    with pytest.raises(published.ShardError, match=f"{shard}: "):
        scb.main(["--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"), "--encoder", "tfidf"])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow   # seconds: the full tier (the fast tier stays under 3 minutes)
def test_a_misspelt_flag_is_exit_2_before_any_work(tmp_path):
    import subprocess
    import sys

    write_scb(tmp_path / "data")
    for job in ("eval.scb", "eval.all"):
        done = subprocess.run([sys.executable, "-m", job, "--data", str(tmp_path / "data"), "--output",
                               str(tmp_path / "out"), "--max-triplet", "10"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[2], timeout=300)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1] == {   # eval.all has --max-triplets: it is named
            "eval.scb": "error: unknown flag --max-triplet (neither a flag of python -m eval.scb nor a Beam pipeline "
                        "option)",
            "eval.all": "error: unknown flag --max-triplet (did you mean --max-triplets?)"}[job]
        assert not (tmp_path / "out").exists()


@pytest.mark.slow   # a trained encoder and three Beam jobs: the full tier
def test_a_concatenation_of_the_jobs_methods_is_joined_from_their_embeddings(tmp_path, tiny_model):
    """A `concat:` whose parts the job embeds anyway is their embeddings side by side, as its own
    encoder would give: the same rows as a job that encodes it, without encoding the articles again;
    and a part whose rows an earlier run kept is embedded for the concatenation only, not rescored."""
    articles = write_scb(tmp_path / "data")
    data, concat = str(tmp_path / "data"), f"concat:twice={tiny_model}+{tiny_model}"
    alone = scb.main(["--data", data, "--output", str(tmp_path / "alone"), "--encoder", concat])
    part = f"saved:once={tiny_model}"
    part_first = scb.main(["--data", data, "--output", str(tmp_path / "joined"), "--encoder", part])
    joined = scb.main(["--data", data, "--output", str(tmp_path / "joined"), "--encoder", part, "--encoder", concat])

    def rows_of(result, method):
        return sorted((row["article_id"], row["variant"], row["algorithm"], row["ARI"], row["AMI"])
                      for row in result["rows"] if row["method"] == method)

    assert rows_of(joined, "twice") == rows_of(alone, "twice") and len(rows_of(alone, "twice")) > 0
    assert rows_of(joined, "once") == rows_of(part_first, "once")
    # The second run scored the concatenation only: the part's rows were kept, its embeddings joined.
    assert joined["counters"][scb_job.METHODS_SCORED] == len(articles)
    assert joined["counters"][scb_job.METHODS_KEPT] == len(articles)
    assert set(joined["profile"]["encoding"]) == {"once"} and joined["profile"]["encoding"]["once"]["batches"] > 0
    assert set(alone["profile"]["encoding"]) == {"twice"}
    assert joined["profile"]["clustering"]["iclust"]["articles"] == len(articles)


def _distribution(name: str, total: int, count: int, step: str | None, namespace: str = "wikisim_embed"):
    from apache_beam.metrics import monitoring_infos
    from apache_beam.metrics.cells import DistributionData

    return monitoring_infos.int64_user_distribution(namespace, name, DistributionData(total, count, 0, total),
                                                    ptransform=step)


def _job_metrics(infos):
    """What a finished job's PipelineResult.metrics() reads, through Beam's own PortableMetrics."""
    from apache_beam.portability.api import beam_job_api_pb2
    from apache_beam.runners.portability.portable_runner import PortableMetrics

    class Result:
        def metrics(self):
            return PortableMetrics(beam_job_api_pb2.GetJobMetricsResponse(
                metrics=beam_job_api_pb2.MetricResults(committed=infos, attempted=infos)))

    return Result()


def test_job_profile_is_the_same_whether_a_runner_names_steps_by_label_or_transform_id_or_not_at_all():
    """The DirectRunner names a RunInference metric's step `Embed[m]/BeamML_RunInference`, Prism
    `ref_AppliedPTransform_Embed-m-BeamML_RunInference_<n>` and some of its own metrics with no
    step (None): the profile is the same, and `m` never takes `m-2`'s time."""
    from apache_beam.metrics import monitoring_infos
    from apache_beam.metrics.cells import DistributionData

    def infos(step_of):
        return [_distribution("inference_batch_latency_micro_secs", 3_000_000, 3, step_of("m")),
                _distribution("load_model_latency_milli_secs", 250, 1, step_of("m")),
                _distribution("inference_batch_latency_micro_secs", 1_000_000, 2, step_of("m-2")),
                _distribution(scb_job.profile_metric("kmeans"), 40, 3, "Score", namespace=NAMESPACE)]

    direct = infos(lambda method: f"Embed[{method}]/BeamML_RunInference")
    prism = infos(lambda method: f"ref_AppliedPTransform_Embed-{method}-BeamML_RunInference_{len(method)}")
    prism += [_distribution("inference_batch_latency_micro_secs", 9_000_000, 9, None),
              monitoring_infos.int64_distribution(monitoring_infos.SAMPLED_BYTE_SIZE_URN, DistributionData(
                  9921, 3, 2322, 4242), pcollection="ref_PCollection_1")]
    expected = scb_job.job_profile(_job_metrics(direct), ["m", "m-2", "kept"])
    assert expected["encoding"] == {"m": {"seconds": 3.0, "batches": 3, "load_seconds": 0.25},
                                    "m-2": {"seconds": 1.0, "batches": 2, "load_seconds": 0.0}}
    assert expected["clustering"]["kmeans"] == {"seconds": 0.04, "articles": 3}
    assert scb_job.job_profile(_job_metrics(prism), ["m", "m-2", "kept"]) == expected


@pytest.mark.slow   # two real Beam jobs, one on Prism (about 30 s): the full tier
def test_scb_on_prism_reports_what_the_direct_runner_reports(tmp_path):
    import apache_beam

    prism_binary = Path(__file__).resolve().parents[2] / ".cache" / "prism" / f"v{apache_beam.__version__}" / "prism"
    if not prism_binary.exists():
        pytest.skip(f"no Prism binary at {prism_binary} (make prism)")
    write_scb(tmp_path / "data")
    flags = ["--data", str(tmp_path / "data"), "--encoder", "tfidf", "--encoder", "mean-vectors"]
    direct = scb.main([*flags, "--output", str(tmp_path / "direct"), "--runner", "DirectRunner"])
    prism = scb.main([*flags, "--output", str(tmp_path / "prism"), "--runner", "PrismRunner",
                      "--prism_location", str(prism_binary)])
    for key in ("methods", "counters", "articles", "dead_letters", "skipped", "summary", "differences", "rows"):
        assert prism[key] == direct[key], key

    def measured(profile):   # what the profile counts; its seconds are each run's own
        return ({method: entry["batches"] for method, entry in profile["encoding"].items()},
                {step: entry["articles"] for step, entry in profile["clustering"].items()})

    assert measured(prism["profile"]) == measured(direct["profile"])
    assert set(direct["profile"]["encoding"]) == {"tfidf", "mean-vectors"}


def test_a_kept_rows_file_cut_at_a_line_boundary_is_set_aside_and_its_articles_scored_again(tmp_path, capsys):
    """Kept rows files prove themselves whole: one cut at a line boundary (`head -n -1`, which
    still parses) is set aside with one stderr line naming it, so its articles are scored again
    rather than reported with rows missing; an intact file is reused."""
    from eval.kept import KeepRowsFn, kept_articles, read_kept_rows, rows_folder

    def article_rows(article_id):
        return [{"article_id": article_id, "method": "m", "variant": variant, "algorithm": algorithm, "ARI": 0.5}
                for variant in VARIANTS for algorithm in ALGORITHMS]

    keep = KeepRowsFn(str(tmp_path), keep_seconds=0)   # a file per article
    keep.start_bundle()
    for article_id in (1, 2):
        keep.process(article_rows(article_id))
    keep.finish_bundle()
    key = {"spec": "m"}
    assert kept_articles(str(tmp_path), {"m": key}) == {"m": frozenset({1, 2})}
    assert capsys.readouterr().err == ""
    [cut] = [path for path in Path(rows_folder(str(tmp_path), "m")).glob("part-*.jsonl")
             if json.loads(path.read_text().splitlines()[0])["article_id"] == 2]
    cut.write_text("".join(cut.read_text().splitlines(keepends=True)[:-1]))   # head -n -1
    assert kept_articles(str(tmp_path), {"m": key}) == {"m": frozenset({1})}
    assert capsys.readouterr().err.splitlines() == [
        f"eval.scb: the kept file {cut} is not whole ({len(article_rows(2)) - 1} rows where {cut}.whole.json counts "
        f"{len(article_rows(2))}); set aside as {cut}.incomplete: its articles are scored again"]
    assert not cut.exists() and Path(f"{cut}.incomplete").exists()
    assert read_kept_rows(str(tmp_path), ["m"], {1, 2}) == article_rows(1)


@pytest.mark.slow   # two real Beam jobs: the full tier
def test_a_rerun_rescores_the_articles_of_a_kept_rows_file_cut_at_a_line_boundary(tmp_path, capsys):
    """The job end to end: a kept rows file cut by one line is scored again, never reported with n
    one short for its article; the intact files are reused; the report is the first run's."""
    articles = write_scb(tmp_path / "data")
    flags = ["--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"), "--encoder", "tfidf",
             "--keep-seconds", "0"]
    first = scb.main(flags)
    [cut, *intact] = sorted((tmp_path / "out" / "scb" / "rows" / "tfidf").glob("part-*.jsonl"))
    assert len(intact) == len(articles) - 1   # a file per article
    cut.write_text("".join(cut.read_text().splitlines(keepends=True)[:-1]))   # head -n -1
    capsys.readouterr()
    rerun = scb.main(flags)
    assert {entry["articles"] for entry in rerun["summary"] if entry["variant"] == "all"} == {len(articles)}
    assert rerun["summary"] == first["summary"] and rerun["rows"] == first["rows"]
    counters = rerun["counters"]
    assert counters[scb_job.METHODS_SCORED] == 1 and counters[scb_job.METHODS_KEPT] == len(articles) - 1
    assert f"eval.scb: the kept file {cut} is not whole (" in capsys.readouterr().err
