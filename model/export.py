"""Writes a model dir's fine-tuned transformer as a sentence-transformers / Hugging Face folder
(`model.hf`), as `model.train` does at the end of a run.

    python -m model.export --model-dir MODEL --output DIR [--format sentence-transformers]
        [--report EVAL_REPORT_DIR]

The network is rebuilt from the flags the model dir records (`inputs.json`) and its best
checkpoint loaded; `--report` adds an `eval.all` report's scores, with their intervals, to the
model card. `--check-data RUN` then loads the folder with sentence-transformers itself (where it
is installed) and prints the cosines between its embeddings and the Keras export's on the run's
SCB sentences.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from model.hf import FORMATS, model_card, report_scores, write_sentence_transformers
from pipeline.cli import UsageError, flag, parse_config, refuse_file_as_folder, run_cli


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    model_dir: str = flag(help="a model.train model dir with a transformer encoder")
    output: str = flag(help="the folder to write")
    format: str = flag("sentence-transformers", help=f"one of {', '.join(FORMATS)}")
    report: str | None = flag(None, help="an eval.all report folder whose scores go into the model card")
    check_data: str | None = flag(None, help="a pipeline run: after writing, encode its SCB sentences with "
                                             "sentence-transformers and with the Keras export, print their cosines "
                                             "(needs sentence-transformers installed)")
    check_sentences: int = flag(3000, help="--check-data: how many distinct SCB sentences")

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"--format must be one of {FORMATS}, got {self.format!r}")


def export_model_dir(config: ExportConfig) -> str:
    """Rebuilds the model dir's network from its recorded flags, loads its best checkpoint and
    writes the folder."""
    from model.config import NetworkKind, TrainConfig

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
    if not NetworkKind(flags["encoder"]).exports_sentence_transformers:
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
                      report_scores(config.report, name), int(encoder.output_shape[-1]))
    return write_sentence_transformers(encoder, checkpoint_dir(flags["encoder"]), config.output,
                                       max_tokens=train_config.inputs.max_tokens, similarity=similarity, card=card)


def scb_sentences(data: str, limit: int) -> list[str]:
    """The first `limit` distinct sentences of a run's SCB articles, as the pipeline wrote them."""
    from pipeline.published import Run, read_bytes
    from pipeline.records import SCB, ScbRecord

    sentences: dict[str, None] = {}
    for path in Run.open(data).paths(SCB):
        for line in read_bytes(path).decode("utf-8").splitlines():
            sentences.update(dict.fromkeys(ScbRecord.from_json(line).sentences))
            if len(sentences) >= limit:
                return list(sentences)[:limit]
    return list(sentences)


def check_against_sentence_transformers(config: ExportConfig, sentence_transformer) -> dict:
    """Cosines between the export loaded by sentence-transformers and the Keras export, row by row."""
    import numpy as np

    from model.encoder import load_encoder

    if not config.check_data:
        raise UsageError("the check against sentence-transformers encodes the SCB sentences of --check-data")
    sentences = scb_sentences(config.check_data, config.check_sentences)
    theirs = sentence_transformer(config.output, device="cpu").encode(sentences, batch_size=64)
    ours = load_encoder(config.model_dir).encode(sentences)
    cosines = (theirs * ours).sum(1) / np.linalg.norm(theirs, axis=1) / np.linalg.norm(ours, axis=1)
    result = {"sentences": len(sentences), "min": float(cosines.min()), "median": float(np.median(cosines)),
              "below_0.9999": int((cosines < 0.9999).sum())}
    print(f"sentence-transformers vs the Keras export on {result['sentences']} SCB sentences: cosine min "
          f"{result['min']:.6f}, median {result['median']:.6f}, {result['below_0.9999']} below 0.9999")
    return result


def main(argv: list[str] | None = None) -> str:
    config = parse_config(ExportConfig, argv, prog="python -m model.export", description=__doc__)
    sentence_transformer: Callable[..., Any] | None = None   # the SentenceTransformer class, with --check-data
    if config.check_data:   # PyTorch loads before TensorFlow (the other order can crash: model.encoders)
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise UsageError("--check-data needs sentence-transformers: pip install sentence-transformers") from None
        sentence_transformer = SentenceTransformer
    path = export_model_dir(config)
    print(f"sentence-transformers folder at {path}")
    if sentence_transformer is not None:
        check_against_sentence_transformers(config, sentence_transformer)
    return path


if __name__ == "__main__":
    sys.exit(run_cli(main))
