"""Each Beam transform of the pipeline on its own: TestPipeline (DirectRunner) + assert_that.

The inputs are real Wikipedia pages: the pages of the embedded excerpt (the gensim wheel's, as
the demo reads it) with under `MAX_PAGE_CHARS` characters of wikitext, so that each pipeline
runs in seconds. What each transform must output is computed here from the pure functions it
composes (`rules.build_article`, `triplets.*_triplets`, `records.*`), applied element by
element, and checked again against properties that can be read off the articles (anchor and
positive openers of one section, the negative where its rule takes it from, no record in
another split's output, counters equal to what was set aside or left unfilled).
"""
from __future__ import annotations

import collections
import gzip
import json

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing import test_pipeline  # the module: pytest would try to collect a class named Test*
from apache_beam.testing.util import BeamAssertException, assert_that, equal_to

from core import counters, records
from core.records import DATASET_OF_STRATEGY, DEAD_LETTERS
from core.splits import SPLITS, split_of
from pipeline.parse.sentences import DEFAULT_SPACY_MODEL, SentenceSplitter
from pipeline.parse.wikitext import parse_wikitext
from pipeline.read.dumps import Page, dead_letter, decode_pages, embedded_dump_path
from pipeline.triplets import make as triplets
from pipeline.triplets.rules import (
    RuleConfig,
    build_article,
    paragraph_openers,
    positive_pairs,
    scb_eligible,
    triplet_slots,
)
from pipeline.triplets.transforms import BuildArticles, SentenceTriplets, TitleTriplets
from pipeline.write import examples
from pipeline.write.transforms import PassageRecords, ScbRecords, WriteJsonLines, WriteTripletSplits

SEED = 3
RULES = RuleConfig()
MAX_PAGE_CHARS = 40_000   # the excerpt's smaller pages: ~150 of its 206, 15 of them articles that pass the rules
MALFORMED_ID, GIANT_ID, ONE_SECTION_ID = 10**9, 10**9 + 1, 10**9 + 2


def counter(result, name: str) -> int:
    """The committed value of one "wikisim" counter of a finished pipeline, summed over its steps."""
    found = result.metrics().query(MetricsFilter().with_namespace(counters.NAMESPACE).with_name(name))["counters"]
    return sum(metric.committed for metric in found)


def run(p):
    result = p.run()
    result.wait_until_finish()
    return result


def fields(record: bytes) -> dict:
    """A serialised triplet's features, by name."""
    decoded = {}
    for name, feature in records.Example.FromString(record).features.feature.items():
        kind = feature.WhichOneof("kind")
        value = getattr(feature, kind).value[0]
        decoded[name] = value.decode("utf-8") if kind == "bytes_list" else value
    return decoded


def by_split(batches_by_split: dict):
    """(split, record) of every record a triplet transform hands on, as per-article batches, per split:
    one PCollection, so that one `assert_that` checks them all (each costs about half a second)."""
    return [batches_by_split[split] | f"Tag[{split}]" >> beam.FlatMap(
        lambda article_batch, split: [(split, r) for r in article_batch[1]], split=split)
            for split in SPLITS] | "AllSplits" >> beam.Flatten()


def tagged(expected: dict) -> list[tuple[str, bytes]]:
    return [(split, record) for split in SPLITS for record in expected[split]]


def all_of(*matchers):
    """One matcher that applies each of `matchers`, with its message cut short (equal_to's lists every
    element of both sides: megabytes of triplets)."""
    def check(found):
        for matcher in matchers:
            try:
                matcher(found)
            except BeamAssertException as error:
                message = str(error)
                raise BeamAssertException(message[:2000] + (" ..." if len(message) > 2000 else "")) from None
    return check


def reference_articles(pages, splitter) -> tuple[list, collections.Counter]:
    """The articles of the pages that are articles (namespace 0, no redirect), by the pure rules,
    and the counts `build_article` gives for them."""
    articles, counts = [], collections.Counter()
    for page in pages:
        if page.namespace != 0 or page.redirect:
            continue
        article, page_counts = build_article(page.page_id, page.title, split_of(page.page_id, SEED),
                                             parse_wikitext(page.text), splitter, RULES)
        counts.update(page_counts)
        if article is not None:
            articles.append(article)
    return articles, counts


@pytest.fixture(scope="module")
def splitter():
    return SentenceSplitter(DEFAULT_SPACY_MODEL)


@pytest.fixture(scope="module")
def real_pages() -> list[Page]:
    return [page for page in decode_pages(embedded_dump_path()) if len(page.text) < MAX_PAGE_CHARS]


