"""Thin Beam compositions of the pure functions in `wikitext`, `rules`, `triplets`, `records`.

Every record that does not go on is counted under a named counter in the "wikisim"
namespace (`counters.NAMESPACE`, names in `pipeline.counters`); `pipeline.run` writes them all to stats.json.
"""
from __future__ import annotations

import collections
import uuid

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from pipeline import counters, order, records, runs, sinks, triplets
from pipeline.dumps import Page, dead_letter
from pipeline.records import DATASET_OF_STRATEGY, DEAD_LETTERS
from pipeline.rules import Article, RuleConfig, build_article, scb_eligible
from pipeline.sentences import ParagraphTooLong, SentenceSplitter
from pipeline.splits import SPLITS, split_of
from pipeline.triplets import NegativeStrategy
from pipeline.wikitext import parse_wikitext

ARTICLE_NAMESPACE = 0


def count(name: str, value: int = 1) -> None:
    Metrics.counter(counters.NAMESPACE, name).inc(value)


def increment_all(counts: collections.Counter) -> None:
    for name, value in counts.items():
        if value:
            count(name, value)


class _BuildArticlesFn(beam.DoFn):
    """Page -> Article, or a counter saying why not (and a dead letter for parse failures)."""

    def __init__(self, seed: int, spacy_model: str, rules: RuleConfig):
        self.seed = seed
        self.spacy_model = spacy_model
        self.rules = rules
        self.splitter: SentenceSplitter | None = None   # built on the worker (setup)

    def setup(self):
        self.splitter = SentenceSplitter(self.spacy_model)

    def process(self, page: Page):
        if page.namespace != ARTICLE_NAMESPACE:
            count(counters.PAGES_NON_ARTICLE)
            return
        if page.redirect:
            count(counters.PAGES_REDIRECT)
            return
        try:
            parsed = parse_wikitext(page.text)
        except Exception as err:  # one malformed page must not stop the run: count, set aside
            count(counters.PARSE_ERRORS)
            letter = dead_letter(page.source, page.page_id, page.title, "parse_error", f"{type(err).__name__}: {err}")
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, dict(letter, stage="parse"))  # the shared shape
            return
        split = split_of(page.page_id, self.seed)
        assert self.splitter is not None, "setup() builds the splitter"
        try:
            article, counts = build_article(page.page_id, page.title, split, parsed, self.splitter, self.rules)
        except ParagraphTooLong as err:
            count(counters.PARAGRAPHS_TOO_LONG)
            letter = dead_letter(page.source, page.page_id, page.title, "paragraph_too_long", str(err))
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, dict(letter, stage="sentences"))
            return
        increment_all(counts)
        if article is not None:
            yield article


class BuildArticles(beam.PTransform):
    """Pages -> {"articles": PCollection[Article], "dead_letters": PCollection[dict]}."""

    def __init__(self, seed: int, spacy_model: str, rules: RuleConfig):
        super().__init__()
        self.fn = _BuildArticlesFn(seed, spacy_model, rules)

    def expand(self, pages):
        outputs = pages | beam.ParDo(self.fn).with_outputs(DEAD_LETTERS, main="articles")
        return {"articles": outputs.articles, DEAD_LETTERS: outputs[DEAD_LETTERS]}


def unfilled_slots_counter(strategy: NegativeStrategy) -> str:
    """The counter of `strategy`'s slots that got no triplet (no opener, or for other_article no donor)."""
    return counters.NO_DONOR if strategy == NegativeStrategy.OTHER_ARTICLE else counters.no_opener_counter(strategy)


def records_by_split(dataset: str, made: list[triplets.Triplet]):
    """The triplets of one article as serialised `tf.train.Example`s, one (article id, list)
    per split (in the order made), each a tagged output named after its split, counted per split
    in one increment each. Serialising where the triplets are made, and handing Beam one element
    per article and split, spares it a Partition step, a serialising step and a counter call per
    triplet."""
    batches: dict[str, list[bytes]] = {}
    for triplet, record in zip(made, records.triplet_examples(made)):
        batches.setdefault(triplet.split, []).append(record)
    for split, batch in batches.items():
        count(counters.split_counter(dataset, split), len(batch))
        yield beam.pvalue.TaggedOutput(split, (made[0].article_id, batch))


def by_split(outputs) -> dict:
    """{split: PCollection[(article id, list[bytes])]} of a ParDo tagged by `records_by_split`."""
    return {split: outputs[split] for split in SPLITS}


