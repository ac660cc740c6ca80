"""Entry point: Wikipedia dump -> triplet shards, SCB, passages, dead letters and stats.json.

    python -m pipeline.run --output DIR [--input PATH|GLOB] [--index PATH] [--seed N] [Beam options]

Without `--input` it reads the real Wikipedia excerpt inside the gensim wheel. The flags mirror
`PipelineConfig` (and the paper's thresholds in `rules.RuleConfig`); every other flag is a
Beam pipeline option and is passed through unchanged, so the same command runs on the
DirectRunner, the PrismRunner (`--prism_location .cache/prism/v2.77.0/prism`, built by `make prism`;
docs/pipeline.md, "Portable runners") or Dataflow (`--runner DataflowRunner --project ... --region ...
--temp_location gs://... --setup_file ./setup.py`). On Dataflow, `--wait false` returns once the job
is submitted, printing its id; `python -m pipeline.publish --output ...` then publishes the run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from core import counters as counter_names
from core import files, folders, jobserver, progress, published, records
from core.cli import DataLossError, UsageError, config_flags, flag, parse_config, run_cli
from core.files import is_remote
from core.folders import check_output_path
from core.records import NegativeStrategy
from core.runner import Runner
from core.splits import SPLITS
from pipeline.parse.sentences import DEFAULT_SPACY_MODEL, SentenceSplitter
from pipeline.triplets.rules import RuleConfig
from pipeline.write.order import order_record

if TYPE_CHECKING:   # Beam loads after the flags parse (main): --help and a bad flag answer without it
    import apache_beam as beam



class ConfigError(UsageError):
    """A flag value the job cannot run with; the message names the flag."""


class InputLossError(DataLossError):
    """The run finished and wrote its outputs, but lost more of its input than allowed."""


class OutputWriteError(DataLossError):
    """Writing the outputs failed (disk full, permission, credentials): nothing is published."""


def io_failure(error: BaseException | None) -> OSError | None:
    """The OSError behind a failed job (Beam re-raises a worker's error wrapped, with the OSError as
    its cause or context, or as its message), or None when the failure is not an I/O one."""
    while error is not None:
        if isinstance(error, OSError):
            return error
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def writes_of(out: str) -> Iterator[None]:
    """A write of the run that fails (disk full, a permission, credentials), in Beam's job or of
    the run's own files: OutputWriteError naming `out`, one line; any other error as it is."""
    try:
        yield
    except (UsageError, DataLossError):
        raise
    except Exception as error:
        failure = io_failure(error) or (error if "[Errno" in str(error) else None)
        if failure is None:
            raise
        first = (str(failure).splitlines() or [type(failure).__name__])[0]
        raise OutputWriteError(f"writing {out} failed: {first[:300]}; nothing was published") from error


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    output: str = flag(help="output folder, local or gs://")
    overwrite: bool = flag(False, help="replace the run that --output holds (deletes only what a run of this "
                                       "pipeline writes); without it a non-empty --output is refused")
    input: str | None = flag(None, help="dump file or glob (.xml, .xml.bz2), local or gs://; "
                                        "default: the embedded excerpt")
    index: str | None = flag(None, help="multistream index of a single dump file")
    page_shards: int = flag(1, help="workers that share each dump file without a multistream index: each "
                                    "decompresses the file and parses every N-th page (by id); set it to about "
                                    "the number of workers when the input is a few large plain files")
    seed: int = flag(0, help="seed of the split and of every random draw")
    spacy_model: str = flag(DEFAULT_SPACY_MODEL, help="spaCy pipeline for sentences: blank:<lang> or a model name")
    negatives: str = flag(NegativeStrategy.ADJACENT.value,
                          help="comma-separated negative rules of triplets-sen to write: adjacent (the paper's "
                               "dataset, triplets-sen/), same_article, other_article (the paper's ablation, "
                               "triplets-sen-<rule>/)")
    max_lost_fraction: float = flag(0.01, help="fail the run (exit 1, after writing its outputs and stats) when the "
                                    "read stage loses more than this fraction of the pages the multistream index "
                                    "lists, or loses pages of a stream without an index (a loss of unknown size) "
                                    "unless this is 1")
    other_article_bucket_size: int = flag(1000, help="about how many articles share a bucket when drawing "
                                                     "other_article negatives")
    wait: bool = flag(True, help="wait for the job to end, then publish the run (stats.json, manifest). false: on "
                                 "Dataflow only, return once the job is submitted, printing its id; the run is "
                                 "then published by a follow-up step, python -m pipeline.publish --output OUTPUT, "
                                 "which waits for the job to end (until then readers and other runs refuse the "
                                 "folder)")
    rules: RuleConfig = RuleConfig()

    def __post_init__(self):
        check_output_path(self.output)
        try:
            chosen = self.negative_strategies()
        except ValueError:   # a name that is no NegativeStrategy
            chosen = ()
        if not chosen:
            raise ConfigError(f"--negatives {self.negatives!r}: choose one or more of "
                              f"{', '.join(NegativeStrategy)}, comma-separated")
        if self.page_shards < 1:
            raise ConfigError(f"--page-shards must be >= 1, got {self.page_shards}")
        if not 0.0 <= self.max_lost_fraction <= 1.0:
            raise ConfigError(f"--max-lost-fraction is a fraction in [0, 1], got {self.max_lost_fraction}")
        if self.other_article_bucket_size < 1:
            raise ConfigError(f"--other-article-bucket-size must be >= 1, got {self.other_article_bucket_size}")
        rules = self.rules
        if not 1 <= rules.min_tokens <= rules.max_tokens:
            raise ConfigError(f"--min-tokens {rules.min_tokens} / --max-tokens {rules.max_tokens}: "
                              "need 1 <= min <= max")
        if not 1 <= rules.scb_min_sections <= rules.scb_max_sections:
            raise ConfigError(
                f"--scb-min-sections {rules.scb_min_sections} / --scb-max-sections {rules.scb_max_sections}: "
                "need 1 <= min <= max")
        if rules.min_sections < 1 or rules.max_paragraph_distance < 1:
            raise ConfigError("--min-sections and --max-paragraph-distance must be >= 1")

    def negative_strategies(self) -> tuple[NegativeStrategy, ...]:
        names = (name.strip() for name in self.negatives.split(","))
        return tuple(dict.fromkeys(NegativeStrategy(name) for name in names if name))

    def triplet_datasets(self) -> list[str]:
        """The triplet datasets this run writes, in a fixed order."""
        chosen = self.negative_strategies()
        sentence = [dataset for dataset, strategy in records.SENTENCE_DATASETS.items() if strategy in chosen]
        return [*sentence, records.TITLES_DATASET]