def one_opener_section(article, article_id: int):
    """The article as if only its section with the most positive pairs had paragraph openers (every
    other section's openers demoted to non-openers): the rare shape whose slots find no opener
    to draw, for adjacent (the neighbours) and for same_article (every other section)."""
    pairs = [len(positive_pairs(paragraph_openers(section), RULES)) for section in article.sections]
    keep = pairs.index(max(pairs))
    sections = tuple(
        section if index == keep
        else section._replace(sentences=tuple(sentence._replace(opener=False) for sentence in section.sentences))
        for index, section in enumerate(article.sections))
    return article._replace(article_id=article_id, title=f"{article.title} (one section with openers)",
                            sections=sections)


@pytest.fixture(scope="module")
def articles(real_pages, splitter):
    """The real pages' articles, dealt round-robin over the splits (so that every split gets
    several, whatever the seed draws for so few), and one with openers in a single section."""
    built, _ = reference_articles(real_pages, splitter)
    built = [article._replace(split=SPLITS[i % len(SPLITS)]) for i, article in enumerate(built)]
    return [*built, one_opener_section(built[0], ONE_SECTION_ID)]


# --- BuildArticles ---------------------------------------------------------------------------------

@pytest.mark.slow   # seconds: the full tier (the fast tier stays under 3 minutes)
def test_build_articles_gives_the_rules_articles_and_counts_every_page_once(real_pages, splitter):
    article_page = next(page for page in real_pages if page.namespace == 0 and not page.redirect
                        and reference_articles([page], splitter)[0])
    first_paragraph = parse_wikitext(article_page.text).sections[0].paragraphs[0].text
    malformed = Page(MALFORMED_ID, "Nested templates", 0, None, "{{" * 5000 + "x" + "}}" * 5000, "test")
    giant = article_page._replace(   # a real article with one paragraph longer than spaCy takes
        page_id=GIANT_ID, title="Giant paragraph",
        text=f"{article_page.text}\n\n== Long ==\n{(first_paragraph + ' ') * (10**6 // len(first_paragraph) + 1)}\n")
    pages = [*real_pages, malformed, giant]
    expected, counts = reference_articles(real_pages, splitter)
    assert len(expected) > 10 and {page.namespace for page in pages} > {0}
    assert any(page.redirect for page in pages) and counts[counters.ARTICLES_TOO_FEW_SECTIONS]

    p = test_pipeline.TestPipeline()
    built = p | beam.Create(pages) | BuildArticles(SEED, DEFAULT_SPACY_MODEL, RULES)

    def in_the_split_of_their_id(found):
        if any(article.split != split_of(article.article_id, SEED) for article in found):
            raise BeamAssertException("an article in another split than its id's")

    assert_that(built["articles"], all_of(equal_to(expected), in_the_split_of_their_id), label="Articles")
    letter_keys = set(dead_letter("source", 1, "title", "reason", "detail"))

    def dead_letters_of_the_two_broken_pages(letters):
        got = sorted((letter["page_id"], letter["title"], letter["stage"], letter["reason"]) for letter in letters)
        if got != [(MALFORMED_ID, "Nested templates", "parse", "parse_error"),
                   (GIANT_ID, "Giant paragraph", "sentences", "paragraph_too_long")]:
            raise BeamAssertException(f"dead letters {got}")
        if any(set(letter) != letter_keys or not letter["detail"] for letter in letters):
            raise BeamAssertException(f"not the shared dead-letter shape: {letters}")

    assert_that(built[DEAD_LETTERS], dead_letters_of_the_two_broken_pages, label="DeadLetters")
    result = run(p)

    non_article = sum(1 for page in pages if page.namespace != 0)
    redirects = sum(1 for page in pages if page.namespace == 0 and page.redirect)
    n_pages, n_articles = len(pages), len(expected)
    outcomes = {name: counter(result, name) for name in counters.PAGE_OUTCOMES}
    assert outcomes == {
        counters.ARTICLES_USED: n_articles,
        counters.ARTICLES_TOO_FEW_SECTIONS: counts[counters.ARTICLES_TOO_FEW_SECTIONS],
        counters.PAGES_NON_ARTICLE: non_article,
        counters.PAGES_DUPLICATE_ID: 0,   # counted by the read (`pipeline.read.dedupe`), before BuildArticles
        counters.PAGES_REDIRECT: redirects,
        counters.PARSE_ERRORS: 1,
        counters.PARAGRAPHS_TOO_LONG: 1,
    }
    assert sum(outcomes.values()) == n_pages   # every page ends in exactly one outcome
    # The rules' own counts (sentences, sections, slots) are the pure function's, page by page.
    assert {name: counter(result, name) for name in counts} == dict(counts)
    assert counts[counters.TRIPLET_SLOTS] == sum(triplet_slots(article.sections, RULES) for article in expected)


