"""model.curves: a run's curve from its history.json, or from its TensorBoard log when it has none."""
import json

import pytest
import tensorflow as tf

from model.training.model_dir import HISTORY, LEARNING_CURVE, LOGS, TRAINING_CURVE

pytestmark = pytest.mark.slow   # TensorFlow loads (the fast tier stays under 3 minutes)


def _killed_run(model_dir, accuracies):
    """A model dir as a run killed after len(accuracies) epochs leaves it: Keras' TensorBoard
    validation scalars (`epoch_triplet_accuracy`, one per epoch), no history.json."""
    with tf.summary.create_file_writer(str(model_dir / LOGS / "validation")).as_default():
        for epoch, accuracy in enumerate(accuracies):
            tf.summary.scalar("epoch_triplet_accuracy", accuracy, step=epoch)
            tf.summary.scalar("epoch_loss", 1.0 - accuracy, step=epoch)


def test_a_killed_runs_tensorboard_log_and_a_finished_runs_history(tmp_path, capsys):
    from core.cli import UsageError
    from model.curves import curves_figure, main

    finished, killed = tmp_path / "finished", tmp_path / "killed"
    finished.mkdir()
    curve = [{"epoch": 1, "triplets_seen": 512, "val_triplet_accuracy": 0.61},
             {"epoch": 2, "triplets_seen": 1024, "val_triplet_accuracy": 0.64}]
    (finished / HISTORY).write_text(json.dumps({
        "learning_curve": curve, "best_val_triplet_accuracy": 0.64, "untrained_val_triplet_accuracy": 0.5,
        "evaluation_triplets": "all", "record_counts": {}, "config": {}, "distance": "l1", "global_batch_size": 256,
        "replicas": 1}))   # what every trainer writes (model.training.model_dir.HISTORY_FIELDS)
    _killed_run(killed, [0.6, 0.625, 0.65])
    curves = main(["--run", f"finished={finished}", "--run", f"killed={killed}@512",
                   "--output", str(tmp_path / "curves.png")])
    assert curves["finished"] == curve
    assert [(p["triplets_seen"], round(p["val_triplet_accuracy"], 6)) for p in curves["killed"]] == [
        (512, 0.6), (1024, 0.625), (1536, 0.65)]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[-2:] == ["finished", "killed"]
    assert [line.split()[:3] for line in printed[1:]] == [["512", "0.6100", "0.6000"], ["1,024", "0.6400", "0.6250"],
                                                         ["1,536", "-", "0.6500"]]
    assert (tmp_path / "curves.png").stat().st_size > 0
    (axis,) = curves_figure(curves, "two runs").axes   # what curves.png draws: a curve per run
    assert [(line.get_label(), list(line.get_xdata())) for line in axis.lines] == [
        ("finished", [0.512, 1.024]), ("killed", [0.512, 1.024, 1.536])]
    assert [text.get_text() for text in axis.get_legend().get_texts()] == ["finished", "killed"]
    assert (axis.get_xlabel(), axis.get_title()) == ("training triplets seen (thousands)", "two runs")
    with pytest.raises(UsageError, match="give @TRIPLETS_PER_EPOCH"):
        main(["--run", f"killed={killed}", "--output", str(tmp_path / "again.png")])


SUMMARY = {"loss": [0.9, 0.7], "val_loss": [0.95, 0.8], "triplet_accuracy": [0.6, 0.7],
           "val_triplet_accuracy": [0.58, 0.66], "untrained_val_triplet_accuracy": 0.52,
           "mean_vectors_val_triplet_accuracy": 0.61, "distance": "cosine", "global_batch_size": 64,
           "evaluation_triplets": 512,
           "learning_curve": [{"triplets_seen": 640, "cpu_seconds": 60, "val_triplet_accuracy": 0.58},
                              {"triplets_seen": 1280, "cpu_seconds": 150, "val_triplet_accuracy": 0.66}],
           "config": {"dataset": "triplets-sen", "encoder": "bilstm", "lstm_units": 16, "teacher": None}}


def _legend(axis) -> list[str]:
    return [text.get_text() for text in axis.get_legend().get_texts()]


