"""triplets-sen (three negative strategies), triplets-titles, the split, and the record format."""
import collections
import subprocess
import sys

import tensorflow as tf

from core import records
from core.splits import split_of
from model.training.tf_input import triplet_feature_spec
from pipeline.triplets.make import (
    adjacent_triplets,
    n_other_article_buckets,
    other_article_bucket,
    other_article_triplets,
    same_article_triplets,
    title_triplets,
)
from pipeline.triplets.rules import Article, ArticleSection, KeptSentence, triplet_slots
from pipeline.write import examples


def _section(article_id: int, index: int, paragraphs: int) -> ArticleSection:
    """Each paragraph: an opener and one more sentence; text names article, section, paragraph."""
    sentences = []
    for p in range(paragraphs):
        sentences.append(KeptSentence(f"a{article_id} s{index} p{p} opener", 6, p, True))
        sentences.append(KeptSentence(f"a{article_id} s{index} p{p} second", 6, p, False))
    return ArticleSection(f"Section {index}", (), tuple(sentences))


def _article(article_id: int, paragraphs_per_section=(2, 5, 1, 3, 2)) -> Article:
    sections = tuple(_section(article_id, i, n) for i, n in enumerate(paragraphs_per_section))
    return Article(article_id, f"Article {article_id}", "train", ("Lead.",), sections)


def _without_openers(article: Article, index: int) -> Article:
    """The article with section `index` keeping only its non-opener sentences."""
    section = article.sections[index]
    stripped = section._replace(sentences=tuple(s for s in section.sentences if not s.opener))
    return article._replace(sections=article.sections[:index] + (stripped,) + article.sections[index + 1:])


def _assert_negatives_are_openers(made):
    for t in made:
        assert t.negative.endswith(" opener"), t.negative
        assert t.negative.split()[2] == f"p{t.negative_paragraph}"


