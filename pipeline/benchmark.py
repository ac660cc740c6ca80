"""Benchmarks the pipeline at 1x and 16x the embedded excerpt; prints measured ratios.

    python -m pipeline.benchmark [--workdir DIR] [--scale 16] [--pages-per-stream 100]

Builds, from the real excerpt, a 16x dump (every page repeated with new ids and titles) as one
ordinary bz2 stream and as a multistream file with its index, then measures each command as a
subprocess (wall time, CPU time and peak RSS from `os.wait4`):

1. `python -m pipeline.run` vs `python -m gensim.scripts.segment_wiki` on the same file (goal <= 1.0x),
   with the pipeline's defaults (one in-memory worker) and, as `..._2_workers`, with two
   multi_processing workers sharing the file (`--page-shards 2`; segment_wiki uses its default
   pool, `cpu_count - 1` workers beside its reading process), each by wall time and, as `..._cpu`,
   by CPU time (user + system, of the command and its reaped worker processes): segment_wiki's
   wall time has a second process behind it, the pipeline's one worker mostly one core;
2. `python -m pipeline.run` vs `bzcat` of the same file, the decode limit (goal <= 10x);
3. the pipeline's peak RSS (its largest process) at 16x vs 1x (goal <= 1.2x), with the default
   datasets, as `..._2_workers` with two multi_processing workers, and, as `..._all_negatives`,
   with the ablation datasets too (`--negatives` all three);
4. the pipeline on the 16x multistream file with 1 vs 2 DirectRunner workers, multi_processing
   (goal >= 1.6x speed-up; the speed-up is bounded by the cores actually free);
plus the reader alone (`ReadDumpPages` into a count) for the share of the wall time that is
decoding; the per-page stages timed alone in one process on the 1x article pages (bz2 + page
split + mwxml, mwparserfromhell's C tokenizer alone, its whole parse, our rendering to
paragraphs, spaCy sentences), which bound what any orchestration can reach; and a cProfile of
the pipeline on the 1x file, grouped by library, with whether mwparserfromhell's C tokenizer is
active. Writes `benchmark.json`, `benchmark.md` and `benchmark.png` to the workdir. Not a test:
numbers depend on the machine and its load.
"""
from __future__ import annotations

import cProfile
import dataclasses
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.cli import UsageError, flag, parse_config, run_cli
from core.records import SENTENCE_DATASETS
from pipeline import run as pipeline_run
from pipeline.parse.mwtokens import C_TOKENIZER, tokenize
from pipeline.parse.sentences import SentenceSplitter
from pipeline.parse.wikitext import ParsedPage, parse_wikitext

GOALS = {"pipeline_vs_segment_wiki": ("<=", 1.0), "pipeline_vs_bzcat": ("<=", 10.0),
         "rss_16x_vs_1x": ("<=", 1.2), "speedup_2_vs_1_workers": (">=", 1.6)}
ALL_NEGATIVES = ["--negatives", ",".join(SENTENCE_DATASETS.values())]   # every negative strategy


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
    """Flags of `python -m pipeline.benchmark`."""
    workdir: str = flag("", help="folder for the dumps, outputs and benchmark.md; empty = a fresh temporary one")
    scale: int = flag(16, help="the larger input is this many copies of the excerpt")
    pages_per_stream: int = flag(100, help="pages per bz2 stream of the multistream copies")
    profile_top: int = flag(25, help="functions listed from the profile of one run")
    read_only: str | None = flag(None, help="internal: run only the reader on this dump (other flags go to Beam)")


@dataclasses.dataclass
class Measurement:
    name: str
    command: list[str]
    wall_s: float
    peak_rss_mib: float
    cpu_s: float   # user + system seconds of the command and the processes it reaped
    returncode: int


# Runs argv[1:] and prints its wall time and peak RSS. Started with `python -S` (stdlib only, a
# few MiB) because a child's ru_maxrss includes the memory of the process it was forked from.
_LAUNCHER = """
import json, os, subprocess, sys, time
started = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
stderr = child.stderr.read()
_, status, usage = os.wait4(child.pid, 0)
child.returncode = os.waitstatus_to_exitcode(status)
sys.stderr.write(stderr.decode("utf-8", "replace")[-4000:] if child.returncode else "")
print(json.dumps({"wall_s": time.perf_counter() - started, "peak_rss_mib": usage.ru_maxrss / 1024,
                  "cpu_s": usage.ru_utime + usage.ru_stime, "returncode": child.returncode}))
"""


