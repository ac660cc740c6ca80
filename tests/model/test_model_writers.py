"""Every command that writes a folder keeps the guarantees (docs/guarantees.md), on real processes:
it claims the folder (a live writer, told by host, pid and the process's start, is never
joined; a stale claim is recognised), deletes only what its own earlier run wrote and never
through a symbolic link, and reads back every JSON file through one typed reader, so a
truncated or edited one is one `error:` line naming it (exit 2), not a traceback."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from model_shards import write_triplet_shards

from core.folders import COMMAND_CLAIM, owner_record
from model.config import TrainConfig
from model.training.model_dir import BEST_WEIGHTS, CHECKPOINTS, HISTORY, INPUTS, LOGS, VOCABULARY
from model.training.shards import TripletDataError

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
TINY = dict(epochs=1, steps=2, batch_size=8, lstm_units=8, attention_size=4, progress=False, vocabulary="train")


def _cli(*argv, timeout=300):
    return subprocess.run([sys.executable, "-m", *map(str, argv)], capture_output=True, text=True, cwd=REPO,
                          env=ENV, timeout=timeout)


def _one_error_line(done, *named) -> str:
    """The run's one `error:` line (exit 2, no traceback), which names each of `named`."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    for name in named:
        assert str(name) in error, error
    return error


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("shards")))


@pytest.fixture
def sleeper():
    """A live process of this host, and its owner record as it would write it."""
    from core.folders import _process_start

    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    start = _process_start(process.pid)
    assert start is not None       # Linux: /proc tells a process's start
    yield process, {**owner_record(), "pid": process.pid, "process_start": start}
    process.kill()
    process.wait()


@pytest.mark.slow   # a trainer process
def test_train_overwrite_never_deletes_through_a_symbolic_link(shards, tmp_path):
    from model.training.claim import claim_model_dir

    model_dir, outside = tmp_path / "m", tmp_path / "mine"
    config = TrainConfig.from_flags(data=shards, model_dir=str(model_dir), **TINY)
    claim_model_dir(config, str(model_dir))
    outside.mkdir()
    (outside / "thesis.tex").write_text("years of work")
    (model_dir / LOGS).symlink_to(outside)
    done = _cli("model.train", "--data", shards, "--model-dir", model_dir, "--overwrite", "true",
                "--vocabulary", "train", "--lstm-units", "8", "--steps", "2", "--epochs", "1")
    _one_error_line(done, model_dir, "symbolic link", LOGS)
    assert (outside / "thesis.tex").read_text() == "years of work" and (model_dir / INPUTS).exists()
    (model_dir / LOGS).unlink()                       # the link gone, --overwrite recovers the folder
    claim_model_dir(config.with_flags(overwrite=True), str(model_dir))
    assert sorted(os.listdir(model_dir)) == [INPUTS]


