"""wikitext -> lead, top-level sections and prose paragraphs, on hand-written wikitext."""
import gc

import mwparserfromhell
import pytest

from pipeline.parse.collector import collector_paused
from pipeline.parse.sentences import SentenceSplitter
from pipeline.parse.wikitext import parse_wikitext

PAGE = """{{Infobox country|name=Freedonia|capital=Fredville|population=12,000}}
{{Use British English|date=May 2016}}
'''Freedonia''' is a small [[country]] in [[Europe]].<ref>{{cite web|url=http://x.org|title=Atlas}}</ref> \
It is fictional.
<!-- editors: keep the lead short -->
[[File:Flag of Freedonia.svg|thumb|The [[flag]] of Freedonia]]

== History ==
The kingdom was founded in 1820 by [[Rufus T. Firefly|Firefly]]
after a long war.<ref name="a">Smith 2001, p. 4.</ref>

A second paragraph follows the blank line &amp; more.
* A list item that is not prose
* Another list item
The prose after the list is a new paragraph.
{| class="wikitable"
! Year !! Event
|-
| 1820 || Founding
|}
Text after the table.

=== Early years ===
The early years were calm [http://example.org according to sources].

==== Court ====
The court moved twice.

== Geography ==
Freedonia has [[mountain]]s and rivers.
: an indented remark that is a definition list
; A term
[[Category:Fictional countries]]
[[fr:Freedonie]]
"""


def test_lead_and_top_level_sections_with_sub_sections_folded_in():
    parsed = parse_wikitext(PAGE)
    assert [section.title for section in parsed.sections] == ["History", "Geography"]
    assert [paragraph.text for paragraph in parsed.lead] == ["Freedonia is a small country in Europe. It is fictional."]
    history = parsed.sections[0]
    assert [paragraph.text for paragraph in history.paragraphs] == [
        "The kingdom was founded in 1820 by Firefly after a long war.",
        "A second paragraph follows the blank line & more.",
        "The prose after the list is a new paragraph.",
        "Text after the table.",
        "The early years were calm according to sources.",
        "The court moved twice.",
    ]
    assert [paragraph.path for paragraph in history.paragraphs] == [
        ("History",), ("History",), ("History",), ("History",),
        ("History", "Early years"),
        ("History", "Early years", "Court"),
    ]


def test_markup_that_is_not_prose_is_left_out():
    parsed = parse_wikitext(PAGE)
    text = " ".join(p.text for p in parsed.lead + parsed.sections[0].paragraphs + parsed.sections[1].paragraphs)
    for not_prose in ("Infobox", "Fredville", "Atlas", "Smith 2001", "editors", "thumb", "flag", "list item",
                      "Founding", "indented", "A term", "Fictional countries", "Freedonie", "http"):
        assert not_prose not in text
    assert [p.text for p in parsed.sections[1].paragraphs] == ["Freedonia has mountains and rivers."]


def test_a_sub_heading_after_a_level_two_heading_keeps_only_its_ancestors_in_the_path():
    parsed = parse_wikitext("== A ==\n=== B ===\nOne.\n==== C ====\nTwo.\n=== D ===\nThree.\n")
    assert [p.path for p in parsed.sections[0].paragraphs] == [("A", "B"), ("A", "B", "C"), ("A", "D")]


def test_headings_swallowed_by_an_unclosed_italic_tag_still_open_sections():
    # mwparserfromhell nests what follows an unclosed '' inside an italic Tag (seen in "Anarchism").
    text = "== A ==\nStart ''of an italic\n\nthat never closes.\n\n== B ==\nText of B.\n"
    nested = mwparserfromhell.parse(text)
    assert [str(h.title).strip() for h in nested.filter_headings()] == ["A", "B"]
    parsed = parse_wikitext(text)
    assert [section.title for section in parsed.sections] == ["A", "B"]
    assert [p.text for p in parsed.sections[1].paragraphs] == ["Text of B."]


def test_paragraphs_with_wikitext_the_parser_left_as_text_are_dropped_and_counted():
    # A table row outside any table is plain text to mwparserfromhell.
    parsed = parse_wikitext("== A ==\nGood prose here.\n\n|- style=\"x\" | cell || cell\n\nMore prose.\n")
    assert [p.text for p in parsed.sections[0].paragraphs] == ["Good prose here.", "More prose."]
    assert parsed.markup_residue_paragraphs == 1


def test_deeply_nested_templates_raise_so_the_pipeline_can_dead_letter_the_page():
    with pytest.raises(RecursionError):
        parse_wikitext("{{" * 5000 + "x" + "}}" * 5000)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_inside_and_left_as_it_was_by_the_parse_and_the_splitter(enabled):
    (gc.enable if enabled else gc.disable)()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
        with pytest.raises(RecursionError):
            parse_wikitext("{{" * 5000 + "x" + "}}" * 5000)
        assert gc.isenabled() == enabled
        parse_wikitext(PAGE)
        assert gc.isenabled() == enabled
        assert SentenceSplitter().split(["One sentence here. And a second one."])[0][1].n_tokens == 5
        assert gc.isenabled() == enabled
    finally:
        gc.enable()


def test_sentence_splitter_counts_non_space_tokens():
    splitter = SentenceSplitter()
    [sentences] = splitter.split(["The cat sat on the mat.  It was warm, and it slept!"])
    assert [s.text for s in sentences] == ["The cat sat on the mat.", "It was warm, and it slept!"]
    assert [s.n_tokens for s in sentences] == [7, 8]