def measure(name: str, command: list[str]) -> Measurement:
    """Runs a command; its wall time, its CPU time and the peak RSS of its largest process
    (`os.wait4` reports the CPU time summed, and the RSS maximum, over the child and its reaped
    children, e.g. Beam's or segment_wiki's workers)."""
    print(f"[benchmark] {name}: {' '.join(command)}", flush=True)
    launched = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, *command],
                              stdout=subprocess.PIPE, text=True, check=True)
    result = Measurement(name=name, command=command, **json.loads(launched.stdout))
    if result.returncode != 0:
        raise SystemExit(f"[benchmark] {name} failed with exit code {result.returncode}")
    print(f"[benchmark] {name}: {result.wall_s:.1f} s, CPU {result.cpu_s:.1f} s, "
          f"peak RSS {result.peak_rss_mib:.0f} MiB", flush=True)
    return result


def build_inputs(workdir: Path, config: BenchmarkConfig) -> dict[str, str]:
    """The 1x excerpt and, built from it, the scaled plain and multistream dumps."""
    from pipeline.read import dump_writers, multistream
    from pipeline.read.dumps import embedded_dump_path, page_id_and_title

    source = embedded_dump_path()
    header, page_iter = dump_writers.dump_parts(source)
    pages = list(page_iter)
    id_stride = max(page_id_and_title(page)[0] or 0 for page in pages) + 1

    def index_of(dump: str) -> str:
        index = multistream.index_path_for(dump)
        if index is None:
            raise ValueError(f"{dump} is not named as a multistream dump")
        return index

    def scaled():
        return (dump_writers.renumber_page(page, copy, id_stride)
                for copy in range(config.scale) for page in pages)

    paths = {
        "1x": source,
        "1x_multistream": str(workdir / "excerpt-pages-articles-multistream.xml.bz2"),
        "scaled": str(workdir / f"excerpt{config.scale}x-pages-articles.xml.bz2"),
        "scaled_multistream": str(workdir / f"excerpt{config.scale}x-pages-articles-multistream.xml.bz2"),
    }
    dump_writers.write_multistream_dump(header, pages, paths["1x_multistream"],
                                       index_of(paths["1x_multistream"]),
                                       config.pages_per_stream)
    dump_writers.write_plain_dump(header, scaled(), paths["scaled"])
    streams = dump_writers.write_multistream_dump(
        header, scaled(), paths["scaled_multistream"],
        index_of(paths["scaled_multistream"]), config.pages_per_stream)
    print(f"[benchmark] built {config.scale * len(pages)} pages ({config.scale}x {len(pages)}), "
          f"{streams} streams in the multistream file", flush=True)
    return paths


def pipeline_command(input_path: str, output: Path, workers: int | None = None,
                     extra: tuple[str, ...] = ()) -> list[str]:
    """The pipeline on the DirectRunner; with `workers`, that many processes, sharing a plain
    file by page shards (a multistream file is shared by its streams anyway)."""
    command = [sys.executable, "-m", "pipeline.run", "--input", input_path, "--output", str(output),
               "--runner", "DirectRunner", *extra]
    if workers:
        command += ["--direct_running_mode", "multi_processing", "--direct_num_workers", str(workers),
                    "--page-shards", str(workers)]
    return command


def read_only_command(input_path: str, workers: int | None = None) -> list[str]:
    command = [sys.executable, "-m", "pipeline.benchmark", "--read-only", input_path]
    if workers:
        command += ["--direct_running_mode", "multi_processing", "--direct_num_workers", str(workers)]
    return command


