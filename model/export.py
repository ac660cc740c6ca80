"""Writes a trained model dir's transformer encoder as a sentence-transformers (Hugging Face)
folder, as `model.train` does at the end of a run, or as an ONNX folder for CPU workers.

    python -m model.export --model-dir MODEL --output DIR [--format sentence-transformers]
        [--report EVAL_REPORT_DIR] [--overwrite true]
    python -m model.export --model-dir MODEL --format onnx [--quantize int8] --output DIR [--overwrite true]

`--format onnx` takes any transformer model dir: trained, distilled, a soup, or off the shelf
(`model.pretrained`'s, its checkpoint as it ships); `--encoder onnx:DIR` then scores the folder in
the eval jobs.

`--output` must be a new or empty folder, or one an earlier `model.export` wrote: anything else in
it (a `NOTES.md`, an `onnx/`) is refused, and an earlier export is replaced only with
`--overwrite true`, deleting only its own files. While the export runs the folder names this host
and process, so a second writer is refused; once done it names only the command and when it
ended, so the finished folder can be uploaded as it is (to the Hugging Face Hub).

The network is rebuilt from the flags the model dir's training run recorded, with its best
checkpoint, under TensorFlow's Keras where TensorFlow is installed, else JAX's (`KERAS_BACKEND=jax`
chooses it): ONNX and sentence-transformers exports need no TensorFlow. `--report` adds an
`eval.all` report's scores, with their intervals, to the model card. `--check-data RUN` then loads
the folder with sentence-transformers itself (where it is installed) and prints the cosines between
its embeddings and the Keras export's on the run's SCB sentences.

In the code: the formats are `model.formats.hf` and `model.formats.onnx_export`; `--output` is
claimed as every writing command claims its folder (COMMAND_CLAIM, released by `end_claim`); the
recorded flags are the model dir's INPUTS (`recorded_config`).
"""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.cli import UsageError, flag, parse_config, refuse_file_as_folder, run_cli
from core.files import read_bytes, read_json_object
from core.folders import COMMAND_CLAIM, claim_folder, end_claim
from core.published import Run
from core.records import SCB, ScbRecord
from model import keras_backend_here, require_tensorflow_keras, tensorflow_installed
from model.checkpoints import CHECKPOINTS
from model.encoding.encoder import SavedModelEncoder, load_encoder
from model.encoding.trained_net import rebuilt, recorded_config
from model.formats import onnx_export
from model.formats.hf import (
    FORMATS,
    backbone_of,
    export_entries,
    model_card,
    report_scores,
    write_sentence_transformers,
)
from model.similarity import Similarity
from model.training.model_dir import BEST_WEIGHTS, ENCODER, INPUTS, SERVING, ModelDir

SAVED_MODEL = "saved-model"   # `--format`: the model dir's own strings-in ENCODER (model.formats.saved_model)
ONNX = "onnx"                 # `--format`: an ONNX folder (model.formats.onnx_export)


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    model_dir: str = flag(help="a model.train model dir with a transformer encoder")
    output: str | None = flag(None, help="the folder to write (--format sentence-transformers); saved-model "
                                         f"writes the model dir's own {ENCODER}/")
    format: str = flag("sentence-transformers", help=f"one of {', '.join(FORMATS)}; onnx: the graph, tokenizer and "
                                                     "settings for ONNX Runtime; or saved-model: the model dir's "
                                                     f"strings-in {ENCODER}/ (and {SERVING}/N) from --weights")
    quantize: str | None = flag(None, help="--format onnx: int8 quantizes the graph's matrix products (dynamic, "
                                           "for AVX2 CPUs); none = float32")
    weights: str | None = flag(None, help="--format saved-model: the network's weights; none = the model dir's "
                                          f"{BEST_WEIGHTS}")
    report: str | None = flag(None, help="an eval.all report folder whose scores go into the model card")
    check_data: str | None = flag(None, help="a pipeline run: after writing, encode its SCB sentences with "
                                             "sentence-transformers and with the Keras export, print their cosines "
                                             "(needs sentence-transformers installed)")
    check_sentences: int = flag(3000, help="--check-data: how many distinct SCB sentences")
    overwrite: bool = flag(False, help="replace an earlier model.export's folder at --output (only its files); a "
                                       "folder holding anything else is refused either way")

    def __post_init__(self):
        if self.format not in (*FORMATS, ONNX, SAVED_MODEL):
            raise ValueError(f"--format must be one of {', '.join((*FORMATS, ONNX, SAVED_MODEL))}, got {self.format!r}")
        if self.quantize is not None and (self.format != ONNX or self.quantize != "int8"):
            raise UsageError(f"--quantize {self.quantize}: only int8, with --format onnx")
        if self.format != SAVED_MODEL and not self.output:
            raise UsageError(f"--format {self.format} writes a folder of its own: give --output")


