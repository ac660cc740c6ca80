"""Paragraph -> sentences with token counts, with spaCy.

The default is a blank English pipeline with the rule-based `sentencizer` (fast, no model
download). Any installed spaCy model can be named instead (`--spacy-model en_core_web_sm`);
if it has no component that sets sentence boundaries, a sentencizer is added.

A sentence's token count is the number of spaCy tokens that are not whitespace (punctuation
counts as a token, as it does for the GloVe-style tokenizer the model uses).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from pipeline.parse.collector import collector_paused

DEFAULT_SPACY_MODEL = "blank:en"
# spaCy's vocabulary keeps every word type it has tokenised (about 400 bytes each, measured), so
# over a whole dump a worker's would grow by millions. Sentences and token counts do not depend
# on it, so the pipeline is loaded afresh once it holds this many (about 100 MiB).
MAX_VOCAB_LEXEMES = 250_000


class ParagraphTooLong(ValueError):
    """A paragraph longer than spaCy's `max_length` (1,000,000 characters): spaCy would raise
    E088. Such a page is dead-lettered by the pipeline, never fatal."""


class Sentence(NamedTuple):
    text: str
    n_tokens: int


class SentenceSplitter:
    """Splits paragraphs into sentences; build one per worker (loading spaCy is slow)."""

    def __init__(self, model: str = DEFAULT_SPACY_MODEL, max_vocab_lexemes: int = MAX_VOCAB_LEXEMES):
        self.model = model
        self.max_vocab_lexemes = max_vocab_lexemes
        self.nlp = load_sentence_pipeline(model)

    def split(self, paragraphs: Sequence[str]) -> list[list[Sentence]]:
        """One list of sentences per paragraph, in order."""
        if len(self.nlp.vocab) > self.max_vocab_lexemes:
            self.nlp = load_sentence_pipeline(self.model)
        longest = max(map(len, paragraphs), default=0)
        if longest > self.nlp.max_length:
            raise ParagraphTooLong(f"a paragraph of {longest:,} characters (the sentence splitter takes at most "
                                   f"{self.nlp.max_length:,})")
        with collector_paused():   # spaCy's objects of one page, freed by reference counting
            return [sentences_of(text, doc) for text, doc in zip(paragraphs, self.nlp.pipe(paragraphs))]


def sentences_of(text: str, doc) -> list[Sentence]:
    """The non-blank sentences of a paragraph's Doc. Reads only span offsets and one array of the
    Doc: creating a Python Token per token to count them cost as much as spaCy's tokenizer."""
    from spacy.attrs import IS_SPACE

    space = doc.to_array(IS_SPACE)  # whitespace tokens: runs of whitespace other than one space
    has_space = space.any()
    sentences = []
    for span in doc.sents:
        sentence = text[span.start_char:span.end_char].strip()  # Span.text, without building it
        if sentence:
            n_tokens = span.end - span.start
            if has_space:
                n_tokens -= int(space[span.start:span.end].sum())
            sentences.append(Sentence(sentence, n_tokens))
    return sentences


def load_sentence_pipeline(model: str):
    """A blank pipeline (`blank:<lang>`) or an installed model, with a sentence splitter."""
    import spacy  # here, not above: every command's flags (the --spacy-model default) parse without it

    if model.startswith("blank:"):
        nlp = spacy.blank(model.split(":", 1)[1])
    else:
        nlp = spacy.load(model, exclude=["ner", "lemmatizer", "textcat"])
    if not any(nlp.has_pipe(name) for name in ("sentencizer", "senter", "parser")):
        nlp.add_pipe("sentencizer")
    # The tokenizer memoises each whitespace-separated chunk's tokens, but by default only the
    # first 10,000 chunks it sees; a worker sees millions. Caching as many chunks as the vocabulary
    # may hold before the reload gives the same tokens, 1.6x faster on 2,000 pages of the 2019 dump
    # seen once (16.1 -> 9.8 s) and 10x on paragraphs whose words were seen before.
    tokenizer: Any = nlp.tokenizer   # spaCy types it as any callable; a loaded pipeline's is its Tokenizer
    tokenizer.max_cache_size = MAX_VOCAB_LEXEMES
    return nlp
