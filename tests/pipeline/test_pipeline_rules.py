"""Each paper rule on its own, then their composition on a small hand-written article."""
import pytest

from core.splits import split_of
from pipeline.parse.sentences import SentenceSplitter
from pipeline.parse.wikitext import parse_wikitext
from pipeline.triplets.rules import (
    KeptSentence,
    RuleConfig,
    build_article,
    enough_sections,
    is_removed_section,
    neighbour_sections,
    positive_pairs,
    scb_eligible,
    sentence_length_ok,
)


@pytest.mark.parametrize(
    "title",
    ["External links", "external LINKS", "  Further   reading ", "References", "See also", "Notes",
     "Citations", "Authored books", "Background"],
)
def test_removed_section_titles_match_case_insensitively_after_trimming(title):
    assert is_removed_section(title)


@pytest.mark.parametrize("title", ["History", "Notes and references", "Background radiation", "Referencing"])
def test_other_section_titles_stay(title):
    assert not is_removed_section(title)


def test_sentence_length_bounds_are_inclusive():
    assert [n for n in (3, 4, 5, 6, 49, 50, 51) if sentence_length_ok(n)] == [5, 6, 49, 50]
    assert sentence_length_ok(3, RuleConfig(min_tokens=3))


def test_article_needs_five_sections_and_scb_takes_test_articles_with_5_to_12():
    assert not enough_sections(4) and enough_sections(5)
    assert [n for n in range(3, 15) if scb_eligible("test", n)] == list(range(5, 13))
    assert not scb_eligible("train", 6) and not scb_eligible("validation", 6)


def _opener(paragraph: int) -> KeptSentence:
    return KeptSentence(f"Opener of paragraph {paragraph} here.", 6, paragraph, True)


def test_positive_pairs_are_at_most_three_paragraphs_apart_counting_paragraphs_without_opener():
    # Paragraphs 1 and 2 lost their openers to the length rule; they still count for distance.
    openers = [_opener(0), _opener(3), _opener(4), _opener(8)]
    pairs = [(a.paragraph, p.paragraph) for a, p in positive_pairs(openers)]
    assert pairs == [(0, 3), (3, 4)]
    assert [(a.paragraph, p.paragraph) for a, p in positive_pairs(openers, RuleConfig(max_paragraph_distance=4))] == [
        (0, 3), (0, 4), (3, 4), (4, 8)]


def test_neighbour_sections_are_previous_and_next_where_they_exist():
    assert neighbour_sections(0, 5) == [1]
    assert neighbour_sections(2, 5) == [1, 3]
    assert neighbour_sections(4, 5) == [3]


SHORT = "Too short here."  # 4 tokens
LONG = " ".join(["word"] * 55) + "."


def _section(title: str, *paragraphs: str) -> str:
    return f"== {title} ==\n" + "\n\n".join(paragraphs) + "\n\n"


ARTICLE = (
    "The lead sentence is never part of a section.\n\n"
    + _section("Alpha", "Alpha opens its first paragraph well. A second sentence of alpha follows.",
               f"{SHORT} The second sentence of this paragraph is no opener.",
               "Alpha third paragraph opener is long enough.")
    + _section("Background", "Background is removed by the rules entirely.")
    + _section("Beta", "Beta has one paragraph with a proper opener.")
    + _section("Only short", SHORT)
    + _section("Gamma", f"{LONG} Gamma keeps the sentence after a long one.")
    + _section("Delta", "Delta is the fourth section that remains here.")
    + _section("See Also", "Links would be listed here in a real page.")
    + _section("Epsilon", "Epsilon is the fifth remaining section of the page.")
)


@pytest.fixture(scope="module")
def splitter():
    return SentenceSplitter()


