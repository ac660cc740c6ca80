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

import argparse
import sys
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from model.encoders import (add_method_flags, check_encoder_specs, default_encoder_specs, load_encoders,
                           model_dir_specs)
from eval.report import write_triplets_report
from model.data import triplet_sample, triplet_strings
from pipeline.cli import run_cli


@dataclass
class TripletsConfig:
    """Flags of `python -m eval.triplets` (and of eval.all's triplet step)."""

    data: str
    output: str
    dataset: str = "triplets-sen"
    split: str = "test"
    encoders: list[str] = field(default_factory=default_encoder_specs)
    model_dirs: list[str] = field(default_factory=list)
    max_triplets: int | None = None     # a seeded sample of this many triplets; None = the whole split
    seed: int = 0

    def encoder_specs(self) -> list[str]:
        return list(self.encoders) + model_dir_specs(self.model_dirs)


def read_triplets(data: str, dataset: str, split: str, max_triplets: int | None = None,
                  seed: int = 0) -> dict[str, list[str]]:
    """{"anchor", "positive", "negative"}: parallel lists of sentences of one split, or of a
    seeded sample of `max_triplets` of them (`model.data.triplet_sample`, the trainer's too)."""
    columns = {"anchor": [], "positive": [], "negative": []}
    triplets = (triplet_sample(data, dataset, split, max_triplets, seed) if max_triplets
                else triplet_strings(data, dataset, split))
    for example in triplets.as_numpy_iterator():
        for key, values in columns.items():
            values.append(example[key].decode("utf-8"))
    return columns


def triplet_accuracies(anchor: np.ndarray, positive: np.ndarray, negative: np.ndarray) -> dict[str, float]:
    """Fraction of triplets whose positive is strictly closer, by cosine and by L1 distance."""
    def cosine(left, right):
        norms = np.linalg.norm(left, axis=1) * np.linalg.norm(right, axis=1)
        return np.einsum("ij,ij->i", left, right) / np.where(norms > 0, norms, 1.0)

    l1_positive = np.abs(anchor - positive).sum(axis=1)
    l1_negative = np.abs(anchor - negative).sum(axis=1)
    return {
        "accuracy_cosine": float(np.mean(cosine(anchor, positive) > cosine(anchor, negative))),
        "accuracy_l1": float(np.mean(l1_positive < l1_negative)),
    }


def score_encoder(encoder, triplets: dict[str, list[str]]) -> dict:
    """Encodes the unique sentences once, then scores every triplet."""
    unique = list(dict.fromkeys(triplets["anchor"] + triplets["positive"] + triplets["negative"]))
    row_of = {sentence: row for row, sentence in enumerate(unique)}
    embeddings = encoder.encode(unique)

    def rows(key):
        return embeddings[[row_of[sentence] for sentence in triplets[key]]]

    return {"method": encoder.name, **triplet_accuracies(rows("anchor"), rows("positive"), rows("negative"))}


def run(config: TripletsConfig) -> dict:
    triplets = read_triplets(config.data, config.dataset, config.split, config.max_triplets, config.seed)
    if not triplets["anchor"]:
        raise ValueError(f"{config.data}/{config.dataset}/{config.split} holds no triplets to score")
    encoders = load_encoders(config.encoder_specs())
    methods = [score_encoder(encoder, triplets) for encoder in tqdm(encoders, desc="triplet accuracy", unit="method")]
    result = {"dataset": config.dataset, "split": config.split, "triplets": len(triplets["anchor"]),
              "methods": methods}
    write_triplets_report(result, config.output)
    return result


def parse_args(argv: list[str] | None) -> TripletsConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the pipeline's --output; local or gs://")
    parser.add_argument("--output", required=True, help="where the results go; local or gs://")
    parser.add_argument("--dataset", default="triplets-sen")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-triplets", type=int, help="score a seeded sample of this many triplets (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    add_method_flags(parser)
    args = parser.parse_args(argv)
    return TripletsConfig(data=args.data, output=args.output, dataset=args.dataset, split=args.split,
                          encoders=args.encoders or default_encoder_specs(), model_dirs=args.model_dirs,
                          max_triplets=args.max_triplets, seed=args.seed)


def main(argv: list[str] | None = None) -> dict:
    config = parse_args(argv)
    check_encoder_specs(config.encoder_specs())
    return run(config)


if __name__ == "__main__":
    sys.exit(run_cli(main))
