"""model.curves: a run's curve from its history.json, or from its TensorBoard log when it has none."""
import json
import shutil

import pytest

pytestmark = pytest.mark.slow   # the tiny model is trained


def test_a_killed_runs_tensorboard_log_gives_the_curve_its_history_records(tiny_model, tmp_path, capsys):
    from model.curves import main

    killed = tmp_path / "killed"
    shutil.copytree(tiny_model, killed)
    (killed / "history.json").unlink()
    with open(f"{tiny_model}/history.json") as handle:
        history = json.load(handle)
    per_epoch = history["config"]["steps"] * history["global_batch_size"]
    curves = main(["--run", f"finished={tiny_model}", "--run", f"killed={killed}@{per_epoch}",
                   "--output", str(tmp_path / "curves.png")])
    assert curves["finished"] == history["learning_curve"]
    assert [p["triplets_seen"] for p in curves["killed"]] == [p["triplets_seen"] for p in curves["finished"]]
    assert [round(p["val_triplet_accuracy"], 6) for p in curves["killed"]] == [
        round(p["val_triplet_accuracy"], 6) for p in curves["finished"]]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[-2:] == ["finished", "killed"] and len(printed) == 1 + len(curves["finished"])
    assert (tmp_path / "curves.png").stat().st_size > 0
    from pipeline.cli import UsageError

    with pytest.raises(UsageError, match="give @TRIPLETS_PER_EPOCH"):
        main(["--run", f"killed={killed}", "--output", str(tmp_path / "again.png")])
