"""Serialisation of the pipeline's outputs, the data contracts between the stages.

Triplet shards hold `tf.train.Example`s with the contract's features (bytes `anchor`,
`positive`, `negative`, `title`, `anchor_section`, `negative_section`, `kind`, `strategy`;
int64 `article_id`) plus int64 provenance features that let a reader check the rules:
`anchor_section_index`, `negative_section_index`, `negative_article_id`, `anchor_paragraph`,
`positive_paragraph`, `negative_paragraph` (paragraph indices within their sections; -1 where
the sentence is a title, in titles triplets).

The pipeline does not import TensorFlow: importing it costs every Beam worker about 3 s and
several hundred MiB for nothing but two protobuf messages. `tf.train.Example` is declared here
from TensorFlow's `feature.proto` / `example.proto` (same package, names and field numbers) in
a private descriptor pool, and protobuf serialises it; a test checks the bytes equal
TensorFlow's own serialisation of the same example.
"""
from __future__ import annotations

import json
from typing import Sequence

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from pipeline.cli import UsageError
from pipeline.rules import Article
from pipeline.triplets import Triplet

# The triplet datasets, one folder each: sentence triplets by the rule their negatives follow
# (`--negatives`; the triplet feature `strategy` names it): the paper's dataset and its two
# ablations; and title triplets.
PAPER_DATASET = "triplets-sen"
SENTENCE_DATASETS = {
    PAPER_DATASET: "adjacent",
    "triplets-sen-same_article": "same_article",
    "triplets-sen-other_article": "other_article",
}
TITLES_DATASET = "triplets-titles"
TRIPLET_DATASETS = (*SENTENCE_DATASETS, TITLES_DATASET)

# Written last by a run (`pipeline.outputs`): {"outputs": {folder: {"records": n, "shards": [path
# relative to the run folder, ...]}}, "stats": "stats.json"}; folders are `<dataset>/<split>`,
# `scb`, `passages` and `dead_letters`.
MANIFEST = "manifest.json"


class ManifestError(UsageError):
    """A run folder without a (readable) manifest, or without the output asked for."""


def read_manifest(data: str) -> dict:
    """The manifest of the run folder `data` (local or gs://); ManifestError naming it if absent."""
    from apache_beam.io.filesystems import FileSystems

    path = f"{data.rstrip('/')}/{MANIFEST}"
    if not FileSystems.exists(path):
        raise ManifestError(f"{data} has no {MANIFEST}: not the output of a finished pipeline.run "
                            "(it failed, still runs, or the path is wrong)")
    with FileSystems.open(path) as handle:
        return json.loads(handle.read().decode("utf-8"))


def manifest_output(data: str, folder: str) -> tuple[list[str], int]:
    """(shard paths, record count) of one output folder (e.g. `triplets-sen/train`) of a run."""
    outputs = read_manifest(data)["outputs"]
    if folder not in outputs:
        raise ManifestError(f"{data}/{MANIFEST} lists no {folder} (it lists {', '.join(sorted(outputs))})")
    entry = outputs[folder]
    return [f"{data.rstrip('/')}/{shard}" for shard in entry["shards"]], int(entry["records"])


BYTES_FEATURES = ("anchor", "positive", "negative", "title", "anchor_section", "negative_section", "kind", "strategy")
INT64_FEATURES = (
    "article_id",
    "anchor_section_index",
    "negative_section_index",
    "negative_article_id",
    "anchor_paragraph",
    "positive_paragraph",
    "negative_paragraph",
)


_TF_EXAMPLE_PROTO = """
name: "wikisim/tensorflow_example.proto" package: "tensorflow" syntax: "proto3"
message_type { name: "BytesList"
  field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_BYTES } }
message_type { name: "FloatList"
  field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_FLOAT options { packed: true } } }
message_type { name: "Int64List"
  field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_INT64 options { packed: true } } }
message_type { name: "Feature"
  field { name: "bytes_list" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tensorflow.BytesList" oneof_index: 0 }
  field { name: "float_list" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tensorflow.FloatList" oneof_index: 0 }
  field { name: "int64_list" number: 3 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tensorflow.Int64List" oneof_index: 0 }
  oneof_decl { name: "kind" } }
message_type { name: "Features"
  field { name: "feature" number: 1 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".tensorflow.Features.FeatureEntry" }
  nested_type { name: "FeatureEntry"
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".tensorflow.Feature" }
    options { map_entry: true } } }
message_type { name: "Example"
  field { name: "features" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".tensorflow.Features" } }
"""


def _example_class():
    pool = descriptor_pool.DescriptorPool()  # private: no clash with TensorFlow's own registration
    pool.Add(text_format.Parse(_TF_EXAMPLE_PROTO, descriptor_pb2.FileDescriptorProto()))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


Example = _example_class()


# Features that every triplet of one article and dataset shares (but for other_article's donors):
# set once per distinct value and copied; the others are set per triplet.
ARTICLE_FEATURES = ("title", "kind", "strategy", "article_id", "negative_article_id")


def _bytes_and_int64(shared: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The (bytes, int64) features that are shared, or set per triplet: split once, not per triplet."""
    return tuple(tuple(name for name in names if (name in ARTICLE_FEATURES) == shared)
                 for names in (BYTES_FEATURES, INT64_FEATURES))


_SHARED, _PER_TRIPLET = _bytes_and_int64(shared=True), _bytes_and_int64(shared=False)


def triplet_examples(triplets: Sequence[Triplet]) -> list[bytes]:
    """Serialised `tf.train.Example`s of the triplets (map keys sorted: same triplet, same bytes).

    The shared features (`ARTICLE_FEATURES`) are built once per distinct value and copied into
    each example, a quarter of the cost of setting all fifteen features every time.
    """
    shared: dict[tuple, object] = {}
    serialised = []
    for triplet in triplets:
        key = tuple(getattr(triplet, name) for name in ARTICLE_FEATURES)
        if key not in shared:
            shared[key] = _add_features(Example(), triplet, *_SHARED)
        example = Example()
        example.CopyFrom(shared[key])
        serialised.append(_add_features(example, triplet, *_PER_TRIPLET).SerializeToString(deterministic=True))
    return serialised


def _add_features(example, triplet: Triplet, bytes_names: tuple[str, ...], int64_names: tuple[str, ...]):
    feature = example.features.feature
    for name in bytes_names:
        feature[name].bytes_list.value.append(getattr(triplet, name).encode("utf-8"))
    for name in int64_names:
        feature[name].int64_list.value.append(getattr(triplet, name))
    return example


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
