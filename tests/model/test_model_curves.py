"""model.curves: a run's curve from its history.json, or from its TensorBoard log when it has none."""
import json

import pytest
import tensorflow as tf

pytestmark = pytest.mark.slow   # TensorFlow loads (the fast tier stays under 3 minutes)


def _killed_run(model_dir, accuracies):
    """A model dir as a run killed after len(accuracies) epochs leaves it: Keras' TensorBoard
    validation scalars (`epoch_triplet_accuracy`, one per epoch), no history.json."""
    with tf.summary.create_file_writer(str(model_dir / "logs" / "validation")).as_default():
        for epoch, accuracy in enumerate(accuracies):
            tf.summary.scalar("epoch_triplet_accuracy", accuracy, step=epoch)
            tf.summary.scalar("epoch_loss", 1.0 - accuracy, step=epoch)


def test_a_killed_runs_tensorboard_log_and_a_finished_runs_history(tmp_path, capsys):
    from model.curves import main
    from pipeline.cli import UsageError

    finished, killed = tmp_path / "finished", tmp_path / "killed"
    finished.mkdir()
    curve = [{"epoch": 1, "triplets_seen": 512, "val_triplet_accuracy": 0.61},
             {"epoch": 2, "triplets_seen": 1024, "val_triplet_accuracy": 0.64}]
    (finished / "history.json").write_text(json.dumps({"learning_curve": curve}))
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
    with pytest.raises(UsageError, match="give @TRIPLETS_PER_EPOCH"):
        main(["--run", f"killed={killed}", "--output", str(tmp_path / "again.png")])
