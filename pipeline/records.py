"""Serialisation of the pipeline's outputs, exactly as DESIGN.md's data contracts say.

Triplet shards hold `tf.train.Example`s with the contract's features (bytes `anchor`,
`positive`, `negative`, `title`, `anchor_section`, `negative_section`, `kind`, `strategy`;
int64 `article_id`) plus int64 provenance features that let a reader check the rules:
`anchor_section_index`, `negative_section_index`, `negative_article_id`, `anchor_paragraph`,
`positive_paragraph` (-1 for titles triplets).
"""
from __future__ import annotations

import json

import tensorflow as tf

from pipeline.rules import Article
from pipeline.triplets import Triplet

BYTES_FEATURES = ("anchor", "positive", "negative", "title", "anchor_section", "negative_section", "kind", "strategy")
INT64_FEATURES = (
    "article_id",
    "anchor_section_index",
    "negative_section_index",
    "negative_article_id",
    "anchor_paragraph",
    "positive_paragraph",
)


def triplet_feature_spec() -> dict:
    """The parsing spec for `tf.io.parse_example` / `parse_single_example`."""
    spec = {name: tf.io.FixedLenFeature([], tf.string) for name in BYTES_FEATURES}
    spec.update({name: tf.io.FixedLenFeature([], tf.int64) for name in INT64_FEATURES})
    return spec


def triplet_example(triplet: Triplet) -> bytes:
    features = {
        name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[getattr(triplet, name).encode("utf-8")]))
        for name in BYTES_FEATURES
    }
    features.update(
        {name: tf.train.Feature(int64_list=tf.train.Int64List(value=[getattr(triplet, name)])) for name in INT64_FEATURES}
    )
    example = tf.train.Example(features=tf.train.Features(feature=features))
    return example.SerializeToString(deterministic=True)  # map keys sorted: same triplet, same bytes


def scb_record(article: Article) -> dict:
    """All kept sentences of the article with their section label and opener flag."""
    sentences, labels, openers = [], [], []
    for label, section in enumerate(article.sections):
        for sentence in section.sentences:
            sentences.append(sentence.text)
            labels.append(label)
            openers.append(sentence.opener)
    return {
        "article_id": article.article_id,
        "title": article.title,
        "sections": [section.title for section in article.sections],
        "sentences": sentences,
        "labels": labels,
        "openers": openers,
    }


def passages_record(article: Article) -> dict:
    """The article's lead and its kept sections' paragraphs with their heading paths."""
    return {
        "article_id": article.article_id,
        "title": article.title,
        "split": article.split,
        "lead": list(article.lead),
        "sections": [
            {
                "title": section.title,
                "paragraphs": [{"text": p.text, "path": list(p.path)} for p in section.paragraphs],
            }
            for section in article.sections
        ],
    }


def json_line(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, sort_keys=True)
