"""A run's memory does not grow with the dump: no shuffle of the job carries a page or a triplet
(Beam's local runners hold a shuffle whole in one process); the write-time order comes from runs
sorted by each worker (`pipeline.write.runs`), which give the shards sorting the whole split gives; and
the pipeline benchmark reports peak RSS as a ratio between two dump sizes."""
import random

import apache_beam as beam
import pytest
from apache_beam.portability import common_urns
from apache_beam.testing import test_pipeline

from core.records import NegativeStrategy, TripletKind
from core.splits import SPLITS
from pipeline import run
from pipeline.read.dumps import embedded_dump_path
from pipeline.triplets.make import Triplet
from pipeline.write import examples, order, runs
from pipeline.write.transforms import WriteTripletSplits


def _keyed_chunks(n_articles: int, seed: int = 1) -> list[tuple[int, list[bytes]]]:
    rng = random.Random(seed)
    return [(order.order_key(0, "d", "train", article, chunk), [rng.randbytes(rng.randint(1, 300))
                                                               for _ in range(rng.randint(1, 16))])
            for article in range(n_articles) for chunk in range(rng.randint(1, 3))]


def test_shards_merged_from_many_runs_are_the_whole_split_sorted_and_cut(tmp_path):
    pairs = _keyed_chunks(2000)
    buffer = runs.RunBuffer(str(tmp_path), run_bytes=50_000)
    infos = [info for key, chunk in pairs if (info := buffer.add(key, chunk))]
    infos.append(buffer.flush())
    plans = list(runs.shard_plans(infos))
    n_shards = order.shard_count(sum(len(r) for _, chunk in pairs for r in chunk), len(pairs))
    assert len(infos) > 20 and [(shard, n) for shard, n, _ in plans] == [(i, n_shards) for i in range(n_shards)]
    whole = sorted(pairs, key=lambda pair: pair[0])
    for shard, n, every_run in plans:
        assert runs.shard_chunks(every_run, shard, n) == [chunk for key, chunk in whole
                                                          if order.shard_of(key, n) == shard]
    assert list(runs.shard_plans([])) == [] and buffer.flush() is None


def _batches() -> dict[str, list[tuple[int, list[bytes]]]]:
    """Each split's (article id, serialised triplets) of about a KB each: 120 articles of up to 60
    triplets in train (over 3 MiB: several shards), 20 in the others."""
    rng = random.Random(2)

    def triplet(article: int, split: str, number: int) -> Triplet:
        words = " ".join(rng.choice(["river", "stone", "lamp", "north", "song"]) for _ in range(60))
        return Triplet(f"{words} {number}", words, words[::-1], f"Article {article}", "History", "Climate",
                       TripletKind.SEN, NegativeStrategy.ADJACENT, article, split, 1, 2, article, 0, 1, 0)

    sizes = {"train": 120, "validation": 20, "test": 20}
    return {split: [(article, examples.triplet_examples([triplet(article, split, n)
                                                        for n in range(rng.randint(1, 60))]))
                    for article in range(1000 * index, 1000 * index + sizes[split])]
            for index, split in enumerate(SPLITS)}


def _written(batches, folder, run_bytes: int) -> dict[str, bytes]:
    p = test_pipeline.TestPipeline()
    split_inputs = {split: p | f"Create[{split}]" >> beam.Create(batches[split]) for split in SPLITS}
    _ = split_inputs | WriteTripletSplits(str(folder), "d", 0, run_bytes=run_bytes)
    p.run().wait_until_finish()
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("part-*"))}


@pytest.mark.slow   # two Beam runs
def test_a_split_written_through_many_runs_is_the_same_files_as_through_one(tmp_path):
    batches = _batches()
    one_run = _written(batches, tmp_path / "one", run_bytes=1 << 30)
    many_runs = _written(batches, tmp_path / "many", run_bytes=2_000)
    assert sum(name.startswith("d/train/") for name in one_run) > 2 * 2   # shards of train, in both forms
    assert one_run == many_runs
    assert not list(tmp_path.rglob("*.run"))   # the runs went with the temporary folders


def test_no_shuffle_of_the_job_carries_pages_or_triplets(tmp_path):
    """Every GroupByKey of the default job, by the step it serves: the read units, the page ids
    and the copies of repeated ids (`ChooseCopies`), and per triplet split its run list, its
    shard plans and its shard list; per JSON-lines output its written files (Beam's `Write`)."""
    config, _ = run.parse_args(["--output", str(tmp_path / "out")])
    pipeline = beam.Pipeline()
    run.build(pipeline, config, embedded_dump_path())
    shuffles = {"/".join(transform.unique_name.split("/")[:2])
                for transform in pipeline.to_runner_api().components.transforms.values()
                if transform.spec.urn == common_urns.primitives.GROUP_BY_KEY.urn}
    datasets = config.triplet_datasets()
    assert shuffles == {"ReadDump/SpreadReadUnits", "ReadDump/ChooseCopies", "WriteScb/Write", "WritePassages/Write",
                        "WriteDeadLetters/Write", *(f"Write[{dataset}]/{step}[{split}]" for dataset in datasets
                                                    for step in ("AllRuns", "Spread", "AllShards") for split in SPLITS)}


def test_the_benchmark_reports_peak_rss_between_two_dump_sizes_and_cpu_time_beside_wall_time():
    from pipeline import benchmark

    names = [f"{tool}_{size}" for tool in ("bzcat", "segment_wiki", "reader") for size in ("1x", "scaled")]
    names += [f"pipeline_{size}{variant}" for size in ("1x", "scaled")
              for variant in ("", "_2_workers", "_all_negatives")]
    names += [f"{tool}_multistream_{workers}" for tool in ("reader", "pipeline")
              for workers in ("1_worker", "2_workers")]
    rss = {"pipeline_1x": 400, "pipeline_scaled": 440, "pipeline_1x_2_workers": 500, "pipeline_scaled_2_workers": 650}
    cpu = {"segment_wiki_scaled": 20.0, "pipeline_scaled": 25.0}
    results = {name: benchmark.Measurement(name, [], 10.0, rss.get(name, 100), cpu.get(name, 10.0), 0)
               for name in names}
    ratios = benchmark.ratios(results)
    assert ratios["rss_16x_vs_1x"] == pytest.approx(1.1) and ratios["rss_16x_vs_1x_2_workers"] == pytest.approx(1.3)
    # the same wall time, by CPU time: segment_wiki's reader and worker against the pipeline's one worker
    assert ratios["pipeline_vs_segment_wiki_scaled"] == 1.0
    assert ratios["pipeline_vs_segment_wiki_scaled_cpu"] == pytest.approx(1.25)
