"""The job's middle stages as thin Beam compositions of pure functions: pages -> ruled articles
(`pipeline.parse`, `pipeline.triplets.rules`) -> serialised triplets per split (`pipeline.triplets.make`).

Every record that does not go on is counted under a named counter in the "wikisim" namespace
(`counters.NAMESPACE`, names in `core.counters`); `pipeline.run` writes them all to stats.json.
"""
from __future__ import annotations

import collections

import apache_beam as beam
from apache_beam.metrics import Metrics

from core import counters
from core.records import DATASET_OF_STRATEGY, DEAD_LETTERS, TITLES_DATASET, NegativeStrategy
from core.splits import SPLITS, split_of
from pipeline.parse.sentences import ParagraphTooLong, SentenceSplitter
from pipeline.parse.wikitext import parse_wikitext
from pipeline.read.dumps import Page, dead_letter
from pipeline.triplets import make as triplets
from pipeline.triplets.rules import Article, RuleConfig, build_article
from pipeline.write.examples import triplet_examples

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


def records_by_split(dataset: str, made: list[triplets.Triplet]):
    """The triplets of one article as serialised `tf.train.Example`s, one (article id, list)
    per split (in the order made), each a tagged output named after its split, counted per split
    in one increment each. Serialising where the triplets are made, and handing Beam one element
    per article and split, spares it a Partition step, a serialising step and a counter call per
    triplet."""
    batches: dict[str, list[bytes]] = {}
    for triplet, record in zip(made, triplet_examples(made)):
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
    """Articles -> triplets-sen with one negative strategy (see `pipeline.triplets.make`), serialised,
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
            lambda article: records_by_split(TITLES_DATASET, triplets.title_triplets(article))
        ).with_outputs(*SPLITS))
