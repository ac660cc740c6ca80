"""The data contracts between the stages, each declared once here, where the pipeline writes them.

* **Triplets** (`TRIPLET_FEATURES`, {name: type}): each `tf.train.Example` of a triplet shard
  holds these features, one value each. The writer's feature lists, the trainer's parse spec
  (`model.training.tf_input.triplet_feature_spec`) and the three roles a network compares (`ROLES`) all
  derive from it. Besides the roles and their article/section context, int64 provenance
  features let a reader check the rules (paragraph indices within their sections; -1 where the
  sentence is a title, in titles triplets).
* **SCB and passages** (`ScbRecord`, `PassagesRecord`): one JSON line per article. Every
  consumer reads a line with the type's `from_json`, which refuses a line that breaks the
  contract with a `RecordError` naming the field.
* **The manifest**, what a run wrote and the triplet schema, is `core.published`'s.

The pipeline does not import TensorFlow: importing it costs every Beam worker about 3 s and
several hundred MiB for nothing but two protobuf messages. `tf.train.Example` is declared here
from TensorFlow's `feature.proto` / `example.proto` (same package, names and field numbers) in
a private descriptor pool, and protobuf serialises it; a test checks the bytes equal
TensorFlow's own serialisation of the same example.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf.message import Message

from core.splits import SPLITS


class NegativeStrategy(StrEnum):
    """Where a sentence triplet's negative comes from (`--negatives`; the triplet feature `strategy`)."""

    ADJACENT = "adjacent"  # the paper's: an opener of the previous or the next section
    SAME_ARTICLE = "same_article"  # an opener of any other section of the article
    OTHER_ARTICLE = "other_article"  # an opener of a section of another article


class TripletKind(StrEnum):
    """The triplet feature `kind`: sentence triplets, or title triplets."""

    SEN = "sen"
    TITLES = "titles"



# The triplet datasets, one folder each: sentence triplets by the rule their negatives follow
# (`--negatives`; the triplet feature `strategy` names it): the paper's dataset and its two
# ablations; and title triplets.
PAPER_DATASET = "triplets-sen"
SENTENCE_DATASETS = {
    PAPER_DATASET: NegativeStrategy.ADJACENT,
    **{f"{PAPER_DATASET}-{strategy}": strategy for strategy in (NegativeStrategy.SAME_ARTICLE,
                                                                NegativeStrategy.OTHER_ARTICLE)},
}
DATASET_OF_STRATEGY = {strategy: dataset for dataset, strategy in SENTENCE_DATASETS.items()}
TITLES_DATASET = "triplets-titles"
TRIPLET_DATASETS = (*SENTENCE_DATASETS, TITLES_DATASET)
# The run's JSON-lines outputs, one folder each: SCB articles (`ScbRecord`), passages
# (`PassagesRecord`) and the pages set aside (dead letters, `pipeline.read.dumps.dead_letter`'s shape).
SCB = "scb"
PASSAGES = "passages"
DEAD_LETTERS = "dead_letters"


class FeatureType(StrEnum):
    BYTES = "bytes"
    INT64 = "int64"


# The three sentences of a triplet, in the order a triplet network reads them.
ROLES = ("anchor", "positive", "negative")
# Every feature of a triplet Example (the fields of `pipeline.triplets.make.Triplet` but its split).
TRIPLET_FEATURES: dict[str, FeatureType] = {
    **dict.fromkeys(ROLES, FeatureType.BYTES),
    **dict.fromkeys(("title", "anchor_section", "negative_section", "kind", "strategy"), FeatureType.BYTES),
    "article_id": FeatureType.INT64,
    # Provenance: where the negative and the three sentences come from.
    **dict.fromkeys(("anchor_section_index", "negative_section_index", "negative_article_id", "anchor_paragraph",
                     "positive_paragraph", "negative_paragraph"), FeatureType.INT64),
}
# The section each role's sentence comes from, as its (article, section index) features: the anchor
# and the positive are of the anchor's section (the paper's rule), the negative of its own.
SECTION_OF_ROLE = {"anchor": ("article_id", "anchor_section_index"), "positive": ("article_id", "anchor_section_index"),
                   "negative": ("negative_article_id", "negative_section_index")}
BYTES_FEATURES = tuple(name for name, kind in TRIPLET_FEATURES.items() if kind is FeatureType.BYTES)
INT64_FEATURES = tuple(name for name, kind in TRIPLET_FEATURES.items() if kind is FeatureType.INT64)

# Features that every triplet of one article and dataset shares (but for other_article's donors):
# a writer sets them once per distinct value (`pipeline.write.examples`).
ARTICLE_FEATURES = ("title", "kind", "strategy", "article_id", "negative_article_id")

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


