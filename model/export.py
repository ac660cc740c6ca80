"""Writes a model dir's fine-tuned transformer as a sentence-transformers / Hugging Face folder
(`model.hf`), as `model.train` does at the end of a run.

    python -m model.export --model-dir MODEL --output DIR [--format sentence-transformers]
        [--report EVAL_REPORT_DIR]

The network is rebuilt from the flags the model dir records (`inputs.json`) and its best
checkpoint loaded; `--report` adds an `eval.all` report's scores, with their intervals, to the
model card.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from model.hf import FORMATS, model_card, report_scores, write_sentence_transformers
from pipeline.cli import UsageError, flag, parse_config, refuse_file_as_folder, run_cli


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    model_dir: str = flag(help="a model.train model dir with a transformer encoder")
    output: str = flag(help="the folder to write")
    format: str = flag("sentence-transformers", help=f"one of {', '.join(FORMATS)}")
    report: str | None = flag(None, help="an eval.all report folder whose scores go into the model card")

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"--format must be one of {FORMATS}, got {self.format!r}")


def export_model_dir(config: ExportConfig) -> str:
    """Rebuilds the model dir's network from its recorded flags, loads its best checkpoint and
    writes the folder."""
    from model.config import TrainConfig

    refuse_file_as_folder("--output", config.output)

    inputs_path, best = os.path.join(config.model_dir, "inputs.json"), os.path.join(
        config.model_dir, "checkpoints", "best.weights.h5")
    for path in (inputs_path, best):
        if not os.path.exists(path):
            raise UsageError(f"--model-dir {config.model_dir}: no {os.path.relpath(path, config.model_dir)}")
    with open(inputs_path, encoding="utf-8") as handle:
        flags = json.load(handle).get("flags")
    if not flags:
        raise UsageError(f"--model-dir {config.model_dir}: inputs.json records no flags (a run before they were)")
    if flags["encoder"] == "bilstm":
        raise UsageError(f"--model-dir {config.model_dir} holds a bilstm encoder: only transformer encoders "
                         "export to sentence-transformers")
    if os.path.exists(config.output) and os.listdir(config.output) and not os.path.exists(
            os.path.join(config.output, "modules.json")):
        raise UsageError(f"--output {config.output} is a folder that is not an export: refusing to replace it")
    from model.train import build_models
    from model.transformer import checkpoint_dir

    train_config = TrainConfig.from_flags(**{**flags, "model_dir": config.model_dir})
    encoder, model = build_models(train_config, None, global_batch=1)
    model.load_weights(best)
    history_path = os.path.join(config.model_dir, "history.json")
    summary = {"config": flags}
    if os.path.exists(history_path):
        with open(history_path, encoding="utf-8") as handle:
            summary = json.load(handle)
    similarity = train_config.resolved("distance")
    name = os.path.basename(config.model_dir.rstrip("/"))
    card = model_card(summary, name, similarity, train_config.inputs.max_tokens,
                      report_scores(config.report, name))
    return write_sentence_transformers(encoder, checkpoint_dir(flags["encoder"]), config.output,
                                       max_tokens=train_config.inputs.max_tokens, similarity=similarity, card=card)


def main(argv: list[str] | None = None) -> str:
    config = parse_config(ExportConfig, argv, prog="python -m model.export", description=__doc__)
    path = export_model_dir(config)
    print(f"sentence-transformers folder at {path}")
    return path


if __name__ == "__main__":
    sys.exit(run_cli(main))
