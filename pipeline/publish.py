"""Publishes a run that `pipeline.run --wait false` submitted to Dataflow: the follow-up step.

    python -m pipeline.publish --output OUT [--wait false]

The submission left OUT locked by its job (`_RUNNING` names the job's id, project and region,
and the run's flags). This waits for the job to end, then does what `pipeline.run` does after
a job it waited for: reconciles the job's counters, writes stats.json, checks every shard
against them and writes the manifest, releasing the folder. A job that failed or was cancelled
leaves the run unpublished (exit 1, `_UNPUBLISHED` records why; `--overwrite` can then replace
it). Ctrl-C while waiting changes nothing: the job runs on, the folder stays locked, and this
command can be run again. A folder already published is left as it is (exit 0).

Needs Beam's gcp extra and credentials that can read the job (`gcloud auth application-default
login`). It reads the job through Beam's own Dataflow client (`DataflowApplicationClient`,
`DataflowPipelineResult`, `DataflowMetrics`), as `apache_beam.runners.dataflow.dataflow_metrics`'s
command does; it is not exercised by the tests, which have no Dataflow.
"""
from __future__ import annotations

import dataclasses
import sys
import time

from core import folders
from core.cli import DataLossError, UsageError, config_from_flags, flag, parse_config, run_cli
from core.files import read_json_object
from core.folders import LOCK, submitted_job
from core.published import MANIFEST
from core.runner import Runner
from pipeline import run as pipeline_run


@dataclasses.dataclass(frozen=True)
class PublishConfig:
    output: str = flag(help="the --output of a pipeline.run --wait false on Dataflow, local or gs://")
    wait: bool = flag(True, help="wait for the job to end; false: publish only a job that has ended, otherwise "
                                 "say its state (error, exit 2) and change nothing")


class JobFailedError(DataLossError):
    """The submitted job ended without succeeding: the run stays unpublished."""


def dataflow_result(job: dict):
    """A Beam `DataflowPipelineResult` of the submitted job (`job`: id, project, region), whose
    `wait_until_finish` polls it and whose `metrics()` queries its counters."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.dataflow.dataflow_metrics import DataflowMetrics
    from apache_beam.runners.dataflow.dataflow_runner import DataflowPipelineResult, DataflowRunner
    from apache_beam.runners.dataflow.internal import apiclient

    options = PipelineOptions(project=job["project"], region=job["region"])
    client = apiclient.DataflowApplicationClient(options)
    runner = DataflowRunner()
    runner.dataflow_client = client
    result = DataflowPipelineResult(client.get_job(job["id"]), runner, options)
    result.metric_results = DataflowMetrics(client, result)
    return result


def submission(out: str) -> tuple[dict, dict] | None:
    """(job, run) that the folder's lock records, or None when the folder is already published;
    UsageError naming the folder when it holds no submitted job."""
    from apache_beam.io.filesystems import FileSystems


    if not FileSystems.exists(f"{out}/{LOCK}"):
        if FileSystems.exists(f"{out}/{MANIFEST}"):
            return None
        raise UsageError(f"--output {out}: no run submitted with --wait false is there (no {LOCK} lock); nothing "
                         "to publish")
    record = read_json_object(f"{out}/{LOCK}")
    job = submitted_job(record)
    if job is None or not isinstance(record.get("run"), dict):
        raise UsageError(f"--output {out}: its {LOCK} lock names no submitted Dataflow job (a run that waits for its "
                         "job holds it); nothing to publish")
    return job, record["run"]


def main(argv: list[str] | None = None) -> dict:
    """Waits for the submitted job, then publishes the run; returns its stats ({} when it was published before)."""
    config = parse_config(PublishConfig, argv, "python -m pipeline.publish", __doc__.split("\n\n")[0])
    out = config.output.rstrip("/")
    found = submission(out)
    if found is None:
        print(f"pipeline.publish: {out} is published already")
        return {}
    job, run = found

    run_config = config_from_flags(pipeline_run.PipelineConfig, run["config"])
    if run_config.output.rstrip("/") != out:
        raise UsageError(f"--output {out}: its lock records a run of {run_config.output} (a moved folder?); publish "
                         "it where its job wrote it")
    result = dataflow_result(job)
    if not config.wait and not result.is_in_terminal_state():
        raise UsageError(f"Dataflow job {job['id']} is {result.state}: {out} is not published yet; run this again once "
                         "it ends, or without --wait false to wait for it")
    print(f"pipeline.publish: waiting for Dataflow job {job['id']} ({job['project']}/{job['region']}) to end")
    try:
        result.wait_until_finish()
    except Exception as error:   # Beam's DataflowRuntimeException: the job failed or was cancelled
        if not result.is_in_terminal_state():
            raise   # the job may still run: the folder stays locked by it
        folders.end_unpublished(out, f"Dataflow job {job['id']} ended {result.state}")
        raise JobFailedError(f"Dataflow job {job['id']} ended {result.state}, not done: {out} is not published "
                             f"(--overwrite can replace it); {str(error).splitlines()[0][:200]}") from error
    try:
        stats = pipeline_run.finish(result, run_config, run["input"], Runner(run["runner"]),
                                    time.time() - job["submitted"])
    except BaseException as error:
        folders.end_unpublished(out, str(error)[:300])
        raise
    pipeline_run.publish(run_config, stats["counters"])
    return stats


if __name__ == "__main__":
    sys.exit(run_cli(main))
