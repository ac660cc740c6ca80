"""The SCB job (`python -m eval.scb`'s, and eval.all's SCB step): the Beam pipeline that reads,
embeds and clusters the articles, and its result, macro-averaged per method x algorithm x
variant (`eval.scb` says what it scores and why the job is the only reader of the SCB files)."""
from __future__ import annotations

import heapq
import json
import os
import re
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from core import jobserver, records
from core.counters import NAMESPACE, job_totals, reported_value
from core.files import is_remote
from core.progress import progress_bar, timed
from core.published import ManifestError, Run, check_record_count
from core.splits import stable_hash
from eval.clustering import cluster_embeddings, clustering_metrics, macro_average
from eval.config import ALGORITHMS, VARIANTS, ScbConfig
from eval.evaluator import EvalResult, Figure, Inputs
from eval.intervals import comparisons, mean_interval
from eval.kept import KeepRowsFn, check_kept, kept_articles, read_kept_rows
from eval.report import read_jsonl, scb_ari_figure, scb_ari_summary, scb_markdown
from model.encoding.encoders import SpecKind, method_names
from model.encoding.inference import EncoderModelHandler, threads_per_worker

NAME = "scb"
ARTICLES_READ = "scb_eval_articles_read"   # the job's counter of SCB lines read, checked against the manifest
METHODS_SCORED = "scb_eval_article_methods_scored"   # (article, method) pairs embedded and clustered by this job
METHODS_KEPT = "scb_eval_article_methods_kept"       # ... whose rows an earlier, killed run kept (eval.kept)
SAMPLE = "scb/sample"   # the ids of the articles the job scores, a JSON line each: the report's rows are theirs
REFUSED_LINES = "scb/dead_letters"   # the SCB lines the job could not parse, a JSON line each
# The job's profile (`job_profile`): per article, each clustering step's milliseconds over all its methods.
PROFILE_STEPS = ("geometry", "kmeans", "iclust", "average-link", "metrics")


def profile_metric(step: str) -> str:
    """The Beam distribution of a profile step's milliseconds per article."""
    return f"scb_eval_ms_{step.replace('-', '_')}"



def variant_subset(record: records.ScbRecord, variant: str) -> np.ndarray:
    """Indices of the article's sentences that a variant clusters."""
    if variant == "all":
        return np.arange(len(record.sentences))
    if variant == "openers":
        return np.flatnonzero(np.asarray(record.openers, dtype=bool))
    raise ValueError(f"unknown SCB variant {variant!r}; expected one of {VARIANTS}")


def score_article(record: records.ScbRecord, embeddings_by_method: dict[str, np.ndarray], seed: int,
                  seconds: dict[str, float] | None = None) -> list[dict]:
    """Per method, variant and algorithm: the clustering metrics of one article; `seconds` (where
    given) adds the time of each clustering algorithm and of the metrics (`PROFILE_STEPS`).

    k is the number of sections that have sentences in the variant; a variant with fewer than
    two such sections is skipped (openers only can lose whole sections) and reported as such.
    All methods' embeddings of the article are clustered together (`cluster_embeddings`)."""
    rows = []
    spent: dict[str, float] = {} if seconds is None else seconds
    labels = np.asarray(record.labels)
    for variant in VARIANTS:
        subset = variant_subset(record, variant)
        n_clusters = len(np.unique(labels[subset]))
        if n_clusters < 2:
            rows += [{"article_id": record.article_id, "method": method, "variant": variant,
                      "skipped": f"{n_clusters} section(s) with {variant} sentences"}
                     for method in embeddings_by_method]
            continue
        predictions = cluster_embeddings({method: embeddings[subset] for method, embeddings
                                          in embeddings_by_method.items()}, n_clusters, seed, spent)
        with timed(spent, "metrics"):
            for method, by_algorithm in predictions.items():
                for algorithm, predicted in by_algorithm.items():
                    rows.append({
                        "article_id": record.article_id, "title": record.title, "method": method,
                        "variant": variant, "algorithm": algorithm, "sentences": int(len(subset)),
                        "k": int(n_clusters), **clustering_metrics(labels[subset], predicted),
                    })
    return rows


