"""Wikitext -> lead + top-level sections -> paragraphs of plain prose, with mwparserfromhell.

The parse walks the constructs mwparserfromhell's tokenizer finds (Heading, Text, Tag, Wikilink,
ExternalLink, Template, Comment, HTMLEntity, ...) and keeps only the text a reader sees as
running prose (it renders from the token stream, see `_TokenRenderer`, with the same result
as walking mwparserfromhell's node tree, at a third of the cost):

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

import bisect
import re
from typing import NamedTuple

from mwparserfromhell.definitions import is_visible
from mwparserfromhell.nodes import HTMLEntity
from mwparserfromhell.parser import ParserError
from mwparserfromhell.parser import tokens as T
from mwparserfromhell.parser.builder import Builder

from pipeline.parse.collector import collector_paused
from pipeline.parse.mwtokens import tokenize

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
_SPACE_BEFORE_PUNCTUATION = re.compile(r" +([,.;:!?)])")
_HAS_WORD = re.compile(r"\w")
# Wikitext that mwparserfromhell left as plain text (it gives up on some malformed pages): these
# markers, a line of a table (a paragraph starting with "|"), or an HTML tag.
_MARKUP_RESIDUE_MARKERS = ("[[", "]]", "{{", "}}", "{|", "|}", "|-", "''")
_HTML_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*[ />]")

_BREAK = "\n\n"
# mwparserfromhell's recursive tree builder gave up (RecursionError) a few hundred levels deep;
# the renderer keeps that limit so that such a page is still dead-lettered.
MAX_NESTING = 300

# Every construct is one span of tokens from its opener to its closer.
_OPENERS = frozenset({T.TemplateOpen, T.ArgumentOpen, T.WikilinkOpen, T.ExternalLinkOpen, T.HTMLEntityStart,
                      T.HeadingStart, T.CommentStart, T.TagOpenOpen})
_CLOSERS = frozenset({T.TemplateClose, T.ArgumentClose, T.WikilinkClose, T.ExternalLinkClose, T.HTMLEntityEnd,
                      T.HeadingEnd, T.CommentEnd, T.TagCloseClose, T.TagCloseSelfclose})
_SILENT_OPENERS = frozenset({T.TemplateOpen, T.ArgumentOpen, T.CommentStart})  # render as nothing
_TAG_NAME_ENDS = frozenset({T.TagAttrStart, T.TagCloseOpen, T.TagCloseSelfclose})
# Kinds of the top-level items `_TokenRenderer.prose_items` yields.
_HEADING, _TEXT, _LIST_LINE, _RENDERED = "heading", "text", "list line", "rendered"


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
    """Parses one page's wikitext into its lead and top-level sections of prose paragraphs,
    with Python's cyclic garbage collector paused (`collector.collector_paused`: the tokens of a
    page are up to hundreds of thousands of objects).

    Raises what mwparserfromhell raises on wikitext it cannot tokenize, and RecursionError on
    constructs nested deeper than `MAX_NESTING`; the caller dead-letters the page.
    """
    with collector_paused():
        return _paragraphs_of(_TokenRenderer(tokenize(text)))


def _paragraphs_of(page: _TokenRenderer) -> ParsedPage:
    """The lead and top-level sections of the rendered page."""
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
    for kind, value in page.prose_items(0, len(page.tokens)):
        if kind is _HEADING:
            flush()
            in_list_line = False
            level, title = value
            title = normalise_whitespace(title)
            if level <= 2 or not sections:
                sections.append((title, []))
                path, heading_levels = (title,), (level,)
            else:
                # Keep ancestors with a lower level; this heading replaces same/deeper ones.
                keep = [i for i, heading_level in enumerate(heading_levels) if heading_level < level] or [0]
                path = tuple(path[i] for i in keep) + (title,)
                heading_levels = tuple(heading_levels[i] for i in keep) + (level,)
            continue
        if in_list_line:
            if kind is _TEXT and "\n" in value:
                in_list_line = False
                block.append(_BREAK + value.split("\n", 1)[1])
            continue
        if kind is _LIST_LINE:
            in_list_line = True
            block.append(_BREAK)
            continue
        block.append(value)
    flush()
    return ParsedPage(
        lead=tuple(lead),
        sections=tuple(Section(title, tuple(paragraphs)) for title, paragraphs in sections),
        markup_residue_paragraphs=residue,
    )


class _TokenRenderer:
    """Renders mwparserfromhell's token stream of one page straight to prose.

    mwparserfromhell's own tree builder (pure Python, one object per node, recursive) cost twice
    its C tokenizer on real pages; the rendering needs no tree: every construct is a span from an
    opening to its closing token, found once (`close`), and a template, comment or argument is
    skipped by jumping over its span. What each construct renders as is described in the
    module docstring; tag names, link targets and bare URLs are read as the wikitext they were
    written as (`source`), like `str()` of the builder's nodes.
    """

    def __init__(self, token_list: list):
        self.tokens = token_list
        self.close, self.headings = _matching_closes(token_list)

    def holds_heading(self, start: int, stop: int) -> bool:
        first = bisect.bisect_left(self.headings, start)
        return first < len(self.headings) and self.headings[first] < stop

    def prose_items(self, start: int, stop: int):
        """(kind, value) per top-level construct in [start, stop): headings as (level, title), text
        as its string, a wiki-markup list item as `_LIST_LINE`, anything else rendered. A tag whose
        contents hold a heading (an unclosed `''` swallows the headings after it, seen in
        "Anarchism") is opened up and its contents walked as top-level."""
        tokens, close = self.tokens, self.close
        i = start
        while i < stop:
            token = tokens[i]
            kind = type(token)
            if kind is T.Text:
                yield _TEXT, token["text"]  # tokens are dicts: their attributes go through a Python __getattr__
                i += 1
            elif kind is T.HeadingStart:
                yield _HEADING, (token.level, self.render(i + 1, close[i]))
                i = close[i] + 1
            elif kind is T.TagOpenOpen:
                name, contents = self.tag_parts(i)
                if contents is not None and self.holds_heading(*contents):
                    yield from self.prose_items(*contents)
                elif name in LIST_TAGS and token.wiki_markup:
                    yield _LIST_LINE, None
                else:
                    yield _RENDERED, self.render_tag(name, contents)
                i = close[i] + 1
            else:
                end = self.after(i)
                yield _RENDERED, self.render(i, end)
                i = end

    def render(self, start: int, stop: int) -> str:
        """The visible prose of the constructs in [start, stop)."""
        tokens, close = self.tokens, self.close
        parts = []
        i = start
        while i < stop:
            token = tokens[i]
            kind = type(token)
            if kind is T.Text:
                parts.append(token["text"])
                i += 1
                continue
            end = close[i] if kind in _OPENERS else i
            if kind is T.WikilinkOpen:
                parts.append(self.render_wikilink(i + 1, end))
            elif kind is T.ExternalLinkOpen:
                parts.append(self.render_external_link(token.brackets, i + 1, end))
            elif kind is T.TagOpenOpen:
                parts.append(self.render_tag(*self.tag_parts(i)))
            elif kind is T.HTMLEntityStart:
                parts.append(_entity(tokens[i + 1 : end]))
            elif kind is T.HeadingStart:  # a heading nested inside a tag: keep its words
                parts.append(self.render(i + 1, end))
            elif kind not in _SILENT_OPENERS:
                raise ParserError(f"unexpected {kind.__name__} token")
            i = end + 1
        return "".join(parts)

    def after(self, index: int) -> int:
        """The index just past the construct (or lone token) that starts at `index`."""
        return self.close[index] + 1 if type(self.tokens[index]) in _OPENERS else index + 1

    def split_at(self, start: int, stop: int, separator) -> int | None:
        """The first `separator` token at this level of [start, stop), or None."""
        i = start
        while i < stop:
            if type(self.tokens[i]) is separator:
                return i
            i = self.after(i)
        return None

    def source(self, start: int, stop: int) -> str:
        """The wikitext of [start, stop), as `str()` of its nodes gives it."""
        if all(type(token) is T.Text for token in self.tokens[start:stop]):
            return "".join(token["text"] for token in self.tokens[start:stop])
        return str(Builder().build(list(self.tokens[start:stop])))

    def render_wikilink(self, start: int, stop: int) -> str:
        separator = self.split_at(start, stop, T.WikilinkSeparator)
        title_end = stop if separator is None else separator
        title = self.source(start, title_end).strip()
        if title.startswith(":"):  # [[:Category:X]] is a visible link to the category page
            return title[1:] if separator is None else self.render(separator + 1, stop)
        if ":" in title:
            prefix = title.split(":", 1)[0].strip().lower()
            if prefix in NON_PROSE_LINK_NAMESPACES or _INTERLANGUAGE_PREFIX.match(prefix):
                return ""
        return self.render(start, title_end) if separator is None else self.render(separator + 1, stop)

    def render_external_link(self, brackets: bool, start: int, stop: int) -> str:
        separator = self.split_at(start, stop, T.ExternalLinkSeparator)
        if not brackets:
            return self.source(start, stop if separator is None else separator)
        return "" if separator is None else self.render(separator + 1, stop)

    def tag_parts(self, start: int) -> tuple[str, tuple[int, int] | None]:
        """A tag's lower-cased name and the span of its contents (None when self-closing)."""
        tokens, close = self.tokens, self.close
        end = close[start]
        i = start + 1
        while type(tokens[i]) not in _TAG_NAME_ENDS:
            i = self.after(i)
        name = self.source(start + 1, i).strip().lower()
        if type(tokens[end]) is T.TagCloseSelfclose:
            return name, None
        while type(tokens[i]) is not T.TagCloseOpen:  # attributes
            i = self.after(i)
        contents_end = self.split_at(i + 1, end, T.TagOpenClose)
        if contents_end is None:
            raise ParserError("tag without its closing tag")
        return name, (i + 1, contents_end)

    def render_tag(self, name: str, contents: tuple[int, int] | None) -> str:
        """`_BREAK` for block elements that end a paragraph; the contents of formatting tags."""
        if name in BLOCK_TAGS:
            return _BREAK
        if name == "br":
            return " "
        if name in DROPPED_INLINE_TAGS or not is_visible(name) or name in LIST_TAGS or contents is None:
            return ""
        return self.render(*contents)