@pytest.mark.slow   # a trainer process
def test_a_truncated_inputs_json_is_one_error_line(shards, tmp_path):
    from model.training.claim import claim_model_dir

    model_dir = tmp_path / "m"
    claim_model_dir(TrainConfig.from_flags(data=shards, model_dir=str(model_dir), **TINY), str(model_dir))
    whole = (model_dir / INPUTS).read_text()
    (model_dir / INPUTS).write_text(whole[: len(whole) // 2])   # a kill in the middle of a write
    done = _cli("model.train", "--data", shards, "--model-dir", model_dir, "--vocabulary", "train",
                "--lstm-units", "8", "--steps", "2", "--epochs", "1")
    _one_error_line(done, model_dir / INPUTS, "not a complete JSON file")


def test_a_model_dir_a_live_trainer_holds_is_refused_and_a_reused_pid_is_not_its_owner(shards, tmp_path, sleeper):
    from model.training.claim import claim_model_dir

    model_dir = tmp_path / "m"
    config = TrainConfig.from_flags(data=shards, model_dir=str(model_dir), **TINY)
    claim_model_dir(config, str(model_dir))
    claim = json.loads((model_dir / INPUTS).read_text())
    _, live = sleeper
    (model_dir / INPUTS).write_text(json.dumps({**claim, "owner": live}))
    with pytest.raises(TripletDataError, match=f"is being trained by pid {live['pid']}"):
        claim_model_dir(config, str(model_dir))
    with pytest.raises(TripletDataError, match="is being trained by"):   # not even with --overwrite
        claim_model_dir(config.with_flags(overwrite=True), str(model_dir))
    # PID 1 is alive, but it is not the process that wrote this claim: its start differs (or is unknown)
    for reused in ({**live, "pid": 1}, {"host": live["host"], "pid": 1}):
        (model_dir / INPUTS).write_text(json.dumps({**claim, "owner": reused}))
        claim_model_dir(config, str(model_dir))
    assert json.loads((model_dir / INPUTS).read_text())["owner"]["pid"] == os.getpid()


def test_a_resume_that_spells_out_a_default_or_a_trailing_slash_is_the_same_run(shards, tmp_path):
    from model.training.claim import claim_model_dir

    model_dir = str(tmp_path / "m")
    config = TrainConfig.from_flags(data=shards, model_dir=model_dir, **TINY)
    claim_model_dir(config, model_dir)
    (tmp_path / "m" / VOCABULARY).write_text("goal\nstar")
    claim_model_dir(config.with_flags(dropout=0.2, data=shards + "/", learning_rate=1e-3, distance="l1"), model_dir)
    with pytest.raises(TripletDataError, match=r"--dropout 0.2 -> 0.3"):
        claim_model_dir(config.with_flags(dropout=0.3), model_dir)
    recorded = json.loads((tmp_path / "m" / INPUTS).read_text())
    del recorded["flags"]["backend"]                      # a run recorded before --backend existed
    (tmp_path / "m" / INPUTS).write_text(json.dumps(recorded))
    claim_model_dir(config, model_dir)
    assert (tmp_path / "m" / VOCABULARY).exists()


@pytest.fixture
def exportable(fine_tuned, tmp_path):
    """What model.export reads of a fine-tuned model dir before it loads the network: its
    inputs.json and history.json (copied) and a checkpoint (a placeholder)."""
    model_dir, _ = fine_tuned
    copy = tmp_path / "minilm-sen"
    (copy / CHECKPOINTS).mkdir(parents=True)
    for name in (INPUTS, HISTORY):
        shutil.copyfile(model_dir / name, copy / name)
    (copy / BEST_WEIGHTS).write_bytes(b"")
    return copy


@pytest.mark.parametrize("fault, named", [
    ("truncated inputs.json", INPUTS),
    ("inputs.json of a list", INPUTS),
    ("unknown flag in inputs.json", INPUTS),
    ("bad encoder in inputs.json", INPUTS),
    ("truncated history.json", HISTORY),
    ("truncated report triplets.json", "triplets.json"),
    ("report of other methods", "'minilm-sen'"),
    ("output is a symbolic link", "symbolic link"),
])
def test_export_faults_are_one_error_line_and_write_nothing(exportable, tmp_path, fault, named):
    inputs, history = exportable / INPUTS, exportable / HISTORY
    recorded = json.loads(inputs.read_text())
    output, report = tmp_path / "st", tmp_path / "report"
    report.mkdir()
    flags = []
    if fault == "truncated inputs.json":
        inputs.write_text(inputs.read_text()[:50])
    elif fault == "inputs.json of a list":
        inputs.write_text("[]")
    elif fault == "unknown flag in inputs.json":
        inputs.write_text(json.dumps({**recorded, "flags": {**recorded["flags"], "warp_drive": 9}}))
    elif fault == "bad encoder in inputs.json":
        inputs.write_text(json.dumps({**recorded, "flags": {**recorded["flags"], "encoder": "gpt-7"}}))
    elif fault == "truncated history.json":
        history.write_text(history.read_text()[:40])
    elif fault == "truncated report triplets.json":
        (report / "triplets.json").write_text('{"methods": [')
        flags = ["--report", report]
    elif fault == "report of other methods":
        (report / "triplets.json").write_text(json.dumps({"methods": [{"method": "tfidf"}, {"method": "minilm"}]}))
        flags = ["--report", report]
    else:
        (tmp_path / "elsewhere").mkdir()
        output.symlink_to(tmp_path / "elsewhere")
    done = _cli("model.export", "--model-dir", exportable, "--output", output, *flags)
    error = _one_error_line(done, named)
    if fault == "report of other methods":
        assert error == (f"error: --report {report} holds no scores of 'minilm-sen' (the --model-dir's folder name, "
                         "which eval.all gives its rows); its triplets.json and scb.json score 'minilm', 'tfidf': "
                         "pass the report that scored this model dir")
    assert not Path(f"{output}.partial").exists()
    assert not output.exists() or output.is_symlink() and os.listdir(tmp_path / "elsewhere") == []


def test_export_keeps_the_users_files_and_replaces_its_own_only_with_overwrite(fine_tuned, tmp_path):
    from core.cli import UsageError
    from model.export import main as export

    model_dir, _ = fine_tuned
    mine = tmp_path / "mine"
    (mine / "onnx").mkdir(parents=True)
    (mine / "NOTES.md").write_text("my notes")
    (mine / "modules.json").write_text("[]")              # looks like an export, is the user's folder
    with pytest.raises(UsageError, match="holds files model.export does not write"):
        export(["--model-dir", str(model_dir), "--output", str(mine)])
    assert sorted(os.listdir(mine)) == ["NOTES.md", "modules.json", "onnx"]
    out = tmp_path / "st"
    export(["--model-dir", str(model_dir), "--output", str(out)])
    first = (out / "model.safetensors").stat()
    # The folder is what a user uploads: its ended claim names no host or pid, nor does any file.
    claim = json.loads((out / COMMAND_CLAIM).read_text())
    assert claim["command"] == "model.export" and claim.keys() == {"command", "ended"}
    assert not [path for path in out.rglob("*") if path.is_file() and _names_this_host(path)]
    card = (out / "README.md").read_text()
    assert "THIS_FOLDER" not in card and f'folder = "{model_dir.name}"   # this folder\'s path' in card
    assert {oct(path.stat().st_mode & 0o777) for path in out.rglob("*") if path.is_file()} == {"0o644"}
    with pytest.raises(UsageError, match="already holds the output of an earlier model.export"):
        export(["--model-dir", str(model_dir), "--output", str(out)])
    time.sleep(0.01)
    export(["--model-dir", str(model_dir), "--output", str(out), "--overwrite", "true"])
    assert (out / "model.safetensors").stat().st_mtime_ns != first.st_mtime_ns
    assert not [name for name in os.listdir(out) if "partial" in name]


def _names_this_host(path: Path) -> bool:
    """Whether the export's file names this host as a word: in its text, or in the weights' header
    (their tensors are numbers; the checkpoint's tokenizer files are copied as they ship)."""
    from model.formats.hf import TOKENIZER_FILES

    if path.name in TOKENIZER_FILES:
        return False
    data = path.read_bytes()
    if path.suffix == ".safetensors":
        data = data[8:8 + int.from_bytes(data[:8], "little")]
    return re.search(rb"\b" + re.escape(socket.gethostname().encode()) + rb"\b", data) is not None


def test_a_claim_that_is_not_one_is_one_error_line(tiny_model, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / COMMAND_CLAIM).write_text("[]")
    source = tmp_path / "sentences.txt"
    source.write_text("The striker scored.\n")
    done = _cli("model.embed", "--model-dir", tiny_model, "--input", source, "--output", out)
    _one_error_line(done, out / COMMAND_CLAIM, "list")


def test_two_embeds_into_one_folder_never_lose_rows(tiny_model, tmp_path):
    """Started 1 s apart into one empty --output: the claim decides under a flock, so one runs
    and the other is refused, naming the live one; the folder holds every row of the one that ran."""
    import pyarrow.parquet as pq

    lines = [f"Sentence number {i} is about the {'striker' if i % 2 else 'oven'}." for i in range(1065)]
    source = tmp_path / "sentences.txt"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "model.embed", "--model-dir", tiny_model, "--input", str(source),
            "--output", str(out)]
    first = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    second = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = [(process.wait(timeout=300), *process.communicate()) for process in (first, second)]
    assert sorted(code for code, _, _ in results) == [0, 2], [err[-2000:] for _, _, err in results]
    (refused,) = [err for code, _, err in results if code == 2]
    assert "is being written by model.embed" in refused.strip().splitlines()[-1]
    rows = sum(pq.read_metadata(path).num_rows for path in out.glob("embeddings-*.parquet"))
    assert rows == len(lines)
