"""OUT/summary.json of `infra/accelerator/quality_run.sh OUT`: each model's test accuracy with its
interval and SCB score, its training speed (ms a step, triplets/s, an MFU estimate), the student
export's size, and each stage's seconds; printed as a table too.

    python -m infra.accelerator.summary --out OUT [--peak-tflops 989]

The MFU is an upper-bound estimate, not a profile: a step's FLOPs are taken as 2 x P x T for
the forward pass of every transformer layer and 4 x P x T more for the backward pass of the
trained ones (P their parameters, from the checkpoint's config.json; T the wordpieces of the
step's sentences, at most 3 x batch sentences of ASSUMED_WORDPIECES each), plus the teacher's
forward pass in a distillation, over the device's peak (`--peak-tflops`, H200 bfloat16 dense).
"""
from __future__ import annotations

import csv
import json
import os
import sys
from dataclasses import dataclass

from core.cli import UsageError, flag, parse_config, run_cli
from model.checkpoints import CHECKPOINTS
from model.training.model_dir import HISTORY, ModelDir

# quality_run.sh's names: each model's method name in the reports (the student's is its int8
# export, also that folder's name) and its model dir.
TEACHER, STUDENT = "teacher", "student-int8"
MODEL_DIRS = {TEACHER: "models/mpnet-sen", STUDENT: "models/mpnet-distilled"}
ASSUMED_WORDPIECES = 32   # a Wikipedia sentence's wordpieces, about (docs/transformer.md: mean 21 words)
SUMMARY = "summary.json"


@dataclass(frozen=True)
class SummaryConfig:
    out: str = flag(help="the folder quality_run.sh wrote")
    peak_tflops: float = flag(989.0, help="the device's peak dense TFLOP/s at the run's precision (H200 bfloat16: "
                                          "989); 0: no MFU (a CPU rehearsal)")


