"""`model.soup`: runs of one recipe averaged into a model dir every reader takes."""
import json
import os

import numpy as np
import pytest

from model.soup import one_recipe, souped
from pipeline.cli import UsageError


def test_the_soup_is_the_mean_of_the_runs_a_scale_of_the_way_from_the_untrained_net():
    untrained = [np.zeros((2, 2), np.float32), np.ones(3, np.float32)]
    runs = [[np.full((2, 2), 2.0), np.full(3, 3.0)], [np.full((2, 2), 4.0), np.full(3, 5.0)]]
    np.testing.assert_array_equal(souped(untrained, runs)[0], np.full((2, 2), 3.0))
    np.testing.assert_array_equal(souped(untrained, runs, 0.5)[1], np.full(3, 1 + 0.5 * (4 - 1)))
    np.testing.assert_array_equal(souped(untrained, runs, 0.0)[1], untrained[1])
    with pytest.raises(UsageError, match="not of one Net"):
        souped(untrained, [runs[0], [np.zeros((2, 3)), np.zeros(3)]])


def test_runs_of_another_recipe_are_refused_naming_the_flag():
    first = {"encoder": "minilm", "data": "RUN", "seed": 1, "learning_rate": 5e-5, "transformer_layers": None}
    assert one_recipe([first, {**first, "seed": 2, "learning_rate": 4e-5}], ("a", "b")) == first
    with pytest.raises(UsageError, match=r"--model-dir b is not of a's recipe \(--transformer-layers 2 vs None\)"):
        one_recipe([first, {**first, "transformer_layers": 2}], ("a", "b"))


def test_a_soup_of_a_run_with_itself_is_that_run_as_a_model_dir(fine_tuned, tmp_path):
    import h5py

    from model.encoding.encoder import load_encoder
    from model.soup import main

    model_dir, _ = fine_tuned
    summary = main(["--model-dir", str(model_dir), "--model-dir", str(model_dir), "--output", str(tmp_path / "soup")])
    soup = tmp_path / "soup"
    assert {"inputs.json", "history.json", "checkpoints", "encoder", "sentence-transformers", "claim.json"} <= set(
        os.listdir(soup))
    history = json.loads((soup / "history.json").read_text())
    assert history["soup"]["runs"] == [str(model_dir)] * 2 and history["delta_scale"] == 1.0
    assert history["best_val_triplet_accuracy"] == summary["soup"]["run_val_triplet_accuracy"][0]

    def weights(path):
        with h5py.File(path) as handle:
            found = []
            handle["layers"].visititems(lambda name, item: found.append(item[()]) if isinstance(item, h5py.Dataset)
                                        else None)
            return found

    for ours, theirs in zip(weights(soup / "checkpoints" / "best.weights.h5"),
                            weights(model_dir / "checkpoints" / "best.weights.h5")):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    sentences = ["The striker scored twice.", "Bake the bread in a hot oven."]
    ours, theirs = (load_encoder(str(path)).encode(sentences) for path in (soup, model_dir))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
