"""Validation accuracy against training triplets seen, for several model dirs, in one PNG: the
equal-learning comparison of two recipes (docs/training.md).

    python -m model.curves --run LABEL=MODEL_DIR [--run LABEL=MODEL_DIR[@TRIPLETS_PER_EPOCH] ...] --output PNG

A model dir's curve is its history's learning curve; a run without one (killed before its
end) is read from its TensorBoard validation log (`logs/validation`, Keras' `epoch_triplet_accuracy`
per epoch), each epoch counting `@TRIPLETS_PER_EPOCH` triplets (steps x global batch). The points
are printed too, side by side by triplets seen.
"""
from __future__ import annotations

import glob
import os
import sys
import textwrap
from dataclasses import dataclass

from core.cli import UsageError, flag, parse_config, run_cli
from model.training.model_dir import HISTORY, LOGS, ModelDir
from model.training.plots import _pyplot, _save_png


@dataclass(frozen=True)
class CurvesConfig:
    run: tuple[str, ...] = flag((), repeatable=True, help="LABEL=MODEL_DIR, or LABEL=MODEL_DIR@TRIPLETS_PER_EPOCH "
                                                          f"for a run without {HISTORY}")
    output: str = flag("learning_curves.png", help="the PNG to write")
    title: str = flag("", help="the plot's title (what the curves compare, their validation samples)")

    def __post_init__(self):
        if not self.run:
            raise UsageError("--run: give at least one LABEL=MODEL_DIR")
        for entry in self.run:
            if "=" not in entry:
                raise UsageError(f"--run {entry!r}: expected LABEL=MODEL_DIR")


def tensorboard_curve(model_dir: str, triplets_per_epoch: int) -> list[dict]:
    """[{"triplets_seen", "val_triplet_accuracy"}] from the run's TensorBoard validation log."""
    import tensorflow as tf

    files = sorted(glob.glob(os.path.join(ModelDir(model_dir).file(LOGS), "validation", "events.out.tfevents.*")))
    if not files:
        raise UsageError(f"--run {model_dir}: no {HISTORY} and no {LOGS}/validation event file")
    by_epoch = {}
    for raw in tf.data.TFRecordDataset(files):
        event = tf.compat.v1.Event.FromString(raw.numpy())
        for value in event.summary.value:
            if value.tag == "epoch_triplet_accuracy":   # tf.summary's tensor, or tensorboardX's simple_value
                by_epoch[event.step] = float(tf.make_ndarray(value.tensor) if value.HasField("tensor")
                                             else value.simple_value)
    return [{"triplets_seen": (epoch + 1) * triplets_per_epoch, "val_triplet_accuracy": accuracy}
            for epoch, accuracy in sorted(by_epoch.items())]


def run_curve(entry: str) -> tuple[str, list[dict]]:
    label, target = entry.split("=", 1)
    model_dir, _, per_epoch = target.partition("@")
    history = ModelDir(model_dir).history()
    if history is not None:
        return label, history.learning_curve
    if not per_epoch:
        raise UsageError(f"--run {entry}: {model_dir} has no {HISTORY}: give @TRIPLETS_PER_EPOCH to read its "
                         "TensorBoard log")
    return label, tensorboard_curve(model_dir, int(per_epoch))


def curves_figure(curves: dict[str, list[dict]], title: str | None = None):
    """One validation accuracy curve per run against training triplets seen, on one axis."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.2))
    for label, points in curves.items():
        axis.plot([p["triplets_seen"] / 1000 for p in points], [p["val_triplet_accuracy"] for p in points], "o-",
                  label=label)
    axis.set_xlabel("training triplets seen (thousands)")
    axis.set_ylabel("validation triplet accuracy")
    axis.grid(alpha=0.3)
    axis.legend()
    if title:
        axis.set_title(textwrap.fill(title, 90), fontsize=9)
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> dict:
    config = parse_config(CurvesConfig, argv, "python -m model.curves", __doc__.split("\n\n")[0])
    curves = dict(run_curve(entry) for entry in config.run)
    _save_png(curves_figure(curves, config.title), config.output)
    seen = sorted({p["triplets_seen"] for points in curves.values() for p in points})
    print("triplets seen  " + "  ".join(f"{label:>24}" for label in curves))
    for triplets in seen:
        cells = [next((f"{p['val_triplet_accuracy']:.4f}" for p in points if p["triplets_seen"] == triplets), "-")
                 for points in curves.values()]
        print(f"{triplets:>13,}  " + "  ".join(f"{cell:>24}" for cell in cells))
    return curves


if __name__ == "__main__":
    sys.exit(run_cli(main))
