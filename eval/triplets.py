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

from core.cli import parse_config, run_cli
from core.folders import claim_folder, reading
from eval.config import TripletsConfig
from eval.evaluator import Inputs
from eval.report import REPORT_WRITES, write_result
from model.encoding.encoders import check_encoder_specs
from model.training.shards import open_run


def parse_args(argv: list[str] | None) -> TripletsConfig:
    return parse_config(TripletsConfig, argv, "python -m eval.triplets", __doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> dict:
    config = parse_args(argv)
    check_encoder_specs(config.methods.specs())
    from apache_beam.io.filesystems import FileSystems

    from eval import triplets_job  # TensorFlow's reader, pyarrow, matplotlib: once the flags are parsed

    with reading(open_run(config.data)):
        triplets = triplets_job.read_test_triplets(config)
        claim_folder(config.output, "eval", REPORT_WRITES, "--output", None)
        evaluation = triplets_job.run(config, Inputs(triplets=triplets))
        write_result(evaluation, config.output)

    print(evaluation.markdown)
    print(f"report: {FileSystems.join(config.output, 'triplets.md')} (+ triplets.json, triplets_accuracy.png)")
    return evaluation.result


if __name__ == "__main__":
    sys.exit(run_cli(main))
