"""The run's records made from the job's articles and triplets: the producer's side of the
contracts `core.records` declares (a consumer reads them back with `core.records` alone)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.message import Message

from core.records import (
    ARTICLE_FEATURES,
    BYTES_FEATURES,
    INT64_FEATURES,
    Example,
    PassageParagraph,
    PassageSection,
    PassagesRecord,
    ScbRecord,
)
from pipeline.triplets.make import Triplet
from pipeline.triplets.rules import Article


def _bytes_and_int64(shared: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The (bytes, int64) features that are shared, or set per triplet: split once, not per triplet."""
    def split(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(name for name in names if (name in ARTICLE_FEATURES) == shared)

    return split(BYTES_FEATURES), split(INT64_FEATURES)


_SHARED, _PER_TRIPLET = _bytes_and_int64(shared=True), _bytes_and_int64(shared=False)


def triplet_examples(triplets: Sequence[Triplet]) -> list[bytes]:
    """Serialised `tf.train.Example`s of the triplets (map keys sorted: same triplet, same bytes).

    The shared features (`ARTICLE_FEATURES`) are built once per distinct value and copied into
    each example, a quarter of the cost of setting all fifteen features every time.
    """
    shared: dict[tuple[object, ...], Message] = {}
    serialised = []
    for triplet in triplets:
        key = tuple(getattr(triplet, name) for name in ARTICLE_FEATURES)
        if key not in shared:
            shared[key] = _add_features(Example(), triplet, *_SHARED)
        example = Example()
        example.CopyFrom(shared[key])
        serialised.append(_add_features(example, triplet, *_PER_TRIPLET).SerializeToString(deterministic=True))
    return serialised


def _add_features(example: Any, triplet: Triplet, bytes_names: tuple[str, ...], int64_names: tuple[str, ...]) -> Any:
    """`example`: an `Example`, whose fields (built at run time) the type checker cannot see."""
    feature = example.features.feature
    for name in bytes_names:
        feature[name].bytes_list.value.append(getattr(triplet, name).encode("utf-8"))
    for name in int64_names:
        feature[name].int64_list.value.append(getattr(triplet, name))
    return example


def scb_record(article: Article) -> ScbRecord:
    """All kept sentences of the article with their section label and opener flag."""
    kept = [(sentence.text, label, sentence.opener) for label, section in enumerate(article.sections)
            for sentence in section.sentences]
    sentences, labels, openers = zip(*kept) if kept else ((), (), ())
    return ScbRecord(article.article_id, article.title, tuple(section.title for section in article.sections),
                     tuple(sentences), tuple(labels), tuple(openers))


def passages_record(article: Article) -> PassagesRecord:
    """The article's lead and its kept sections' paragraphs with their heading paths."""
    return PassagesRecord(article.article_id, article.title, article.split, tuple(article.lead), tuple(
        PassageSection(section.title, tuple(PassageParagraph(p.text, tuple(p.path)) for p in section.paragraphs))
        for section in article.sections))