def check_spacy_model(name: str) -> None:
    """Loads the sentence pipeline once here, so a wrong --spacy-model fails before the job starts."""
    try:
        SentenceSplitter(name)
    except (OSError, ImportError, ValueError) as err:
        raise ConfigError(f"--spacy-model {name!r} cannot be loaded: {err}") from err


def parse_args(argv: list[str] | None) -> tuple[PipelineConfig, list[str]]:
    """Our flags -> PipelineConfig; the remaining flags are Beam's (checked), returned untouched."""
    return parse_config(PipelineConfig, argv, "python -m pipeline.run", __doc__.split("\n\n")[0], passthrough=True)


def build(pipeline: beam.Pipeline, config: PipelineConfig, input_pattern: str,
          progress_folder: str | None = None) -> list[str]:
    """Adds every stage and output of the job to `pipeline`; returns the inputs' multistream
    indexes ([] when one has none), which give the number of pages to read."""
    import apache_beam as beam

    from pipeline.read.pages import ReadDumpPages
    from pipeline.triplets import transforms as triplet_transforms
    from pipeline.write import transforms as write_transforms

    out = config.output.rstrip("/")
    reader = ReadDumpPages(input_pattern, config.index, config.page_shards, progress_folder)
    read = pipeline | "ReadDump" >> reader   # one page per page id (`pipeline.read.dedupe`)
    built = read["pages"] | "BuildArticles" >> triplet_transforms.BuildArticles(config.seed, config.spacy_model,
                                                                                 config.rules)
    articles = built["articles"]

    for strategy in config.negative_strategies():
        dataset = records.DATASET_OF_STRATEGY[strategy]
        (
            articles
            | f"Triplets[{dataset}]"
            >> triplet_transforms.SentenceTriplets(strategy, config.seed, config.rules,
                                                   config.other_article_bucket_size)
            | f"Write[{dataset}]" >> write_transforms.WriteTripletSplits(out, dataset, config.seed)
        )
    (
        articles
        | f"Triplets[{records.TITLES_DATASET}]" >> triplet_transforms.TitleTriplets()
        | f"Write[{records.TITLES_DATASET}]" >> write_transforms.WriteTripletSplits(out, records.TITLES_DATASET,
                                                                             config.seed)
    )
    (
        articles
        | "Scb" >> write_transforms.ScbRecords(config.rules)
        | "WriteScb" >> write_transforms.WriteJsonLines(f"{out}/{records.SCB}/part", counter_names.SCB_ARTICLES)
    )
    (
        articles
        | "Passages" >> write_transforms.PassageRecords()
        | "WritePassages" >> write_transforms.WriteJsonLines(f"{out}/{records.PASSAGES}/part",
                                                      counter_names.PASSAGES_ARTICLES)
    )
    (
        (read[records.DEAD_LETTERS], built[records.DEAD_LETTERS])
        | "AllDeadLetters" >> beam.Flatten()
        | "WriteDeadLetters" >> write_transforms.WriteJsonLines(f"{out}/{records.DEAD_LETTERS}/part",
                                                         counter_names.DEAD_LETTERS_WRITTEN)
    )
    return reader.indexes()


