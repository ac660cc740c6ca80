"""The read stage as a Beam transform: dump files -> pages and dead letters.

`pipeline.read.dumps` decodes pages from a byte range of a dump file (pure functions);
`pipeline.read.multistream` plans the byte ranges from a multistream index; `pipeline.read.dedupe` chooses
the copy kept of a page id read twice, from page ids alone; this module composes them into
`ReadDumpPages`, counting every outcome. The arrows point one way: read -> dedupe -> multistream
-> dumps.
"""
from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam

from core import counters, progress
from core.records import DEAD_LETTERS
from pipeline.read import dedupe, multistream
from pipeline.read.dumps import STREAM_FAULTS, Page, check_input, dead_letter, decode_pages, range_source


def decode_read_unit(read_unit) -> Iterator[Page | dict]:
    """Pages and dead letters of one `multistream.ReadUnit`.

    `expected` lists the (page_id, title) a multistream index places in the range. Pages it
    lists that the range yielded in no form (lost to a truncated or corrupt stream) get one
    dead letter each, carrying the stream fault as reason, so that with an index
    `index pages == pages read + page dead letters` holds exactly. Without an index the stream
    fault itself is the record (no page id, the decompressed offset in its detail).
    """
    path, start, end, expected, shard, n_shards = read_unit
    seen: set[int] = set()
    stream_fault = None
    for item in decode_pages(path, start, end, shard, n_shards):
        if isinstance(item, Page):
            seen.add(item.page_id)
        elif expected and item["page_id"] is None and item["reason"] in STREAM_FAULTS:
            stream_fault = item
            continue
        elif item["page_id"] is not None:
            seen.add(item["page_id"])
        yield item
    missing = [(page_id, title) for page_id, title in expected if page_id not in seen]
    for page_id, title in missing:
        if stream_fault:
            yield dict(stream_fault, page_id=page_id, title=title)
        else:
            yield dead_letter(range_source(path, start, end), page_id, title, "missing_from_stream",
                              "listed in the index but not found in its stream")
    if stream_fault and not missing:
        yield stream_fault


class _DecodeReadUnitsFn(beam.DoFn):
    """Thin wrapper over `decode_read_unit`: counts each outcome, routes dead letters, and of a
    repeated page id passes on only the copy `choices` (a side input, `pipeline.read.dedupe`) names."""

    def __init__(self, progress_folder: str | None = None):
        self.progress_folder = progress_folder
        self.progress = None
        counter = beam.metrics.Metrics.counter
        self.pages_read = counter(counters.NAMESPACE, counters.PAGES_READ)
        self.pages_dead_lettered = counter(counters.NAMESPACE, counters.READ_PAGES_DEAD_LETTERED)
        self.fragments_dead_lettered = counter(counters.NAMESPACE, counters.READ_FRAGMENTS_DEAD_LETTERED)
        self.units_read = counter(counters.NAMESPACE, counters.READ_RANGES)
        self.index_pages = counter(counters.NAMESPACE, counters.INDEX_PAGES)
        self.streams_lost = counter(counters.NAMESPACE, counters.READ_STREAMS_LOST)
        self.pages_duplicate = counter(counters.NAMESPACE, counters.PAGES_DUPLICATE_ID)

    def setup(self):
        if self.progress_folder:
            self.progress = progress.PageCounts(self.progress_folder)

    def process(self, read_unit, choices: dict):
        self.units_read.inc()
        self.index_pages.inc(len(read_unit.expected))
        copies = dedupe.Copies(read_unit, choices)
        for item in decode_read_unit(read_unit):
            if isinstance(item, Page):   # shown in progress as it goes on to be parsed
                self.pages_read.inc()
                if self.progress:
                    self.progress.add(pages=1)
                lost_to = copies.is_kept(item)
                if lost_to is None:
                    yield item
                else:
                    self.pages_duplicate.inc()
                    yield beam.pvalue.TaggedOutput(DEAD_LETTERS, dedupe.duplicate_letter(item, lost_to))
                continue
            if item["page_id"] is not None:
                self.pages_dead_lettered.inc()
                if self.progress:
                    self.progress.add(dead_letters=1)
            else:
                self.fragments_dead_lettered.inc()
                if item["reason"] in STREAM_FAULTS and not read_unit.expected:   # pages lost, how many unknown
                    self.streams_lost.inc()
            beam.metrics.Metrics.counter(counters.NAMESPACE, counters.READ_REASON_PREFIX + item["reason"]).inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, item)

    def finish_bundle(self):
        if self.progress:
            self.progress.flush()


class ReadDumpPages(beam.PTransform):
    """Dump file(s) -> {"pages": PCollection[Page], one per page id, "dead_letters": PCollection[dict]}.

    Files are listed and checked when the transform is constructed (a bad `--input` fails at once
    with its path). Each file becomes read units: one per bz2 stream range when a multistream index
    is given or lies beside it, else one per page shard of the whole file (`page_shards`);
    units are reshuffled so that workers decode them in parallel, and each unit is read and
    decoded by one worker, fused with whatever consumes the pages (no dump-sized buffer
    between read and parse). A page id read twice goes on once: `dedupe.ChooseCopies` names the
    copy kept from the units' page ids before the decode; the others are counted
    (`pages_duplicate_id`) and dead-lettered.
    """

    def __init__(self, file_pattern: str, index: str | None = None, page_shards: int = 1,
                 progress_folder: str | None = None):
        super().__init__()
        self.file_pattern = file_pattern
        self.index = index
        self.page_shards = page_shards
        self.progress_folder = progress_folder
        paths = check_input(file_pattern, index)
        self.files = [(path, index if index is not None else multistream.find_index(path)) for path in paths]

    def indexes(self) -> list[str]:
        """The multistream index of every input file, or [] when one has none (no known total)."""
        found = [index for _, index in self.files if index]
        return found if len(found) == len(self.files) else []

    def expand(self, pbegin):
        files = self.files
        units = (
            pbegin
            | "ListDumpFiles" >> beam.Create(files)
            | "PlanReadUnits" >> beam.FlatMap(multistream.plan_read_units, self.page_shards)
            | "SpreadReadUnits" >> beam.Reshuffle()
        )
        choices = units | "ChooseCopies" >> dedupe.ChooseCopies()
        decoded = units | "DecodePages" >> beam.ParDo(
            _DecodeReadUnitsFn(self.progress_folder), beam.pvalue.AsDict(choices)).with_outputs(DEAD_LETTERS,
                                                                                                main="pages")
        return {"pages": decoded.pages, DEAD_LETTERS: decoded[DEAD_LETTERS]}