class ParseScbFn(beam.DoFn):
    """JSON lines -> `ScbRecord`s; malformed lines -> the `dead_letters` output, counted."""

    def __init__(self, source: str):
        self.source = source
        self.read = beam.metrics.Metrics.counter(NAMESPACE, ARTICLES_READ)
        self.malformed = beam.metrics.Metrics.counter(NAMESPACE, "scb_eval_articles_malformed")

    def process(self, line: str):
        self.read.inc()
        try:
            yield records.ScbRecord.from_json(line)
        except records.RecordError as error:
            self.malformed.inc()
            yield beam.pvalue.TaggedOutput(records.DEAD_LETTERS, {
                "stage": "eval-scb", "source": self.source, "page_id": None, "title": None,
                "reason": "malformed_scb_record", "detail": f"{error}: {line[:200]}"})


class ScoreArticleFn(beam.DoFn):
    """(article, its embeddings by the methods that do not keep its rows) -> the article's score
    rows, as one list (`eval.kept.KeepRowsFn` writes them)."""

    def __init__(self, seed: int, methods: int, articles: int | None = None):
        self.seed = seed
        self.methods = methods     # every method of the job: those missing from an article keep its rows
        self.articles = articles   # the progress bar's total: the articles the job scores
        self.sentences = beam.metrics.Metrics.counter(NAMESPACE, "scb_eval_sentences_scored")
        self.skipped = beam.metrics.Metrics.counter(NAMESPACE, "scb_eval_variants_skipped")
        self.scored = beam.metrics.Metrics.counter(NAMESPACE, METHODS_SCORED)
        self.kept = beam.metrics.Metrics.counter(NAMESPACE, METHODS_KEPT)
        self.milliseconds = {step: beam.metrics.Metrics.distribution(NAMESPACE, profile_metric(step))
                             for step in PROFILE_STEPS}

    def setup(self):
        self.progress = progress_bar(desc="scb articles clustered", unit="article", total=self.articles)

    def process(self, embedded: tuple[records.ScbRecord, dict[str, Any]]):   # (article, its embeddings by method)
        record, embeddings_by_method = embedded
        self.scored.inc(len(embeddings_by_method))
        self.kept.inc(self.methods - len(embeddings_by_method))
        if embeddings_by_method:
            self.sentences.inc(len(record.sentences))
            seconds: dict[str, float] = {}
            rows = score_article(record, embeddings_by_method, self.seed, seconds)
            for step, distribution in self.milliseconds.items():
                distribution.update(round(1e3 * seconds.get(step, 0.0)))
            self.skipped.inc(sum("skipped" in row for row in rows))
            yield rows
        self.progress.update()

    def teardown(self):
        self.progress.close()


def count_articles_scored(record: records.ScbRecord) -> records.ScbRecord:
    beam.metrics.Metrics.counter(NAMESPACE, "scb_eval_articles_scored").inc()
    return record


def sample_rank(record: records.ScbRecord, seed: int) -> int:
    """The order in which a seeded sample takes articles: the same in every run and on every runner."""
    return stable_hash("scb-sample", seed, record.article_id)


def read_articles(data: str, max_articles: int | None = None, seed: int = 0) -> list[records.ScbRecord]:
    """The run's SCB articles (or the seeded sample the job scores) in one process, for
    measurements beside the job (`eval.benchmark`), which reads the files itself; a malformed
    line is skipped, as the job sets it aside."""
    articles = []
    for path in scb_files(data):
        with FileSystems.open(path) as handle:
            for line in handle.read().decode("utf-8").splitlines():
                try:
                    articles.append(records.ScbRecord.from_json(line))
                except records.RecordError:
                    continue
    return heapq.nsmallest(max_articles, articles, key=lambda record: sample_rank(record, seed)) if max_articles \
        else articles


def scb_files(data: str) -> list[str]:
    """The SCB files of a pipeline run, from its manifest (a folder without one is refused)."""
    try:
        return Run.open(data).paths(records.SCB)
    except ManifestError as error:
        raise FileNotFoundError(str(error)) from None


