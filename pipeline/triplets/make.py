"""Triplets from a ruled article: triplets-sen (three negative strategies) and triplets-titles.

triplets-sen: every positive pair of `rules.positive_pairs` (two paragraph openers of one
section, at most 3 paragraphs apart) gives one triplet per neighbouring section, so at most
two: a pair's *slots* (`rules.triplet_slots` counts them). All three sentences are paragraph
openers, as the paper has it (section 3.1: "to focus our weakly labeled data on sentences
that are typically stand-alone in nature, we consider only paragraph opening sentences"): the
negative is a random opener of the chosen section, never a mid-paragraph sentence, so a model
cannot score a triplet by telling openers from non-openers. A slot whose chosen section has no
opener gives no triplet and is counted (`triplets_<strategy>_no_opener_negative`), so that per
strategy: triplets written + no-opener slots (+ no-donor slots) = `triplet_slots`.

* `adjacent` (the paper's default): one triplet with an opener of the previous section and
  one with an opener of the next section (only one at the first/last section).
* `same_article`: as many slots as `adjacent`, each negative an opener of a random section of
  the same article other than the anchor's, among the sections that have one.
* `other_article`: as many slots as `adjacent`, each negative an opener of a random section
  (among those with one) of a random *other* article. To scale without a side input holding the corpus,
  articles are bucketed by `stable_hash(seed, article_id) % n_buckets` (n_buckets grows with the
  corpus, about `bucket_size` articles each), grouped by bucket, and each article draws its
  donors among the *other* articles of its bucket (sorted by id, so the draw does not depend
  on grouping order). An article alone in its bucket has no donor; its would-be triplets are
  counted (`triplets_other_article_no_donor`), never filled from the same article.

triplets-titles: for each section, the pivot is its first kept sentence; the positive is
"<article title> <section title>", the negative the same string for the previous and the next
section (one triplet each).

Every random draw uses its own `random.Random` seeded from (seed, strategy, article id, pair,
neighbour/draw index), never the global RNG, so the output does not depend on worker, bundle or
processing order.
"""
from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from core.records import NegativeStrategy, TripletKind
from core.splits import stable_hash
from pipeline.triplets.rules import (
    Article,
    KeptSentence,
    RuleConfig,
    neighbour_sections,
    paragraph_openers,
    positive_pairs,
)


class Triplet(NamedTuple):
    anchor: str
    positive: str
    negative: str
    title: str
    anchor_section: str
    negative_section: str
    kind: TripletKind
    strategy: NegativeStrategy
    article_id: int
    split: str
    anchor_section_index: int
    negative_section_index: int  # index in the negative's own article
    negative_article_id: int
    anchor_paragraph: int
    positive_paragraph: int  # -1 for titles triplets (the positive is a title)
    negative_paragraph: int  # -1 for titles triplets (the negative is a title)


def seeded_rng(seed: int, strategy: NegativeStrategy, *keys) -> random.Random:
    return random.Random(stable_hash(seed, strategy.value, *keys))


def sentence_pairs(article: Article, config: RuleConfig) -> Iterator[tuple[int, KeptSentence, KeptSentence]]:
    """(section index, anchor, positive) for every positive pair of the article."""
    for index, section in enumerate(article.sections):
        for anchor, positive in positive_pairs(paragraph_openers(section), config):
            yield index, anchor, positive


def _triplet(article, strategy, index, anchor, positive, negative_article, negative_index, negative) -> Triplet:
    return Triplet(
        anchor=anchor.text,
        positive=positive.text,
        negative=negative.text,
        title=article.title,
        anchor_section=article.sections[index].title,
        negative_section=negative_article.sections[negative_index].title,
        kind=TripletKind.SEN,
        strategy=strategy,
        article_id=article.article_id,
        split=article.split,
        anchor_section_index=index,
        negative_section_index=negative_index,
        negative_article_id=negative_article.article_id,
        anchor_paragraph=anchor.paragraph,
        positive_paragraph=positive.paragraph,
        negative_paragraph=negative.paragraph,
    )


def openers_by_section(article: Article) -> list[list[KeptSentence]]:
    """The paragraph openers of each section, in section order: every negative is drawn from these."""
    return [paragraph_openers(section) for section in article.sections]


def sections_with_openers(openers: list[list[KeptSentence]]) -> list[int]:
    return [index for index, section_openers in enumerate(openers) if section_openers]