def run_read_only(input_path: str, beam_args: list[str]) -> None:
    """The reader alone: ReadDumpPages into a count of pages (what decoding costs)."""
    import apache_beam as beam

    from pipeline.read.pages import ReadDumpPages

    with beam.Pipeline(argv=["--runner", "DirectRunner", *beam_args]) as pipeline:
        read = pipeline | ReadDumpPages(input_path)
        _ = read["pages"] | beam.combiners.Count.Globally() | beam.Map(print)


def stage_seconds(input_path: str) -> dict[str, float]:
    """Each per-page stage timed alone, in this process, over the dump's article pages."""
    import mwparserfromhell

    from pipeline.read.dumps import Page, decode_pages

    def timed(work) -> float:
        started = time.perf_counter()
        work()
        return time.perf_counter() - started

    pages: list[Page | dict] = []
    seconds = {"read: bz2 + page split + mwxml": timed(lambda: pages.extend(decode_pages(input_path)))}
    texts = [p.text for p in pages if isinstance(p, Page) and p.namespace == 0 and not p.redirect]

    def each_text(work):  # keeps no result alive, as the pipeline does not
        for text in texts:
            work(text)

    seconds["mwparserfromhell tokenizer alone"] = timed(lambda: each_text(tokenize))
    seconds["mwparserfromhell parse (tokenizer + tree builder)"] = timed(lambda: each_text(mwparserfromhell.parse))
    parsed: list[ParsedPage] = []  # plain tuples of strings: keeping them costs the collector nothing like the trees
    seconds["parse_wikitext (parse + render to paragraphs)"] = timed(lambda: parsed.extend(map(parse_wikitext, texts)))
    splitter = SentenceSplitter()
    paragraphs = [p.text for page in parsed for section in page.sections for p in section.paragraphs]
    seconds["spaCy sentences + tokens (all section paragraphs)"] = timed(lambda: splitter.split(paragraphs))
    return seconds


def profile_pipeline(input_path: str, output: Path, top: int) -> dict:
    """cProfile of one in-process pipeline run; total seconds by library and the top functions."""
    profiler = cProfile.Profile()
    profiler.enable()
    pipeline_run.main(["--input", input_path, "--output", str(output), "--overwrite", "--runner", "DirectRunner"])
    profiler.disable()
    stats = pstats.Stats(profiler)
    by_library: dict[str, float] = {}
    rows = []
    # attr-defined: typeshed leaves out Stats.stats, the raw table every pstats report reads
    for (filename, line, function), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        library = _library_of(filename)
        by_library[library] = by_library.get(library, 0.0) + own
        rows.append((own, cumulative, calls, f"{library}:{Path(filename).name}:{line}:{function}"))
    rows.sort(reverse=True)
    return {"total_s": sum(by_library.values()),
            "own_time_by_library_s": dict(sorted(by_library.items(), key=lambda kv: -kv[1])),
            "top_functions": [{"own_s": round(own, 3), "cumulative_s": round(cum, 3), "calls": calls,
                               "function": name} for own, cum, calls, name in rows[:top]]}


# The job's own code and the shared base it stands on, named by module in a profile.
PROJECT_PACKAGES = tuple(Path(__file__).resolve().parents[1] / name for name in ("pipeline", "core"))