def test_build_article_applies_every_rule_and_counts_what_it_drops(splitter):
    article, counts = build_article(7, "Test page", split_of(7, 0), parse_wikitext(ARTICLE), splitter)
    assert article is not None
    assert [s.title for s in article.sections] == ["Alpha", "Beta", "Gamma", "Delta", "Epsilon"]
    assert article.lead == ("The lead sentence is never part of a section.",)
    alpha = article.sections[0]
    assert [(s.paragraph, s.opener) for s in alpha.sentences] == [(0, True), (0, False), (1, False), (2, True)]
    gamma = article.sections[2]
    assert [(s.text, s.opener) for s in gamma.sentences] == [("Gamma keeps the sentence after a long one.", False)]
    assert all(5 <= s.n_tokens <= 50 for section in article.sections for s in section.sentences)
    assert counts["sections_removed_by_title"] == 2
    assert counts["sections_without_sentences"] == 1
    assert counts["sentences_too_short"] == 2
    assert counts["sentences_too_long"] == 1
    assert counts["articles_used"] == 1
    assert counts["sentences_kept"] == sum(len(s.sentences) for s in article.sections)


def test_build_article_rejects_an_article_with_four_remaining_sections(splitter):
    four = ARTICLE.replace("== Epsilon ==", "== Notes ==")
    article, counts = build_article(7, "Test page", "train", parse_wikitext(four), splitter)
    assert article is None
    assert counts["articles_too_few_sections"] == 1 and counts["articles_used"] == 0


def test_an_article_without_enough_sections_with_paragraphs_is_rejected_before_sentence_splitting():
    class NoSplitting:
        def split(self, paragraphs):
            raise AssertionError("sentences were split for an article that cannot be used")

    four = "The lead.\n\n" + "".join(
        _section(title, f"{title} is a section with a paragraph of prose.")
        for title in ("Alpha", "Beta", "Gamma", "Delta")
    ) + _section("Epsilon", "* a list, which is not a paragraph")
    article, counts = build_article(7, "Test page", "train", parse_wikitext(four), NoSplitting())
    assert article is None
    assert counts["articles_too_few_sections"] == 1 and counts["sentences_kept"] == 0


def test_the_sentence_splitter_bounds_its_vocabulary_without_changing_sentences():
    paragraphs = [f"Word{i}a word{i}b appear here. Then word{i}c and word{i}d end it." for i in range(300)]
    unbounded = SentenceSplitter()
    fresh = len(unbounded.nlp.vocab)  # a new pipeline's own lexemes
    bounded = SentenceSplitter(max_vocab_lexemes=fresh + 100)
    split_bounded, split_unbounded = [], []
    for start in range(0, len(paragraphs), 10):  # one call per article, as the pipeline does
        split_bounded += bounded.split(paragraphs[start:start + 10])
        split_unbounded += unbounded.split(paragraphs[start:start + 10])
        assert len(bounded.nlp.vocab) <= fresh + 100 + 40  # the bound plus one call's new words
    assert len(unbounded.nlp.vocab) > fresh + 1200
    assert split_bounded == split_unbounded
    assert [len(sentences) for sentences in split_bounded] == [2] * 300


@pytest.mark.slow   # seconds of real work: the fast tier stays under 3 minutes
def test_the_tokenizer_cache_changes_no_sentence_of_real_paragraphs():
    from itertools import islice

    from pipeline.read.dumps import Page, decode_pages, embedded_dump_path

    pages = (page for page in decode_pages(embedded_dump_path())
             if isinstance(page, Page) and page.namespace == 0 and not page.redirect)
    paragraphs = [paragraph.text for page in islice(pages, 12) for section in parse_wikitext(page.text).sections
                  for paragraph in section.paragraphs]
    cached = SentenceSplitter()
    uncached = SentenceSplitter()
    uncached.nlp.tokenizer.max_cache_size = 0  # every chunk tokenized afresh
    assert cached.nlp.tokenizer.max_cache_size > 10_000  # spaCy's default keeps only the first 10,000 chunks
    reference = uncached.split(paragraphs)
    assert len(paragraphs) > 300 and sum(map(len, reference)) > 1000
    assert cached.split(paragraphs) == reference  # first sight: chunks go into the cache
    assert cached.split(paragraphs) == reference  # every chunk now comes from the cache
