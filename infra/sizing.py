"""Runs the pipeline twice here (the excerpt, then COPIES times it) and projects Dataflow's size for the full dump.

    python -m infra.sizing [--copies 4] [--dump-gb 22] [--articles 6.8e6] [--worker-vcpus 4] [--target-hours 3]
        [--dry-run true]

`--dry-run true` prints the two runs it would make and exits. Otherwise it runs `pipeline.run`
(DirectRunner, one process, minutes) on the embedded excerpt and on a multistream dump
COPIES times its size (its pages repeated with new ids and titles by `pipeline.read.multistream`), so
start-up cost cancels out of the marginal cost per article and per compressed MB. Costs are CPU
seconds of this process (all its threads), not wall time, so other load on the machine does not
inflate them. The full dump's
CPU time is projected both ways (the excerpt's articles are longer than the average article, so the
per-article figure runs high; the per-MB one depends on the dump compressing like the excerpt) and
turned into worker counts and a cost at the given list prices. Every projected figure is an
estimate and is printed as one; only the two timed runs are measurements.
"""
from __future__ import annotations

import math
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass

from core.cli import UsageError, flag, parse_config, run_cli
from pipeline import run as pipeline_run

ID_STRIDE = 10_000_000  # page ids of copy N: id + N * ID_STRIDE (the excerpt's ids are below 31,000)


@dataclass(frozen=True)
class Measurement:
    """One timed pipeline run."""
    articles: int  # pages that were articles (used or left out by a rule), from stats.json
    pages: int
    compressed_mb: float
    wall_seconds: float  # the pipeline's own wall time (stats.json), imports excluded
    cpu_seconds: float  # CPU time of this process (all threads) during the run


def build_copies(copies: int, folder: str) -> str:
    """The embedded excerpt repeated `copies` times as a multistream dump (with its index)."""
    from pipeline.read.dump_writers import dump_parts, renumber_page, write_multistream_dump
    from pipeline.read.dumps import embedded_dump_path

    header, page_iter = dump_parts(embedded_dump_path())
    pages = list(page_iter)
    dump = os.path.join(folder, f"excerpt-x{copies}-multistream.xml.bz2")
    enlarged = (renumber_page(page, copy, ID_STRIDE) for copy in range(copies) for page in pages)
    write_multistream_dump(header, enlarged, dump, os.path.join(folder, f"excerpt-x{copies}-multistream-index.txt.bz2"))
    return dump


def measure(dump: str | None, output: str) -> Measurement:
    from pipeline.read.dumps import embedded_dump_path

    argv = ["--output", output, "--runner", "DirectRunner"] + (["--input", dump] if dump else [])
    cpu_before = time.process_time()
    stats = pipeline_run.main(argv)
    cpu_seconds = time.process_time() - cpu_before
    outcomes = stats["reconciliation"]["outcomes"]
    articles = outcomes["articles_used"] + outcomes["articles_too_few_sections"]
    return Measurement(
        articles=articles,
        pages=stats["reconciliation"]["pages_read"],
        compressed_mb=os.path.getsize(dump or embedded_dump_path()) / 1e6,
        wall_seconds=stats["wall_seconds"],
        cpu_seconds=cpu_seconds,
    )


def projection_lines(small: Measurement, big: Measurement, args: SizingConfig) -> list[str]:
    seconds = big.cpu_seconds - small.cpu_seconds
    per_article = seconds / (big.articles - small.articles)
    per_mb = seconds / (big.compressed_mb - small.compressed_mb)
    core_hours = {
        "per article": per_article * args.articles / 3600,
        "per compressed MB": per_mb * args.dump_gb * 1000 / 3600,
    }
    lines = [
        f"measured: marginal {per_article * 1000:.0f} ms per article, {per_mb:.1f} s per compressed MB "
        f"of CPU time (one DirectRunner process on this machine)",
        f"ESTIMATE for {args.articles / 1e6:.1f} M articles / {args.dump_gb:g} GB bz2, "
        f"{args.worker_vcpus}-vCPU workers, {args.memory_gb_per_vcpu:g} GB per vCPU:",
    ]
    rate = args.vcpu_hour_usd + args.memory_gb_per_vcpu * args.gb_hour_usd
    for basis, hours in core_hours.items():
        workers = math.ceil(hours / (args.target_hours * args.worker_vcpus))
        lines.append(
            f"  scaled {basis:17}: {hours:8,.0f} vCPU-hours -> {workers:4d} workers for {args.target_hours:g} h, "
            f"about ${hours * rate:,.0f} of worker time at ${args.vcpu_hour_usd}/vCPU-h + "
            f"${args.gb_hour_usd}/GB-h"
        )
    return lines


@dataclass(frozen=True)
class SizingConfig:
    """Flags of `python -m infra.sizing`."""
    copies: int = flag(4, help="size of the larger run, in excerpts (>= 2: the slope needs two sizes)")
    dump_gb: float = flag(22.0, help="full dump, bz2 GB")
    articles: float = flag(6.8e6, help="articles in the full dump")
    worker_vcpus: int = flag(4, help="vCPUs per Dataflow worker")
    memory_gb_per_vcpu: float = flag(4.0, help="GB of memory per vCPU (n2-standard: 4)")
    target_hours: float = flag(3.0, help="wanted wall time of the job")
    vcpu_hour_usd: float = flag(0.056, help="Dataflow batch vCPU list price")
    gb_hour_usd: float = flag(0.003557, help="Dataflow batch memory list price")
    dry_run: bool = flag(False, help="print the two pipeline runs it would make (and where), and exit")

    def __post_init__(self):
        if self.copies < 2:
            raise UsageError("--copies must be >= 2 (the slope needs two sizes)")


def main(argv: list[str] | None = None) -> None:
    args = parse_config(SizingConfig, argv, "python -m infra.sizing", __doc__.split("\n\n")[0])
    print(f"infra.sizing runs pipeline.run twice (DirectRunner, one process), in a temporary folder: on the embedded "
          f"excerpt, then on the excerpt repeated {args.copies} times as one multistream dump; then it projects")
    if args.dry_run:
        return
    with tempfile.TemporaryDirectory(prefix="wikisim-sizing-") as folder:
        small = measure(None, os.path.join(folder, "out-x1"))
        big = measure(build_copies(args.copies, folder), os.path.join(folder, f"out-x{args.copies}"))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for label, m in (("x1", small), (f"x{args.copies}", big)):
        print(f"measured {label}: {m.pages} pages, {m.articles} articles, {m.compressed_mb:.2f} MB bz2, "
              f"{m.cpu_seconds:.1f} s CPU, {m.wall_seconds:.1f} s wall")
    print(f"measured peak RSS of this process: {peak_mb:,.0f} MB")
    print("\n".join(projection_lines(small, big, args)))


if __name__ == "__main__":
    sys.exit(run_cli(main))
