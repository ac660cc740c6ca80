"""`model.soup`: runs of one recipe averaged into a model dir every reader takes."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from core.cli import UsageError
from core.folders import COMMAND_CLAIM
from model.soup import one_recipe, parse_args, souped
from model.training.model_dir import BEST_WEIGHTS, CHECKPOINTS, ENCODER, HISTORY, INPUTS, SENTENCE_TRANSFORMERS


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


def test_an_output_in_or_around_a_run_and_a_run_given_twice_are_refused_before_anything_is_written(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    (tmp_path / "link-to-a").symlink_to(first)
    runs = ["--model-dir", str(first), "--model-dir", str(second)]
    for output in (first, first / "soup", tmp_path, tmp_path / "link-to-a", f"{tmp_path}/b/../a/"):
        with pytest.raises(UsageError, match=rf"^--output {output} is, lies inside or holds --model-dir {first}: "):
            parse_args([*runs, "--output", str(output)])
    for twice in (f"{first}/", str(tmp_path / "link-to-a"), f"{second}/../a"):
        with pytest.raises(UsageError, match=rf"^--model-dir {twice} is the folder of --model-dir {first}: "):
            parse_args([*runs, "--model-dir", twice, "--output", str(tmp_path / "soup")])
    assert parse_args([*runs, "--output", str(tmp_path / "soup")]).model_dirs == (str(first), str(second))
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "link-to-a"]


def _files(folder) -> dict[str, tuple[int, int, bytes]]:
    """Every file under `folder`: relative path -> (size, mtime_ns, bytes)."""
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns, path.read_bytes())
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_soup_of_a_run_with_its_copy_is_that_run_as_a_model_dir(fine_tuned, tmp_path):
    import h5py

    from model.encoding.encoder import load_encoder
    from model.soup import main

    model_dir, _ = fine_tuned
    copy = shutil.copytree(model_dir, tmp_path / "minilm-sen-copy")
    summary = main(["--model-dir", str(model_dir), "--model-dir", str(copy), "--output", str(tmp_path / "soup")])
    soup = tmp_path / "soup"
    assert {INPUTS, HISTORY, CHECKPOINTS, ENCODER, SENTENCE_TRANSFORMERS, COMMAND_CLAIM} <= set(
        os.listdir(soup))
    history = json.loads((soup / HISTORY).read_text())
    assert history["soup"]["runs"] == [str(model_dir), str(copy)] and history["delta_scale"] == 1.0
    assert history["best_val_triplet_accuracy"] == summary["soup"]["run_val_triplet_accuracy"][0]

    def weights(path):
        with h5py.File(path) as handle:
            found = []
            handle["layers"].visititems(lambda name, item: found.append(item[()]) if isinstance(item, h5py.Dataset)
                                        else None)
            return found

    for ours, theirs in zip(weights(soup / BEST_WEIGHTS),
                            weights(model_dir / BEST_WEIGHTS)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    sentences = ["The striker scored twice.", "Bake the bread in a hot oven."]
    ours, theirs = (load_encoder(str(path)).encode(sentences) for path in (soup, model_dir))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_a_soup_into_one_of_its_runs_is_refused_with_that_run_intact(fine_tuned, tmp_path):
    """The soup of S and A written over S (`--overwrite true`) would delete S's weights before
    reading them: one `error:` line, exit 2, every file of S as it was."""
    from model.soup import main

    model_dir, _ = fine_tuned
    soup = tmp_path / "soup"
    main(["--model-dir", str(model_dir), "--model-dir", str(shutil.copytree(model_dir, tmp_path / "copy")),
          "--output", str(soup)])
    before = _files(soup)
    refused = subprocess.run([sys.executable, "-m", "model.soup", "--model-dir", str(soup), "--model-dir",
                              str(model_dir), "--output", f"{soup}/", "--overwrite", "true"],
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [f"error: --output {soup}/ is, lies inside or holds --model-dir {soup}: "
                                           "the soup would replace the run it reads; choose another folder"]
    assert _files(soup) == before and BEST_WEIGHTS in before