# --- Triplets ----------------------------------------------------------------------------------------

def _openers(section) -> set[tuple[str, int]]:
    return {(sentence.text, sentence.paragraph) for sentence in paragraph_openers(section)}


def follow_the_rule(strategy: str, articles: list, buckets: dict | None = None):
    """A matcher of (split, record): each split has records, each a triplet-sen of an article of that split whose
    anchor and positive are openers of one section at most `max_paragraph_distance` paragraphs
    apart, and whose negative is an opener of the section its rule draws from."""
    by_id = {article.article_id: article for article in articles}

    def check(found):
        if {split for split, _ in found} != set(SPLITS):
            raise BeamAssertException(f"a split without {strategy} triplets")
        for split, record in found:
            t = fields(record)
            article, donor = by_id[t["article_id"]], by_id[t["negative_article_id"]]
            anchor_section = article.sections[t["anchor_section_index"]]
            negative_section = donor.sections[t["negative_section_index"]]
            problems = [
                article.split != split and f"an article of {article.split}",
                (t["kind"], t["strategy"], t["title"]) != ("sen", strategy, article.title) and "kind/strategy/title",
                (t["anchor"], t["anchor_paragraph"]) not in _openers(anchor_section) and "anchor not an opener",
                (t["positive"], t["positive_paragraph"]) not in _openers(anchor_section) and "positive not an opener",
                not 0 < t["positive_paragraph"] - t["anchor_paragraph"] <= RULES.max_paragraph_distance
                and "pair too far apart",
                t["anchor_section"] != anchor_section.title and "anchor_section",
                (t["negative"], t["negative_paragraph"]) not in _openers(negative_section) and "negative not an opener",
                t["negative_section"] != negative_section.title and "negative_section",
            ]
            if strategy == "adjacent":
                problems.append((donor is not article or abs(t["negative_section_index"] - t["anchor_section_index"])
                                 != 1) and "negative not from a neighbouring section")
            elif strategy == "same_article":
                problems.append((donor is not article or t["negative_section_index"] == t["anchor_section_index"])
                                and "negative not from another section of the article")
            else:
                problems.append((donor is article or buckets[donor.article_id] != buckets[article.article_id])
                                and "negative not from another article of the bucket")
            if any(problems):
                raise BeamAssertException(f"{[p for p in problems if p]}: {t}")

    return check


def _check_triplet_counters(result, dataset: str, strategy: str, expected: dict, unfilled: int, articles):
    written = {split: counter(result, counters.split_counter(dataset, split)) for split in SPLITS}
    assert written == {split: len(expected[split]) for split in SPLITS}
    assert counter(result, counters.unfilled_slots_counter(strategy)) == unfilled
    # Every slot gives a triplet or is counted unfilled.
    assert sum(written.values()) + unfilled == sum(triplet_slots(article.sections, RULES) for article in articles)


@pytest.mark.slow   # seconds of a real Beam or tf.data run: the full tier
@pytest.mark.parametrize("strategy", ["adjacent", "same_article"])
def test_sentence_triplets_are_the_rules_triplets_of_each_article_in_its_split(articles, strategy):
    make = {"adjacent": triplets.adjacent_triplets, "same_article": triplets.same_article_triplets}[strategy]
    made = [make(article, SEED, RULES) for article in articles]
    expected = {split: [record for article, (triplets_of, _) in zip(articles, made) if article.split == split
                        for record in examples.triplet_examples(triplets_of)] for split in SPLITS}
    unfilled = sum(n for _, n in made)
    assert unfilled and all(expected.values())   # the inputs leave slots unfilled and fill every split

    p = test_pipeline.TestPipeline()
    out = p | beam.Create(articles) | SentenceTriplets(strategy, SEED, RULES, other_article_bucket_size=1000)
    assert_that(by_split(out), all_of(equal_to(tagged(expected)), follow_the_rule(strategy, articles)))
    result = run(p)
    _check_triplet_counters(result, DATASET_OF_STRATEGY[strategy], strategy, expected, unfilled, articles)