def expected_counters(config: PipelineConfig) -> list[str]:
    """Counters stats.json always lists, at 0 when nothing incremented them."""
    datasets = config.triplet_datasets()
    return [
        counter_names.PAGES_READ,
        counter_names.INDEX_PAGES,
        counter_names.READ_PAGES_DEAD_LETTERED,
        counter_names.READ_STREAMS_LOST,
        *counter_names.PAGE_OUTCOMES,
        *(counter_names.split_counter(dataset, split) for dataset in datasets for split in SPLITS),
        counter_names.TRIPLET_SLOTS,
        *(counter_names.unfilled_slots_counter(strategy) for strategy in config.negative_strategies()),
        counter_names.SCB_ARTICLES,
        counter_names.PASSAGES_ARTICLES,
        counter_names.DEAD_LETTERS_WRITTEN,
    ]


def counters_of(result, config: PipelineConfig, runner: Runner = Runner()) -> dict[str, int]:
    """Every "wikisim" counter of the finished run, summed over the steps that use it; those it
    did not increment at 0. A run whose runner reported none of them (the read stage always counts
    what it read or lost) is a CountersMissingError: zeros would reconcile as an empty read."""
    reported = counter_names.job_totals(result)
    if not reported:
        raise counter_names.CountersMissingError(
            f"the runner ({runner}) reported none of the job's counters (Beam metrics namespace "
            f"{counter_names.NAMESPACE}): the run cannot be reconciled; nothing was published")
    return dict(sorted({**dict.fromkeys(expected_counters(config), 0), **reported}.items()))


def triplet_slots_filled(counters: dict[str, int], strategy: NegativeStrategy) -> int:
    """Triplets written with `strategy` plus its slots that had no negative to draw."""
    dataset = records.DATASET_OF_STRATEGY[strategy]
    written = sum(counters.get(counter_names.split_counter(dataset, split), 0) for split in SPLITS)
    return written + counters.get(counter_names.unfilled_slots_counter(strategy), 0)


def reconciliation(counters: dict[str, int], strategies: tuple[NegativeStrategy, ...]) -> dict:
    """The read stage (with a multistream index: pages it lists = pages read + pages
    dead-lettered by the read; without one, streams that stopped decoding lose an unknown
    number of pages), pages_read against the page outcomes (articles used + each reason to
    skip), and for each negative strategy, `triplet_slots` against triplets written + slots
    left unfilled."""
    outcomes = {name: counters.get(name, 0) for name in counter_names.PAGE_OUTCOMES}
    pages_read = counters.get(counter_names.PAGES_READ, 0)
    index_pages = counters.get(counter_names.INDEX_PAGES, 0)
    lost = counters.get(counter_names.READ_PAGES_DEAD_LETTERED, 0)
    read_balanced = not index_pages or index_pages == pages_read + lost
    slots = {strategy: triplet_slots_filled(counters, strategy) for strategy in strategies}
    balanced = read_balanced and pages_read == sum(outcomes.values()) and all(
        n == counters.get(counter_names.TRIPLET_SLOTS, 0) for n in slots.values())
    return {
        "index_pages": index_pages,
        "pages_lost_by_read": lost,
        "lost_fraction": lost / index_pages if index_pages else (0.0 if pages_read else None),
        "streams_lost_unknown_pages": counters.get(counter_names.READ_STREAMS_LOST, 0),
        "pages_read": pages_read,
        "outcomes": outcomes,
        "triplet_slots": counters.get(counter_names.TRIPLET_SLOTS, 0),
        "triplet_slots_by_strategy": slots,
        "balanced": balanced,
    }