def _example_class() -> type[Message]:
    pool = descriptor_pool.DescriptorPool()  # private: no clash with TensorFlow's own registration
    file_proto = text_format.Parse(_TF_EXAMPLE_PROTO, descriptor_pb2.FileDescriptorProto())
    # no-untyped-call: typeshed's protobuf stubs leave DescriptorPool's methods unannotated
    pool.Add(file_proto)  # type: ignore[no-untyped-call]
    descriptor = pool.FindMessageTypeByName("tensorflow.Example")  # type: ignore[no-untyped-call]
    return message_factory.GetMessageClass(descriptor)


Example = _example_class()


class RecordError(ValueError):
    """A JSON line that breaks the SCB or passages contract; the message names the field."""


def _field(record: Any, name: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    if not isinstance(record, dict):
        raise RecordError(f"{where.rstrip('.') or 'the record'} is a {type(record).__name__}, not a JSON object")
    if name not in record:
        raise RecordError(f"missing field '{where}{name}'")
    value = record[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise RecordError(f"field '{where}{name}' is a {type(value).__name__}")
    return value


def _list_of(record: dict[str, Any], name: str, kind: type, where: str = "") -> tuple[Any, ...]:
    values = _field(record, name, list, where)
    if any(not isinstance(value, kind) or (isinstance(value, bool) and kind is int) for value in values):
        raise RecordError(f"field '{where}{name}' holds a value that is not a {kind.__name__}")
    return tuple(values)


def _json_object(line: str | bytes) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise RecordError(f"not JSON: {error}") from None


@dataclass(frozen=True)
class ScbRecord:
    """One SCB article (`<run>/scb/*.jsonl.gz`): its kept sentences in page order, each with the
    index of its section (`labels`) and whether it opens a paragraph (`openers`)."""

    article_id: int
    title: str
    sections: tuple[str, ...]
    sentences: tuple[str, ...]
    labels: tuple[int, ...]
    openers: tuple[bool, ...]

    @classmethod
    def from_json(cls, line: str | bytes) -> ScbRecord:
        """The record of one line; RecordError when it breaks the contract (SCB clusters an
        article's sentences into its sections, so at least two sections must have some)."""
        fields = _json_object(line)
        record = cls(_field(fields, "article_id", int), _field(fields, "title", str),
                     _list_of(fields, "sections", str), _list_of(fields, "sentences", str),
                     _list_of(fields, "labels", int), _list_of(fields, "openers", bool))
        if not len(record.sentences) == len(record.labels) == len(record.openers):
            raise RecordError(f"sentences/labels/openers lengths differ: {len(record.sentences)}/"
                              f"{len(record.labels)}/{len(record.openers)}")
        if any(not 0 <= label < len(record.sections) for label in record.labels):
            raise RecordError(f"labels must index sections (0..{len(record.sections) - 1})")
        if len(set(record.labels)) < 2:
            raise RecordError("fewer than 2 sections have sentences")
        return record

    def to_json(self) -> str:
        return json_line(self)


@dataclass(frozen=True)
class PassageParagraph:
    text: str
    path: tuple[str, ...]  # the headings it sits under: (top-level section, sub-heading, ...)


@dataclass(frozen=True)
class PassageSection:
    title: str
    paragraphs: tuple[PassageParagraph, ...]


@dataclass(frozen=True)
class PassagesRecord:
    """One article of `<run>/passages/*.jsonl.gz`: its lead and its kept sections' paragraphs."""

    article_id: int
    title: str
    split: str
    lead: tuple[str, ...]
    sections: tuple[PassageSection, ...]

    @classmethod
    def from_json(cls, line: str | bytes) -> PassagesRecord:
        """The record of one line; RecordError naming the field when it breaks the contract."""
        fields = _json_object(line)
        split = _field(fields, "split", str)
        if split not in SPLITS:
            raise RecordError(f"field 'split' is {split!r}, not one of {SPLITS}")
        sections = []
        for number, section in enumerate(_field(fields, "sections", list)):
            where = f"sections[{number}]."
            paragraphs = tuple(
                PassageParagraph(_field(paragraph, "text", str, f"{where}paragraphs[{index}]."),
                                 _list_of(paragraph, "path", str, f"{where}paragraphs[{index}]."))
                for index, paragraph in enumerate(_field(section, "paragraphs", list, where)))
            sections.append(PassageSection(_field(section, "title", str, where), paragraphs))
        return cls(_field(fields, "article_id", int), _field(fields, "title", str), split,
                   _list_of(fields, "lead", str), tuple(sections))

    def to_json(self) -> str:
        return json_line(self)


def json_line(record: dict[str, Any] | ScbRecord | PassagesRecord) -> str:
    """One JSON line of a record type or of a dict (a dead letter), keys sorted."""
    fields = dataclasses.asdict(record) if dataclasses.is_dataclass(record) else record
    return json.dumps(fields, ensure_ascii=False, sort_keys=True)
