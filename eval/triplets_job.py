"""Triplet accuracy's scoring (`python -m eval.triplets`'s, and eval.all's triplet step; that
module says what is scored and how)."""
from __future__ import annotations

import itertools

import numpy as np
from apache_beam.io.filesystems import FileSystems

from core import records
from core.cli import UsageError
from core.progress import progress_bar
from core.published import Run, check_record_count
from eval.config import TripletsConfig
from eval.evaluator import EvalResult, Figure, Inputs
from eval.intervals import comparisons, proportion_interval
from eval.report import triplets_figure, triplets_markdown, triplets_table
from model.encoding.embedding_cache import EMBEDDINGS_FOLDER, cache_embeddings
from model.encoding.encoders import load_encoders
from model.similarity import REPORTED, Similarity
from model.training.arrays import batched, split_triplets
from model.training.shards import open_run, verify_split

NAME = "triplets"


def read_triplets(data: str, dataset: str, split: str, max_triplets: int | None = None,
                  seed: int = 0) -> dict[str, list[str]]:
    """{role: sentences} (`records.ROLES`): parallel lists of sentences of one split, or of a
    seeded sample of `max_triplets` of them (the split from shard `seed` on, its first records: the
    trainer's `--evaluation-triplets` sample, `model.training.arrays.TripletInput.evaluation`)."""
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
    verify_split(open_run(config.data), config.dataset, config.split)   # the whole split as the run wrote it
    triplets = read_triplets(config.data, config.dataset, config.split, config.max_triplets, config.seed)
    if not triplet_count(triplets):
        raise UsageError(f"{config.data}/{config.dataset}/{config.split} holds no triplets to score")
    if not config.max_triplets:   # every record of the split parsed and scored
        check_record_count(f"{config.data}/{config.dataset}/{config.split}", triplet_count(triplets),
                           Run.open(config.data).output(f"{config.dataset}/{config.split}").records)
    return triplets


def run(config: TripletsConfig, inputs: Inputs) -> EvalResult:
    """Scores every method: the result, its tables and its plot. eval.all passes the triplets it
    read (`inputs.triplets`) and specs of the embeddings it cached for all its steps."""
    triplets = inputs.triplets or read_test_triplets(config)
    specs = inputs.specs
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
    return EvalResult(NAME, result, triplets_markdown(result),
                      (Figure("triplets_accuracy.png", "triplet accuracy", triplets_figure(result)),),
                      triplets_table(result))
