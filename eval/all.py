"""All the evaluations in one run, every method in one table each, and one combined `report.md`.

    python -m eval.all --data OUT --output EVAL [--model-dir DIR ...] [--encoder SPEC ...]
                       [--sick SICK.txt] [--qs3m QS3M_DIR] [Beam options for the SCB job]

Each method first embeds every distinct sentence of the driver's evaluations once (the test
split's triplets and SICK; `model.encoding.embedding_cache`, kept in `<output>/embeddings/`), which triplet
accuracy on the test split of triplets-sen and, when `--sick` is given, SICK relatedness score.
The SCB clustering job (Beam) is the only reader of the SCB files: its workers embed the articles
they score (`eval.scb` says why: no driver holds a full dump's SCB). With `--qs3m`, the QS3M
models of that `python -m model.qs3m` folder cluster `--data`'s passages (`eval.qs3m`). Each
evaluation (`eval.evaluator`) writes its own JSON/Markdown/PNG into `--output`, and `report.md`
puts the tables and plots together with the wall time of each step (`seconds` in report.json).
The whole sets by default; `--max-triplets` and `--max-scb-articles` score seeded samples.

A killed run resumes: rerun the same command. Each method's embeddings and its SCB rows are kept
as they complete and reused while the run's data, the method and the seed are the same, and
refused with one line when they are not (`eval.kept`); `runs` in report.json lists the wall time
of every run that went into the report.
"""
from __future__ import annotations

import sys

from core.cli import parse_config, refuse_file_as_folder, run_cli
from core.folders import reading
from core.published import Run
from eval.config import ReportConfig
from model.encoding.encoders import check_encoder_specs


def main(argv: list[str] | None = None) -> dict:
    args, beam_args = parse_config(ReportConfig, argv, "python -m eval.all", __doc__.split("\n\n")[0],
                                   passthrough=True)
    refuse_file_as_folder("--output", args.output)
    check_encoder_specs(args.methods.specs())
    from eval import all_job  # the jobs' libraries load once the flags are parsed

    with reading(Run.open(args.data)):   # a reader's lease: no pipeline.run --overwrite replaces it meanwhile
        return all_job.evaluate(args, beam_args)


if __name__ == "__main__":
    sys.exit(run_cli(main))
