"""Several `model.jax_train` runs on one bundle, averaged into one Net (a uniform model soup).

    python -m model.jax_soup --bundle BUNDLE --trained RUN --trained RUN ... --output SOUP

Runs fine-tuned from the same checkpoint, differing only in their batch order (`--seed`) or
learning rate, stay in one basin of the loss; the mean of their weights is one Net at one Net's
cost that is often more accurate than the best of them (Wortsman et al., 2022, "Model soups").
SOUP gets the mean of the runs' deltas (`delta-*.npz`) and a history.json, as a run's folder, so
`model.jax_unpack` takes it. No library averages Keras weight deltas, hence these lines.

It prints each run's and the soup's accuracy on the bundle's validation triplets, and the soup's at
each of `--scales`: the soup's delta times s, the interpolation toward the checkpoint of WiSE-FT
(Wortsman et al., 2022), which gives back some of the checkpoint's general relatedness (SICK) for
some of the fine-tuned accuracy. `model.jax_unpack --scale s` writes the Net at one of them.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import numpy as np

from model.jax_bundle import read_deltas
from pipeline.cli import UsageError, flag, parse_config, run_cli


@dataclass(frozen=True, kw_only=True)
class SoupConfig:
    bundle: str = flag(help="python -m model.jax_bundle's folder, the one every run trained on")
    trained: tuple[str, ...] = flag((), repeatable=True, help="a model.jax_train output folder (two at least)")
    output: str = flag(help="where to write the soup's delta-*.npz and history.json")
    scales: tuple[float, ...] = flag((1.0,), help="the soup's delta is scored on validation at each of these "
                                                  "multiples (1 = the soup; 0 = the checkpoint)")


def mean_deltas(runs: list[dict[int, np.ndarray]]) -> list[np.ndarray]:
    """The float32 mean of each weight's delta over the runs (`model.jax_bundle.read_deltas`' form)."""
    if any(sorted(run) != sorted(runs[0]) for run in runs):
        raise UsageError("the runs are not of one Net: their deltas are of different weights")
    return [np.stack([run[index] for run in runs]).astype(np.float32).mean(axis=0) for index in sorted(runs[0])]


def soup(config: SoupConfig) -> dict:
    import jax

    from model.jax_train import build, padded_sentences, triplet_ids, triplet_scorer, write_deltas

    if len(config.trained) < 2:
        raise UsageError("--trained: a soup needs two runs at least")
    histories = []
    for run in config.trained:
        path = os.path.join(run, "history.json")
        if not os.path.exists(path):
            raise UsageError(f"{path}: not found (--trained)")
        with open(path, encoding="utf-8") as handle:
            histories.append(json.load(handle))
    if any(history["config"]["bundle"] != histories[0]["config"]["bundle"] or history["weights"] !=
           histories[0]["weights"] for history in histories):
        raise UsageError("--trained: the runs were not trained on one bundle, with one Net")
    runs = [read_deltas(run) for run in config.trained]
    deltas = mean_deltas(runs)

    encoder = build(config.bundle, histories[0]["config"]["transformer_layers"])
    start = [np.asarray(weight) for weight in encoder.get_weights()]
    validation = np.load(os.path.join(config.bundle, "validation.npz"))
    score = triplet_scorer(encoder, triplet_ids(padded_sentences(validation), validation["triplets"]))

    def accuracy(weight_deltas: list[np.ndarray], scale: float) -> float:
        encoder.set_weights([weight + scale * delta for weight, delta in zip(start, weight_deltas)])
        return score([v.value for v in encoder.trainable_variables],
                     [v.value for v in encoder.non_trainable_variables])

    run_accuracy = [accuracy(mean_deltas([run]), 1.0) for run in runs]
    by_scale = {str(scale): accuracy(deltas, scale) for scale in sorted({1.0, *config.scales}, reverse=True)}
    for run, value in zip(config.trained, run_accuracy):
        print(f"run {run}: validation triplet accuracy {value:.4f}")
    for scale, value in by_scale.items():
        print(f"soup x {scale}: validation triplet accuracy {value:.4f}")
    write_deltas(config.output, deltas)
    summary = {**histories[0],
               # the curve drawn is the first run's; the soup's own point is best_val_triplet_accuracy
               "best_val_triplet_accuracy": by_scale["1.0"],
               "triplets_seen": sum(history["triplets_seen"] for history in histories),
               "device": jax.devices()[0].device_kind,
               "soup": {"runs": list(config.trained), "run_val_triplet_accuracy": run_accuracy,
                        "run_seeds": [history["config"]["seed"] for history in histories],
                        "run_learning_rates": [history["config"]["learning_rate"] for history in histories],
                        "run_learning_curves": [history["learning_curve"] for history in histories],
                        "val_triplet_accuracy_by_scale": by_scale}}
    with open(os.path.join(config.output, "history.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
    return summary


def main(argv: list[str] | None = None) -> dict:
    os.environ.setdefault("KERAS_BACKEND", "jax")   # as model.jax_train: at main, not at import
    return soup(parse_config(SoupConfig, argv, "python -m model.jax_soup", __doc__.split("\n\n")[0]))


if __name__ == "__main__":
    sys.exit(run_cli(main))
