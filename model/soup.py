"""Several `model.train` runs of one recipe averaged into one Net (a uniform model soup).

    python -m model.soup --model-dir RUN --model-dir RUN ... --output SOUP [--scale 0.8]
        [--overwrite true]

Runs fine-tuned from the same checkpoint, differing only in their batch order (`--seed`) or
learning rate, stay in one basin of the loss; the mean of their weights is one Net at one Net's
cost that is often more accurate than the best of them (Wortsman et al., 2022, "Model soups").
`--scale s` moves the soup toward the untrained Net (the pre-trained checkpoint): its change times
s, the interpolation of WiSE-FT (Wortsman et al., 2022), which gives back some of the
checkpoint's general relatedness (SICK) for some of the fine-tuned accuracy.

The runs' best checkpoints are read whatever backend trained them (Keras weights files are the same
under TensorFlow and JAX), and the soup is made under TensorFlow's Keras where TensorFlow is
installed, else under JAX's (its ENCODER then written by a TensorFlow process elsewhere, as after a
JAX run: `model.formats.trained.export_in_tensorflow`). The soup is scored on the runs' validation
triplets, beside each run, and SOUP is written as a model dir every reader takes (`eval.all`,
`model.export`): its INPUTS (the first run's recipe and the runs), BEST_WEIGHTS, HISTORY, ENCODER
and, for a transformer, SENTENCE_TRANSFORMERS (`model.training.model_dir`'s names). It is claimed as
every writing command claims its folder (COMMAND_CLAIM). An `--output` that is, lies inside or holds
a `--model-dir` is refused before the claim (its `--overwrite` would delete the weights the soup
reads), and so is one run given twice under two spellings (`A`, `A/`, a link to `A`): it would count
twice in the mean. No library averages Keras weights, hence these lines.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import numpy as np

from core.cli import UsageError, flag, parse_config, run_cli
from core.files import is_remote, write_complete
from core.folders import claim_folder, reading
from model import keras_backend_here
from model.encoding.trained_net import network_of, recorded_config
from model.formats.trained import export_run
from model.net.wordpieces import wordpieces
from model.training.model_dir import (
    BEST_WEIGHTS,
    CHECKPOINTS,
    ENCODER,
    HISTORY,
    INPUTS,
    SENTENCE_TRANSFORMERS,
    SERVING,
    VERTEX_MODEL,
    ModelDir,
)
from model.training.shards import open_run

PROG = "python -m model.soup"
# What the soup writes into --output: `--overwrite` deletes these and nothing else.
WRITES = (INPUTS, HISTORY, CHECKPOINTS, ENCODER, SERVING, VERTEX_MODEL, SENTENCE_TRANSFORMERS)
# Flags the runs of one soup may differ in: their batch order and step size, not their Net or data.
MAY_DIFFER = ("seed", "learning_rate", "model_dir", "backend", "distribution_strategy", "static_shapes",
              "jit_compile", "budget_minutes", "epochs", "steps", "patience", "progress", "checkpoint_every",
              "overwrite", "max_lost_fraction", "serving_version", "precision")


@dataclass(frozen=True, kw_only=True)
class SoupConfig:
    model_dirs: tuple[str, ...] = flag((), name="model-dir", repeatable=True,
                                       help="a model.train model dir (two at least, of one recipe)")
    output: str = flag(help="the soup's model dir")
    scale: float = flag(1.0, help="the soup's change from the untrained Net times this (1: the soup; 0: the "
                                  "checkpoint)")
    overwrite: bool = flag(False, help="replace an earlier model.soup at --output (only its files)")

    def __post_init__(self):
        if len(self.model_dirs) < 2:
            raise UsageError("--model-dir: a soup needs two runs at least")
        if not 0.0 <= self.scale <= 1.0:
            raise UsageError(f"--scale must be in [0, 1], got {self.scale}")
        runs: dict[str, str] = {}   # resolved folder -> the --model-dir that named it first
        for path in self.model_dirs:
            folder = resolved(path)
            if folder in runs:
                raise UsageError(f"--model-dir {path} is the folder of --model-dir {runs[folder]}: a soup averages "
                                 "distinct runs, each once")
            runs[folder] = path
        output = resolved(self.output)
        for folder, path in runs.items():
            if output == folder or output.startswith(folder + "/") or folder.startswith(output + "/"):
                raise UsageError(f"--output {self.output} is, lies inside or holds --model-dir {path}: the soup "
                                 "would replace the run it reads; choose another folder")


def resolved(path: str) -> str:
    """The folder `path` names, however spelt: a local path with its links and `..` resolved; a
    remote one (`gs://...`) without trailing slashes."""
    return path.rstrip("/") if is_remote(path) else os.path.realpath(path)


def parse_args(argv: list[str] | None = None) -> SoupConfig:
    return parse_config(SoupConfig, argv, PROG, __doc__.split("\n\n")[0])


def souped(untrained: list[np.ndarray], runs: list[list[np.ndarray]], scale: float = 1.0) -> list[np.ndarray]:
    """The float32 mean of each weight over the runs (lists of one Net's weights, in its order),
    `scale` of the way from the untrained Net's weights (WiSE-FT)."""
    if any(len(run) != len(untrained) or any(a.shape != b.shape for a, b in zip(run, untrained)) for run in runs):
        raise UsageError("--model-dir: the runs are not of one Net (their weights differ in number or shape)")
    means = [np.stack([run[index] for run in runs]).astype(np.float32).mean(axis=0) for index in range(len(untrained))]
    return [base + scale * (mean - base) for base, mean in zip(untrained, means)]


def one_recipe(recipes: list[dict], model_dirs: tuple[str, ...]) -> dict:
    """The first run's recorded flags, once every run is checked to share them (but `MAY_DIFFER`)."""
    first = recipes[0]
    for recipe, path in zip(recipes[1:], model_dirs[1:]):
        differing = sorted(name for name in set(first) | set(recipe)
                           if name not in MAY_DIFFER and first.get(name) != recipe.get(name))
        if differing:
            name = differing[0]
            raise UsageError(f"--model-dir {path} is not of {model_dirs[0]}'s recipe (--{name.replace('_', '-')} "
                             f"{recipe.get(name)} vs {first.get(name)}): a soup averages runs of one Net on one data")
    return first


def soup(config: SoupConfig) -> dict:
    """Averages the runs, scores the soup and each run on validation, writes the soup's model dir."""
    recorded = [recorded_config(path) for path in config.model_dirs]
    recipe = one_recipe([flags for flags, _ in recorded], config.model_dirs)
    bests = [ModelDir(path).best_weights for path in config.model_dirs]
    for path, best in zip(config.model_dirs, bests):
        if not os.path.exists(best):
            raise UsageError(f"--model-dir {path}: no {BEST_WEIGHTS}")
    import keras

    train_config = recorded[0][1].with_flags(backend=keras.backend.backend(), distribution_strategy="auto",
                                             model_dir=config.output, precision="float32")   # as exported
    claim_folder(config.output, "model.soup", WRITES, "--output", config.overwrite)
    return _soup(config, train_config, recipe, bests)


def _soup(config: SoupConfig, train_config, recipe: dict, bests: list[str]) -> dict:
    from model.training.arrays import TripletInput  # Keras: loaded once its backend is chosen

    if train_config.network.kind.reads_word_vectors:
        raise UsageError("--model-dir: a soup of BiLSTM runs is not made (each has its own vocabulary); soups are "
                         "of a pre-trained transformer's fine-tuned runs")
    run = open_run(train_config.inputs.data)
    word_ids, encoder, model = network_of(train_config)
    untrained = [np.asarray(weight) for weight in model.get_weights()]
    model.optimizer.build(model.trainable_variables)   # the checkpoints hold its state too
    runs = []
    with reading(run):
        network = train_config.network
        source = TripletInput(train_config, run, wordpieces(train_config.inputs.max_tokens, network.encoder,
                                                            network.checkpoint))
        validation = source.evaluation("validation")
        if train_config.runtime.backend == "tensorflow":   # tf.distribute's input
            from model.training.tf_input import evaluation  # TensorFlow, which a JAX soup may lack

            validation = evaluation(validation, source)
        run_accuracy = []
        for best in bests:
            model.load_weights(best)
            runs.append([np.asarray(weight) for weight in model.get_weights()])
            run_accuracy.append(float(model.evaluate(validation, verbose=0, return_dict=True)["triplet_accuracy"]))
        model.set_weights(souped(untrained, runs, config.scale))
        accuracy = float(model.evaluate(validation, verbose=0, return_dict=True)["triplet_accuracy"])
    for path, value in zip(config.model_dirs, run_accuracy):
        print(f"run {path}: validation triplet accuracy {value:.4f}")
    print(f"soup of {len(runs)} runs x {config.scale}: validation triplet accuracy {accuracy:.4f}")
    output = config.output.rstrip("/")
    os.makedirs(ModelDir(output).file(CHECKPOINTS), exist_ok=True)
    model.save_weights(ModelDir(output).best_weights)
    histories = [ModelDir(path).history() for path in config.model_dirs]
    first = histories[0]
    summary = {**(first.record if first else {}), "best_val_triplet_accuracy": accuracy, "delta_scale": config.scale,
               "soup": {"runs": list(config.model_dirs), "run_val_triplet_accuracy": run_accuracy,
                        "run_learning_curves": [history.learning_curve if history else [] for history in histories]},
               "config": {**(first.config if first else recipe), "model_dir": config.output}}
    write_complete(ModelDir(output).file(INPUTS), json.dumps({"flags": {**recipe, "model_dir": config.output},
                                                        "soup_of": list(config.model_dirs)}, indent=2).encode())
    export_run(train_config, output, word_ids, encoder, ModelDir(output).best_weights, summary)
    ModelDir(output).write_history(summary)
    return summary


def main(argv: list[str] | None = None) -> dict:
    config = parse_args(argv)
    keras_backend_here()   # TensorFlow's Keras where it is installed, else JAX's (an accelerator image)
    return soup(config)


if __name__ == "__main__":
    sys.exit(run_cli(main))
