"""`pipeline.run --wait false` (return once a Dataflow job is submitted) and its follow-up,
`pipeline.publish`, as far as they run without Dataflow: the flag, its refusal under a local
runner, the lock a submission leaves (held by the job once the submitting process is gone, so
readers and other runs refuse the folder), and the follow-up's refusals. Submitting, and
publishing a job that ended, need Dataflow: they are not exercised here."""
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core import folders, published
from core.cli import config_parser, run_cli
from core.runner import Runner
from pipeline import publish, run

REPO = Path(__file__).resolve().parents[2]
JOB = {"id": "2026-11-27_01_02_03-1234567890", "project": "my-project", "region": "europe-west4", "submitted": 0.0}


def test_wait_false_parses_beside_dataflow_flags_and_its_help_names_the_follow_up():
    beam_flags = ["--runner", "DataflowRunner", "--project", "my-project", "--region", "europe-west4",
                  "--temp_location", "gs://my-bucket/tmp"]   # options Beam's Dataflow validation accepts
    config, passed = run.parse_args(["--output", "gs://b/out", "--wait", "false", *beam_flags])
    assert config.wait is False and passed == beam_flags
    assert run.parse_args(["--output", "gs://b/out"])[0].wait is True
    assert [Runner(name).is_dataflow for name in ("DataflowRunner", "dataflow",
                                               "apache_beam.runners.dataflow.dataflow_runner.DataflowRunner",
                                                "DirectRunner", "PrismRunner", None)] == [True] * 3 + [False] * 3
    # the runners whose workers run here (and so report progress through a local folder)
    assert [Runner(name).is_local for name in (None, "DirectRunner", "direct", "SwitchingDirectRunner",
                                               "apache_beam.runners.direct.direct_runner.BundleBasedDirectRunner",
                                               "PrismRunner", "prism", "DataflowRunner", "FlinkRunner",
                                               "SparkRunner")] == [True] * 7 + [False] * 3
    text = " ".join(config_parser(run.PipelineConfig, "p", "").format_help().split())
    assert "python -m pipeline.publish --output OUTPUT" in text


@pytest.mark.parametrize("flags, complaint", [
    (["--wait", "false"], "error: --wait false: only a Dataflow job runs on once this command exits; under "
                          "DirectRunner"),
    (["--wait", "false", "--runner", "PrismRunner"], "error: --wait false: only a Dataflow job runs on"),
    (["--wait", "later"], "error: argument --wait: expected true or false, got 'later'"),
])
def test_wait_false_under_a_local_runner_or_a_bad_value_is_one_error_line_before_anything_is_written(
        tmp_path, capsys, flags, complaint):
    status = run_cli(run.main, ["--output", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1 and err.startswith(complaint), err
    assert not (tmp_path / "out").exists()


def _submit_and_exit(out: Path) -> None:
    """A process that claims `out` and records a submitted job in its lock, as `run.submitted`
    does once Dataflow accepted the job, then exits."""
    script = (f"from core import folders\n"
              f"folders.claim_output({str(out)!r}, False, ['scb'])\n"
              f"folders.record_submitted_job({str(out)!r}, {JOB!r}, "
              f"{{'config': {{'output': {str(out)!r}}}, 'input': 'gs://b/dump', 'runner': 'DataflowRunner'}})\n")
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=120)


def test_a_submitted_jobs_lock_holds_the_folder_after_the_submitting_process_is_gone(tmp_path, capsys):
    out = tmp_path / "out"
    _submit_and_exit(out)
    lock = json.loads((out / folders.LOCK).read_text())
    assert folders.process_alive(lock) is False and folders.submitted_job(lock) == JOB
    owner = folders.live_lock_owner(str(out))
    assert owner.startswith(f"Dataflow job {JOB['id']} in my-project/europe-west4, submitted with --wait false")
    assert f"python -m pipeline.publish --output {out}" in owner
    with pytest.raises(folders.OutputInUseError, match=f"being written by another run \\(Dataflow job {JOB['id']}"):
        folders.claim_output(str(out), overwrite=True, folders=["scb"])   # --overwrite too: the job writes there
    with pytest.raises(published.ManifestError, match="has no manifest.json"):
        published.Run.open(str(out))                                    # not readable as published
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    assert run_cli(publish.main, ["--output", str(moved)]) == 2       # refused before Dataflow is asked
    assert f"its lock records a run of {out} (a moved folder?)" in capsys.readouterr().err


def test_publish_refuses_a_folder_without_a_submitted_job_and_leaves_a_published_one(tmp_path, capsys):
    assert run_cli(publish.main, ["--output", str(tmp_path / "none")]) == 2
    assert "no run submitted with --wait false is there" in capsys.readouterr().err
    waiting = tmp_path / "waiting"                   # a run that waits for its job holds its own lock
    folders.claim_output(str(waiting), False, ["scb"])
    assert run_cli(publish.main, ["--output", str(waiting)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "its _RUNNING lock names no submitted Dataflow job" in err
    folders.end_unpublished(str(waiting), "test")
    done = tmp_path / "done"
    (done / "scb").mkdir(parents=True)
    (done / "scb" / "part-00000-of-00001.jsonl.gz").write_bytes(gzip.compress(b"{}\n"))
    folders.write_manifest(str(done), {"scb": 1})
    assert run_cli(publish.main, ["--output", str(done), "--wait", "false"]) == 0
    assert capsys.readouterr().out == f"pipeline.publish: {done} is published already\n"
