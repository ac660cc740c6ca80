"""Which copy of a repeated page id is kept, decided from page ids before the pages are read.

A page id read twice (a dump that lists it twice, or two inputs holding the same pages) would
make each such article's triplets twice, so one copy is kept: the first by source, title and
text, whatever order the copies arrive in; the others are counted (`pages_duplicate_id`) and
dead-lettered. Grouping every page by id to decide it shuffled the whole dump's text: on Beam's
local runners the launching process holds a shuffle whole (5.3 GiB for the 2019 file, in
docs/results.md). Here nothing that grows with the dump's text is grouped:

1. the page ids of each read unit (`unit_page_ids`): from the multistream index when the file
   has one (the plan read it already), else off the raw page bytes (`dumps.raw_page_ids`: no
   XML parse, one decompression of the file); counted per id, those seen more than once are
   *repeated* (usually none);
2. only the read units that hold a repeated id are decoded again, and only their pages with a
   repeated id are grouped by id; of each group `choose_copy` names the kept copy by its read
   unit and its rank among that unit's copies of the id (a `Choice`);
3. the read proper decodes each unit once and, for a repeated id, passes on only the chosen copy
   (`Copies.is_kept`). Decoding is deterministic, so the ranks of steps 2 and 3 agree.

The grouping holds the ids (a few dozen bytes a page) and the text of the pages whose id repeats.
"""
from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import apache_beam as beam
from apache_beam.metrics import Metrics

from core import counters
from pipeline.read.dumps import Page, dead_letter, decode_pages, raw_page_ids
from pipeline.read.multistream import ReadUnit


class Choice(NamedTuple):
    """The kept copy of a repeated page id: its read unit (`unit_key`), its rank among that
    unit's decoded copies of the id, and its source and title (for the others' dead letters)."""

    unit: tuple
    rank: int
    source: str
    title: str


def unit_key(unit: ReadUnit) -> tuple:
    """A read unit without its index lines: what names it in a `Choice`."""
    return unit.path, unit.start, unit.end, unit.shard, unit.n_shards


def unit_page_ids(unit: ReadUnit) -> Iterator[int]:
    """The page ids of a read unit: the index's, or without one those of its raw pages, every
    page shard's from shard 0 (the file is decompressed once for its ids, not once per shard)."""
    if unit.expected:
        yield from (page_id for page_id, _ in unit.expected)
    elif unit.shard == 0:
        yield from raw_page_ids(unit.path, unit.start, unit.end)


def repeated_ids(id_and_count: tuple[int, int]) -> Iterator[int]:
    """The id, if it was seen more than once (counted: `page_ids_repeated`)."""
    page_id, seen = id_and_count
    if seen > 1:
        Metrics.counter(counters.NAMESPACE, counters.PAGE_IDS_REPEATED).inc()
        yield page_id


def ranked_pages(items: Iterable[Page | dict], wanted) -> Iterator[tuple[int, Page]]:
    """(rank, page) of each decoded page whose id is `wanted`: its rank among the unit's pages of that id."""
    seen: collections.Counter = collections.Counter()
    for item in items:
        if isinstance(item, Page) and item.page_id in wanted:
            yield seen[item.page_id], item
            seen[item.page_id] += 1


def copies_of_repeated_ids(unit: ReadUnit, repeated: frozenset[int]) -> Iterator[tuple[int, tuple]]:
    """(page id, (unit key, rank, page)) of each page of `unit` whose id is repeated; a unit whose
    index lists none of them is not decoded."""
    if not repeated or (unit.expected and repeated.isdisjoint(page_id for page_id, _ in unit.expected)):
        return
    items = decode_pages(unit.path, unit.start, unit.end, unit.shard, unit.n_shards)
    for rank, page in ranked_pages(items, repeated):
        yield page.page_id, (unit_key(unit), rank, page)


def copy_order(copy: tuple) -> tuple:
    """Where a copy (unit key, rank, page) stands among its id's: by source, title and text (the
    same whatever order the copies arrived in), then by read unit and rank."""
    (path, start, end, shard, n_shards), rank, page = copy
    return page.source, page.title, page.text, path, start, -1 if end is None else end, shard, n_shards, rank


def choose_copy(page_id: int, copies: Iterable[tuple]) -> tuple[int, Choice]:
    """(page id, the `Choice` of its first copy by `copy_order`)."""
    unit, rank, kept = min(copies, key=copy_order)
    return page_id, Choice(unit, rank, kept.source, kept.title)


def duplicate_letter(page: Page, kept: Choice) -> dict:
    """The dead letter of a copy that was not kept."""
    return dict(dead_letter(page.source, page.page_id, page.title, "duplicate_page_id",
                            f"page id {page.page_id} was already read from {kept.source} ({kept.title!r})"),
                stage="dedupe")


class Copies:
    """The read of one unit's side of the choices: `is_kept` says, page by page in the order the
    unit decodes, whether a page is its id's chosen copy (every page of an id that does not
    repeat is)."""

    def __init__(self, unit: ReadUnit, choices: dict[int, Choice]):
        self.key = unit_key(unit)
        self.choices = choices
        self.seen: collections.Counter = collections.Counter()

    def is_kept(self, page: Page) -> Choice | None:
        """None when `page` goes on; else the `Choice` it lost to."""
        choice = self.choices.get(page.page_id)
        if choice is None:
            return None
        rank = self.seen[page.page_id]
        self.seen[page.page_id] += 1
        return None if (choice.unit, choice.rank) == (self.key, rank) else choice


class _CopiesOfRepeatedIdsFn(beam.DoFn):
    """`copies_of_repeated_ids`, with the repeated ids (a side input) as a set, built once per list."""

    def __init__(self) -> None:
        self.source: list[int] | None = None
        self.repeated: frozenset[int] = frozenset()

    def process(self, unit: ReadUnit, repeated: list[int]):
        if repeated is not self.source:
            self.source, self.repeated = repeated, frozenset(repeated)
        yield from copies_of_repeated_ids(unit, self.repeated)


class ChooseCopies(beam.PTransform):
    """Read units -> PCollection[(page id, Choice)], one per repeated page id (steps 1 and 2 above)."""

    def expand(self, units):
        repeated = (units
                    | "PageIds" >> beam.FlatMap(unit_page_ids)
                    | "CountIds" >> beam.combiners.Count.PerElement()
                    | "RepeatedIds" >> beam.FlatMap(repeated_ids))
        return (units
                | "CopiesOfRepeatedIds" >> beam.ParDo(_CopiesOfRepeatedIdsFn(), beam.pvalue.AsList(repeated))
                | "GroupCopies" >> beam.GroupByKey()
                | "Choose" >> beam.MapTuple(choose_copy))
