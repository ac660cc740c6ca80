"""Paragraph -> sentences with token counts, with spaCy.

The default is a blank English pipeline with the rule-based `sentencizer` (fast, no model
download). Any installed spaCy model can be named instead (`--spacy_model en_core_web_sm`);
if it has no component that sets sentence boundaries, a sentencizer is added.

A sentence's token count is the number of spaCy tokens that are not whitespace (punctuation
counts as a token, as it does for the GloVe-style tokenizer the model uses).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import spacy

DEFAULT_SPACY_MODEL = "blank:en"


class Sentence(NamedTuple):
    text: str
    n_tokens: int


class SentenceSplitter:
    """Splits paragraphs into sentences; build one per worker (loading spaCy is slow)."""

    def __init__(self, model: str = DEFAULT_SPACY_MODEL):
        if model.startswith("blank:"):
            self.nlp = spacy.blank(model.split(":", 1)[1])
        else:
            self.nlp = spacy.load(model, exclude=["ner", "lemmatizer", "textcat"])
        if not any(self.nlp.has_pipe(name) for name in ("sentencizer", "senter", "parser")):
            self.nlp.add_pipe("sentencizer")

    def split(self, paragraphs: Sequence[str]) -> list[list[Sentence]]:
        """One list of sentences per paragraph, in order."""
        return [
            [
                Sentence(span.text.strip(), sum(1 for token in span if not token.is_space))
                for span in doc.sents
                if span.text.strip()
            ]
            for doc in self.nlp.pipe(paragraphs)
        ]
