"""A `model.jax_train` run's trained weights back into a model dir, as `model.train` leaves one.

    python -m model.jax_unpack --bundle BUNDLE --trained DIR --model-dir MODEL

It adds the run's float16 deltas to the bundle's weights (`model.jax_bundle`), loads them into the
TensorFlow Net (or the layer-reduced student the run distilled) and writes MODEL/encoder (the
strings-in SavedModel every eval job reads), MODEL/sentence-transformers, history.json and the
learning curve.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from model.jax_bundle import ENCODER, WEIGHTS, trained_weights
from pipeline.cli import UsageError, flag, parse_config, refuse_file_as_folder, run_cli


@dataclass(frozen=True, kw_only=True)
class UnpackConfig:
    bundle: str = flag(help="the folder `pack` wrote")
    trained: str = flag(help="the folder model.jax_train wrote (delta-*.npz, history.json)")
    model_dir: str = flag(help="the model dir to write (encoder/, sentence-transformers/, history.json)")
    overwrite: bool = flag(False, help="replace the encoder of a model dir that has one (else refused)")
    scale: float = flag(1.0, help="add this multiple of the run's deltas: 1 = the run; below 1 interpolates "
                                  "toward the bundle's checkpoint (WiSE-FT, model.jax_soup)")


def unpack(config: UnpackConfig) -> str:
    for path in (os.path.join(config.bundle, WEIGHTS), os.path.join(config.trained, "history.json")):
        if not os.path.exists(path):
            raise UsageError(f"{path}: not found (--bundle / --trained)")
    if not 0.0 <= config.scale <= 1.0:
        raise UsageError(f"--scale must be within [0, 1], got {config.scale}")
    refuse_file_as_folder("--model-dir", config.model_dir)
    if os.path.exists(os.path.join(config.model_dir, "encoder")) and not config.overwrite:
        raise UsageError(f"--model-dir {config.model_dir} already has an encoder: --overwrite true replaces it")
    with open(os.path.join(config.trained, "history.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    # TensorFlow's import (seconds) after the flags' checks
    from model.hf import EXPORT_FOLDER, model_card, write_sentence_transformers
    from model.plots import plot_learning_curve
    from model.saved_model import ExportableEncoder
    from model.similarity import Similarity
    from model.transformer import build_transformer_encoder, checkpoint_dir, token_ids

    encoder = build_transformer_encoder(ENCODER, layers=summary["config"].get("transformer_layers"))
    encoder.set_weights(trained_weights(config.bundle, config.trained, [weight.path for weight in encoder.weights],
                                        config.scale))
    if config.scale != 1.0:
        # the validation accuracy at this scale, where model.jax_soup measured it
        summary["delta_scale"] = config.scale
        summary["best_val_triplet_accuracy"] = (summary.get("soup", {}).get("val_triplet_accuracy_by_scale", {})
                                                .get(str(config.scale)))
    os.makedirs(config.model_dir, exist_ok=True)
    word_ids = token_ids(name=ENCODER)
    ExportableEncoder(word_ids, encoder, similarity=Similarity.COSINE).export(f"{config.model_dir}/encoder")
    name = os.path.basename(config.model_dir.rstrip("/"))
    card = model_card(summary, name, Similarity.COSINE, word_ids.max_tokens, [], int(encoder.output_shape[-1]))
    write_sentence_transformers(encoder, checkpoint_dir(ENCODER), f"{config.model_dir}/{EXPORT_FOLDER}",
                                max_tokens=word_ids.max_tokens, similarity=Similarity.COSINE, card=card)
    with open(f"{config.model_dir}/history.json", "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
    plot_learning_curve(summary, f"{config.model_dir}/learning_curve.png")
    validation = summary["best_val_triplet_accuracy"]
    print(f"encoder at {config.model_dir}/encoder; validation triplet accuracy "
          f"{'not measured' if validation is None else f'{validation:.4f}'} "
          f"(untrained {summary['untrained_val_triplet_accuracy']:.4f})")
    return config.model_dir


def main(argv: list[str] | None = None) -> str:
    return unpack(parse_config(UnpackConfig, argv, "python -m model.jax_unpack", __doc__.split("\n\n")[0]))


if __name__ == "__main__":
    sys.exit(run_cli(main))