def adjacent_triplets(article: Article, seed: int, config: RuleConfig = RuleConfig()) -> tuple[list[Triplet], int]:
    """Triplets with an opener of each neighbouring section, and how many slots had none."""
    strategy = NegativeStrategy.ADJACENT
    triplets, no_opener = [], 0
    openers = openers_by_section(article)
    for index, anchor, positive in sentence_pairs(article, config):
        for neighbour in neighbour_sections(index, len(article.sections)):
            if not openers[neighbour]:
                no_opener += 1
                continue
            rng = seeded_rng(seed, strategy, article.article_id, index, anchor.paragraph, positive.paragraph,
                             neighbour)
            negative = rng.choice(openers[neighbour])
            triplets.append(_triplet(article, strategy, index, anchor, positive, article, neighbour, negative))
    return triplets, no_opener


def same_article_triplets(article: Article, seed: int, config: RuleConfig = RuleConfig()) -> tuple[list[Triplet], int]:
    """Triplets with an opener of another section of the article, and how many slots had none."""
    strategy = NegativeStrategy.SAME_ARTICLE
    triplets, no_opener = [], 0
    n_sections = len(article.sections)
    openers = openers_by_section(article)
    with_openers = sections_with_openers(openers)
    for index, anchor, positive in sentence_pairs(article, config):
        others = [i for i in with_openers if i != index]
        for draw in range(len(neighbour_sections(index, n_sections))):
            if not others:
                no_opener += 1
                continue
            rng = seeded_rng(seed, strategy, article.article_id, index, anchor.paragraph, positive.paragraph,
                             draw)
            chosen = rng.choice(others)
            negative = rng.choice(openers[chosen])
            triplets.append(_triplet(article, strategy, index, anchor, positive, article, chosen, negative))
    return triplets, no_opener


def other_article_triplets(
    article: Article, bucket: Sequence[Article], seed: int, config: RuleConfig = RuleConfig()
) -> tuple[list[Triplet], int]:
    """Triplets with an opener from another article of the bucket, and how many slots had no donor.

    A donor is another article of the bucket with at least one opener (an article can pass the
    section rule with none), so a slot is either filled with an opener or counted as no donor.
    """
    strategy = NegativeStrategy.OTHER_ARTICLE
    others = [other for other in bucket if other.article_id != article.article_id]
    openers_of = {other.article_id: openers_by_section(other) for other in others}
    donors = sorted((other for other in others if sections_with_openers(openers_of[other.article_id])),
                    key=lambda a: a.article_id)
    triplets, missing = [], 0
    for index, anchor, positive in sentence_pairs(article, config):
        for draw in range(len(neighbour_sections(index, len(article.sections)))):
            if not donors:
                missing += 1
                continue
            rng = seeded_rng(seed, strategy, article.article_id, index, anchor.paragraph, positive.paragraph,
                             draw)
            donor = rng.choice(donors)
            donor_openers = openers_of[donor.article_id]
            chosen = rng.choice(sections_with_openers(donor_openers))
            negative = rng.choice(donor_openers[chosen])
            triplets.append(_triplet(article, strategy, index, anchor, positive, donor, chosen, negative))
    return triplets, missing


def sentences_only(article: Article) -> Article:
    """The article without its lead and paragraph texts: all that triplets-sen reads.

    `other_article` groups whole buckets of articles; shipping only the kept sentences halves
    what that shuffle (and, on the DirectRunner, its in-memory buffers) holds.
    """
    return article._replace(lead=(), sections=tuple(s._replace(paragraphs=()) for s in article.sections))


def other_article_bucket(article_id: int, seed: int, n_buckets: int) -> int:
    return stable_hash("other_article_bucket", seed, article_id) % n_buckets


def n_other_article_buckets(n_articles: int, bucket_size: int) -> int:
    return max(1, n_articles // bucket_size)


def title_triplets(article: Article) -> list[Triplet]:
    triplets = []
    n_sections = len(article.sections)
    for index, section in enumerate(article.sections):
        pivot = section.sentences[0]
        for neighbour in neighbour_sections(index, n_sections):
            triplets.append(
                Triplet(
                    anchor=pivot.text,
                    positive=f"{article.title} {section.title}",
                    negative=f"{article.title} {article.sections[neighbour].title}",
                    title=article.title,
                    anchor_section=section.title,
                    negative_section=article.sections[neighbour].title,
                    kind=TripletKind.TITLES,
                    strategy=NegativeStrategy.ADJACENT,
                    article_id=article.article_id,
                    split=article.split,
                    anchor_section_index=index,
                    negative_section_index=neighbour,
                    negative_article_id=article.article_id,
                    anchor_paragraph=pivot.paragraph,
                    positive_paragraph=-1,
                    negative_paragraph=-1,
                )
            )
    return triplets