def input_loss(stats: dict, max_lost_fraction: float) -> str | None:
    """Why the run lost too much of its input, naming the likely cause; None when it did not."""
    read = stats["reconciliation"]
    counters = stats["counters"]
    prefix = counter_names.READ_REASON_PREFIX
    reasons = sorted(((n, name.removeprefix(prefix)) for name, n in counters.items()
                      if name.startswith(prefix) and name.removeprefix(prefix) in LOSS_CAUSES and n), reverse=True)
    cause = LOSS_CAUSES[reasons[0][1]] if reasons else "unknown"
    if read["index_pages"] and read["lost_fraction"] > max_lost_fraction:
        return (f"{stats['input']}: the read lost {read['pages_lost_by_read']:,} of the {read['index_pages']:,} "
                f"pages its index lists ({read['lost_fraction']:.1%} > --max-lost-fraction {max_lost_fraction}); "
                f"likely cause: {cause}; see dead_letters/")
    if read["streams_lost_unknown_pages"] and max_lost_fraction < 1:
        return (f"{stats['input']}: {read['streams_lost_unknown_pages']} stream(s) stopped decoding, losing an "
                f"unknown number of pages (no multistream index to count them); likely cause: {cause}; "
                "see dead_letters/ (--max-lost-fraction 1 accepts the loss)")
    if read["pages_read"] == 0:
        return f"{stats['input']}: no page was read; see dead_letters/"
    if not read["outcomes"][counter_names.ARTICLES_USED]:
        why = ", ".join(f"{name} {n:,}" for name, n in read["outcomes"].items() if n)
        return f"{stats['input']}: no article was kept ({why}); nothing to publish"
    return None


# The read stage's dead-letter reasons that lose pages, and what usually causes each.
LOSS_CAUSES = {
    "truncated_stream": "a truncated dump file (an interrupted download or copy)",
    "corrupt_stream": "a corrupt dump file, or an index of another dump (offsets off)",
    "missing_from_stream": "an index of another dump (stale index: its offsets do not match)",
    "malformed_xml": "an index of another dump (offsets inside pages), or a damaged file",
}


def summary_table(counters: dict[str, int]) -> str:
    width = max(map(len, counters), default=10)
    lines = [f"{'counter':<{width}}  {'value':>10}", f"{'-' * width}  {'-' * 10}"]
    lines += [f"{name:<{width}}  {value:>10,}" for name, value in counters.items()]
    return "\n".join(lines)


def output_counters(config: PipelineConfig) -> dict[str, str]:
    """{output folder: the counter of its records}: every folder the run writes, in a fixed order."""
    return {**{f"{dataset}/{split}": counter_names.split_counter(dataset, split)
               for dataset in config.triplet_datasets() for split in SPLITS},
            records.SCB: counter_names.SCB_ARTICLES, records.PASSAGES: counter_names.PASSAGES_ARTICLES,
            records.DEAD_LETTERS: counter_names.DEAD_LETTERS_WRITTEN}


def output_records(counters: dict[str, int], config: PipelineConfig) -> dict[str, int]:
    """Records per output folder, for the manifest."""
    return {folder: counters[name] for folder, name in output_counters(config).items()}