def layer_parameters(encoder: str, checkpoint: str | None, layers: int | None) -> tuple[int, int]:
    """(transformer layers, parameters of one layer) of a checkpoint: attention 4 h^2, feed-forward 2 h i."""
    with open(os.path.join(CHECKPOINTS[encoder].folder(checkpoint), "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    return layers or config["num_hidden_layers"], 4 * hidden * hidden + 2 * hidden * inner


def step_flops(flags: dict, teacher_flags: dict | None) -> float:
    """An upper bound of one training step's FLOPs (the module docstring)."""
    tokens = 3 * flags["batch_size"] * min(ASSUMED_WORDPIECES, flags.get("max_tokens") or ASSUMED_WORDPIECES)
    layers, per_layer = layer_parameters(flags["encoder"], flags.get("checkpoint"), flags.get("transformer_layers"))
    trained = max(0, layers - (flags.get("frozen_layers") or 0))
    flops = tokens * per_layer * (2 * layers + 4 * trained)
    if teacher_flags:
        teacher_layers, teacher_per_layer = layer_parameters(teacher_flags["encoder"], teacher_flags.get("checkpoint"),
                                                             teacher_flags.get("transformer_layers"))
        flops += 2 * tokens * teacher_per_layer * teacher_layers
    return float(flops)


def training_speed(model_dir: str, peak_tflops: float, teacher_flags: dict | None) -> dict:
    """ms a step, triplets/s and the MFU estimate of a model dir's training, from its HISTORY."""
    history = ModelDir(model_dir).history()
    if history is None:
        raise UsageError(f"{model_dir}: no {HISTORY}: did its stage run?")
    flags = history.config   # every flag of the run (INPUTS leaves out those a resume may change)
    last = history.learning_curve[-1]
    batch = history.record["global_batch_size"]
    steps = last["triplets_seen"] / batch
    seconds_a_step = last["wall_seconds"] / steps
    flops = step_flops(flags, teacher_flags)
    return {"triplets_trained": last["triplets_seen"], "global_batch": batch, "ms_a_step": 1000 * seconds_a_step,
            "triplets_per_second": last["triplets_seen"] / last["wall_seconds"],
            "seconds_to_first_step": history.record.get("seconds_to_first_step"),
            "step_tflop_estimate": flops / 1e12,
            "mfu_estimate": flops / seconds_a_step / (peak_tflops * 1e12) if peak_tflops else None,
            "validation_accuracy": history.record.get("best_val_triplet_accuracy"),
            "precision": flags.get("precision", "float32"), "encoder": flags["encoder"],
            "transformer_layers": flags.get("transformer_layers")}


def _json(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def summary(config: SummaryConfig) -> dict:
    """The summary of `config.out`, written to its SUMMARY."""
    out = config.out.rstrip("/")
    if not os.path.isfile(os.path.join(out, "stages.tsv")):
        raise UsageError(f"{out}: no stages.tsv: not a folder quality_run.sh wrote")
    with open(os.path.join(out, "stages.tsv"), encoding="utf-8") as handle:
        stages = {row["stage"]: int(row["seconds"]) for row in csv.DictReader(handle, delimiter="\t")}
    teacher_flags = ModelDir(os.path.join(out, MODEL_DIRS[TEACHER])).recorded_flags()   # its Net's flags
    triplets = {row["method"]: row for row in _json(os.path.join(out, "triplets", "triplets.json"))["methods"]}
    scb = _scb_scores(os.path.join(out, "scb", "scb.json"))
    export = os.path.join(out, STUDENT)
    models = {}
    for name, folder in MODEL_DIRS.items():
        row = triplets[name]
        models[name] = {"model_dir": folder, **training_speed(os.path.join(out, folder), config.peak_tflops,
                                                              teacher_flags if name != TEACHER else None),
                        "test_accuracy": row["accuracy_cosine"],
                        "test_interval": [row["interval_cosine"]["low"], row["interval_cosine"]["high"]],
                        "test_triplets": row["interval_cosine"]["n"], "scb": scb.get(name)}
    models[STUDENT]["export"] = {"folder": STUDENT, "megabytes": sum(
        os.path.getsize(os.path.join(export, name)) for name in os.listdir(export)) / 2 ** 20}
    result = {"models": models, "stage_seconds": stages, "total_seconds": sum(stages.values()),
              "peak_tflops": config.peak_tflops or None}
    with open(os.path.join(out, SUMMARY), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    return result


def _scb_scores(path: str) -> dict:
    """Each method's SCB score as the README reports it (Iclust's ARI over every sentence of the
    sample's articles, with its interval), by method."""
    return {row["method"]: {"iclust_ari": row["ARI"], "iclust_ari_interval": [row["ARI_interval"]["low"],
                                                                             row["ARI_interval"]["high"]],
                            "articles": row["articles"]}
            for row in _json(path)["summary"] if row["algorithm"] == "iclust" and row["variant"] == "all"}


def print_summary(result: dict) -> None:
    print(f"{'model':<13} {'test acc':>9} {'95 % interval':>17} {'SCB ARI':>8} {'ms/step':>8} {'triplets/s':>11} "
          f"{'MFU':>6}")
    for name, model in result["models"].items():
        low, high = model["test_interval"]
        mfu = f"{model['mfu_estimate']:.1%}" if model["mfu_estimate"] is not None else "-"
        ari = f"{model['scb']['iclust_ari']:.3f}" if model["scb"] else "-"
        print(f"{name:<13} {model['test_accuracy']:>9.4f} {f'[{low:.3f}, {high:.3f}]':>17} {ari:>8} "
              f"{model['ms_a_step']:>8.1f} {model['triplets_per_second']:>11.0f} {mfu:>6}")
    print(f"student export: {result['models'][STUDENT]['export']['megabytes']:.1f} MB; stages (s): "
          + ", ".join(f"{name} {seconds}" for name, seconds in result["stage_seconds"].items()))


def main(argv: list[str] | None = None) -> dict:
    config = parse_config(SummaryConfig, argv, "python -m infra.accelerator.summary", __doc__.split("\n\n")[0])
    result = summary(config)
    print_summary(result)
    return result


if __name__ == "__main__":
    sys.exit(run_cli(main))
