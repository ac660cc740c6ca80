"""Queries and balanced passage pairs for QS3M, as pure functions over the passages contract.

A query is one article of `<out>/passages/*.jsonl.gz` (`core.records.PassagesRecord`): its passages are the
paragraphs of its sections, its true clusters are the top-level sections (flat benchmark) or
the full heading paths (hierarchical benchmark), and its lead paragraphs are kept apart as the
query description D. Nothing here reads files or touches TensorFlow, so it is all unit-testable.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from core.records import PassagesRecord

LABELINGS = ("flat", "hierarchical")


@dataclasses.dataclass(frozen=True)
class Query:
    """One article seen as a query: its passages and their true clusters under both labelings."""

    article_id: int
    title: str
    split: str
    lead: tuple[str, ...]
    passages: tuple[str, ...]
    flat_labels: tuple[int, ...]
    hierarchical_labels: tuple[int, ...]

    def labels(self, labeling: str) -> tuple[int, ...]:
        if labeling == "flat":
            return self.flat_labels
        if labeling == "hierarchical":
            return self.hierarchical_labels
        raise ValueError(f"unknown labeling {labeling!r}; expected one of {LABELINGS}")

    def num_clusters(self, labeling: str) -> int:
        return len(set(self.labels(labeling)))


class Pair(NamedTuple):
    """Two passages of one query (indices into `Query.passages`) and 1.0 if they share a cluster."""

    query_index: int
    first: int
    second: int
    same_cluster: float


def _dense_labels(keys: list[Any]) -> tuple[int, ...]:
    """Numbers cluster keys 0, 1, ... in order of first appearance."""
    index: dict[Any, int] = {}
    return tuple(index.setdefault(key, len(index)) for key in keys)


def query_from_record(record: PassagesRecord) -> Query:
    """The Query of one article of the passages contract (`PassagesRecord.from_json` read and checked it).

    A paragraph's heading path is `[top-level heading, sub-heading, ...]`; an empty path falls
    back to the section title, so the hierarchical labels refine the flat ones.
    """
    passages, flat_keys, path_keys = [], [], []
    for section_number, section in enumerate(record.sections):
        for paragraph in section.paragraphs:
            path = paragraph.path or (section.title,)
            passages.append(paragraph.text)
            flat_keys.append(section_number)
            path_keys.append((section_number, *path[1:]))
    return Query(
        article_id=record.article_id,
        title=record.title,
        split=record.split,
        lead=record.lead,
        passages=tuple(passages),
        flat_labels=_dense_labels(flat_keys),
        hierarchical_labels=_dense_labels(path_keys),
    )


def sample_pairs(
    label_lists: Iterable[tuple[int, ...] | list[int]],
    seed: int,
    max_pairs_per_query: int | None = None,
) -> list[Pair]:
    """Balanced same-cluster / different-cluster pairs, never across queries.

    For every query all unordered passage pairs are split by label; the larger class is
    subsampled (without replacement) to the size of the smaller, and `max_pairs_per_query`
    caps the total per query (half each class). Queries with one cluster or one passage give no
    pairs (no negatives to balance them). The order inside a pair is drawn at random so that
    models see no position bias. Deterministic for a given seed.
    """
    rng = np.random.default_rng(seed)
    pairs: list[Pair] = []
    for query_index, query_labels in enumerate(label_lists):
        labels = np.asarray(query_labels)
        first, second = np.triu_indices(len(labels), k=1)
        same = labels[first] == labels[second]
        positives, negatives = np.flatnonzero(same), np.flatnonzero(~same)
        per_class = min(len(positives), len(negatives))
        if max_pairs_per_query is not None:
            per_class = min(per_class, max_pairs_per_query // 2)
        if per_class == 0:
            continue
        chosen = np.concatenate([
            rng.choice(positives, per_class, replace=False),
            rng.choice(negatives, per_class, replace=False),
        ])
        swap = rng.random(len(chosen)) < 0.5
        for position, flip in zip(chosen, swap):
            a, b = int(first[position]), int(second[position])
            if flip:
                a, b = b, a
            pairs.append(Pair(query_index, a, b, float(same[position])))
    return pairs
