"""The paper's rules (Ein Dor et al., 2018), each a pure function, and their composition.

How the ambiguous points are read:

* Sections are top-level sections (sub-sections folded in). The lead is never a section.
  A section is removed when its title, whitespace-normalised and case-folded, equals one of
  `REMOVED_SECTION_TITLES` (exact match: "Notes and references" stays).
* A sentence is kept when it has 5..50 tokens (both ends inclusive, `sentences.Sentence`).
* A section that keeps no sentence after the length rule is dropped too (it can give neither
  an anchor nor a negative); "at least 5 remaining sections" counts sections that survive both
  the title rule and this one. SCB's 5..12 sections counts the same sections.
* A paragraph opener is the paragraph's *first* sentence, and only if that sentence passes
  the length rule; if it is dropped, the paragraph has no opener (its second sentence is
  not promoted).
* Paragraph distance is measured in paragraphs of the section (after folding sub-sections in,
  in page order), counting paragraphs whose opener was dropped: openers of paragraphs 0 and
  3 are 3 apart and form a pair; 0 and 4 do not. Each unordered pair appears once, anchor =
  the earlier paragraph's opener.
* Neighbouring sections are the previous and next *remaining* sections.
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from core import counters
from core.cli import flag

if TYPE_CHECKING:   # annotations only: every command's flags (RuleConfig) parse without spaCy or the parser
    from pipeline.parse.sentences import SentenceSplitter
    from pipeline.parse.wikitext import Paragraph, ParsedPage

REMOVED_SECTION_TITLES = frozenset(
    {
        "background",
        "external links",
        "further reading",
        "references",
        "see also",
        "notes",
        "citations",
        "authored books",
    }
)


@dataclasses.dataclass(frozen=True)
class RuleConfig:
    """The paper's thresholds; each is also a flag of `python -m pipeline.run`."""

    min_tokens: int = flag(5, help="a sentence is kept with at least this many tokens")
    max_tokens: int = flag(50, help="... and at most this many")
    min_sections: int = flag(5, help="an article is used when this many sections keep a sentence")
    max_paragraph_distance: int = flag(3, help="anchor and positive openers at most this many paragraphs apart")
    scb_min_sections: int = flag(5, help="an SCB article (test split) has at least this many sections")
    scb_max_sections: int = flag(12, help="... and at most this many")


class KeptSentence(NamedTuple):
    text: str
    n_tokens: int
    paragraph: int  # index of its paragraph within the section
    opener: bool  # the first sentence of its paragraph


class ArticleSection(NamedTuple):
    title: str
    paragraphs: tuple[Paragraph, ...]
    sentences: tuple[KeptSentence, ...]


class Article(NamedTuple):
    """An article that passed every rule: what all outputs are built from."""

    article_id: int
    title: str
    split: str
    lead: tuple[str, ...]
    sections: tuple[ArticleSection, ...]


def is_removed_section(title: str) -> bool:
    return " ".join(title.split()).casefold() in REMOVED_SECTION_TITLES


def sentence_length_ok(n_tokens: int, config: RuleConfig = RuleConfig()) -> bool:
    return config.min_tokens <= n_tokens <= config.max_tokens


def enough_sections(n_sections: int, config: RuleConfig = RuleConfig()) -> bool:
    return n_sections >= config.min_sections


def scb_eligible(split: str, n_sections: int, config: RuleConfig = RuleConfig()) -> bool:
    return split == "test" and config.scb_min_sections <= n_sections <= config.scb_max_sections


def paragraph_openers(section: ArticleSection) -> list[KeptSentence]:
    return [sentence for sentence in section.sentences if sentence.opener]


def positive_pairs(
    openers: Sequence[KeptSentence], config: RuleConfig = RuleConfig()
) -> list[tuple[KeptSentence, KeptSentence]]:
    """Pairs of openers of one section at most `max_paragraph_distance` paragraphs apart."""
    return [
        (anchor, positive)
        for i, anchor in enumerate(openers)
        for positive in openers[i + 1 :]
        if 0 < positive.paragraph - anchor.paragraph <= config.max_paragraph_distance
    ]


def neighbour_sections(index: int, n_sections: int) -> list[int]:
    """The previous and the next section's index, where they exist."""
    return [i for i in (index - 1, index + 1) if 0 <= i < n_sections]


def triplet_slots(sections: Sequence[ArticleSection], config: RuleConfig = RuleConfig()) -> int:
    """(positive pair, neighbouring section) slots: the most triplets-sen one strategy can give."""
    return sum(
        len(positive_pairs(paragraph_openers(section), config)) * len(neighbour_sections(index, len(sections)))
        for index, section in enumerate(sections)
    )


def build_article(
    article_id: int,
    title: str,
    split: str,
    parsed: ParsedPage,
    splitter: SentenceSplitter,
    config: RuleConfig = RuleConfig(),
) -> tuple[Article | None, collections.Counter]:
    """Applies the section, sentence and article rules to one parsed page.

    Returns the article (None when it keeps fewer than `min_sections` sections) and counts of
    what each rule dropped, for the pipeline's counters. The sentence counters cover the
    articles whose sentences were split: one with fewer than `min_sections` remaining sections
    that hold a paragraph is rejected before that.
    """
    counts: collections.Counter = collections.Counter()
    counts["paragraphs_markup_residue"] += parsed.markup_residue_paragraphs
    named = [section for section in parsed.sections if not is_removed_section(section.title)]
    counts["sections_removed_by_title"] += len(parsed.sections) - len(named)
    if not enough_sections(sum(1 for section in named if section.paragraphs), config):
        # Only a section with a paragraph can keep a sentence: decided before splitting sentences
        # (spaCy is most of a page's cost; on the 2019 dump a fifth of it went to such articles).
        counts[counters.ARTICLES_TOO_FEW_SECTIONS] += 1
        return None, counts
    sentences_per_paragraph = splitter.split(
        [paragraph.text for section in named for paragraph in section.paragraphs]
    )
    kept_sections = []
    cursor = 0
    for section in named:
        kept: list[KeptSentence] = []
        for paragraph_index in range(len(section.paragraphs)):
            for position, sentence in enumerate(sentences_per_paragraph[cursor + paragraph_index]):
                if sentence_length_ok(sentence.n_tokens, config):
                    kept.append(KeptSentence(sentence.text, sentence.n_tokens, paragraph_index, position == 0))
                elif sentence.n_tokens < config.min_tokens:
                    counts["sentences_too_short"] += 1
                else:
                    counts["sentences_too_long"] += 1
        cursor += len(section.paragraphs)
        if kept:
            kept_sections.append(ArticleSection(section.title, section.paragraphs, tuple(kept)))
        else:
            counts["sections_without_sentences"] += 1
    if not enough_sections(len(kept_sections), config):
        counts[counters.ARTICLES_TOO_FEW_SECTIONS] += 1
        return None, counts
    counts[counters.ARTICLES_USED] += 1
    counts["sections_kept"] += len(kept_sections)
    counts["sentences_kept"] += sum(len(section.sentences) for section in kept_sections)
    counts[counters.TRIPLET_SLOTS] += triplet_slots(kept_sections, config)
    article = Article(
        article_id=article_id,
        title=title,
        split=split,
        lead=tuple(paragraph.text for paragraph in parsed.lead),
        sections=tuple(kept_sections),
    )
    return article, counts
