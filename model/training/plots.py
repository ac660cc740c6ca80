"""The training curves `model.train` draws into its model dir from its summary (its HISTORY):
TRAINING_CURVE (loss and accuracy per epoch) and LEARNING_CURVE (validation accuracy
against triplets seen and CPU time). matplotlib loads when a curve is drawn, not at import."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from core.files import write_bytes
from model.config import NetworkKind


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display on a training machine)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_png(figure, path: str) -> None:
    """The figure as a PNG at `path` (local or gs://), written whole (`core.files.write_bytes`)."""
    import io

    import matplotlib.pyplot as plt

    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=100)
    plt.close(figure)
    write_bytes(path, png.getvalue())


def plot_history(history: dict, path: str) -> Figure:
    """Loss and triplet accuracy per epoch (training and validation) as a PNG; returns the figure
    (closed), so a test can read what it draws."""
    plt = _pyplot()
    epochs = range(1, len(history["loss"]) + 1)
    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for axis, metric in ((loss_axis, "loss"), (accuracy_axis, "triplet_accuracy")):
        axis.plot(epochs, history[metric], "o-", label="train")
        axis.plot(epochs, history[f"val_{metric}"], "o-", label="validation")
        axis.set_xlabel("epoch")
        axis.set_ylabel(metric.replace("_", " "))
        axis.grid(alpha=0.3)
    accuracy_axis.axhline(history["untrained_val_triplet_accuracy"], color="grey", ls="--", label="untrained")
    accuracy_axis.legend()
    figure.suptitle(f"{history['config']['dataset']}: triplet network training")
    figure.tight_layout()
    _save_png(figure, path)
    return figure


def plot_learning_curve(summary: dict, path: str) -> Figure:
    """Validation triplet accuracy against training triplets seen and against CPU minutes,
    with the untrained network and mean word vectors on the same sample as reference lines, as a
    PNG; returns the figure (closed)."""
    from matplotlib.ticker import FuncFormatter

    plt = _pyplot()
    # a soup (`model.soup`) draws each of its runs, and its own accuracy as a line
    soup = summary.get("soup")
    runs = ({f"run {number}": curve for number, curve in enumerate(soup["run_learning_curves"], 1)} if soup
            else {"trained network": summary["learning_curve"]})
    config = summary["config"]
    kind = NetworkKind(config["encoder"])
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    # a run on an accelerator (its history names its `device`) is timed by its training minutes there
    timed_by = (("wall_seconds", f"training minutes on {summary['device']}") if summary.get("device")
                else ("cpu_seconds", "process CPU minutes"))
    for axis, key, label in ((axes[0], "triplets_seen", "training triplets seen"), (axes[1], *timed_by)):
        scale = 1 if key == "triplets_seen" else 60
        for run, points in runs.items():
            axis.plot([point[key] / scale for point in points], [point["val_triplet_accuracy"] for point in points],
                      "o-", label=run)
        if soup and summary["best_val_triplet_accuracy"] is not None:
            axis.axhline(summary["best_val_triplet_accuracy"], color="black", label="their soup" + (
                f" (x {summary['delta_scale']} of its change)" if summary.get("delta_scale") else ""))
        if summary["mean_vectors_val_triplet_accuracy"] is not None:
            axis.axhline(summary["mean_vectors_val_triplet_accuracy"], color="tab:red", ls="--", label="mean-vectors")
        axis.axhline(summary["untrained_val_triplet_accuracy"], color="grey", ls=":",
                     label=("the student before training" if config.get("teacher")
                            else f"{kind} off the shelf" if kind.pretrained else "untrained"))
        axis.set_xlabel(label)
        axis.grid(alpha=0.3)
    axes[0].xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value / 1000:,.0f}k"))
    axes[0].set_ylabel(f"validation triplet accuracy ({summary['distance']})")
    axes[0].legend()
    network = kind.label(config["lstm_units"]) + (" fine-tuned" if kind.pretrained else "")
    if config.get("teacher"):
        network += f" distilled from {os.path.basename(config['teacher'].rstrip('/'))}"
    figure.suptitle(f"{config['dataset']}: learning curve ({network}, batch "
                    f"{summary['global_batch_size']}, {summary['evaluation_triplets']} validation triplets)")
    figure.tight_layout()
    _save_png(figure, path)
    return figure