def test_the_training_curve_draws_loss_and_accuracy_per_epoch(tmp_path):
    from model.training.plots import plot_history

    figure = plot_history(SUMMARY, str(tmp_path / TRAINING_CURVE))
    assert (tmp_path / TRAINING_CURVE).stat().st_size > 0
    loss, accuracy = figure.axes
    assert [(line.get_label(), list(line.get_ydata())) for line in loss.lines] == [
        ("train", [0.9, 0.7]), ("validation", [0.95, 0.8])]
    assert [(line.get_label(), list(line.get_ydata())) for line in accuracy.lines] == [
        ("train", [0.6, 0.7]), ("validation", [0.58, 0.66]), ("untrained", [0.52, 0.52])]
    assert list(loss.lines[0].get_xdata()) == [1, 2]   # epochs count from 1
    assert (loss.get_ylabel(), accuracy.get_ylabel(), loss.get_xlabel()) == ("loss", "triplet accuracy", "epoch")
    assert loss.get_legend() is None and _legend(accuracy) == ["train", "validation", "untrained"]
    assert figure.get_suptitle() == "triplets-sen: triplet network training"


def test_the_learning_curve_draws_accuracy_against_triplets_and_cpu_time_with_its_baselines(tmp_path):
    from model.training.plots import plot_learning_curve

    figure = plot_learning_curve(SUMMARY, str(tmp_path / LEARNING_CURVE))
    assert (tmp_path / LEARNING_CURVE).stat().st_size > 0
    seen, cpu = figure.axes
    for axis, x in ((seen, [640, 1280]), (cpu, [1.0, 2.5])):   # CPU seconds drawn as minutes
        trained, mean_vectors, untrained = axis.lines
        assert (list(trained.get_xdata()), list(trained.get_ydata())) == (x, [0.58, 0.66])
        assert (list(mean_vectors.get_ydata()), list(untrained.get_ydata())) == ([0.61, 0.61], [0.52, 0.52])
    assert _legend(seen) == ["trained network", "mean-vectors", "untrained"]
    assert (seen.get_xlabel(), cpu.get_xlabel()) == ("training triplets seen", "process CPU minutes")
    assert seen.get_ylabel() == "validation triplet accuracy (cosine)"
    assert figure.get_suptitle() == ("triplets-sen: learning curve (BiLSTM 16, batch 64, 512 validation triplets)")

    # A distilled transformer: no word vectors (no mean-vectors line), the student before training.
    distilled = {**SUMMARY, "mean_vectors_val_triplet_accuracy": None,
                 "config": {**SUMMARY["config"], "encoder": "minilm", "teacher": "gs://b/teacher/"}}
    figure = plot_learning_curve(distilled, str(tmp_path / "distilled.png"))
    assert _legend(figure.axes[0]) == ["trained network", "the student before training"]
    assert "(minilm fine-tuned distilled from teacher, batch 64" in figure.get_suptitle()

    # A run on an accelerator (history.json names its device): timed by its training minutes there, not CPU.
    on_device = {**distilled, "device": "NVIDIA H200",
                 "learning_curve": [{**point, "wall_seconds": seconds} for point, seconds
                                    in zip(SUMMARY["learning_curve"], (30, 90))]}
    timed = plot_learning_curve(on_device, str(tmp_path / "device.png")).axes[1]
    assert timed.get_xlabel() == "training minutes on NVIDIA H200"
    assert list(timed.lines[0].get_xdata()) == [0.5, 1.5]

    # A soup (model.soup): each run's curve, and the soup's accuracy as a line.
    curves = on_device["learning_curve"]
    soup = {**on_device, "best_val_triplet_accuracy": 0.9, "delta_scale": 0.8,
            "soup": {"run_learning_curves": [curves, [{**point, "val_triplet_accuracy": 0.5} for point in curves]]}}
    souped = plot_learning_curve(soup, str(tmp_path / "soup.png")).axes[0]
    assert _legend(souped)[:3] == ["run 1", "run 2", "their soup (x 0.8 of its change)"]
    assert list(souped.lines[1].get_ydata()) == [0.5, 0.5] and list(souped.lines[2].get_ydata()) == [0.9, 0.9]