def _pairs(article):
    # Section with n paragraphs whose openers are all kept: pairs at distance 1..3.
    return {i: sum(1 for a in range(len(s.sentences) // 2) for b in range(a + 1, len(s.sentences) // 2) if b - a <= 3)
            for i, s in enumerate(article.sections)}


def test_adjacent_gives_one_triplet_per_neighbour_with_negatives_from_that_neighbour():
    article = _article(1)
    made, no_opener = adjacent_triplets(article, seed=0)
    pairs = _pairs(article)
    expected = sum(n * (1 if i in (0, len(article.sections) - 1) else 2) for i, n in pairs.items())
    assert len(made) == expected == triplet_slots(article.sections) and no_opener == 0
    _assert_negatives_are_openers(made)
    for t in made:
        assert " opener" in t.anchor and " opener" in t.positive
        assert t.anchor.split()[1] == t.positive.split()[1] == f"s{t.anchor_section_index}"
        assert 0 < t.positive_paragraph - t.anchor_paragraph <= 3
        assert abs(t.negative_section_index - t.anchor_section_index) == 1
        assert t.negative.split()[1] == f"s{t.negative_section_index}"
        assert t.negative_section == f"Section {t.negative_section_index}"
        assert (t.kind, t.strategy, t.negative_article_id) == ("sen", "adjacent", 1)
    # A pair of a middle section yields one triplet with the previous and one with the next.
    middle = collections.Counter((t.anchor, t.positive) for t in made if t.anchor_section_index == 1)
    assert set(middle.values()) == {2}


def test_a_neighbour_without_openers_gives_no_triplet_and_is_counted():
    article = _without_openers(_article(1, (3, 4, 4, 4, 3)), 2)
    made, no_opener = adjacent_triplets(article, seed=0)
    # Sections 1 and 3 lose their slot towards section 2; section 2 has no pairs of its own.
    assert no_opener == _pairs(article)[1] + _pairs(article)[3] > 0
    assert len(made) + no_opener == triplet_slots(article.sections)
    assert all(t.negative_section_index != 2 for t in made)
    _assert_negatives_are_openers(made)
    same, same_no_opener = same_article_triplets(article, seed=0)
    assert same_no_opener == 0 and len(same) == triplet_slots(article.sections)
    assert all(t.negative_section_index != 2 for t in same)


def test_draws_are_deterministic_per_seed():
    article = _article(1, (3, 8, 8, 8, 3))
    assert adjacent_triplets(article, seed=5) == adjacent_triplets(article, seed=5)
    negatives = {seed: [t.negative for t in adjacent_triplets(article, seed=seed)[0]] for seed in (5, 6)}
    assert negatives[5] != negatives[6]


def test_same_article_negatives_come_from_another_section_of_the_article():
    article = _article(2, (4, 4, 4, 4, 4, 4))
    made, no_opener = same_article_triplets(article, seed=0)
    assert len(made) == len(adjacent_triplets(article, seed=0)[0]) and no_opener == 0
    _assert_negatives_are_openers(made)
    assert all(t.negative_section_index != t.anchor_section_index and t.negative_article_id == 2 for t in made)
    assert all(t.negative.startswith(f"a2 s{t.negative_section_index} ") for t in made)
    # Not only neighbours: a random section of the article.
    assert any(abs(t.negative_section_index - t.anchor_section_index) > 1 for t in made)


def test_other_article_negatives_never_come_from_the_same_article():
    bucket = [_article(i) for i in (3, 4, 5)]
    for article in bucket:
        made, missing = other_article_triplets(article, bucket, seed=0)
        assert missing == 0 and len(made) == len(adjacent_triplets(article, seed=0)[0])
        _assert_negatives_are_openers(made)
        assert all(t.negative_article_id != article.article_id for t in made)
        assert all(t.negative.startswith(f"a{t.negative_article_id} s{t.negative_section_index} ") for t in made)
    # The draw does not depend on the order the bucket arrives in.
    assert other_article_triplets(bucket[0], bucket, 0) == other_article_triplets(bucket[0], bucket[::-1], 0)


def test_an_article_alone_in_its_bucket_gets_no_other_article_triplet_and_counts_them():
    alone = _article(6)
    made, missing = other_article_triplets(alone, [alone], seed=0)
    assert made == [] and missing == len(adjacent_triplets(alone, seed=0)[0]) > 0


def test_other_article_buckets_grow_with_the_corpus():
    assert n_other_article_buckets(50, 1000) == 1
    assert n_other_article_buckets(10_000, 1000) == 10
    sizes = collections.Counter(other_article_bucket(i, 0, 10) for i in range(10_000))
    assert len(sizes) == 10 and min(sizes.values()) > 800


def test_title_triplets_pair_the_section_pivot_with_its_title_against_neighbour_titles():
    article = _article(7)
    made = title_triplets(article)
    assert len(made) == 2 * len(article.sections) - 2
    for t in made:
        assert t.anchor == article.sections[t.anchor_section_index].sentences[0].text
        assert t.positive == f"Article 7 Section {t.anchor_section_index}"
        assert t.negative == f"Article 7 Section {t.negative_section_index}"
        assert abs(t.negative_section_index - t.anchor_section_index) == 1
        assert (t.kind, t.strategy) == ("titles", "adjacent")


def test_split_is_deterministic_about_80_10_10_and_depends_on_the_seed():
    splits = [split_of(i, 0) for i in range(20_000)]
    shares = {name: splits.count(name) / len(splits) for name in ("train", "validation", "test")}
    assert abs(shares["train"] - 0.8) < 0.02 and abs(shares["validation"] - 0.1) < 0.01
    assert abs(shares["test"] - 0.1) < 0.01
    assert splits == [split_of(i, 0) for i in range(20_000)]
    assert splits != [split_of(i, 1) for i in range(20_000)]


def test_triplet_examples_parse_back_with_the_contract_features():
    triplet = adjacent_triplets(_article(8), seed=0)[0][0]
    parsed = tf.io.parse_single_example(examples.triplet_examples([triplet])[0], triplet_feature_spec())
    for name in records.BYTES_FEATURES:
        assert parsed[name].numpy().decode("utf-8") == getattr(triplet, name)
    for name in records.INT64_FEATURES:
        assert int(parsed[name]) == getattr(triplet, name)
    assert {"anchor", "positive", "negative", "title", "anchor_section", "negative_section", "kind", "strategy",
            "article_id"} <= set(parsed)


def test_triplet_examples_are_byte_identical_to_tensorflows_own_serialisation():
    article = _article(8)
    made = adjacent_triplets(article, seed=0)[0] + title_triplets(article)  # two kinds: two sets of shared features
    assert len(made) > 4 and len({t.kind for t in made}) == 2

    def tensorflows(triplet):
        features = {name: tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[getattr(triplet, name).encode("utf-8")]))
                    for name in records.BYTES_FEATURES}
        features.update({name: tf.train.Feature(int64_list=tf.train.Int64List(value=[getattr(triplet, name)]))
                         for name in records.INT64_FEATURES})
        return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString(deterministic=True)

    assert examples.triplet_examples(made) == [tensorflows(triplet) for triplet in made]


def test_the_pipeline_does_not_import_tensorflow():
    code = "import sys, pipeline.run, pipeline.benchmark; print('tensorflow' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "False"


def test_scb_record_labels_index_sections_and_flag_openers():
    article = _article(9)
    record = examples.scb_record(article)
    assert record.sections == tuple(s.title for s in article.sections)
    assert len(record.sentences) == len(record.labels) == len(record.openers)
    for sentence, label, opener in zip(record.sentences, record.labels, record.openers):
        assert sentence.split()[1] == f"s{label}"
        assert opener == sentence.endswith("opener")
