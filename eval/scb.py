"""Sentence clustering benchmark (SCB) scoring as a Beam batch job (the paper's Table 4).

    python -m eval.scb --data OUT --output EVAL [--encoder SPEC ...] [--model-dir DIR ...] [Beam options]

reads `<data>/scb/*.jsonl.gz` (local or gs://), and per article and method: encodes the sentences
once, clusters them with k-means, Iclust and average-link (k = the article's number of sections)
and scores MI, AMI, RI and ARI, for all sentences and for paragraph openers only. Each method
embeds the articles through Beam's RunInference with the project's handler
(`model.encoding.inference.EncoderModelHandler`: the encoder built once per worker from its spec string, an
article's sentences encoded together). Per-article rows are kept as they are scored, in
`<output>/scb/rows/<method>/part-*.jsonl` (`eval.kept`: a killed job's rerun scores only the
rest), malformed records go to `<output>/scb/dead_letters-*.jsonl`; the driver then
macro-averages per method x algorithm x variant and writes the report files.

The job is the only reader of the SCB files: the driver checks them from the manifest and their
sizes (`check_scb_input`, no record read), the job reads, parses and samples them, its workers
embed their own articles, and the driver compares the records the job read with the manifest's
count (`check_scb_read`). So the SCB scales out with the workers: on a full dump's SCB no
machine holds every article or vector, where a driver that read the articles to embed them
(into `model.encoding.embedding_cache`) would hold them all.
"""
from __future__ import annotations

import sys

from core.cli import parse_config, run_cli
from core.folders import claim_folder, reading
from core.published import Run
from eval.config import ScbConfig
from eval.evaluator import Inputs
from eval.report import REPORT_WRITES, write_result
from model.encoding.encoders import check_encoder_specs


def parse_args(argv: list[str] | None) -> tuple[ScbConfig, list[str]]:
    """(config, Beam's pipeline options)."""
    return parse_config(ScbConfig, argv, "python -m eval.scb", __doc__.split("\n\n")[0], passthrough=True)


def main(argv: list[str] | None = None) -> dict:
    config, beam_args = parse_args(argv)
    from apache_beam.io.filesystems import FileSystems

    from eval import scb_job  # Beam and scikit-learn: once the flags are parsed

    with reading(Run.open(config.data)):
        scb_job.check_scb_input(config.data)
        check_encoder_specs(config.methods.specs())
        claim_folder(config.output, "eval", REPORT_WRITES, "--output", None)
        # (kept results of another key: refused before any work)
        evaluation = scb_job.run(config, Inputs(beam_args=beam_args))
        write_result(evaluation, config.output)

    print(evaluation.markdown)
    print(f"report: {FileSystems.join(config.output, 'scb.md')} (+ scb.json, scb_ari.png, per-article rows in scb/)")
    return evaluation.result


if __name__ == "__main__":
    sys.exit(run_cli(main))