def _library_of(filename: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            return filename.split(marker, 1)[1].split("/", 1)[0]
    source = Path(filename).resolve()
    for package in PROJECT_PACKAGES:
        if source.is_relative_to(package):
            return ".".join(source.relative_to(package.parent).with_suffix("").parts)
    if filename.endswith((".pyx", ".pxd")):  # Cython modules name themselves relative to their package
        return filename.split("/", 1)[0] if "/" in filename else "cython (spaCy)"
    if filename.startswith("~") or filename.startswith("<"):
        return "builtins"
    return "python-stdlib"


def ratios(results: dict[str, Measurement]) -> dict[str, float]:
    r = {}
    for size in ("1x", "scaled"):
        for run in (f"pipeline_{size}", f"pipeline_{size}_2_workers"):
            suffix = run.removeprefix("pipeline_")
            r[f"pipeline_vs_segment_wiki_{suffix}"] = results[run].wall_s / results[f"segment_wiki_{size}"].wall_s
            r[f"pipeline_vs_segment_wiki_{suffix}_cpu"] = results[run].cpu_s / results[f"segment_wiki_{size}"].cpu_s
            r[f"pipeline_vs_bzcat_{suffix}"] = results[run].wall_s / results[f"bzcat_{size}"].wall_s
        r[f"reader_vs_bzcat_{size}"] = results[f"reader_{size}"].wall_s / results[f"bzcat_{size}"].wall_s
    r["rss_16x_vs_1x"] = results["pipeline_scaled"].peak_rss_mib / results["pipeline_1x"].peak_rss_mib
    r["rss_16x_vs_1x_2_workers"] = (results["pipeline_scaled_2_workers"].peak_rss_mib
                                    / results["pipeline_1x_2_workers"].peak_rss_mib)
    r["rss_16x_vs_1x_all_negatives"] = (results["pipeline_scaled_all_negatives"].peak_rss_mib
                                        / results["pipeline_1x_all_negatives"].peak_rss_mib)
    r["speedup_2_vs_1_workers"] = (results["pipeline_multistream_1_worker"].wall_s
                                   / results["pipeline_multistream_2_workers"].wall_s)
    r["reader_speedup_2_vs_1_workers"] = (results["reader_multistream_1_worker"].wall_s
                                          / results["reader_multistream_2_workers"].wall_s)
    return r


def write_report(workdir: Path, config: BenchmarkConfig, results: dict[str, Measurement],
                 measured_ratios: dict[str, float], stages: dict[str, float], profile: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = ["| measurement | wall s | CPU s | cores busy | peak RSS MiB |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {m.name} | {m.wall_s:.2f} | {m.cpu_s:.2f} | {m.cpu_s / m.wall_s:.2f} | {m.peak_rss_mib:.0f} |"
              for m in results.values()]
    lines += ["", "| ratio | measured | goal |", "|---|---:|---|"]
    for name, value in measured_ratios.items():
        goal = next((f"{op} {bound}" for key, (op, bound) in GOALS.items() if name.startswith(key)), "")
        lines.append(f"| {name} | {value:.2f} | {goal} |")
    # Marginal cost of one more excerpt's worth of pages: start-up cancels out.
    per_excerpt = {name: (results[f"{name}_scaled"].wall_s - results[f"{name}_1x"].wall_s) / (config.scale - 1)
                   for name in ("segment_wiki", "pipeline")}
    lines += ["", "Per-page stages alone, one process, the 1x excerpt's article pages, against the marginal "
              f"wall time per excerpt's worth of pages of segment_wiki ({per_excerpt['segment_wiki']:.2f} s) and "
              f"of the pipeline, one worker ({per_excerpt['pipeline']:.2f} s):", "",
              "| stage | s | x segment_wiki | share of the pipeline |", "|---|---:|---:|---:|"]
    lines += [f"| {stage} | {sec:.2f} | {sec / per_excerpt['segment_wiki']:.2f} | {sec / per_excerpt['pipeline']:.0%} |"
              for stage, sec in stages.items()]
    lines += ["", f"cProfile of the pipeline on the 1x excerpt ({profile['total_s']:.1f} s of own time):",
              "", "| library | own s |", "|---|---:|"]
    lines += [f"| {lib} | {sec:.2f} |" for lib, sec in list(profile["own_time_by_library_s"].items())[:12]]
    lines += ["", "| function | own s | cumulative s | calls |", "|---|---:|---:|---:|"]
    lines += [f"| {f['function']} | {f['own_s']} | {f['cumulative_s']} | {f['calls']} |"
              for f in profile["top_functions"]]
    (workdir / "benchmark.md").write_text("\n".join(lines) + "\n")
    (workdir / "benchmark.json").write_text(json.dumps(
        {"config": dataclasses.asdict(config), "cpu_count": os.cpu_count(),
         "measurements": {k: dataclasses.asdict(v) for k, v in results.items()},
         "ratios": measured_ratios, "stage_seconds_1x": stages, "profile": profile}, indent=2))

    figure, (walls, rates) = plt.subplots(1, 2, figsize=(13, 5))
    names = list(results)
    rows = range(len(names))
    walls.barh([row + 0.2 for row in rows], [results[n].wall_s for n in names], height=0.4, color="tab:blue",
               label="wall")
    walls.barh([row - 0.2 for row in rows], [results[n].cpu_s for n in names], height=0.4, color="tab:gray",
               label="CPU (user + system)")
    walls.set_yticks(list(rows), names)
    walls.set_xlabel("seconds")
    walls.set_title("Commands measured")
    walls.legend()
    ratio_names = list(measured_ratios)
    rates.barh(ratio_names, [measured_ratios[n] for n in ratio_names], color="tab:orange")
    for name, (_op, bound) in GOALS.items():
        for i, ratio_name in enumerate(ratio_names):
            if ratio_name.startswith(name):
                rates.plot([bound, bound], [i - 0.4, i + 0.4], color="black")
    rates.set_xscale("log")
    rates.set_xlabel("ratio (black tick: goal)")
    rates.set_title("Ratios")
    figure.tight_layout()
    figure.savefig(workdir / "benchmark.png", dpi=110)
    plt.close(figure)


def run_benchmark(config: BenchmarkConfig) -> dict[str, float]:

    workdir = Path(config.workdir or tempfile.mkdtemp(prefix="wikisim-benchmark-"))
    workdir.mkdir(parents=True, exist_ok=True)
    paths = build_inputs(workdir, config)
    stages = stage_seconds(paths["1x"])
    print(f"[benchmark] stages alone: {json.dumps(stages)}", flush=True)
    profile = profile_pipeline(paths["1x"], workdir / "out_profile", config.profile_top)
    profile["mwparserfromhell_c_tokenizer"] = C_TOKENIZER
    print(f"[benchmark] profile: {json.dumps(profile['own_time_by_library_s'])}", flush=True)
    results: dict[str, Measurement] = {}

    def record(name: str, command: list[str]) -> None:
        results[name] = measure(name, command)
        partial = {k: dataclasses.asdict(v) for k, v in results.items()}
        (workdir / "measurements.partial.json").write_text(json.dumps(partial, indent=2))

    for size in ("1x", "scaled"):
        dump = paths[size]
        record(f"bzcat_{size}", ["bzcat", dump])
        record(f"segment_wiki_{size}", [sys.executable, "-m", "gensim.scripts.segment_wiki", "-f", dump,
                                        "-o", str(workdir / f"segment_wiki_{size}.json.gz")])
        record(f"reader_{size}", read_only_command(dump))
        for run, workers, extra in ((f"pipeline_{size}", None, ()), (f"pipeline_{size}_2_workers", 2, ()),
                                    (f"pipeline_{size}_all_negatives", None, tuple(ALL_NEGATIVES))):
            shutil.rmtree(workdir / f"out_{run}", ignore_errors=True)
            record(run, pipeline_command(dump, workdir / f"out_{run}", workers, extra))
    for workers, label in ((1, "1_worker"), (2, "2_workers")):
        record(f"reader_multistream_{label}", read_only_command(paths["scaled_multistream"], workers))
        shutil.rmtree(workdir / f"out_multistream_{label}", ignore_errors=True)
        record(f"pipeline_multistream_{label}",
               pipeline_command(paths["scaled_multistream"], workdir / f"out_multistream_{label}", workers))
    measured_ratios = ratios(results)
    write_report(workdir, config, results, measured_ratios, stages, profile)
    print((workdir / "benchmark.md").read_text())
    print(f"mwparserfromhell C tokenizer active: {profile['mwparserfromhell_c_tokenizer']}")
    print(f"cores: {os.cpu_count()} (shared with whatever else runs); results in {workdir}")
    return measured_ratios


def main(argv: list[str] | None = None) -> None:
    config, beam_args = parse_config(BenchmarkConfig, argv, "python -m pipeline.benchmark",
                                     __doc__.split("\n\n")[0], passthrough=True)
    if config.read_only:
        run_read_only(config.read_only, beam_args)
        return
    if beam_args:
        raise UsageError(f"unrecognized arguments: {' '.join(beam_args)}")
    run_benchmark(config)


if __name__ == "__main__":
    sys.exit(run_cli(main))