def build_pipeline(pipeline: beam.Pipeline, config: ScbConfig, kept: dict[str, frozenset[int]]) -> None:
    """read SCB -> parse (dead letters aside) -> [seeded sample] -> embed by each method that does
    not keep the article's rows (`kept`: method -> article ids) -> score per article -> rows
    written whole into each method's rows folder (`eval.kept`), as they are scored.

    The sample keeps the `max_articles` articles of smallest `sample_rank`: the same articles in
    every run and on every runner, chosen here and nowhere else; their ids go to `SAMPLE`."""
    parsed = (
        pipeline
        | "ListScb" >> beam.Create(scb_files(config.data))
        | "ReadScb" >> beam.io.ReadAllFromText()
        | "Parse" >> beam.ParDo(ParseScbFn(FileSystems.join(config.data, records.SCB))).with_outputs(
            records.DEAD_LETTERS, main="articles")
    )
    articles = parsed.articles
    if config.max_articles:
        seed = config.seed
        articles = (articles
                    | "Sample" >> beam.combiners.Top.Of(config.max_articles,
                                                        key=lambda record: -sample_rank(record, seed))
                    | "Unlist" >> beam.FlatMap(lambda sample: sample)
                    | "Spread" >> beam.Reshuffle())   # Top.Of's one list would keep the sample on one worker
    (articles
     | "SampleIds" >> beam.Map(lambda record: json.dumps({"article_id": record.article_id}))
     | "WriteSampleIds" >> beam.io.WriteToText(FileSystems.join(config.output, SAMPLE), file_name_suffix=".jsonl"))
    embedded = articles | "CountArticles" >> beam.Map(lambda record: (count_articles_scored(record), {}))
    specs = config.methods.specs()
    composed = concatenated_parts(specs)
    threads = threads_per_worker(pipeline.options)
    for spec, method in zip(specs, method_names(specs)):
        if method not in composed:   # a part also embeds what a concatenation of it needs
            needed_by = [concat for concat, parts in composed.items() if method in parts]
            embedded = embed_unless_kept(embedded, spec, method,
                                         kept[method].intersection(*(kept[concat] for concat in needed_by)), threads)
    for concat, parts in composed.items():
        embedded = embedded | f"Concatenate[{concat}]" >> beam.Map(
            concatenate_parts, concat, parts, kept[concat], {part: kept[part] for part in parts})
    listed = Run.open(config.data).output(records.SCB).records
    scored = min(listed, config.max_articles) if config.max_articles else listed
    (embedded
     | "Score" >> beam.ParDo(ScoreArticleFn(config.seed, len(specs), scored))
     | "KeepRows" >> beam.ParDo(KeepRowsFn(config.output, config.keep_seconds)))
    (parsed[records.DEAD_LETTERS]
     | "DeadLettersToJson" >> beam.Map(json.dumps)
     | "WriteDeadLetters" >> beam.io.WriteToText(FileSystems.join(config.output, REFUSED_LINES),
                                                 file_name_suffix=".jsonl"))


def embed_unless_kept(embedded: beam.PCollection, spec, method: str, kept_ids: frozenset[int],
                      threads: int | None = None) -> beam.PCollection:
    """Adds `method`'s embeddings to each (article, embeddings by method) whose rows it does not
    keep, through RunInference (one element = one article's sentences, encoded together; a kept
    article's element is empty, and is not encoded), the encoder on `threads` threads in each
    worker (`threads_per_worker`). One chain of maps, no Partition and Flatten:
    the runner fuses every method's step with the scoring and the writing of the rows, so an
    article's rows are kept as soon as it is scored, not after every article is embedded."""
    from apache_beam.ml.inference.base import KeyedModelHandler, RunInference  # PyTorch too, where installed

    return (embedded
            | f"Sentences[{method}]" >> beam.Map(lambda keyed, ids=kept_ids: (
                keyed, () if keyed[0].article_id in ids else tuple(keyed[0].sentences)))
            | f"Embed[{method}]" >> RunInference(KeyedModelHandler(EncoderModelHandler(spec, 1, 8, threads)))
            | f"Add[{method}]" >> beam.Map(add_embeddings, method))


def concatenated_parts(specs: list) -> dict[str, tuple[str, ...]]:
    """concatenation method -> the job's methods whose embeddings it joins, for each `concat:`
    spec every part of which the job embeds as a `saved:` method of the same export: its
    encoder is theirs side by side (`ConcatEncoder`), so the job joins their embeddings instead
    of encoding each article twice more."""
    saved = {spec.paths[0]: spec.name for spec in specs if spec.kind is SpecKind.SAVED}
    return {spec.name: tuple(saved[path] for path in spec.paths) for spec in specs
            if spec.kind is SpecKind.CONCAT and all(path in saved for path in spec.paths)}


def concatenate_parts(element: tuple[records.ScbRecord, dict[str, Any]], concat: str, parts: tuple[str, ...],
                      kept_ids: frozenset[int], kept_by_part: dict[str, frozenset[int]]):
    """(article, embeddings by method) with the concatenation's embeddings joined from its parts'
    (unless it keeps the article's rows), and without a part's that keeps its own rows (it was
    embedded for the concatenation only, and is not scored again)."""
    record, embeddings_by_method = element
    if record.article_id not in kept_ids:
        embeddings_by_method = {**embeddings_by_method,
                                concat: np.concatenate([embeddings_by_method[part] for part in parts], axis=1)}
    return record, {method: embeddings for method, embeddings in embeddings_by_method.items()
                    if record.article_id not in kept_by_part.get(method, ())}


