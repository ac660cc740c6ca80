"""Wikitext -> lead + top-level sections -> paragraphs of plain prose, with mwparserfromhell.

The parse walks mwparserfromhell's node tree (Heading, Text, Tag, Wikilink, ExternalLink,
Template, Comment, HTMLEntity, ...) and keeps only the text a reader sees as running prose:

* Templates (infoboxes, citations, navboxes, hatnotes), comments and template arguments
  render as nothing.
* ``<ref>`` and the tags mwparserfromhell marks invisible (math, gallery, ...) render as
  nothing; tables, galleries, ``<pre>``, ``<blockquote>``, ``<poem>`` and horizontal rules
  are not paragraph text and also *end* the paragraph they interrupt.
* A list line (``*``, ``#``, ``:``, ``;``) is not paragraph text either: everything from the
  list marker to the end of its line is dropped and the surrounding prose is split there.
* File/Image/Media and Category links and interlanguage links render as nothing; any other
  wikilink renders as its label (or its title); a bracketed external link as its label.
* Formatting tags (bold, italic, span, ...) render as their contents; HTML entities are
  decoded.

Headings of level 1 or 2 open a top-level section; deeper headings are folded into the
enclosing top-level section, and every paragraph keeps its heading path
(``("History", "Early years")``). A paragraph is a run of lines separated by a blank line
(as MediaWiki renders it); a heading, a list or a block element also ends a paragraph.
Paragraphs without any letter or digit (stray punctuation left by removed markup) are dropped.
mwparserfromhell gives up on some malformed constructs and returns them as plain text (a few
tables in "Alaska", stray ``<ref>`` openers); a rendered paragraph that still holds wikitext
(``[[``, ``{{``, ``{|``, ``|-``, ``''``, an HTML tag) is dropped and counted in
``ParsedPage.markup_residue_paragraphs`` rather than fed to the sentence splitter.
Only the final whitespace normalisation and paragraph splitting use regular expressions, and
only over the already-rendered plain text.
"""
from __future__ import annotations

import re
from typing import NamedTuple

import mwparserfromhell
from mwparserfromhell.definitions import is_visible
from mwparserfromhell.nodes import (
    Argument,
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Template,
    Text,
    Wikilink,
)
from mwparserfromhell.wikicode import Wikicode

# Link namespaces whose target is media or metadata, not prose.
NON_PROSE_LINK_NAMESPACES = frozenset({"file", "image", "media", "category"})
# Interlanguage prefixes look like "fr", "de", "zh-min-nan", "be-x-old", "simple".
_INTERLANGUAGE_PREFIX = re.compile(r"^(?:[a-z]{2,3}(?:-[a-z]+)*|simple)$")
# Tags that are not paragraph text and break the paragraph they sit in.
BLOCK_TAGS = frozenset({"table", "gallery", "pre", "blockquote", "poem", "hr", "references", "timeline", "imagemap"})
# Inline tags rendered as nothing (besides those mwparserfromhell marks invisible).
DROPPED_INLINE_TAGS = frozenset({"ref", "math", "chem", "ce", "hiero", "score", "syntaxhighlight", "source", "nowiki"})
LIST_TAGS = frozenset({"li", "dt", "dd"})
_BEHAVIOUR_SWITCH = re.compile(r"__[A-Z]+__")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_WHITESPACE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCTUATION = re.compile(r" +([,.;:!?)])")
_HAS_WORD = re.compile(r"\w")
# Wikitext that mwparserfromhell left as plain text (it gives up on some malformed pages).
_MARKUP_RESIDUE = re.compile(r"\[\[|\]\]|\{\{|\}\}|\{\||\|\}|\|-|^\||''|</?[A-Za-z][A-Za-z0-9]*[ />]")

_BREAK = "\n\n"


class Paragraph(NamedTuple):
    """One paragraph of prose and the heading path it sits under (empty for the lead)."""

    text: str
    path: tuple[str, ...]


class Section(NamedTuple):
    """A top-level section with its sub-sections' paragraphs folded in, in page order."""

    title: str
    paragraphs: tuple[Paragraph, ...]


class ParsedPage(NamedTuple):
    lead: tuple[Paragraph, ...]
    sections: tuple[Section, ...]
    markup_residue_paragraphs: int  # paragraphs dropped because unparsed markup survived