class _SentenceTripletsFn(beam.DoFn):
    def __init__(self, strategy: NegativeStrategy, seed: int, rules: RuleConfig):
        self.make = {NegativeStrategy.ADJACENT: triplets.adjacent_triplets,
                     NegativeStrategy.SAME_ARTICLE: triplets.same_article_triplets}[strategy]
        self.dataset = DATASET_OF_STRATEGY[strategy]
        self.no_opener_counter = counters.no_opener_counter(strategy)
        self.seed = seed
        self.rules = rules

    def process(self, article: Article):
        made, no_opener = self.make(article, self.seed, self.rules)
        count(self.no_opener_counter, no_opener)
        yield from records_by_split(self.dataset, made)


class _OtherArticleTripletsFn(beam.DoFn):
    def __init__(self, seed: int, rules: RuleConfig):
        self.dataset = DATASET_OF_STRATEGY[NegativeStrategy.OTHER_ARTICLE]
        self.seed = seed
        self.rules = rules

    def process(self, bucket_and_articles):
        _, bucket = bucket_and_articles
        bucket = list(bucket)
        for article in bucket:
            made, missing = triplets.other_article_triplets(article, bucket, self.seed, self.rules)
            count(counters.NO_DONOR, missing)
            yield from records_by_split(self.dataset, made)


class SentenceTriplets(beam.PTransform):
    """Articles -> triplets-sen with one negative strategy (see `pipeline.triplets`), serialised,
    as {split: PCollection[list[bytes]]}."""

    def __init__(self, strategy: NegativeStrategy, seed: int, rules: RuleConfig, other_article_bucket_size: int):
        super().__init__()
        self.strategy = strategy
        self.seed = seed
        self.rules = rules
        self.bucket_size = other_article_bucket_size

    def expand(self, articles):
        if self.strategy != NegativeStrategy.OTHER_ARTICLE:
            return by_split(articles | beam.ParDo(_SentenceTripletsFn(self.strategy, self.seed, self.rules))
                            .with_outputs(*SPLITS))
        seed, bucket_size = self.seed, self.bucket_size
        n_articles = articles | "CountArticles" >> beam.combiners.Count.Globally()
        return by_split(
            articles
            | "SentencesOnly" >> beam.Map(triplets.sentences_only)
            | "KeyByBucket"
            >> beam.Map(
                lambda article, n: (
                    triplets.other_article_bucket(
                        article.article_id, seed, triplets.n_other_article_buckets(n, bucket_size)
                    ),
                    article,
                ),
                n=beam.pvalue.AsSingleton(n_articles),
            )
            | "GroupBuckets" >> beam.GroupByKey()
            | "DrawFromOtherArticles"
            >> beam.ParDo(_OtherArticleTripletsFn(self.seed, self.rules)).with_outputs(*SPLITS)
        )


class TitleTriplets(beam.PTransform):
    """Articles -> triplets-titles, serialised, as {split: PCollection[list[bytes]]}."""

    def expand(self, articles):
        return by_split(articles | beam.FlatMap(
            lambda article: records_by_split(records.TITLES_DATASET, triplets.title_triplets(article))
        ).with_outputs(*SPLITS))


def keyed_chunks(article_and_records: tuple[int, list[bytes]], seed: int, dataset: str, split: str):
    """(order key, chunk of records) of one article's records of one split (`pipeline.order`)."""
    article_id, batch = article_and_records
    for index, chunk in enumerate(order.chunks(batch)):
        yield order.order_key(seed, dataset, split, article_id, index), chunk


class _SortedRunsFn(beam.DoFn):
    """One split's records -> `runs.RunInfo`s: each article's chunks and their order keys
    (`keyed_chunks`) gathered into a `runs.RunBuffer`, written as a sorted run whenever it holds
    `run_bytes` of records, and the rest at the end of the bundle."""

    def __init__(self, temp_folder: str, seed: int, dataset: str, split: str, run_bytes: int):
        self.temp_folder = temp_folder
        self.seed, self.dataset, self.split = seed, dataset, split
        self.run_bytes = run_bytes
        self.buffer: runs.RunBuffer | None = None

    def start_bundle(self):
        self.buffer = runs.RunBuffer(self.temp_folder, self.run_bytes)

    def process(self, article_and_records: tuple[int, list[bytes]]):
        assert self.buffer is not None, "start_bundle() makes the buffer"
        for key, chunk in keyed_chunks(article_and_records, self.seed, self.dataset, self.split):
            written = self.buffer.add(key, chunk)
            if written:
                yield written

    def finish_bundle(self):
        assert self.buffer is not None, "start_bundle() makes the buffer"
        written = self.buffer.flush()
        if written:
            yield GlobalWindows.windowed_value(written)