def export_model_dir(config: ExportConfig) -> str:
    """Rebuilds the model dir's network from its recorded flags, loads its best checkpoint (or
    `--weights`) and writes `--format`: a sentence-transformers folder at `--output`, claimed
    (`core.folders.claim_folder`: a folder holding anything an export does not write is refused,
    an earlier export replaced only with `--overwrite`), or the model dir's own ENCODER."""
    if config.output:   # a file where the folder goes: refused first, before the model dir is read
        refuse_file_as_folder("--output", config.output)
    if config.format == ONNX:   # any transformer model dir, off the shelf too: its own checks
        return export_onnx(config)
    model_dir = ModelDir(config.model_dir)
    weights = config.weights or model_dir.best_weights
    flags, train_config = recorded_config(config.model_dir)
    if not os.path.exists(weights):
        raise UsageError(f"--model-dir {config.model_dir}: no {BEST_WEIGHTS}" if not config.weights
                         else f"--weights {weights}: no such file")
    if config.format == SAVED_MODEL:
        from model.formats.saved_model import write_saved_models  # TensorFlow: this format alone needs it

        _, train_config, word_ids, encoder, _ = rebuilt(config.model_dir, weights)
        write_saved_models(train_config, word_ids, encoder, config.model_dir)
        return model_dir.encoder
    assert config.output is not None   # __post_init__
    if not train_config.network.kind.exports_sentence_transformers:
        raise UsageError(f"--model-dir {config.model_dir} holds a bilstm encoder: only transformer encoders "
                         "export to sentence-transformers")
    history = model_dir.history()
    name = os.path.basename(config.model_dir.rstrip("/"))
    report_lines = report_scores(config.report, name)
    claim_folder(config.output, "model.export", export_entries(), "--output", config.overwrite)
    _, train_config, _, encoder, _ = rebuilt(config.model_dir, weights)
    similarity = train_config.resolved("distance")
    card = model_card(history, history.config if history else flags, name, similarity,
                      train_config.inputs.max_tokens, report_lines, int(encoder.output_shape[-1]))
    folder = CHECKPOINTS[flags["encoder"]].folder(train_config.network.checkpoint)
    write_sentence_transformers(encoder, folder, config.output,
                                max_tokens=train_config.inputs.max_tokens, similarity=similarity, card=card)
    return end_claim(config.output, "model.export")


def is_off_the_shelf(model_dir: str) -> bool:
    """Whether `model_dir` is `model.pretrained`'s: a checkpoint's export, no recorded training."""
    claim = os.path.join(model_dir, COMMAND_CLAIM)
    return (not os.path.exists(os.path.join(model_dir, INPUTS)) and os.path.exists(claim)
            and read_json_object(claim).get("command") == "model.pretrained")


def refuse_onnx_of(encoder: str, model_dir: str) -> None:
    """The ONNX graph (`model.formats.onnx_export`) is BERT's: another checkpoint is refused, saying what to do."""
    if CHECKPOINTS[encoder].architecture != "bert":
        raise UsageError(f"--model-dir {model_dir} holds an {encoder} encoder: the ONNX graph is written for BERT "
                         "(minilm) only; export it --format sentence-transformers, or distil it into minilm "
                         "(model.train --encoder minilm --teacher) and export that")


def onnx_source(model_dir: str, weights: str | None):
    """A function that rebuilds, once the output is claimed, (keras-hub backbone with the model
    dir's weights, the Dense projection after pooling or None, checkpoint name, wordpieces per
    sentence, similarity); what makes the model dir unfit is refused now."""
    if is_off_the_shelf(model_dir):
        export = SavedModelEncoder(model_dir)
        name = export.checkpoint or "minilm"
        refuse_onnx_of(name, model_dir)
        return functools.partial(off_the_shelf, name, export)
    flags, train_config = recorded_config(model_dir)
    best = ModelDir(model_dir).best_weights
    if not os.path.exists(weights or best):
        raise UsageError(f"--weights {weights}: no such file" if weights
                         else f"--model-dir {model_dir}: no {BEST_WEIGHTS}")
    if not train_config.network.kind.exports_sentence_transformers:
        raise UsageError(f"--model-dir {model_dir} holds a bilstm encoder: only transformer encoders export to onnx")
    refuse_onnx_of(flags["encoder"], model_dir)

    def trained():
        _, config, _, encoder, _ = rebuilt(model_dir, weights or best)
        projection = next((layer for layer in encoder.layers if layer.name == "projection"), None)
        return backbone_of(encoder), projection, flags["encoder"], config.inputs.max_tokens, config.resolved("distance")
    return trained


