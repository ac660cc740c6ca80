"""`python -m eval.all`'s run: every evaluation of the registry (`EVALUATORS`) whose inputs are
given, on the sentences embedded once per method, and the combined report (`eval.all` says what it
holds)."""
from __future__ import annotations

import dataclasses
from typing import Any

from apache_beam.io.filesystems import FileSystems

from core.files import read_json_object
from core.folders import claim_folder
from core.progress import timed
from core.published import Run
from eval import qs3m, scb_job, sick, triplets_job
from eval.benchmark_job import is_transformer
from eval.config import Qs3mEvalConfig, ReportConfig, ScbConfig, SickConfig, TripletsConfig
from eval.evaluator import EvalResult, Evaluator, Inputs
from eval.kept import check_kept, encoder_key, keeps_results, refuse_other_source, runs_ledger
from eval.report import REPORT_WRITES, learning_curves_figure, write_figure, write_json, write_result, write_text
from eval.scb_job import check_scb_input
from eval.sick import read_sick, sick_sentences
from eval.triplets_job import distinct_sentences, read_test_triplets
from model.encoding.embedding_cache import EMBEDDINGS_FOLDER, cache_embeddings
from model.encoding.encoders import EncoderSpec, Methods, SpecKind, named_model_dir
from model.export import main as export
from model.training.model_dir import History, ModelDir

_ORDER: tuple[Evaluator, ...] = (scb_job, triplets_job, sick, qs3m)   # the report's order
EVALUATORS: dict[str, Evaluator] = {evaluator.NAME: evaluator for evaluator in _ORDER}


def evaluation_configs(args: ReportConfig) -> dict[str, Any]:
    """Each evaluation's flags, by name, from eval.all's: the SCB and triplets always, SICK with
    `--sick`, QS3M with `--qs3m` (its models scored on `--data`'s passages)."""
    configs: dict[str, Any] = {
        scb_job.NAME: ScbConfig(data=args.data, output=args.output, methods=args.methods, seed=args.seed,
                                max_articles=args.max_scb_articles, keep_seconds=args.keep_seconds),
        triplets_job.NAME: TripletsConfig(data=args.data, output=args.output, methods=args.methods,
                                          max_triplets=args.max_triplets, seed=args.seed)}
    if args.sick:
        configs[sick.NAME] = SickConfig(sick=args.sick, output=args.output, methods=args.methods)
    if args.qs3m:
        configs[qs3m.NAME] = Qs3mEvalConfig(passages=args.data, model_dir=args.qs3m, output=args.output,
                                            seed=args.seed)
    return configs


def trained_histories(model_dirs: tuple[str, ...]) -> dict[str, History]:
    """name -> the history of each `--model-dir` that has one (an untrained export has none)."""

    histories = {}
    for name, path in map(named_model_dir, model_dirs):
        history = ModelDir(path).history()
        if history is not None:
            histories[name] = history
    return histories


ONNX_FOLDER = "onnx"   # under --output: the int8 exports `--int8 true` encodes with


def check_int8_sources(methods: Methods, output: str) -> None:
    """Before the claim and any export: a transformer model dir whose int8 export kept in `output`
    (`NAME.source.json`) is of other files, while the report keeps results under NAME, is refused
    with one line (`eval.kept`): exporting it would replace the model the report scored."""
    for spec in methods.specs():
        if spec.kind is SpecKind.SAVED and is_transformer(spec) and keeps_results(output, spec.name):
            refuse_other_source(FileSystems.join(output, ONNX_FOLDER, f"{spec.name}.source.json"), encoder_key(spec),
                                output)


def int8_methods(methods: Methods, output: str) -> Methods:
    """`methods` with each transformer model dir's saved spec replaced by its int8 ONNX export's
    (`onnx:NAME=<output>/onnx/NAME`), exported now unless the export of the same encoder files is
    there (`NAME.source.json`: the SavedModel's key); every other spec as it was."""
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


def evaluate(args: ReportConfig, beam_args: list[str]) -> dict:
    """Checks the inputs and claims `--output` (before any work), embeds the triplets' and SICK's
    sentences once per method, runs the evaluations and writes the report."""
    check_scb_input(args.data)
    sick_splits = read_sick(args.sick) if args.sick else None
    if args.int8:
        check_int8_sources(args.methods, args.output)
    claim_folder(args.output, "eval", REPORT_WRITES, "--output", None)
    histories = trained_histories(args.methods.model_dirs)
    if args.int8:   # the methods every step scores; the learning curves still come from the model dirs
        args = dataclasses.replace(args, methods=int8_methods(args.methods, args.output))
    # kept embeddings and SCB rows of another model, run or seed: refused before any work (eval.kept)
    check_kept(args.output, args.methods.specs(), Run.open(args.data).sha256, args.seed)
    configs = evaluation_configs(args)
    seconds: dict[str, float] = {}
    with runs_ledger(args.output) as runs:   # a resumed report's cost: every run's wall time
        with timed(seconds, "embed"):
            test_triplets, sentences, specs = _embed(args, configs[triplets_job.NAME], sick_splits)
        evaluations = {}
        for name, evaluator in EVALUATORS.items():
            if name in configs:
                with timed(seconds, name):
                    evaluations[name] = evaluator.run(configs[name], Inputs(beam_args, specs, test_triplets))
                    write_result(evaluations[name], args.output)
        runs[-1].update(finished=True, seconds=round(sum(seconds.values()), 1))
        return _write_report(args, evaluations, seconds, len(sentences), runs, histories)


def _embed(args: ReportConfig, triplet_config: TripletsConfig,
           sick_splits: dict | None) -> tuple[dict[str, list[str]], list[str], list[EncoderSpec]]:
    """(the test triplets, every distinct sentence of the triplets and SICK, the method specs of
    their cached embeddings): each method embeds each sentence once. The SCB articles are not
    among them: the SCB job reads and embeds them itself."""
    test_triplets = read_test_triplets(triplet_config)
    sentences = list(dict.fromkeys(
        distinct_sentences(test_triplets) + (sick_sentences(sick_splits) if sick_splits else [])))
    specs = cache_embeddings(args.methods.specs(), sentences, FileSystems.join(args.output, EMBEDDINGS_FOLDER))
    return test_triplets, sentences, specs


def _write_report(args: ReportConfig, evaluations: dict[str, EvalResult], seconds: dict[str, float], sentences: int,
                  runs: list[dict], histories: dict[str, History]) -> dict:
    """report.md (every table and plot, with the trained models' learning curves), summary.md (its
    head and each evaluation's main table) and report.json, which is returned."""
    scb_result, triplet_result = evaluations[scb_job.NAME].result, evaluations[triplets_job.NAME].result
    sick_result = evaluations[sick.NAME].result if sick.NAME in evaluations else None
    sections = [evaluation.section() for evaluation in evaluations.values()]
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
        [header.rstrip() + "\n", *(evaluation.summary for evaluation in evaluations.values())]
        + [f"\nEvery table (MI, AMI, RI, openers, differences) and plot: "
           f"{FileSystems.join(args.output, 'report.md')}"]))
    combined = {"data": args.data, "methods": methods, "seconds": seconds, "runs": runs,
                "sentences_embedded": sentences, "scb": scb_result["summary"], "triplets": triplet_result,
                "sick": sick_result}
    if qs3m.NAME in evaluations:
        combined[qs3m.NAME] = evaluations[qs3m.NAME].result
    write_json(FileSystems.join(args.output, "report.json"), combined)
    print(f"report: {FileSystems.join(args.output, 'report.md')} (+ report.json and the PNG plots beside it)")
    return combined
