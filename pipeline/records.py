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
from collections.abc import Sequence

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from pipeline.cli import DataLossError, UsageError
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

# Written last by a run (`pipeline.outputs`): {"format_version": 2, "outputs": {folder: {"records": n,
# "shards": [path relative to the run folder, ...], "shard_bytes": [size, ...], "shard_records":
# [n, ...]}}, "stats": "stats.json"}; folders are `<dataset>/<split>`, `scb`, `passages` and
# `dead_letters`. Version 1 (no version field) had no per-shard sizes or counts.
MANIFEST = "manifest.json"
MANIFEST_VERSION = 2


class ManifestError(UsageError):
    """A run folder without a (readable) manifest, or without the output asked for."""


class ShardError(DataLossError):
    """A shard the manifest lists is missing, or not what the run wrote (size or record count)."""


def read_manifest(data: str) -> dict:
    """The manifest of the run folder `data` (local or gs://); ManifestError naming it if absent
    or of a format version this code does not know."""
    from apache_beam.io.filesystems import FileSystems

    path = f"{data.rstrip('/')}/{MANIFEST}"
    if not FileSystems.exists(path):
        raise ManifestError(f"{data} has no {MANIFEST}: not the output of a finished pipeline.run "
                            "(it failed, still runs, or the path is wrong)")
    with FileSystems.open(path) as handle:
        manifest = json.loads(handle.read().decode("utf-8"))
    if manifest.get("format_version", 1) not in (1, MANIFEST_VERSION):
        raise ManifestError(f"{path}: format_version {manifest['format_version']} is unknown to this code "
                            f"(it reads 1 and {MANIFEST_VERSION}); upgrade wikisim")
    return manifest


def manifest_output(data: str, folder: str) -> tuple[list[str], int]:
    """(shard paths, record count) of one output folder (e.g. `triplets-sen/train`) of a run.
    Every shard is first checked to exist with the size the run wrote (ShardError naming it):
    a missing, truncated or replaced shard is refused in seconds, before anything is read."""
    outputs = read_manifest(data)["outputs"]
    if folder not in outputs:
        raise ManifestError(f"{data}/{MANIFEST} lists no {folder} (it lists {', '.join(sorted(outputs))})")
    entry = outputs[folder]
    paths = [f"{data.rstrip('/')}/{shard}" for shard in entry["shards"]]
    if "shard_bytes" in entry:
        check_shard_sizes(paths, entry["shard_bytes"])
    return paths, int(entry["records"])


def shard_records(data: str, folder: str) -> dict[str, int]:
    """{shard path: records the run wrote to it} of one output folder ({} for a version-1 manifest)."""
    entry = read_manifest(data)["outputs"][folder]
    return dict(zip((f"{data.rstrip('/')}/{shard}" for shard in entry["shards"]), entry.get("shard_records", [])))


def file_sizes(paths: list[str]) -> dict[str, int | None]:
    """{path: size in bytes, or None when it does not exist}, local or remote (one listing per folder)."""
    from apache_beam.io.filesystems import FileSystems

    sizes: dict[str, int | None] = dict.fromkeys(paths)
    for folder in sorted({path.rsplit("/", 1)[0] for path in paths}):
        for meta in FileSystems.match([f"{folder}/*"])[0].metadata_list:
            if meta.path in sizes:
                sizes[meta.path] = meta.size_in_bytes
    return sizes


def check_shard_sizes(paths: list[str], expected: list[int]) -> None:
    """ShardError naming the first shard that is missing or not of the size the run wrote."""
    found = file_sizes(paths)
    for path, size in zip(paths, expected):
        if found[path] is None:
            raise ShardError(f"{path}: missing (the manifest lists it); the run folder is incomplete")
        if found[path] != size:
            raise ShardError(f"{path}: {found[path]:,} bytes where the run wrote {size:,} (truncated, replaced "
                             "or corrupt); rerun the pipeline or restore the shard")


def count_shard_records(path: str) -> tuple[int, str | None]:
    """(records, why the shard broke off or None) of one shard, read back through Beam
    FileSystems: TFRecord frames (length, CRC, data, CRC) of a `.tfrecord.gz`, lines of a
    `.jsonl.gz`. A shard that ends inside a record or stops decompressing counts the records
    before the break."""
    import zlib

    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    count = 0
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.GZIP) as handle:
            if ".tfrecord" in path:
                while header := handle.read(12):
                    length = int.from_bytes(header[:8], "little")
                    if len(header) != 12 or len(handle.read(length + 4)) != length + 4:
                        return count, f"ends inside record {count + 1}"
                    count += 1
            else:
                while block := handle.read(1 << 20):
                    count += block.count(b"\n")
    except (zlib.error, EOFError, OSError) as error:
        return count, f"stops decompressing ({error})"
    return count, None


def check_record_count(where: str, read: int, expected: int, max_lost_fraction: float = 0.0) -> int:
    """Records read against what the manifest says: more is always wrong (mixed or replaced
    data), fewer is a loss allowed up to `max_lost_fraction`. Returns the loss."""
    if read > expected:
        raise ShardError(f"{where}: {read:,} records where the manifest lists {expected:,} (mixed or replaced shards)")
    lost = expected - read
    if lost > max_lost_fraction * max(expected, 1):
        raise ShardError(f"{where}: {read:,} of the {expected:,} records the manifest lists ({lost:,} lost "
                         f"> --max-lost-fraction {max_lost_fraction})")
    return lost


def verify_output(data: str, folder: str, max_lost_fraction: float = 0.0) -> int:
    """What every consumer checks before it reads an output: each shard there with its size
    (`manifest_output`), then its records counted and compared with the manifest, both ways,
    shard by shard (ShardError naming the shard or the folder). Returns the records lost to
    shards that break off, allowed up to `max_lost_fraction` of the output."""
    paths, expected = manifest_output(data, folder)
    per_shard = shard_records(data, folder)
    lost = 0
    for path in paths:
        read, broken = count_shard_records(path)
        if path in per_shard:
            if read > per_shard[path]:
                raise ShardError(f"{path}: {read:,} records where the run wrote {per_shard[path]:,} (mixed or "
                                 "replaced shards)")
            lost += per_shard[path] - read
        elif broken:
            raise ShardError(f"{path}: {broken} after {read:,} records (truncated or corrupt)")
    if not per_shard:   # a version-1 manifest: the folder's total only
        lost = expected - sum(count_shard_records(path)[0] for path in paths)
    return check_record_count(f"{data.rstrip('/')}/{folder}", expected - lost, expected, max_lost_fraction)


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
