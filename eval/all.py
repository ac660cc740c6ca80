"""All three evaluations in one run, every method in one table each, and one combined `report.md`.

    python -m eval.all --data OUT --output EVAL [--model-dir DIR ...] [--encoder SPEC ...]
                       [--sick SICK.txt] [Beam options for the SCB job]

Each method first embeds every distinct sentence of the driver's evaluations once (the test
split's triplets and SICK; `model.encoding.embedding_cache`, kept in `<output>/embeddings/`), which triplet
accuracy on the test split of triplets-sen and, when `--sick` is given, SICK relatedness score.
The SCB clustering job (Beam) is the only reader of the SCB files: its workers embed the articles
they score (`eval.scb` says why: no driver holds a full dump's SCB). Each evaluation writes its
own JSON/Markdown/PNG into `--output`, and `report.md` puts the tables and plots together with the
wall time of each step (`seconds` in report.json). The whole sets by default; `--max-triplets` and
`--max-scb-articles` score seeded samples.

A killed run resumes: rerun the same command. Each method's embeddings and its SCB rows are kept
as they complete and reused while the run's data, the method and the seed are the same, and
refused with one line when they are not (`eval.kept`); `runs` in report.json lists the wall time
of every run that went into the report.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.cli import flag, parse_config, refuse_file_as_folder, run_cli
from core.folders import claim_folder, reading
from model.encoding.encoders import EncoderSpec, Methods, check_encoder_specs, named_model_dir
from model.training.model_dir import History, ModelDir

if TYPE_CHECKING:   # annotations only: the jobs' libraries load once the flags are parsed
    from eval.triplets import TripletsConfig


@dataclass(frozen=True)
class ReportConfig:
    """Flags of `python -m eval.all`."""

    data: str = flag(help="the pipeline's --output; local or gs://")
    output: str = flag(help="where the results go; local or gs://")
    methods: Methods = Methods()
    sick: str | None = flag(None, help="SICK.txt; without it the SICK step is skipped")
    seed: int = flag(0, help="seed of the clustering and of the samples")
    max_triplets: int | None = flag(None, help="score a seeded sample of this many test triplets; none = all")
    max_scb_articles: int | None = flag(None, help="score a seeded sample of this many SCB articles; none = all")
    int8: bool = flag(False, help="encode each transformer --model-dir with its int8 ONNX export (model.export "
                                  "--format onnx --quantize int8, written into <output>/onnx/NAME): about 2x the "
                                  "SavedModel's speed on CPU, triplet accuracy within 0.001 (docs/export.md)")
    keep_seconds: float = flag(30.0, help="how often the SCB job writes the rows it has scored, which a rerun into "
                                          "the same --output reuses (eval.kept); 0 = after each article")


def trained_histories(model_dirs: tuple[str, ...]) -> dict[str, History]:
    """name -> the history of each `--model-dir` that has one (an untrained export has none)."""

    histories = {}
    for name, path in map(named_model_dir, model_dirs):
        history = ModelDir(path).history()
        if history is not None:
            histories[name] = history
    return histories


def main(argv: list[str] | None = None) -> dict:
    args, beam_args = parse_config(ReportConfig, argv, "python -m eval.all", __doc__.split("\n\n")[0],
                                   passthrough=True)
    from core.published import Run  # the jobs' libraries load once the flags are parsed

    refuse_file_as_folder("--output", args.output)
    check_encoder_specs(args.methods.specs())
    with reading(Run.open(args.data)):   # a reader's lease: no pipeline.run --overwrite replaces it meanwhile
        return _evaluate(args, beam_args)


ONNX_FOLDER = "onnx"   # under --output: the int8 exports `--int8 true` encodes with


def check_int8_sources(methods: Methods, output: str) -> None:
    """Before the claim and any export: a transformer model dir whose int8 export kept in `output`
    (`NAME.source.json`) is of other files, while the report keeps results under NAME, is refused
    with one line (`eval.kept`): exporting it would replace the model the report scored."""
    from apache_beam.io.filesystems import FileSystems

    from eval.benchmark import is_transformer
    from eval.kept import encoder_key, keeps_results, refuse_other_source
    from model.encoding.encoders import SpecKind

    for spec in methods.specs():
        if spec.kind is SpecKind.SAVED and is_transformer(spec) and keeps_results(output, spec.name):
            refuse_other_source(FileSystems.join(output, ONNX_FOLDER, f"{spec.name}.source.json"), encoder_key(spec),
                                output)


def int8_methods(methods: Methods, output: str) -> Methods:
    """`methods` with each transformer model dir's saved spec replaced by its int8 ONNX export's
    (`onnx:NAME=<output>/onnx/NAME`), exported now unless the export of the same encoder files is
    there (`NAME.source.json`: the SavedModel's key); every other spec as it was."""
    from apache_beam.io.filesystems import FileSystems

    from core.files import read_json_object
    from eval.benchmark import is_transformer
    from eval.kept import encoder_key
    from eval.report import write_json
    from model.encoding.encoders import SpecKind
    from model.export import main as export

    texts = []
    for spec in methods.specs():
        if spec.kind is not SpecKind.SAVED or not is_transformer(spec):
            texts.append(str(spec))
            continue
        folder, source = (FileSystems.join(output, ONNX_FOLDER, spec.name + suffix) for suffix in ("", ".source.json"))
        if not FileSystems.exists(source) or read_json_object(source) != encoder_key(spec):
            export(["--model-dir", spec.paths[0], "--format", "onnx", "--quantize", "int8", "--output", folder,
                    "--overwrite", "true"])
            write_json(source, encoder_key(spec))
        texts.append(f"onnx:{spec.name}={folder}")
    return Methods(encoders=tuple(texts))


# Below these, a report is a smoke test: its intervals span most differences between methods.
DEMO_SIZE = {"triplets": 10_000, "scb_articles": 100}
SICK_SOURCE = "SICK.txt from the SemEval 2014 task 1 release"


def scale_lines(test_triplets: int, scb_articles: int, sick_result: dict | None) -> str:
    """The report's head: what the numbers rest on, whether they are demo-size, and SICK's fate."""
    lines = f"Scale: {test_triplets:,} test triplets, {scb_articles:,} SCB articles"
    lines += f", {sick_result['pairs']['TEST']:,} SICK TEST pairs.\n" if sick_result else ".\n"
    if test_triplets < DEMO_SIZE["triplets"] or scb_articles < DEMO_SIZE["scb_articles"]:
        lines += ("**Demo-size data**: at this n the 95 % intervals below are wide and most differences between "
                  "methods are noise (a trained encoder may score under mean-vectors in some cells); it shows the "
                  "pipeline runs end to end. The README's Results section has the 2019 run's numbers.\n")
    if sick_result is None:
        lines += f"SICK relatedness: skipped: pass SICK=path to make, or --sick path ({SICK_SOURCE}).\n"
    return lines


def _evaluate(args: ReportConfig, beam_args: list[str]) -> dict:
    """Checks the inputs and claims `--output` (before any work), embeds the triplets' and SICK's
    sentences once per method, runs the evaluations and writes the report."""
    from core.progress import timed
    from core.published import Run
    from eval import scb, sick
    from eval.kept import check_kept, runs_ledger
    from eval.report import REPORT_WRITES

    scb.check_scb_input(args.data)
    sick_splits = sick.read_sick(args.sick) if args.sick else None
    if args.int8:
        check_int8_sources(args.methods, args.output)
    claim_folder(args.output, "eval", REPORT_WRITES, "--output", None)
    histories = trained_histories(args.methods.model_dirs)
    if args.int8:   # the methods every step scores; the learning curves still come from the model dirs
        args = dataclasses.replace(args, methods=int8_methods(args.methods, args.output))
    # kept embeddings and SCB rows of another model, run or seed: refused before any work (eval.kept)
    check_kept(args.output, args.methods.specs(), Run.open(args.data).sha256, args.seed)
    seconds: dict[str, float] = {}
    with runs_ledger(args.output) as runs:   # a resumed report's cost: every run's wall time
        with timed(seconds, "embed"):
            triplet_config, test_triplets, sentences, specs = _embed(args, sick_splits)
        results = _run_evaluations(args, beam_args, triplet_config, test_triplets, specs, seconds)
        runs[-1].update(finished=True, seconds=round(sum(seconds.values()), 1))
        return _write_report(args, results, seconds, len(sentences), runs, histories)


def _embed(args: ReportConfig,
           sick_splits: dict | None) -> tuple[TripletsConfig, dict[str, list[str]], list[str], list[EncoderSpec]]:
    """(the triplets' config, the test triplets, every distinct sentence of the triplets and SICK,
    the method specs of their cached embeddings): each method embeds each sentence once. The SCB
    articles are not among them: the SCB job reads and embeds them itself."""
    from apache_beam.io.filesystems import FileSystems

    from eval import sick, triplets
    from model.encoding.embedding_cache import EMBEDDINGS_FOLDER, cache_embeddings

    triplet_config = triplets.TripletsConfig(data=args.data, output=args.output, methods=args.methods,
                                             max_triplets=args.max_triplets, seed=args.seed)
    test_triplets = triplets.read_test_triplets(triplet_config)
    sentences = list(dict.fromkeys(
        triplets.distinct_sentences(test_triplets) + (sick.sick_sentences(sick_splits) if sick_splits else [])))
    specs = cache_embeddings(args.methods.specs(), sentences, FileSystems.join(args.output, EMBEDDINGS_FOLDER))
    return triplet_config, test_triplets, sentences, specs


@dataclass(frozen=True)
class _Results:
    """Each evaluation's result (SICK's None when skipped), and the report's section of each."""

    scb: dict
    triplets: dict
    sick: dict | None
    sections: list[str]


def _run_evaluations(args: ReportConfig, beam_args: list[str], triplet_config: TripletsConfig,
                     test_triplets: dict[str, list[str]],
                     specs: list[EncoderSpec], seconds: dict[str, float]) -> _Results:
    """The SCB clustering job, triplet accuracy and (with `--sick`) SICK relatedness, each timed;
    the last two score `specs`, the cached embeddings."""
    from core.progress import timed
    from eval import scb, sick, triplets
    from eval.report import scb_markdown, sick_markdown, triplets_markdown

    sections: list[str] = []
    with timed(seconds, "scb"):
        scb_result = scb.run(scb.ScbConfig(data=args.data, output=args.output, methods=args.methods, seed=args.seed,
                                           max_articles=args.max_scb_articles, keep_seconds=args.keep_seconds),
                           beam_args)
    sections.append(scb_markdown(scb_result) + "\n![per-article ARI](scb_ari.png)\n")

    with timed(seconds, "triplets"):
        triplet_result = triplets.run(triplet_config, test_triplets, specs)
    sections.append(triplets_markdown(triplet_result) + "\n![triplet accuracy](triplets_accuracy.png)\n")

    sick_result = None
    if args.sick:
        with timed(seconds, "sick"):
            sick_result = sick.run(sick.SickConfig(sick=args.sick, output=args.output, methods=args.methods), specs)
        sections.append(sick_markdown(sick_result) + "\n![SICK Pearson r](sick_pearson.png)\n")
    return _Results(scb_result, triplet_result, sick_result, sections)


def _write_report(args: ReportConfig, results: _Results, seconds: dict[str, float], sentences: int,
                  runs: list[dict], histories: dict[str, History]) -> dict:
    """report.md (every table and plot, with the trained models' learning curves), summary.md (its
    head and each benchmark's main table) and report.json, which is returned."""
    from apache_beam.io.filesystems import FileSystems

    from eval.report import (
        learning_curves_figure,
        scb_ari_summary,
        sick_markdown,
        triplets_table,
        write_figure,
        write_json,
        write_text,
    )

    scb_result, triplet_result, sick_result = results.scb, results.triplets, results.sick
    sections = list(results.sections)
    if histories:
        write_figure(FileSystems.join(args.output, "learning_curves.png"), learning_curves_figure(histories))
        sections.append("## Learning curves\n\n![learning curves](learning_curves.png)\n")
    methods = [str(spec) for spec in args.methods.specs()]   # as flag text, in the report and report.json
    header = (f"# Evaluation report\n\nData: `{args.data}`. Methods: {', '.join(f'`{m}`' for m in methods)}.\n"
              + scale_lines(triplet_result["triplets"], scb_result["articles"], sick_result)
              + ("Transformer model dirs are encoded by their int8 ONNX exports (`--int8 true`; docs/export.md "
                 "measures the accuracy kept).\n" if args.int8 else "")
              + f"Wall time: {', '.join(f'{step} {value:.1f} s' for step, value in seconds.items())} "
              f"({sentences} distinct triplet and SICK sentences embedded once per method; the SCB job embeds its "
              "articles)"
              + (f"; {sum(run['seconds'] for run in runs):.1f} s over the {len(runs)} runs into this folder whose "
                 "kept results it reuses" if len(runs) > 1 else "") + ".\n"
              "Reference numbers marked \"paper\" are Ein Dor et al.'s, on their data, not ours.\n\n")
    report = header + "\n".join(sections)
    write_text(FileSystems.join(args.output, "report.md"), report)
    # The headline for a terminal (make demo prints it): the head, each benchmark's main table.
    write_text(FileSystems.join(args.output, "summary.md"), "\n".join(
        [header.rstrip() + "\n", scb_ari_summary(scb_result), triplets_table(triplet_result)]
        + ([sick_markdown(sick_result)] if sick_result else [])
        + [f"\nEvery table (MI, AMI, RI, openers, differences) and plot: "
           f"{FileSystems.join(args.output, 'report.md')}"]))
    combined = {"data": args.data, "methods": methods, "seconds": seconds, "runs": runs,
                "sentences_embedded": sentences, "scb": scb_result["summary"], "triplets": triplet_result,
                "sick": sick_result}
    write_json(FileSystems.join(args.output, "report.json"), combined)
    print(f"report: {FileSystems.join(args.output, 'report.md')} (+ report.json and the PNG plots beside it)")
    return combined


if __name__ == "__main__":
    sys.exit(run_cli(main))