def add_embeddings(keyed, method: str) -> tuple[records.ScbRecord, dict[str, Any]]:
    """((article, embeddings by method), RunInference's result) -> the article with `method`'s
    embeddings added, unless it was not embedded (its rows are kept)."""
    (record, embeddings_by_method), result = keyed
    if result.inference is None:
        return record, embeddings_by_method
    return record, {**embeddings_by_method, method: result.inference}


def check_scb_input(data: str) -> None:
    """Before any work, without reading a record (the job is the files' only reader): a clear
    error naming the path when the manifest lists no SCB file, or naming the first shard that is
    missing or not of the size the run wrote (`Run.check_sizes`). `check_scb_read` completes the
    check from the job's own count."""
    if not scb_files(data):
        raise FileNotFoundError(f"{data}: the run's manifest lists no SCB file")
    Run.open(data).check_sizes(records.SCB)


def check_scb_read(data: str, counters: dict[str, int]) -> None:
    """ShardError when the job read other than the records the manifest lists (replaced shards
    of the same size): the report of part of the articles, or of others, is refused."""
    check_record_count(FileSystems.join(data, records.SCB), counters.get(ARTICLES_READ, 0),
                       Run.open(data).output(records.SCB).records)


def remove_previous_rows(output: str) -> None:
    """Deletes a previous run's sample and dead-letter files, which a run with fewer shards would
    not overwrite, and what its killed job's sinks left (`leftover_sink_temps`); the kept rows
    stay (`eval.kept`)."""
    stale = [metadata.path for sink in (SAMPLE, REFUSED_LINES)
             for metadata in FileSystems.match([FileSystems.join(output, f"{sink}-*.jsonl")])[0].metadata_list]
    stale += leftover_sink_temps(output)
    if stale:
        FileSystems.delete(stale)


def leftover_sink_temps(output: str) -> list[str]:
    """What a killed job's sinks (`SAMPLE`, `REFUSED_LINES`) left in `<output>/scb`: Beam writes a
    sink's shards into `beam-temp-<name>-<uuid1 hex>` beside them and deletes that folder when the
    step ends. Those names only, each the folder (local) or its files (remote); the report's claim,
    taken before, says no other job writes there now."""
    folder = FileSystems.join(output, "scb")
    own = re.compile(rf"beam-temp-({'|'.join(re.escape(sink.split('/')[-1]) for sink in (SAMPLE, REFUSED_LINES))})"
                     r"-[0-9a-f]{32}$")
    if not is_remote(output):
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        return [os.path.join(folder, name) for name in names
                if own.match(name) and os.path.isdir(os.path.join(folder, name))]
    found = FileSystems.match([FileSystems.join(folder, "beam-temp-*/**")])[0].metadata_list
    return [metadata.path for metadata in found if own.match(metadata.path[len(folder) + 1:].split("/")[0])]


def job_profile(pipeline_result, methods: list[str]) -> dict:
    """Where the SCB job's time went, summed over its workers (seconds): each encoding method's
    (RunInference's own batch latencies and model loads, step `Embed[method]`) and each clustering
    step over all methods (`PROFILE_STEPS`), with the articles each covers. A distribution a runner
    reports without a value adds nothing (the profile is a measurement, not a reconciled count)."""
    def distribution(metric) -> tuple[int, int]:   # (sum, count)
        value = reported_value(metric)
        return (value.sum, value.count) if value is not None else (0, 0)

    queried = pipeline_result.metrics().query(MetricsFilter())["distributions"]
    of_method = {id(metric): embedding_method(metric.key.step, methods) for metric in queried}
    encoding = {}
    for method in methods:
        steps = [metric for metric in queried if of_method[id(metric)] == method]
        if not steps:   # joined from its parts' embeddings (`concatenated_parts`)
            continue
        batches = [distribution(metric) for metric in steps
                   if metric.key.metric.name == "inference_batch_latency_micro_secs"]
        loads = [distribution(metric) for metric in steps if metric.key.metric.name == "load_model_latency_milli_secs"]
        encoding[method] = {"seconds": sum(total for total, _ in batches) / 1e6,
                            "batches": sum(count for _, count in batches),
                            "load_seconds": sum(total for total, _ in loads) / 1e3}
    clustering = {}
    for step in PROFILE_STEPS:
        found = [distribution(metric) for metric in queried
                 if metric.key.metric.namespace == NAMESPACE and metric.key.metric.name == profile_metric(step)]
        clustering[step] = {"seconds": sum(total for total, _ in found) / 1e3,
                            "articles": sum(count for _, count in found)}
    return {"encoding": encoding, "clustering": clustering}