@pytest.mark.slow   # seconds of a real Beam or tf.data run: the full tier
@pytest.mark.parametrize("bucket_size", [1000, 2], ids=["one-bucket", "buckets-of-about-2"])
def test_other_article_triplets_draw_from_other_articles_of_the_bucket(articles, bucket_size):
    n_buckets = triplets.n_other_article_buckets(len(articles), bucket_size)
    bucket_of = {article.article_id: triplets.other_article_bucket(article.article_id, SEED, n_buckets)
                 for article in articles}
    shipped = [triplets.sentences_only(article) for article in articles]   # what the transform groups
    made = [triplets.other_article_triplets(article, [other for other in shipped
                                                      if bucket_of[other.article_id] == bucket_of[article.article_id]],
                                            SEED, RULES)
            for article in shipped]
    expected = {split: [record for article, (triplets_of, _) in zip(articles, made) if article.split == split
                        for record in examples.triplet_examples(triplets_of)] for split in SPLITS}
    no_donor = sum(n for _, n in made)
    alone = [n for n in collections.Counter(bucket_of.values()).values() if n == 1]
    assert all(expected.values()) and bool(no_donor) == bool(alone) == (bucket_size == 2)

    p = test_pipeline.TestPipeline()
    out = p | beam.Create(articles) | SentenceTriplets("other_article", SEED, RULES, bucket_size)
    assert_that(by_split(out),
                all_of(equal_to(tagged(expected)), follow_the_rule("other_article", articles, bucket_of)))
    result = run(p)
    _check_triplet_counters(result, DATASET_OF_STRATEGY["other_article"], "other_article", expected, no_donor,
                            articles)


@pytest.mark.slow   # seconds: a Beam pipeline
def test_title_triplets_pair_each_sections_first_sentence_with_its_title_against_a_neighbours(articles):
    expected = {split: [record for article in articles if article.split == split
                        for record in examples.triplet_examples(triplets.title_triplets(article))] for split in SPLITS}
    by_id = {article.article_id: article for article in articles}

    def titles_of_neighbours(found):
        for split, record in found:
            t = fields(record)
            article = by_id[t["article_id"]]
            index, neighbour = t["anchor_section_index"], t["negative_section_index"]
            section = article.sections[index]
            if (article.split != split or t["kind"] != "titles" or abs(index - neighbour) != 1
                    or t["negative_article_id"] != article.article_id
                    or t["anchor"] != section.sentences[0].text
                    or t["positive"] != f"{article.title} {section.title}"
                    or t["negative"] != f"{article.title} {article.sections[neighbour].title}"):
                raise BeamAssertException(f"not a titles triplet of {split}: {t}")

    p = test_pipeline.TestPipeline()
    out = p | beam.Create(articles) | TitleTriplets()
    assert_that(by_split(out), all_of(equal_to(tagged(expected)), titles_of_neighbours))
    result = run(p)
    # Each section gives one triplet per neighbour: 2 * sections - 2 per article.
    assert sum(map(len, expected.values())) == sum(2 * len(article.sections) - 2 for article in articles)
    assert {split: counter(result, counters.split_counter(records.TITLES_DATASET, split)) for split in SPLITS} == {
        split: len(expected[split]) for split in SPLITS}


def _tfrecords(path) -> list[bytes]:
    """The records of one gzipped TFRecord file (length, length CRC, data, data CRC)."""
    found = []
    with gzip.open(path, "rb") as handle:
        while header := handle.read(12):
            length = int.from_bytes(header[:8], "little")
            found.append(handle.read(length))
            handle.read(4)
    return found


def _write(batches: dict, folder, seed: int = 0) -> None:
    p = test_pipeline.TestPipeline()
    split_inputs = {split: p | f"Create[{split}]" >> beam.Create(batches[split], reshuffle=False) for split in SPLITS}
    _ = split_inputs | WriteTripletSplits(str(folder), "some-dataset", seed)
    run(p)


@pytest.mark.slow   # seconds of a real Beam or tf.data run: the full tier
def test_write_triplet_splits_writes_each_split_in_its_key_order_and_an_empty_split_as_an_empty_shard(articles,
                                                                                                     tmp_path):
    from pipeline.write import order

    batches = {split: [(article.article_id, examples.triplet_examples(triplets.title_triplets(article)))
                       for article in articles if article.split == split] for split in SPLITS}
    batches["validation"] = []
    _write(batches, tmp_path)
    for split in SPLITS:
        shards = sorted((tmp_path / "some-dataset" / split).glob("part-*-of-*.tfrecord.gz"))
        assert shards, split
        written = [record for shard in shards for record in _tfrecords(shard)]
        # the whole split, each article's records cut into chunks, in the order of the chunks' keys
        expected = sorted((order.order_key(0, "some-dataset", split, article_id, index), chunk)
                          for article_id, batch in batches[split] for index, chunk in enumerate(order.chunks(batch)))
        assert written == [record for _, chunk in expected for record in chunk]
    assert sorted(p.name for p in (tmp_path / "some-dataset" / "validation").iterdir()) \
        == ["part-00000-of-00001.parquet", "part-00000-of-00001.tfrecord.gz"]   # an empty shard in both forms
    assert not list((tmp_path / "some-dataset").glob("*/beam-temp-*"))


