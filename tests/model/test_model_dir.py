"""The model dir's one owner (`model.training.model_dir`): history.json is written by one writer
that checks every key against its type, and every file a run writes is named there."""
import json

import pytest

from model.training.model_dir import HISTORY, HISTORY_FIELDS, RUN_ENTRIES, ModelDir, history_errors

FINISHED = {"learning_curve": [], "best_val_triplet_accuracy": 0.64, "untrained_val_triplet_accuracy": 0.5,
            "evaluation_triplets": "all", "record_counts": {}, "config": {}, "distance": "l1",
            "global_batch_size": 256, "replicas": 1, "loss": [0.7], "val_triplet_accuracy": [0.64],
            "seconds_to_first_step": None, "stopped_by_budget": False, "epochs_run": 1}


def test_the_writer_checks_every_key_and_its_type(tmp_path):
    model_dir = ModelDir(str(tmp_path))
    model_dir.write_history(FINISHED)
    assert json.loads((tmp_path / HISTORY).read_text()) == FINISHED == model_dir.history()
    for summary, named in [({**FINISHED, "replicas": True}, "replicas is bool"),
                           ({**FINISHED, "epochs_run": "1"}, "epochs_run is str"),
                           ({**FINISHED, "accuracy_at_dawn": 1.0}, "holds accuracy_at_dawn"),
                           ({key: value for key, value in FINISHED.items() if key != "distance"}, "lacks distance")]:
        assert named in "; ".join(history_errors(summary))
        with pytest.raises(ValueError, match=named):
            model_dir.write_history(summary)


def test_every_required_field_is_one_a_run_writes_and_the_run_entries_are_distinct():
    assert set(HISTORY_FIELDS) <= set(FINISHED)
    assert len(set(RUN_ENTRIES)) == len(RUN_ENTRIES) and HISTORY in RUN_ENTRIES
