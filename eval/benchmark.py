"""Throughput of the SCB scoring job: sentences per second, per method, on this machine.

    python -m eval.benchmark --data OUT [--encoder SPEC ...] [--model-dir DIR ...] [--output DIR]

For each method separately it times (1) encoding alone: `encode` over every SCB article, as the
job calls it, and (2) the whole Beam job (DirectRunner: read, encode, three clusterings x two
variants, metrics, write; encoding each distinct sentence once into the job's embedding cache),
and prints sentences/s for both and the share of the job spent
encoding. Sentences are counted by the job's own `scb_eval_sentences_scored` counter.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass

from model.encoders import Methods, load_encoder
from pipeline.cli import flag, parse_config, run_cli


def benchmark_method(spec: str, data: str, articles: list, output: str) -> dict:
    from apache_beam.io.filesystems import FileSystems

    from eval import scb

    encoder = load_encoder(spec)
    start = time.perf_counter()
    for article in articles:
        encoder.encode(list(article.sentences))
    encode_seconds = time.perf_counter() - start
    start = time.perf_counter()
    result = scb.run(scb.ScbConfig(data=data, output=FileSystems.join(output, encoder.name),
                                   methods=Methods(encoders=(spec,))),
                     ["--runner", "DirectRunner"])
    job_seconds = time.perf_counter() - start
    sentences = result["counters"]["scb_eval_sentences_scored"]
    return {"method": encoder.name, "articles": result["articles"], "sentences": sentences,
            "encode_seconds": encode_seconds, "encode_sentences_per_s": sentences / encode_seconds,
            "job_seconds": job_seconds, "job_sentences_per_s": sentences / job_seconds,
            "encode_share_of_job": encode_seconds / job_seconds}


@dataclass(frozen=True)
class ScbBenchmarkConfig:
    """Flags of `python -m eval.benchmark`."""

    data: str = flag(help="the pipeline's --output (its manifest lists scb/)")
    methods: Methods = Methods()
    output: str | None = flag(None, help="where to keep the job outputs and benchmark.md; none = a temp dir")


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_config(ScbBenchmarkConfig, argv, "python -m eval.benchmark", __doc__.split("\n\n")[0])
    from apache_beam.io.filesystems import FileSystems  # Beam and the SCB job load once the flags are parsed

    from eval import scb
    from eval.report import markdown_table, write_text

    scb.check_scb_input(args.data)
    output = args.output or tempfile.mkdtemp(prefix="eval-benchmark-")
    articles = scb.read_articles(args.data)
    specs = args.methods.specs()
    rows = [benchmark_method(spec, args.data, articles, output) for spec in specs]
    table = markdown_table(
        ["method", "articles", "sentences", "encode s", "encode sentences/s", "job s", "job sentences/s",
         "encode share of job"],
        [[r["method"], r["articles"], r["sentences"], r["encode_seconds"], r["encode_sentences_per_s"],
          r["job_seconds"], r["job_sentences_per_s"], r["encode_share_of_job"]] for r in rows])
    write_text(FileSystems.join(output, "benchmark.md"), "## SCB scoring throughput (DirectRunner)\n\n" + table)
    write_text(FileSystems.join(output, "benchmark.json"), json.dumps(rows, indent=2) + "\n")
    print(table)
    print(f"benchmark.md, benchmark.json and the jobs' outputs in {output}")
    return rows


if __name__ == "__main__":
    sys.exit(run_cli(main))