@pytest.mark.slow   # seconds: the full tier (the fast tier stays under 3 minutes)
def test_the_write_order_depends_on_the_seed_and_the_data_not_on_the_input_order(articles, tmp_path):
    batches = {split: [(article.article_id, examples.triplet_examples(triplets.title_triplets(article)))
                       for article in articles if article.split == split] for split in SPLITS}
    _write(batches, tmp_path / "a")
    _write({split: list(reversed(batches[split])) for split in SPLITS}, tmp_path / "b")
    _write(batches, tmp_path / "c", seed=1)

    def train_records(folder):
        return [record for shard in sorted((folder / "some-dataset" / "train").glob("part-*.tfrecord.gz"))
                for record in _tfrecords(shard)]

    assert train_records(tmp_path / "a") == train_records(tmp_path / "b")
    assert train_records(tmp_path / "a") != train_records(tmp_path / "c")
    assert sorted(train_records(tmp_path / "a")) == sorted(train_records(tmp_path / "c"))


def test_a_split_is_cut_into_shards_by_its_size():
    from pipeline.write import order

    assert order.shard_count(0, 0) == 1
    assert order.shard_count(300 << 10, 40) == 1                      # the demo: under a MiB
    assert order.shard_count(40 << 20, 10_000) == 16                  # 40 MiB: the floor of 16 shards
    assert order.shard_count(5 << 20, 10_000) == 5                    # 5 MiB: no shard under a MiB
    assert order.shard_count(100 << 30, 10 ** 7) == 267               # 100 GiB: 384 MiB of records each
    assert order.shard_count(40 << 20, 3) == 3                        # never more shards than chunks
    keys = [order.order_key(0, "d", "train", article, 0) for article in range(20_000)]
    sizes = collections.Counter(order.shard_of(key, 16) for key in keys)
    assert sorted(sizes) == list(range(16)) and max(sizes.values()) < 1.15 * min(sizes.values())


# --- SCB and passages ------------------------------------------------------------------------------

def test_scb_records_are_the_test_articles_with_the_rules_number_of_sections(articles):
    rules = RuleConfig(scb_min_sections=6, scb_max_sections=8)   # both bounds cut some of the test split
    eligible = [article for article in articles if scb_eligible(article.split, len(article.sections), rules)]
    test_split = [article for article in articles if article.split == "test"]
    assert eligible and {len(a.sections) for a in test_split} - set(range(6, 9)) and len(eligible) < len(test_split)

    p = test_pipeline.TestPipeline()
    found = p | beam.Create(articles) | ScbRecords(rules)
    assert_that(found, all_of(equal_to([examples.scb_record(article) for article in eligible])))
    result = run(p)
    n_articles, n_eligible = len(articles), len(eligible)
    assert counter(result, counters.SCB_ARTICLES_NOT_ELIGIBLE) == n_articles - n_eligible
    assert counter(result, counters.SCB_SENTENCES) == sum(
        len(section.sentences) for article in eligible for section in article.sections)


def test_passage_records_of_every_article_are_written_as_json_lines_and_counted(articles, tmp_path):
    """PassageRecords and its writer: each article's passages record, one JSON line each."""
    p = test_pipeline.TestPipeline()
    passages = p | beam.Create(articles) | PassageRecords()
    assert_that(passages, all_of(equal_to([examples.passages_record(article) for article in articles])))
    _ = passages | WriteJsonLines(str(tmp_path / "passages" / "part"), counters.PASSAGES_ARTICLES)
    result = run(p)
    lines = []
    for shard in sorted((tmp_path / "passages").glob("part-*-of-*.jsonl.gz")):
        with gzip.open(shard, "rt", encoding="utf-8") as handle:
            lines += handle.read().splitlines()
    assert sorted(lines) == sorted(examples.passages_record(article).to_json() for article in articles)
    assert sorted(json.loads(line)["article_id"] for line in lines) == sorted(a.article_id for a in articles)
    n_articles = len(articles)
    assert counter(result, counters.PASSAGES_ARTICLES) == n_articles
