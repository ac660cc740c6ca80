"""The model dir's one owner (`model.training.model_dir`): history.json is written by one writer
that checks every key against its type, and every file a run writes is named there."""
import json
from dataclasses import fields

import pytest

from model.training.model_dir import (
    HISTORY,
    HISTORY_FIELDS,
    HISTORY_OPTIONAL,
    RUN_ENTRIES,
    History,
    ModelDir,
    history_errors,
)

FINISHED = {"learning_curve": [], "best_val_triplet_accuracy": 0.64, "untrained_val_triplet_accuracy": 0.5,
            "evaluation_triplets": "all", "record_counts": {}, "config": {}, "distance": "l1",
            "global_batch_size": 256, "replicas": 1, "loss": [0.7], "val_triplet_accuracy": [0.64],
            "seconds_to_first_step": None, "stopped_by_budget": False, "epochs_run": 1}


def test_the_writer_checks_every_key_and_its_type(tmp_path):
    model_dir = ModelDir(str(tmp_path))
    model_dir.write_history(FINISHED)
    history = model_dir.history()
    assert history is not None and json.loads((tmp_path / HISTORY).read_text()) == FINISHED == history.record
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


def test_the_typed_history_has_one_attribute_per_key_the_writer_defines():
    """Its readers read History's attributes: each key the writer checks is one, a key a run left
    out reads None, Keras' per-epoch lists are `epochs`."""
    assert {item.name for item in fields(History)} == {*HISTORY_FIELDS, *HISTORY_OPTIONAL, "epochs", "record"}
    history = History.of(FINISHED)
    assert (history.distance, history.epochs_run, history.test_triplet_accuracy) == ("l1", 1, None)
    assert history.epochs == {"loss": [0.7], "val_triplet_accuracy": [0.64]}
    assert history.expected_records("test") is None
    assert History.of({**FINISHED, "record_counts": {"test": {"expected": 9}}}).expected_records("test") == 9
