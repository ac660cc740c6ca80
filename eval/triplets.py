"""Triplet accuracy on the test split (the paper's Table 3).

    python -m eval.triplets --data OUT --output EVAL [--encoder SPEC ...] [--model-dir DIR ...]

A triplet counts as correct when the anchor is strictly closer to the positive than to the
negative (ties count as wrong, like the trainer's own accuracy). Every method is scored both with
cosine similarity (how the paper scores its baselines) and with L1 distance (the trained
network's own metric), so no method needs special handling. Each method embeds each distinct
sentence once (`model.encoding.embedding_cache`: `<output>/embeddings/<method>.parquet`, reused by a later
run while the sentences and the encoder are the same); TF-IDF encodes the split's distinct
sentences in one call, its IDF fitted on them, and stays sparse. Shards are read with
`model.training.arrays` (local or gs://), in a fixed order, so the bootstrap's intervals repeat exactly.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from core import records
from core.cli import UsageError, flag, parse_config, run_cli
from core.folders import claim_folder, reading
from core.progress import progress_bar
from core.published import Run, check_record_count
from core.records import PAPER_DATASET, TRIPLET_DATASETS
from core.splits import SPLITS
from eval.intervals import comparisons, proportion_interval
from model.encoding.encoders import EncoderSpec, Methods, check_encoder_specs, load_encoders
from model.similarity import REPORTED, Similarity


@dataclass(frozen=True)
class TripletsConfig:
    """Flags of `python -m eval.triplets` (and of eval.all's triplet step)."""

    data: str = flag(help="the pipeline's --output (its manifest lists the shards); local or gs://")
    output: str = flag(help="where the results go; local or gs://")
    dataset: str = flag(PAPER_DATASET, help=f"triplet dataset: one of {', '.join(TRIPLET_DATASETS)}")
    split: str = flag("test", help=f"split scored: one of {', '.join(SPLITS)}")
    methods: Methods = Methods()
    max_triplets: int | None = flag(None, help="score a seeded sample of this many triplets; none = the whole split")
    seed: int = flag(0, help="seed of the triplet sample")

    def __post_init__(self):
        if self.dataset not in TRIPLET_DATASETS:
            raise UsageError(f"--dataset must be one of {TRIPLET_DATASETS}, got {self.dataset!r}")
        if self.split not in SPLITS:
            raise UsageError(f"--split must be one of {SPLITS}, got {self.split!r}")


def read_triplets(data: str, dataset: str, split: str, max_triplets: int | None = None,
                  seed: int = 0) -> dict[str, list[str]]:
    """{role: sentences} (`records.ROLES`): parallel lists of sentences of one split, or of a
    seeded sample of `max_triplets` of them (the split from shard `seed` on, its first records: the
    trainer's `--evaluation-triplets` sample, `model.training.arrays.TripletInput.evaluation`)."""
    import itertools

    from model.training.arrays import batched, split_triplets
    from model.training.shards import open_run

    columns: dict[str, list[str]] = {role: [] for role in records.ROLES}
    triplets = split_triplets(open_run(data), dataset, split, rotation=seed if max_triplets else 0)
    with progress_bar(desc=f"read {dataset}/{split}", unit=" triplets", unit_scale=True) as progress:
        for batch in batched(itertools.islice(triplets, max_triplets), 4096):
            for key, values in columns.items():
                values += [triplet[key] for triplet in batch]
            progress.update(len(batch))
    return columns


def triplet_count(triplets: dict[str, list[str]]) -> int:
    return len(triplets[records.ROLES[0]])


def distinct_sentences(triplets: dict[str, list[str]]) -> list[str]:
    """Every sentence of the triplets once, in order of first appearance."""
    return list(dict.fromkeys(sentence for role in records.ROLES for sentence in triplets[role]))


def triplet_correct(anchor, positive, negative) -> dict[Similarity, np.ndarray]:
    """Per triplet, whether its positive is strictly closer, by cosine and by L1 distance (in the
    order of `REPORTED`); rows dense, or sparse (TF-IDF)."""
    return {similarity: similarity.triplet_correct(anchor, positive, negative) for similarity in REPORTED}


def triplet_accuracies(correct: dict[Similarity, np.ndarray]) -> dict[str, float | dict]:
    """`accuracy_<distance>` (the fraction of triplets correct) and `interval_<distance>` (its 95 %
    interval) of `triplet_correct`'s answers, cosine's first."""
    return {**{f"accuracy_{d}": float(np.mean(correct[d])) for d in REPORTED},
            **{f"interval_{d}": proportion_interval(correct[d]) for d in REPORTED}}


def score_encoder(encoder, triplets: dict[str, list[str]]) -> tuple[dict, dict[Similarity, np.ndarray]]:
    """Encodes the unique sentences once, then scores every triplet: (accuracies, per-triplet
    correctness by distance)."""
    unique = distinct_sentences(triplets)
    row_of = {sentence: row for row, sentence in enumerate(unique)}
    embeddings = encoder.encode(unique)

    def rows(key):
        return embeddings[[row_of[sentence] for sentence in triplets[key]]]

    correct = triplet_correct(*map(rows, records.ROLES))
    return {"method": encoder.name, **triplet_accuracies(correct)}, correct


def read_test_triplets(config: TripletsConfig) -> dict[str, list[str]]:
    """The split's triplets (or the configured sample), checked whole against the run's manifest."""
    from model.training.shards import open_run, verify_split

    verify_split(open_run(config.data), config.dataset, config.split)   # the whole split as the run wrote it
    triplets = read_triplets(config.data, config.dataset, config.split, config.max_triplets, config.seed)
    if not triplet_count(triplets):
        raise UsageError(f"{config.data}/{config.dataset}/{config.split} holds no triplets to score")
    if not config.max_triplets:   # every record of the split parsed and scored
        check_record_count(f"{config.data}/{config.dataset}/{config.split}", triplet_count(triplets),
                           Run.open(config.data).output(f"{config.dataset}/{config.split}").records)
    return triplets


def run(config: TripletsConfig, triplets: dict[str, list[str]] | None = None,
        specs: list[EncoderSpec] | None = None) -> dict:
    """Scores every method and writes `<output>/triplets.{json,md}` and the plot; returns the result.
    eval.all passes the triplets it read and specs of the embeddings it cached for all its steps."""
    from apache_beam.io.filesystems import FileSystems  # Beam, pyarrow, matplotlib: after the flags parse

    from eval.report import write_triplets_report
    from model.encoding.embedding_cache import EMBEDDINGS_FOLDER, cache_embeddings

    triplets = triplets or read_test_triplets(config)
    if specs is None:
        specs = cache_embeddings(config.methods.specs(), distinct_sentences(triplets),
                                 FileSystems.join(config.output, EMBEDDINGS_FOLDER))
    scored = [score_encoder(encoder, triplets) for encoder in load_encoders(specs)]
    methods = [accuracies for accuracies, _ in scored]
    # Paired bootstrap over triplets: each method's accuracy minus each reference method's.
    differences = [{"distance": distance.value, **row} for distance in REPORTED for row in comparisons(
        {entry["method"]: correct[distance] for entry, correct in scored}, config.seed)]
    result = {"dataset": config.dataset, "split": config.split, "triplets": triplet_count(triplets),
              "methods": methods, "differences": differences}
    write_triplets_report(result, config.output)
    return result


def parse_args(argv: list[str] | None) -> TripletsConfig:
    return parse_config(TripletsConfig, argv, "python -m eval.triplets", __doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> dict:
    config = parse_args(argv)
    check_encoder_specs(config.methods.specs())
    from apache_beam.io.filesystems import FileSystems

    from eval.report import REPORT_WRITES, triplets_markdown
    from model.training.shards import open_run

    with reading(open_run(config.data)):
        triplets = read_test_triplets(config)
        claim_folder(config.output, "eval", REPORT_WRITES, "--output", None)
        result = run(config, triplets)

    print(triplets_markdown(result))
    print(f"report: {FileSystems.join(config.output, 'triplets.md')} (+ triplets.json, triplets_accuracy.png)")
    return result


if __name__ == "__main__":
    sys.exit(run_cli(main))