def _matching_closes(token_list: list) -> tuple[list[int], list[int]]:
    """For each opening token the index of its closing token (every construct is one span), and
    the indexes of the headings' opening tokens, in order."""
    close = [0] * len(token_list)
    headings = []
    open_at: list[int] = []
    for index, token in enumerate(token_list):
        kind = type(token)
        if kind in _OPENERS:
            if kind is T.HeadingStart:
                headings.append(index)
            open_at.append(index)
            if len(open_at) > MAX_NESTING:
                raise RecursionError(f"wikitext nested deeper than {MAX_NESTING} levels")
        elif kind in _CLOSERS:
            if not open_at:
                raise ParserError(f"unmatched {kind.__name__} token")
            close[open_at.pop()] = index
    if open_at:
        raise ParserError(f"unclosed {type(token_list[open_at[-1]]).__name__} token")
    return close, headings


def _entity(entity_tokens: list) -> str:
    """An HTML entity's character, from the tokens between its `&` and `;`."""
    if type(entity_tokens[0]) is not T.HTMLEntityNumeric:
        return HTMLEntity(entity_tokens[0].text, named=True).normalize()
    if type(entity_tokens[1]) is T.HTMLEntityHex:
        return HTMLEntity(entity_tokens[2].text, named=False, hexadecimal=True).normalize()
    return HTMLEntity(entity_tokens[1].text, named=False, hexadecimal=False).normalize()


def split_paragraphs(rendered: str) -> list[str]:
    """Splits rendered prose at blank lines and normalises each paragraph's whitespace."""
    rendered = _BEHAVIOUR_SWITCH.sub("", rendered)
    paragraphs = (normalise_whitespace(chunk) for chunk in _PARAGRAPH_BREAK.split(rendered))
    return [p for p in paragraphs if _HAS_WORD.search(p)]


def has_markup_residue(paragraph: str) -> bool:
    """Substring tests first: one regular expression of all the markers took twice as long."""
    return (paragraph.startswith("|") or any(marker in paragraph for marker in _MARKUP_RESIDUE_MARKERS)
            or ("<" in paragraph and _HTML_TAG.search(paragraph) is not None))


def normalise_whitespace(text: str) -> str:
    text = " ".join(text.split())  # str.split's whitespace is the regex \s: the same, at half the cost
    return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", text) if " " in text else text