class _WriteShardFn(beam.DoFn):
    """Writes one shard, merged from the split's runs (`runs.shard_chunks`), to the split's
    temporary folder (TFRecord and Parquet)."""

    def __init__(self, temp_folder: str):
        self.temp_folder = temp_folder

    def process(self, plan: tuple[int, int, list[runs.RunInfo]]):
        index, n_shards, infos = plan
        chunks = runs.shard_chunks(infos, index, n_shards)
        yield from sinks.write_triplet_shard(self.temp_folder, index, n_shards, chunks)


class WriteTripletSplits(beam.PTransform):
    """{split: (article id, serialised triplets)} -> `<out>/<dataset>/<split>/part-SSSSS-of-NNNNN.tfrecord.gz`
    (and its Parquet twin `.parquet`, `pipeline.parquet`), each split in its fixed pseudo-random
    order (`pipeline.order`): chunks keyed by a seeded hash, sorted into runs by each worker and
    merged by shard (`pipeline.runs`: no shuffle carries a triplet, so a local run's memory does
    not grow with the split), written to a temporary folder and renamed into place once every
    shard is written. A split that gets no triplet is written as one empty shard, so every split
    of every dataset is readable (as zero records).

    The shard count comes from the runs' sizes, gathered in one list, rather than from side
    inputs over the chunks: on the DirectRunner's multi_processing mode (Beam 2.77, 2 workers)
    the PCollection held back while such side inputs were computed lost 1-10 % of the 2019
    dump's train chunks in 2 runs of 2 (docs/pipeline.md). The shard plans pass a Reshuffle,
    which spreads the shards over the workers.
    """

    def __init__(self, output: str, dataset: str, seed: int, run_bytes: int = runs.RUN_BYTES):
        super().__init__()
        self.output = output.rstrip("/")
        self.dataset = dataset
        self.seed = seed
        self.run_bytes = run_bytes
        self.run_id = uuid.uuid4().hex   # one temporary folder per split and run; a retried shard rewrites its file

    def expand(self, records_of_split):
        for split in SPLITS:
            folder = f"{self.output}/{self.dataset}/{split}"
            temp_folder = f"{folder}/beam-temp-part-{self.run_id}"
            _ = (records_of_split[split]
                 | f"SortedRuns[{split}]" >> beam.ParDo(_SortedRunsFn(temp_folder, self.seed, self.dataset, split,
                                                                      self.run_bytes))
                 | f"AllRuns[{split}]" >> beam.combiners.ToList()
                 | f"PlanShards[{split}]" >> beam.FlatMap(runs.shard_plans)
                 | f"Spread[{split}]" >> beam.Reshuffle()
                 | f"WriteShards[{split}]" >> beam.ParDo(_WriteShardFn(temp_folder))
                 | f"AllShards[{split}]" >> beam.combiners.ToList()
                 | f"Finalize[{split}]" >> beam.Map(sinks.finalize_shards, folder, temp_folder))
        return beam.pvalue.PDone(records_of_split[SPLITS[0]].pipeline)


class WriteJsonLines(beam.PTransform):
    """Records (`to_json`) or dicts -> `<prefix>-NNNNN-of-MMMMM.jsonl.gz`, counting each under `counter_name`."""

    def __init__(self, prefix: str, counter_name: str):
        super().__init__()
        self.prefix = prefix
        self.counter_name = counter_name

    def expand(self, dicts):
        counter_name = self.counter_name

        def to_line(record) -> str:
            count(counter_name)
            return records.json_line(record)

        return (
            dicts
            | "ToJson" >> beam.Map(to_line)
            | "Write" >> sinks.write_text(self.prefix)
        )


class ScbRecords(beam.PTransform):
    """Test-split articles with 5..12 sections -> SCB records (counts their sentences too)."""

    def __init__(self, rules: RuleConfig):
        super().__init__()
        self.rules = rules

    def expand(self, articles):
        rules = self.rules

        def record(article: Article):
            if not scb_eligible(article.split, len(article.sections), rules):
                count(counters.SCB_ARTICLES_NOT_ELIGIBLE)
                return
            scb = records.ScbRecord.from_article(article)
            count(counters.SCB_SENTENCES, len(scb.sentences))
            yield scb

        return articles | beam.FlatMap(record)


class PassageRecords(beam.PTransform):
    """Articles (every split) -> passages records: each article's lead and kept sections' paragraphs."""

    def expand(self, articles):
        return articles | beam.Map(records.PassagesRecord.from_article)