def embedding_method(step: str | None, methods: list[str]) -> str | None:
    """The method whose `Embed[method]` step reported a metric, or None. The DirectRunner names the
    step by its label (`Embed[m]/BeamML_RunInference`), a portable runner (Prism) by the id the
    SDK gave the transform, the label's other characters as `-` (`ref_AppliedPTransform_Embed-m-
    BeamML_RunInference_42`), and reports some of its own metrics with no step: those are none
    of a method's. The longest match wins, so method `m` never takes `m-2`'s metrics."""
    if not step:
        return None
    portable = step.removeprefix("ref_AppliedPTransform_")
    matching = [method for method in methods
                if step.startswith(f"Embed[{method}]/") or step == f"Embed[{method}]"
                or (portable != step and portable.startswith(re.sub(r"[^a-zA-Z0-9_-]+", "-", f"Embed[{method}]/")))]
    return max(matching, key=len, default=None)


def summarise(rows: list[dict], seed: int = 0) -> list[dict]:
    """Macro-averages per variant x method x algorithm over the scored articles, the mean ARI with
    its 95 % bootstrap interval over them."""
    summary = []
    for variant in VARIANTS:
        scored = [row for row in rows if row["variant"] == variant and "skipped" not in row]
        for entry in macro_average(scored):
            ari = [row["ARI"] for row in scored if (row["method"], row["algorithm"]) == (entry["method"],
                                                                                        entry["algorithm"])]
            summary.append({"variant": variant, **entry, "ARI_interval": mean_interval(ari, seed)})
    return summary


def ari_differences(rows: list[dict], seed: int = 0) -> list[dict]:
    """Per variant and algorithm, each method's mean per-article ARI minus each reference
    method's, with a paired bootstrap over the articles all methods scored (`eval.intervals`)."""
    differences = []
    for variant in VARIANTS:
        for algorithm in ALGORITHMS:
            ari: dict[str, dict[int, float]] = {}   # method -> article id -> ARI
            for row in rows:
                # a skipped article-variant (fewer than 2 sections) has no algorithm
                if "skipped" not in row and row["variant"] == variant and row["algorithm"] == algorithm:
                    ari.setdefault(row["method"], {})[row["article_id"]] = row["ARI"]
            if not ari:
                continue
            common = sorted(set.intersection(*(set(scores) for scores in ari.values())))
            per_method = {method: np.array([scores[article] for article in common]) for method, scores in ari.items()}
            differences += [{"variant": variant, "algorithm": algorithm, **row}
                            for row in comparisons(per_method, seed)]
    return differences


def run(config: ScbConfig, inputs: Inputs) -> EvalResult:
    """Runs the job (Beam's options: `inputs.beam_args`); its result, the report's tables and the
    per-article ARI plot. The caller has checked the input and the encoders (`check_scb_input`,
    `check_encoder_specs`) before any work of its own."""
    specs = config.methods.specs()
    options = PipelineOptions(inputs.beam_args)
    jobserver.prepare_portable_run(options)   # a runner that cannot run refused before any work
    kept = kept_articles(config.output, check_kept(config.output, specs, Run.open(config.data).sha256, config.seed))
    remove_previous_rows(config.output)
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, config, kept)
    with jobserver.run_job(pipeline) as pipeline_result:
        counters = job_totals(pipeline_result)
        profile = job_profile(pipeline_result, method_names(specs))
    check_scb_read(config.data, counters)
    sample = {row["article_id"] for row in read_jsonl(FileSystems.join(config.output, f"{SAMPLE}-*.jsonl"))}
    rows = read_kept_rows(config.output, method_names(specs), sample)
    dead_letters = read_jsonl(FileSystems.join(config.output, f"{REFUSED_LINES}-*.jsonl"))
    result = {
        "methods": method_names(config.methods.specs()),   # the order of the report's rows and boxes
        "counters": counters,
        "profile": profile,
        "articles": len({row["article_id"] for row in rows}),
        "dead_letters": len(dead_letters),
        "skipped": [row for row in rows if "skipped" in row],
        "summary": summarise(rows, config.seed),
        "differences": ari_differences(rows, config.seed),
        "rows": [row for row in rows if "skipped" not in row],
    }
    return EvalResult(NAME, result, scb_markdown(result), (Figure("scb_ari.png", "per-article ARI",
                                                                  scb_ari_figure(result)),),
                      scb_ari_summary(result))


