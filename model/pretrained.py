"""Exports a pre-trained transformer checkpoint, untrained, as the trainer's strings-in encoder.

    python -m model.pretrained --model-dir DIR [--encoder minilm|mpnet] [--checkpoint FOLDER] [--max-tokens 64]

Claims DIR as its own (`core.folders.COMMAND_CLAIM`: a trained model dir, or any
folder holding other files, is refused) and writes its ENCODER (SavedModel: 1-D tf.string ->
{"embeddings": [n, d]}), the very export `model.train --encoder minilm` writes after
fine-tuning, with zero training steps: the off-the-shelf baseline is scored through the same
graph (tokenizer, backbone, mean pooling) as the fine-tuned model, with no PyTorch.
`model.encoding.encoders`' `minilm` spec (sentence-transformers) remains the independent reference.
"""
from __future__ import annotations

import dataclasses
import sys

from core.cli import flag, parse_config, run_cli
from core.folders import claim_folder
from core.storage import staged
from model import require_tensorflow_keras
from model.checkpoints import CHECKPOINTS as PRETRAINED
from model.config import NetworkKind
from model.training.model_dir import ENCODER, ModelDir

# The `--encoder` values that are checkpoints.
CHECKPOINTS = tuple(kind.value for kind in NetworkKind if kind.pretrained)


@dataclasses.dataclass(frozen=True)
class PretrainedConfig:
    model_dir: str = flag(help=f"where {ENCODER}/ goes (local or gs://)")
    encoder: str = flag("minilm", help="the checkpoint: minilm (all-MiniLM-L6-v2) or mpnet (all-mpnet-base-v2)")
    checkpoint: str | None = flag(None, help="the checkpoint's sentence-transformers folder; none = the installed "
                                             "one (make setup; make mpnet-checkpoint)")
    max_tokens: int = flag(64, help="wordpieces kept per sentence, [CLS] and [SEP] included (as the trainer's)")
    overwrite: bool = flag(False, help="replace the export an earlier model.pretrained wrote there; a folder "
                                       "holding anything else (a trained model) is refused either way")

    def __post_init__(self):
        if self.encoder not in CHECKPOINTS:
            raise ValueError(f"--encoder must be a checkpoint, one of {CHECKPOINTS}, got {self.encoder!r}")
        if self.max_tokens < 3:
            raise ValueError(f"--max-tokens must be >= 3, got {self.max_tokens}")


def main(argv: list[str] | None = None) -> str:
    require_tensorflow_keras("model.pretrained")
    config = parse_config(PretrainedConfig, argv, "python -m model.pretrained", __doc__.split("\n\n")[0])
    from model.formats.saved_model import export_checkpoint  # TensorFlow and Keras: after the flags

    PRETRAINED[config.encoder].folder(config.checkpoint)   # an absent checkpoint is refused before the claim
    claim_folder(config.model_dir, "model.pretrained", (ENCODER,), "--model-dir", config.overwrite)
    with staged(config.model_dir) as (model_dir, _):
        export_checkpoint(config.encoder, config.checkpoint, config.max_tokens, ModelDir(model_dir).encoder)
    print(f"{config.encoder} off the shelf: encoder at {ModelDir(config.model_dir).encoder}")
    return config.model_dir


if __name__ == "__main__":
    sys.exit(run_cli(main))
