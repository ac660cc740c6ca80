"""All three evaluations in one run, every method in one table each, and one combined `report.md`.

    python -m eval.all --data OUT --output EVAL [--model-dir DIR ...] [--encoder SPEC ...]
                       [--sick SICK.txt] [Beam options for the SCB job]

Runs the SCB clustering job (Beam), triplet accuracy on the test split of triplets-sen, and, when
`--sick` is given, SICK relatedness; each writes its own JSON/Markdown/PNG into `--output`, and
`report.md` puts the tables and plots together with the wall time of each step.
"""
from __future__ import annotations

import argparse
import sys
import time

from apache_beam.io.filesystems import FileSystems

from eval import scb, sick, triplets
from model.encoders import add_method_flags, default_encoder_specs, model_dir_specs
from eval.report import scb_markdown, sick_markdown, triplets_markdown, write_json, write_text
from pipeline.cli import run_cli


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the pipeline's --output; local or gs://")
    parser.add_argument("--output", required=True, help="where the results go; local or gs://")
    add_method_flags(parser)
    parser.add_argument("--sick", help="SICK.txt; without it the SICK step is skipped")
    parser.add_argument("--seed", type=int, default=0, help="seed of the clustering and of the samples")
    parser.add_argument("--max-triplets", type=int, help="score a seeded sample of this many test triplets "
                        "(default: all)")
    parser.add_argument("--max-scb-articles", type=int, help="score a seeded sample of this many SCB articles "
                        "(default: all)")
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args, beam_args = parse_args(argv)
    encoders = args.encoders or default_encoder_specs()
    seconds: dict[str, float] = {}
    sections: list[str] = []

    start = time.perf_counter()
    scb_result = scb.run(scb.ScbConfig(data=args.data, output=args.output, encoders=encoders,
                                       model_dirs=args.model_dirs, seed=args.seed,
                                       max_articles=args.max_scb_articles), beam_args)
    seconds["scb"] = time.perf_counter() - start
    sections.append(scb_markdown(scb_result) + "\n![per-article ARI](scb_ari.png)\n")

    start = time.perf_counter()
    triplet_result = triplets.run(triplets.TripletsConfig(data=args.data, output=args.output, encoders=encoders,
                                                          model_dirs=args.model_dirs, max_triplets=args.max_triplets,
                                                          seed=args.seed))
    seconds["triplets"] = time.perf_counter() - start
    sections.append(triplets_markdown(triplet_result) + "\n![triplet accuracy](triplets_accuracy.png)\n")

    sick_result = None
    if args.sick:
        start = time.perf_counter()
        sick_result = sick.run(sick.SickConfig(sick=args.sick, output=args.output, encoders=encoders,
                                               model_dirs=args.model_dirs))
        seconds["sick"] = time.perf_counter() - start
        sections.append(sick_markdown(sick_result) + "\n![SICK Pearson r](sick_pearson.png)\n")

    methods = encoders + model_dir_specs(args.model_dirs)
    header = (f"# Evaluation report\n\nData: `{args.data}`. Methods: {', '.join(f'`{m}`' for m in methods)}.\n"
              f"Wall time: {', '.join(f'{step} {value:.1f} s' for step, value in seconds.items())}.\n"
              "Reference numbers marked \"paper\" are Ein Dor et al.'s, on their data, not ours.\n\n")
    write_text(FileSystems.join(args.output, "report.md"), header + "\n".join(sections))
    combined = {"data": args.data, "methods": methods, "seconds": seconds, "scb": scb_result["summary"],
                "triplets": triplet_result, "sick": sick_result}
    write_json(FileSystems.join(args.output, "report.json"), combined)
    return combined


if __name__ == "__main__":
    sys.exit(run_cli(main))
