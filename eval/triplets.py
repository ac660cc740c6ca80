"""Triplet accuracy on the test split (the paper's Table 3).

    python -m eval.triplets --data OUT --output EVAL [--encoder SPEC ...] [--model-dir DIR ...]

A triplet counts as correct when the anchor is strictly closer to the positive than to the
negative (ties count as wrong, like the trainer's own accuracy). Every method is scored both with
cosine similarity (how the paper scores its baselines) and with L1 distance (the trained
network's own metric), so no method needs special handling. Each encoder encodes the split's
unique sentences in one call (so TF-IDF's IDF is fitted on the test split's sentences).
Shards are read with `model.data` (local or gs://).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from eval.intervals import comparisons
from model.encoders import Methods, check_encoder_specs, load_encoders
from pipeline.cli import UsageError, flag, parse_config, run_cli
from pipeline import records
from pipeline.records import PAPER_DATASET, TRIPLET_DATASETS
from pipeline.splits import SPLITS


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
    """{"anchor", "positive", "negative"}: parallel lists of sentences of one split, or of a
    seeded sample of `max_triplets` of them (`model.data.triplet_sample`, the trainer's too)."""
    from model.data import triplet_sample, triplet_strings   # TensorFlow: after the flags parse

    columns = {"anchor": [], "positive": [], "negative": []}
    triplets = (triplet_sample(data, dataset, split, max_triplets, seed) if max_triplets
                else triplet_strings(data, dataset, split))
    for example in triplets.as_numpy_iterator():
        for key, values in columns.items():
            values.append(example[key].decode("utf-8"))
    return columns


DISTANCES = ("cosine", "l1")


def triplet_correct(anchor: np.ndarray, positive: np.ndarray, negative: np.ndarray) -> dict[str, np.ndarray]:
    """Per triplet, whether its positive is strictly closer, by cosine and by L1 distance."""
    def cosine(left, right):
        norms = np.linalg.norm(left, axis=1) * np.linalg.norm(right, axis=1)
        return np.einsum("ij,ij->i", left, right) / np.where(norms > 0, norms, 1.0)

    l1_positive = np.abs(anchor - positive).sum(axis=1)
    l1_negative = np.abs(anchor - negative).sum(axis=1)
    return {"cosine": cosine(anchor, positive) > cosine(anchor, negative), "l1": l1_positive < l1_negative}


def triplet_accuracies(anchor: np.ndarray, positive: np.ndarray, negative: np.ndarray) -> dict[str, float]:
    """Fraction of triplets whose positive is strictly closer, by cosine and by L1 distance."""
    correct = triplet_correct(anchor, positive, negative)
    return {f"accuracy_{distance}": float(np.mean(correct[distance])) for distance in DISTANCES}


def score_encoder(encoder, triplets: dict[str, list[str]]) -> tuple[dict, dict[str, np.ndarray]]:
    """Encodes the unique sentences once, then scores every triplet: (accuracies, per-triplet
    correctness by distance)."""
    unique = list(dict.fromkeys(triplets["anchor"] + triplets["positive"] + triplets["negative"]))
    row_of = {sentence: row for row, sentence in enumerate(unique)}
    embeddings = encoder.encode(unique)

    def rows(key):
        return embeddings[[row_of[sentence] for sentence in triplets[key]]]

    correct = triplet_correct(rows("anchor"), rows("positive"), rows("negative"))
    return ({"method": encoder.name, **{f"accuracy_{d}": float(np.mean(correct[d])) for d in DISTANCES}}, correct)


def run(config: TripletsConfig) -> dict:
    from eval.report import write_triplets_report   # matplotlib and TensorFlow: after the flags parse
    from model.data import verify_split

    verify_split(config.data, config.dataset, config.split)   # the whole split as the run wrote it, or an error
    triplets = read_triplets(config.data, config.dataset, config.split, config.max_triplets, config.seed)
    if not triplets["anchor"]:
        raise ValueError(f"{config.data}/{config.dataset}/{config.split} holds no triplets to score")
    if not config.max_triplets:   # every record of the split parsed and scored
        records.check_record_count(f"{config.data}/{config.dataset}/{config.split}", len(triplets["anchor"]),
                                   records.manifest_output(config.data, f"{config.dataset}/{config.split}")[1])
    encoders = load_encoders(config.methods.specs())
    scored = [score_encoder(encoder, triplets) for encoder in tqdm(encoders, desc="triplet accuracy", unit="method")]
    methods = [accuracies for accuracies, _ in scored]
    # Paired bootstrap over triplets: each method's accuracy minus each reference method's.
    differences = [{"distance": distance, **row} for distance in DISTANCES for row in comparisons(
        {entry["method"]: correct[distance] for entry, correct in scored}, config.seed)]
    result = {"dataset": config.dataset, "split": config.split, "triplets": len(triplets["anchor"]),
              "methods": methods, "differences": differences}
    write_triplets_report(result, config.output)
    return result


def parse_args(argv: list[str] | None) -> TripletsConfig:
    return parse_config(TripletsConfig, argv, "python -m eval.triplets", __doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> dict:
    config = parse_args(argv)
    check_encoder_specs(config.methods.specs())
    return run(config)


if __name__ == "__main__":
    sys.exit(run_cli(main))