def parse_wikitext(text: str) -> ParsedPage:
    """Parses one page's wikitext into its lead and top-level sections of prose paragraphs.

    Lets whatever mwparserfromhell raises on wikitext it cannot parse through (its ParserError,
    or RecursionError on thousands of nested templates); the caller dead-letters the page.
    """
    wikicode = mwparserfromhell.parse(text)
    lead: list[Paragraph] = []
    sections: list[tuple[str, list[Paragraph]]] = []
    path: tuple[str, ...] = ()
    heading_levels: tuple[int, ...] = ()
    block: list[str] = []
    residue = 0

    def flush() -> None:
        nonlocal residue
        paragraphs = split_paragraphs("".join(block))
        clean = [Paragraph(p, path) for p in paragraphs if not has_markup_residue(p)]
        residue += len(paragraphs) - len(clean)
        (sections[-1][1] if sections else lead).extend(clean)
        block.clear()

    in_list_line = False
    for node in prose_nodes(wikicode):
        if isinstance(node, Heading):
            flush()
            in_list_line = False
            title = normalise_whitespace(render_inline(node.title))
            if node.level <= 2 or not sections:
                sections.append((title, []))
                path, heading_levels = (title,), (node.level,)
            else:
                # Keep ancestors with a lower level; this heading replaces same/deeper ones.
                keep = [i for i, level in enumerate(heading_levels) if level < node.level] or [0]
                path = tuple(path[i] for i in keep) + (title,)
                heading_levels = tuple(heading_levels[i] for i in keep) + (node.level,)
            continue
        if in_list_line:
            if isinstance(node, Text) and "\n" in node.value:
                in_list_line = False
                block.append(_BREAK + node.value.split("\n", 1)[1])
            continue
        if isinstance(node, Tag) and tag_name(node) in LIST_TAGS and node.wiki_markup:
            in_list_line = True
            block.append(_BREAK)
            continue
        block.append(render_node(node))
    flush()
    return ParsedPage(
        lead=tuple(lead),
        sections=tuple(Section(title, tuple(paragraphs)) for title, paragraphs in sections),
        markup_residue_paragraphs=residue,
    )


def prose_nodes(wikicode: Wikicode):
    """Top-level nodes, with formatting tags that swallowed headings opened up.

    An unclosed `''` can make mwparserfromhell nest the following headings inside an italic
    tag (seen in "Anarchism"); such a tag's contents are walked as if they were top-level.
    """
    for node in wikicode.nodes:
        if isinstance(node, Tag) and node.contents is not None and node.contents.filter_headings():
            yield from prose_nodes(node.contents)
        else:
            yield node


def render_inline(wikicode: Wikicode) -> str:
    return "".join(render_node(node) for node in wikicode.nodes)


def render_node(node) -> str:
    """The visible prose of one node; `_BREAK` for block elements that end a paragraph."""
    if isinstance(node, Text):
        return node.value
    if isinstance(node, HTMLEntity):
        return node.normalize()
    if isinstance(node, (Template, Comment, Argument)):
        return ""
    if isinstance(node, Wikilink):
        return render_wikilink(node)
    if isinstance(node, ExternalLink):
        if not node.brackets:
            return str(node.url)
        return render_inline(node.title) if node.title is not None else ""
    if isinstance(node, Tag):
        tag = tag_name(node)
        if tag in BLOCK_TAGS:
            return _BREAK
        if tag == "br":
            return " "
        if tag in DROPPED_INLINE_TAGS or not is_visible(tag) or tag in LIST_TAGS:
            return ""
        return render_inline(node.contents) if node.contents is not None else ""
    if isinstance(node, Heading):  # a heading nested inside a tag: keep its words
        return render_inline(node.title)
    stripped = node.__strip__(normalize=True, collapse=True, keep_template_params=False)
    return str(stripped) if stripped else ""


def tag_name(tag: Tag) -> str:
    return str(tag.tag).strip().lower()


def render_wikilink(link: Wikilink) -> str:
    title = str(link.title).strip()
    if title.startswith(":"):  # [[:Category:X]] is a visible link to the category page
        return render_inline(link.text) if link.text is not None else title[1:]
    if ":" in title:
        prefix = title.split(":", 1)[0].strip().lower()
        if prefix in NON_PROSE_LINK_NAMESPACES or _INTERLANGUAGE_PREFIX.match(prefix):
            return ""
    return render_inline(link.text if link.text is not None else link.title)


def split_paragraphs(rendered: str) -> list[str]:
    """Splits rendered prose at blank lines and normalises each paragraph's whitespace."""
    rendered = _BEHAVIOUR_SWITCH.sub("", rendered)
    paragraphs = (normalise_whitespace(chunk) for chunk in _PARAGRAPH_BREAK.split(rendered))
    return [p for p in paragraphs if _HAS_WORD.search(p)]


def has_markup_residue(paragraph: str) -> bool:
    return bool(_MARKUP_RESIDUE.search(paragraph))


def normalise_whitespace(text: str) -> str:
    return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", _WHITESPACE.sub(" ", text)).strip()
