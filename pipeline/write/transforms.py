"""The job's last stage as thin Beam compositions: serialised triplets -> ordered shards
(`pipeline.write.order`, `pipeline.write.runs`, `pipeline.write.sinks`), articles -> SCB and passages
JSON lines (`pipeline.write.examples`). Every record is counted (`core.counters`).
"""
from __future__ import annotations

import uuid

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from core import counters, records
from core.splits import SPLITS
from pipeline.triplets.rules import Article, RuleConfig, scb_eligible
from pipeline.triplets.transforms import count
from pipeline.write import order, runs, sinks
from pipeline.write.examples import passages_record, scb_record


def keyed_chunks(article_and_records: tuple[int, list[bytes]], seed: int, dataset: str, split: str):
    """(order key, chunk of records) of one article's records of one split (`pipeline.write.order`)."""
    article_id, batch = article_and_records
    for index, chunk in enumerate(order.chunks(batch)):
        yield order.order_key(seed, dataset, split, article_id, index), chunk


class _SortedRunsFn(beam.DoFn):
    """One split's records -> `runs.RunInfo`s: each article's chunks and their order keys
    (`keyed_chunks`) gathered into a `runs.RunBuffer`, written as a sorted run whenever it holds
    `run_bytes` of records, and the rest at the end of the bundle."""

    def __init__(self, temp_folder: str, seed: int, dataset: str, split: str, run_bytes: int):
        self.temp_folder = temp_folder
        self.seed, self.dataset, self.split = seed, dataset, split
        self.run_bytes = run_bytes
        self.buffer: runs.RunBuffer | None = None

    def start_bundle(self):
        self.buffer = runs.RunBuffer(self.temp_folder, self.run_bytes)

    def process(self, article_and_records: tuple[int, list[bytes]]):
        assert self.buffer is not None, "start_bundle() makes the buffer"
        for key, chunk in keyed_chunks(article_and_records, self.seed, self.dataset, self.split):
            written = self.buffer.add(key, chunk)
            if written:
                yield written

    def finish_bundle(self):
        assert self.buffer is not None, "start_bundle() makes the buffer"
        written = self.buffer.flush()
        if written:
            yield GlobalWindows.windowed_value(written)


class _WriteShardFn(beam.DoFn):
    """Writes one shard, merged from the split's runs (`runs.shard_chunks`), to the split's
    temporary folder (TFRecord and Parquet)."""

    def __init__(self, temp_folder: str):
        self.temp_folder = temp_folder

    def process(self, plan: tuple[int, int, list[runs.RunInfo]]):
        index, n_shards, infos = plan
        chunks = runs.shard_chunks(infos, index, n_shards)
        yield from sinks.write_triplet_shard(self.temp_folder, index, n_shards, chunks)


class WriteTripletSplits(beam.PTransform):
    """{split: (article id, serialised triplets)} -> `<out>/<dataset>/<split>/part-SSSSS-of-NNNNN.tfrecord.gz`
    (and its Parquet twin `.parquet`, `core.parquet`), each split in its fixed pseudo-random
    order (`pipeline.write.order`): chunks keyed by a seeded hash, sorted into runs by each worker and
    merged by shard (`pipeline.write.runs`: no shuffle carries a triplet, so a local run's memory does
    not grow with the split), written to a temporary folder and renamed into place once every
    shard is written. A split that gets no triplet is written as one empty shard, so every split
    of every dataset is readable (as zero records).

    The shard count comes from the runs' sizes, gathered in one list, rather than from side
    inputs over the chunks: on the DirectRunner's multi_processing mode (Beam 2.77, 2 workers)
    the PCollection held back while such side inputs were computed lost 1-10 % of the 2019
    dump's train chunks in 2 runs of 2 (docs/pipeline.md). The shard plans pass a Reshuffle,
    which spreads the shards over the workers.
    """

    def __init__(self, output: str, dataset: str, seed: int, run_bytes: int = runs.RUN_BYTES):
        super().__init__()
        self.output = output.rstrip("/")
        self.dataset = dataset
        self.seed = seed
        self.run_bytes = run_bytes
        self.run_id = uuid.uuid4().hex   # one temporary folder per split and run; a retried shard rewrites its file

    def expand(self, records_of_split):
        for split in SPLITS:
            folder = f"{self.output}/{self.dataset}/{split}"
            temp_folder = f"{folder}/beam-temp-part-{self.run_id}"
            _ = (records_of_split[split]
                 | f"SortedRuns[{split}]" >> beam.ParDo(_SortedRunsFn(temp_folder, self.seed, self.dataset, split,
                                                                      self.run_bytes))
                 | f"AllRuns[{split}]" >> beam.combiners.ToList()
                 | f"PlanShards[{split}]" >> beam.FlatMap(runs.shard_plans)
                 | f"Spread[{split}]" >> beam.Reshuffle()
                 | f"WriteShards[{split}]" >> beam.ParDo(_WriteShardFn(temp_folder))
                 | f"AllShards[{split}]" >> beam.combiners.ToList()
                 | f"Finalize[{split}]" >> beam.Map(sinks.finalize_shards, folder, temp_folder))
        return beam.pvalue.PDone(records_of_split[SPLITS[0]].pipeline)


class WriteJsonLines(beam.PTransform):
    """Records (`to_json`) or dicts -> `<prefix>-NNNNN-of-MMMMM.jsonl.gz`, counting each under `counter_name`."""

    def __init__(self, prefix: str, counter_name: str):
        super().__init__()
        self.prefix = prefix
        self.counter_name = counter_name

    def expand(self, dicts):
        counter_name = self.counter_name

        def to_line(record) -> str:
            count(counter_name)
            return records.json_line(record)

        return (
            dicts
            | "ToJson" >> beam.Map(to_line)
            | "Write" >> sinks.write_text(self.prefix)
        )


class ScbRecords(beam.PTransform):
    """Test-split articles with 5..12 sections -> SCB records (counts their sentences too)."""

    def __init__(self, rules: RuleConfig):
        super().__init__()
        self.rules = rules

    def expand(self, articles):
        rules = self.rules

        def record(article: Article):
            if not scb_eligible(article.split, len(article.sections), rules):
                count(counters.SCB_ARTICLES_NOT_ELIGIBLE)
                return
            scb = scb_record(article)
            count(counters.SCB_SENTENCES, len(scb.sentences))
            yield scb

        return articles | beam.FlatMap(record)


class PassageRecords(beam.PTransform):
    """Articles (every split) -> passages records: each article's lead and kept sections' paragraphs."""

    def expand(self, articles):
        return articles | beam.Map(passages_record)
