"""Shared by the dump-reading tests: run `ReadDumpPages` alone and read its outputs back."""
import glob
import json
import os

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter

from core.records import DATASET_OF_STRATEGY
from pipeline.read.dumps import Page
from pipeline.read.pages import ReadDumpPages

# pipeline.run writes only the paper's adjacent triplets-sen by default; tests that check the
# ablation datasets or compare whole outputs ask for every negative strategy.
ALL_NEGATIVES = ["--negatives", ",".join(DATASET_OF_STRATEGY)]


def run_read(file_pattern: str, out_dir: str, index=None, workers: int = 1, page_shards: int = 1):
    """Runs ReadDumpPages on the DirectRunner, writes both outputs as JSON lines under
    `out_dir`, and returns (pages sorted by id, dead letters sorted, wikisim counters)."""
    options = ["--runner", "DirectRunner"]
    if workers > 1:
        options += ["--direct_running_mode", "multi_processing", "--direct_num_workers", str(workers)]
    pipeline = beam.Pipeline(argv=options)
    read = pipeline | ReadDumpPages(file_pattern, index, page_shards)
    (read["pages"] | "PagesToJson" >> beam.Map(lambda page: json.dumps(page._asdict()))
     | "WritePages" >> beam.io.WriteToText(os.path.join(out_dir, "pages")))
    (read["dead_letters"] | "DeadToJson" >> beam.Map(json.dumps, sort_keys=True)
     | "WriteDead" >> beam.io.WriteToText(os.path.join(out_dir, "dead")))
    result = pipeline.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed
                for c in result.metrics().query(MetricsFilter().with_namespace("wikisim"))["counters"]}
    pages = sorted(Page(**json.loads(line)) for line in _lines(out_dir, "pages"))
    dead = sorted((json.loads(line) for line in _lines(out_dir, "dead")),
                  key=lambda d: (d["page_id"] or -1, d["reason"], d["source"]))
    return pages, dead, counters


def _lines(out_dir: str, prefix: str):
    for path in sorted(glob.glob(os.path.join(out_dir, prefix + "-*"))):
        with open(path, encoding="utf-8") as f:
            yield from (line for line in f if line.strip())


def as_tuples(pages):
    """Pages without their source, for comparing reads of different files."""
    return [(p.page_id, p.title, p.namespace, p.redirect, p.text) for p in pages]