def off_the_shelf(name: str, export: SavedModelEncoder):
    """`onnx_source`'s tuple for `model.pretrained`'s export `export` of the checkpoint `name`: the
    checkpoint's backbone as it ships, with the tokens and similarity the export records."""
    from model.net.backbone import build_transformer_encoder  # Keras: loaded once its backend is chosen

    return (backbone_of(build_transformer_encoder(name)), None, name, export.max_seq_length or 64,
            export.similarity_fn_name)


def export_onnx(config: ExportConfig) -> str:
    """Writes the ONNX folder at `--output`, claimed as the sentence-transformers export's is."""
    assert config.output is not None   # __post_init__
    if not os.path.isdir(config.model_dir):
        raise UsageError(f"--model-dir {config.model_dir}: no such folder")
    source = onnx_source(config.model_dir, config.weights)
    claim_folder(config.output, "model.export", onnx_export.export_entries(), "--output", config.overwrite)
    backbone, projection, checkpoint, max_tokens, similarity = source()
    vocabulary = os.path.join(CHECKPOINTS[checkpoint].folder(), "vocab.txt")
    onnx_export.write_onnx_folder(backbone, vocabulary, config.output, max_tokens=max_tokens, similarity=similarity,
                                  quantize=config.quantize, projection=projection,
                                  source=os.path.basename(config.model_dir.rstrip("/")))
    return end_claim(config.output, "model.export")


def scb_sentences(data: str, limit: int) -> list[str]:
    """The first `limit` distinct sentences of a run's SCB articles, as the pipeline wrote them."""
    sentences: dict[str, None] = {}
    for path in Run.open(data).paths(SCB):
        for line in read_bytes(path).decode("utf-8").splitlines():
            sentences.update(dict.fromkeys(ScbRecord.from_json(line).sentences))
            if len(sentences) >= limit:
                return list(sentences)[:limit]
    return list(sentences)


def check_against_sentence_transformers(config: ExportConfig, sentence_transformer) -> dict:
    """Cosines between the export loaded by sentence-transformers and the Keras export, row by row."""
    if not config.check_data:
        raise UsageError("the check against sentence-transformers encodes the SCB sentences of --check-data")
    sentences = scb_sentences(config.check_data, config.check_sentences)
    theirs = sentence_transformer(config.output, device="cpu").encode(sentences, batch_size=64)
    ours = load_encoder(config.model_dir).encode(sentences)
    cosines = Similarity.COSINE.pairwise(theirs, ours)
    result = {"sentences": len(sentences), "min": float(cosines.min()), "median": float(np.median(cosines)),
              "below_0.9999": int((cosines < 0.9999).sum())}
    print(f"sentence-transformers vs the Keras export on {result['sentences']} SCB sentences: cosine min "
          f"{result['min']:.6f}, median {result['median']:.6f}, {result['below_0.9999']} below 0.9999")
    return result


def main(argv: list[str] | None = None) -> str:
    config = parse_config(ExportConfig, argv, prog="python -m model.export",
                          description=__doc__.split("\n\nIn the code:")[0])   # the rest is for developers
    if config.format == SAVED_MODEL and not tensorflow_installed():
        raise UsageError(f"--format {SAVED_MODEL} writes TensorFlow functions: TensorFlow is not installed here "
                         "(onnx and sentence-transformers export without it)")
    if config.format == SAVED_MODEL:
        require_tensorflow_keras("model.export --format saved-model")
    keras_backend_here()   # TensorFlow's Keras where it is installed, else JAX's: both rebuild the Net
    sentence_transformer: Callable[..., Any] | None = None   # the SentenceTransformer class, with --check-data
    if config.check_data:   # PyTorch loads before TensorFlow (the other order can crash: model.encoding.encoders)
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise UsageError("--check-data needs sentence-transformers: pip install sentence-transformers") from None
        sentence_transformer = SentenceTransformer
    path = export_model_dir(config)
    kind = {SAVED_MODEL: "strings-in SavedModel", ONNX: f"ONNX folder ({config.quantize or 'float32'})"}
    print(f"{kind.get(config.format, 'sentence-transformers folder')} at {path}")
    if sentence_transformer is not None:
        check_against_sentence_transformers(config, sentence_transformer)
    return path


if __name__ == "__main__":
    sys.exit(run_cli(main))