def triplets_plot_png(counters: dict[str, int], datasets: list[str]) -> bytes:
    """A grouped bar chart of triplets per dataset and split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(SPLITS)
    for offset, split in enumerate(SPLITS):
        values = [counters.get(counter_names.split_counter(dataset, split), 0) for dataset in datasets]
        bars = ax.bar([i + offset * width for i in range(len(datasets))], values, width, label=split)
        ax.bar_label(bars, labels=[f"{value:,}" for value in values], fontsize=7)
    ax.set_xticks([i + width for i in range(len(datasets))], datasets, fontsize=8)
    ax.set_yscale("log")   # the titles dataset has about a tenth of the sentence triplets
    ax.set_ylabel("triplets (log scale)")
    ax.set_title("Triplets per dataset and split")
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> dict:
    """Runs the job and returns what it wrote to stats.json (with `--wait false`, the job it submitted)."""
    config, beam_args = parse_args(argv)
    import apache_beam as beam  # Beam and the job's stages load once the flags are parsed
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.read.dumps import embedded_dump_path

    options = PipelineOptions(beam_args)
    runner = Runner.of(options)
    if not config.wait and not runner.is_dataflow:
        raise ConfigError(f"--wait false: only a Dataflow job runs on once this command exits; under "
                          f"{runner} the job runs in this process, so the command waits for it")
    input_pattern = config.input or embedded_dump_path()
    check_spacy_model(config.spacy_model)
    jobserver.prepare_portable_run(options)
    with folders.private_tempdir():   # Beam's temporary folders, and the progress counts, go with it
        workers_here = runner.is_local or jobserver.sdk_workers_in_launcher(options)   # Flink [local]: LOOPBACK
        folder = progress.progress_folder() if workers_here else None
        pipeline = beam.Pipeline(options=options)
        indexes = build(pipeline, config, input_pattern, folder)   # checks the input (ReadDumpPages), writes nothing
        return _run(pipeline, config, input_pattern, runner, folder, indexes)


def _pages_in(indexes: list[str]) -> Callable[[], int] | None:
    """What counts the pages the run reads (its progress bar's total), where every input has an index."""
    if not indexes:
        return None
    from pipeline.read.multistream import read_index
    return lambda: sum(1 for index in indexes for _ in read_index(index))


def _run(pipeline: beam.Pipeline, config: PipelineConfig, input_pattern: str, runner: Runner,
         folder: str | None, indexes: list[str]) -> dict:
    """Claims the output, runs the built job, reconciles its counters and publishes the run, or
    ends it unpublished (the lock released, what it wrote recorded for --overwrite). With
    `--wait false` it returns once the job is submitted, the folder still locked (`submitted`)."""
    out = config.output.rstrip("/")
    started = time.perf_counter()
    folders.claim_output(out, config.overwrite, list(output_counters(config)))  # after every check, before any write
    try:
        shown: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        log_path = None
        if folder:   # Beam's logs to a file, a progress bar on the terminal
            log_path = f"{out}/{published.RUN_LOG}" if not is_remote(out) else f"{folder}.log"
            shown = progress.show_progress(folder, _pages_in(indexes), log_path)
        # A job server Beam would start here (Prism's, Flink's) runs for this run only: it ends with it, a
        # SIGKILL of this process included, and answers for the job's counters until finish() read them.
        with jobserver.run_job(pipeline, log_path, (writes_of(out), shown), wait=config.wait) as result:
            if not config.wait:
                return submitted(result, pipeline, config, input_pattern, runner)
            stats = finish(result, config, input_pattern, runner, time.perf_counter() - started)
    except BaseException as error:   # the run is over: its lock goes, so readers and a rerun know
        folders.end_unpublished(out, "interrupted" if isinstance(error, KeyboardInterrupt) else str(error)[:300])
        raise
    publish(config, stats["counters"])
    said = log_line(log_path)
    if said:
        print(said, file=sys.stderr)
    return stats


def log_line(log_path: str | None) -> str | None:
    """Where the run's log is, said once the run ended and only when the log holds something (the
    in-memory DirectRunner's stays empty: pointing at it sent users to a 0-byte file); a failed
    portable job's error line names it instead (`jobserver.job_failures`)."""
    import os

    if not log_path or not os.path.isfile(log_path) or os.path.getsize(log_path) == 0:
        return None
    with open(log_path, "rb") as log:
        lines = sum(1 for _ in log)
    return f"pipeline: Beam's log ({lines:,} lines) in {log_path}"


def finish(result, config: PipelineConfig, input_pattern: str, runner: Runner, wall_seconds: float) -> dict:
    """What follows a job that ended (`result`, a Beam PipelineResult): its counters reconciled,
    stats.json and the plot written, the summary printed; InputLossError when it lost more of
    its input than allowed or its counts do not reconcile (the run then stays unpublished)."""
    out = config.output.rstrip("/")
    counters = counters_of(result, config, runner)
    stats: dict[str, Any] = {
        "counters": counters,
        "reconciliation": reconciliation(counters, config.negative_strategies()),
        "input": input_pattern,
        "config": dataclasses.asdict(config),
        "runner": str(runner),
        "wall_seconds": round(wall_seconds, 2),
    }
    plot = triplets_plot_png(counters, config.triplet_datasets())
    with writes_of(out):
        files.write_bytes(f"{out}/{published.STATS}", json.dumps(stats, indent=2, sort_keys=True).encode())
        files.write_bytes(f"{out}/{published.TRIPLETS_PLOT}", plot)
    print(summary_table(counters))
    print(f"pages read {stats['reconciliation']['pages_read']}, reconciled: {stats['reconciliation']['balanced']}; "
          f"wall time {stats['wall_seconds']} s; outputs in {out}")
    loss = input_loss(stats, config.max_lost_fraction) or unreconciled(stats)
    if loss:   # outputs, dead letters and stats stay for inspection, unpublished: readers refuse them
        raise InputLossError(loss)
    return stats


def publish(config: PipelineConfig, counters: dict[str, int]) -> None:
    """Writes the manifest (checked against the counters) and releases the folder: the run is published."""
    out = config.output.rstrip("/")
    triplet_folders = [folder for folder in output_counters(config) if folder.split("/")[0] in records.TRIPLET_DATASETS]
    with writes_of(out):
        folders.publish_manifest(out, output_records(counters, config),
                                 dict.fromkeys(triplet_folders, order_record(config.seed)))


def submitted(result, pipeline: beam.Pipeline, config: PipelineConfig, input_pattern: str,
              runner: Runner) -> dict:
    """`--wait false`: the Dataflow job `result` is submitted. Its id, project and region and
    this run's flags go into the folder's lock (`core.folders.submitted_job`), which then
    stays, held by the job: readers and other runs refuse the folder until `pipeline.publish`
    publishes it (or releases it, once the job failed). Prints the job's id. When the lock
    cannot be written the job is cancelled: no job may write a folder nothing holds."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    out = config.output.rstrip("/")
    cloud = pipeline.options.view_as(GoogleCloudOptions)
    job = {"id": result.job_id(), "project": cloud.project, "region": cloud.region, "submitted": time.time()}
    try:
        folders.record_submitted_job(out, job, {"config": config_flags(config), "input": input_pattern,
                                                "runner": runner.name})
    except BaseException:
        result.cancel()
        with contextlib.suppress(Exception):   # a cancelled job ends in a state wait_until_finish raises for
            result.wait_until_finish()
        raise
    print(f"pipeline: submitted Dataflow job {job['id']} (project {job['project']}, region {job['region']}): "
          f"https://console.cloud.google.com/dataflow/jobs/{job['region']}/{job['id']}?project={job['project']}")
    print(f"pipeline: {out} stays unpublished (readers refuse it) until the job ends and "
          f"`python -m pipeline.publish --output {out}` publishes it")
    return {"job": job}


def unreconciled(stats: dict) -> str | None:
    """Why the run's counts do not add up (which of the reconciliation's sums fails), or None."""
    read = stats["reconciliation"]
    if read["balanced"]:
        return None
    parts = []
    if read["index_pages"] and read["index_pages"] != read["pages_read"] + read["pages_lost_by_read"]:
        parts.append(f"its index lists {read['index_pages']:,} pages, the read gave {read['pages_read']:,} + "
                     f"{read['pages_lost_by_read']:,} dead-lettered (a stale or edited index?)")
    outcomes = sum(read["outcomes"].values())
    if read["pages_read"] != outcomes:
        parts.append(f"{read['pages_read']:,} pages read, {outcomes:,} page outcomes counted")
    slots = {name: n for name, n in read["triplet_slots_by_strategy"].items() if n != read["triplet_slots"]}
    if slots:
        parts.append(f"{read['triplet_slots']:,} triplet slots, filled or counted: {slots}")
    return f"{stats['input']}: the counts do not reconcile ({'; '.join(parts)}); nothing was published"


if __name__ == "__main__":
    sys.exit(run_cli(main))
