"""The job server of a portable runner that Beam would start on this machine (PrismRunner), started
by the launcher itself so that it ends with the run.

Left to Beam, the Prism job server is a subprocess that Beam keeps for the life of the launching
process and stops only at its exit (`atexit`), and nothing ties it to its parent:

* a SIGKILLed launcher leaves it running for ever, holding its port (measured: still there after
  the launcher was gone);
* at a normal exit its stop failed before it stopped the process: Beam made its temporary folder
  in the run's private TMPDIR (`folders.private_tempdir`), already removed by then, so the exit
  printed a traceback and left the Prism process running.

And Beam's launcher waits on the job through a stream of its states opened with a deadline of
`--job_server_timeout` (300 s by default; `JobServiceHandle.run`, which reopens it without a deadline
only when the job server refuses that first request, by the job's preparation id): Prism accepts it,
so a Prism job longer than five minutes failed in the launcher with `DEADLINE_EXCEEDED` (seen on the
2019 dump), its outputs unpublished. `prepare_portable_run` gives a portable run a deadline of days,
unless the user set one. And when the launcher stops waiting (Ctrl-C, an error), a job on a job server
that outlives it would write on into a folder whose lock it releases: `cancel_unfinished` ends it first.

Here Beam's own job server class (`PrismJobServer`) still gives the command (where the binary is,
its arguments, a free port); the launcher starts that process with `PR_SET_PDEATHSIG` (Linux: the
kernel kills it when the launcher dies, SIGKILL included), hands the job to it through Beam's
`--job_endpoint` option, and stops it when the run ends. A `--job_endpoint` the user gives (a job
server of their own) is left alone.

Flink's job server is a Java process (`make flink` builds it from the Beam 2.50 artifacts Maven
Central serves, infra/flink/): the same start, stop and parent-death tie as Prism's, its
`--flink_master` `[local]` (a Flink mini-cluster inside the job server's JVM) or a session cluster's
REST address (infra/flink_cluster.sh). Its jar binds its job and artifact services to the loopback
address (Beam 2.50's own driver binds every interface; infra/flink/src says why).
"""
from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core.cli import DataLossError, UsageError
from core.files import is_remote
from core.folders import private_tempdir
from core.progress import workers_end_on_interrupt
from core.runner import Runner

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 10.0   # a job service's (or worker pool's) answer before any work
JOB_WAIT_S = 30 * 24 * 3600   # Beam's deadline of the launcher's wait on a portable job (`prepare_portable_run`)
# Where `make flink` and `make spark` put Beam's Java job servers (infra/flink/pom.xml and
# infra/spark/pom.xml: their versions, and why those).
JOB_SERVER_JARS = {runner: Path(__file__).resolve().parents[1] / ".cache" / runner / f"beam-{runner}-job-server.jar"
                   for runner in ("flink", "spark")}
# `--flink_master`s whose Flink runs on this machine: Beam's two words for a mini-cluster in the job
# server, and a session cluster on loopback (infra/flink_cluster.sh).
LOCAL_FLINK_MASTERS = ("[local]", "[auto]")
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
SPARK_LOCAL_MASTER = r"^local(\[.+\])?$"   # `--spark_master_url`s of a Spark inside the job server (Beam's pattern)
# How long a TaskManager keeps an SDK worker it no longer uses (`--environment_cache_millis`, Beam's 0:
# released after each task). Beam's worker pool (LOOPBACK, EXTERNAL) knows its workers by an id that
# every TaskManager counts from 1, so a TaskManager releasing its worker "1-1" stopped the other
# TaskManager's "1-1" mid-task ("SDK harness closed connection", the job FAILED, seen on a
# two-TaskManager cluster); kept for the job, none is released while the job runs.
FLINK_ENVIRONMENT_CACHE_MS = 24 * 3600 * 1000
# The job servers log warnings and errors only (at INFO a Flink mini-cluster writes ~18,000 lines for
# the excerpt); Spark's local driver binds loopback and opens no web UI (its default: every interface).
JOB_SERVER_JVM_PROPERTIES = {
    "flink": ("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
              # a warning per operator whose name is too long for a metric: hundreds a job
              "-Dorg.slf4j.simpleLogger.log.org.apache.flink.metrics.MetricGroup=error"),
    "spark": ("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-Dspark.ui.enabled=false",
              "-Dspark.driver.bindAddress=127.0.0.1", "-Dspark.driver.host=127.0.0.1"),
}


def _beam_job_server(options: Any) -> Any:
    """Beam's job server for the runner `options` name, when Beam would start one here as a
    subprocess; None otherwise (an in-process runner, a remote service, or `--job_endpoint`)."""
    from apache_beam.options.pipeline_options import PortableOptions

    if options.view_as(PortableOptions).job_endpoint:
        return None
    runner = Runner.of(options).kind
    if runner == "prism":
        from apache_beam.runners.portability.prism_runner import PrismJobServer

        return PrismJobServer(options)
    if runner == "flink":
        from apache_beam.options.pipeline_options import FlinkRunnerOptions
        from apache_beam.runners.portability.flink_runner import FlinkJarJobServer, FlinkRunner

        flink = options.view_as(FlinkRunnerOptions)
        flink.flink_master = FlinkRunner.add_http_scheme(flink.flink_master)   # as Beam's FlinkRunner does
        flink.flink_job_server_jar = flink.flink_job_server_jar or str(JOB_SERVER_JARS["flink"])
        return FlinkJarJobServer(options)
    if runner == "spark":
        from apache_beam.options.pipeline_options import SparkRunnerOptions
        from apache_beam.runners.portability.spark_runner import SparkJarJobServer

        spark = options.view_as(SparkRunnerOptions)
        spark.spark_job_server_jar = spark.spark_job_server_jar or str(JOB_SERVER_JARS["spark"])
        return SparkJarJobServer(options)
    return None


def flink_master_is_local(master: str) -> bool:
    """Whether `--flink_master` is a Flink on this machine: a mini-cluster in the job server
    (`[local]`, `[auto]`) or a session cluster on loopback (`localhost:8081`, `http://127.0.0.1:8081`)."""
    master = master.strip()
    if master in LOCAL_FLINK_MASTERS:
        return True
    host = master.split("://", 1)[-1].rsplit(":", 1)[0]
    return host in LOOPBACK_HOSTS


def sdk_workers_in_launcher(options: Any) -> bool:
    """Whether the job's SDK workers run inside this process (`--environment_type LOOPBACK`), so
    that its DoFns share this machine's disk (the progress counts) and its stderr (the log)."""
    from apache_beam.options.pipeline_options import PortableOptions

    return (options.view_as(PortableOptions).environment_type or "").upper() == "LOOPBACK"


def _check_java_job_server(runner: str, options: Any) -> None:
    """Beam's Java job server for `runner` (flink, spark) that the launcher will start, there
    before any work (a UsageError that says `make RUNNER` otherwise: Beam would try to download a
    shaded jar that is not served); on a Flink or Spark on this machine without `--environment_type`,
    the SDK workers in the launcher (LOOPBACK, as Beam's runners do for `[local]` and `local[N]`;
    their default for any other master is Docker); on a Flink cluster, workers kept for the whole
    job (FLINK_ENVIRONMENT_CACHE_MS; a `[local]` mini-cluster releases them as it goes, so that none
    is left to complain when its job server stops). Unless `--job_server_jvm_properties` says otherwise, the job
    server's JOB_SERVER_JVM_PROPERTIES, and its temporary files (Flink's spill folders, Spark's
    blocks) in the run's private TMPDIR, so they go with the run."""
    from apache_beam.options.pipeline_options import (
        FlinkRunnerOptions,
        JobServerOptions,
        PortableOptions,
        SparkRunnerOptions,
    )

    portable = options.view_as(PortableOptions)
    if runner == "flink":
        master = options.view_as(FlinkRunnerOptions).flink_master
        local = flink_master_is_local(master)
        jar_flag = "flink_job_server_jar"
        if master not in LOCAL_FLINK_MASTERS and "environment_cache_millis" not in options.get_all_options(
                drop_default=True):   # a cluster's TaskManagers (a mini-cluster has one: nothing to collide)
            portable.environment_cache_millis = FLINK_ENVIRONMENT_CACHE_MS
    else:
        local = re.match(SPARK_LOCAL_MASTER, options.view_as(SparkRunnerOptions).spark_master_url) is not None
        jar_flag = "spark_job_server_jar"
    if not portable.environment_type and local:
        portable.environment_type = "LOOPBACK"
    if portable.job_endpoint:
        return
    server = options.view_as(JobServerOptions)
    if not server.job_server_jvm_properties:
        server.job_server_jvm_properties = [*JOB_SERVER_JVM_PROPERTIES[runner],
                                            f"-Djava.io.tmpdir={tempfile.gettempdir()}"]
    jar = getattr(options.view_as(FlinkRunnerOptions if runner == "flink" else SparkRunnerOptions), jar_flag)
    if jar and is_remote(jar):
        return   # a jar Beam downloads
    if not os.path.isfile(jar or JOB_SERVER_JARS[runner]):
        named = f"--{jar_flag} {jar}: no such file" if jar else f"no job server at {JOB_SERVER_JARS[runner]}"
        raise UsageError(f"--runner {runner.capitalize()}Runner: {named} (`make {runner}` builds Beam's "
                         f"{runner.capitalize()} job server)")


def prepare_portable_run(options: Any) -> None:
    """Under a portable runner (`Runner.is_portable`), before any work: Beam's `--job_server_timeout`
    (the deadline of the launcher's stream of job states, so, on Prism, of the job) becomes
    JOB_WAIT_S unless the command line sets it; and a UsageError naming the flag for what would
    fail later: a `--job_endpoint` where no Beam job service answers (Beam would wait out that
    deadline to connect, or for ever on a port that accepts and never answers), a Prism binary or
    Java job server that is not built (`_check_prism`, `_check_java_job_server`), and an
    `--environment_config` its `--environment_type` cannot read (`_check_environment`)."""
    from apache_beam.options.pipeline_options import PortableOptions

    runner = Runner.of(options).kind
    if not Runner(runner).is_portable:
        return
    if runner == "prism":
        _check_prism(options)
    if runner in JOB_SERVER_JARS:
        _check_java_job_server(runner, options)
    _check_environment(options)
    portable = options.view_as(PortableOptions)
    if "job_server_timeout" not in options.get_all_options(drop_default=True):
        portable.job_server_timeout = JOB_WAIT_S
    if portable.job_endpoint and portable.job_endpoint != "embed":
        _check_job_service(portable.job_endpoint)


def _check_job_service(endpoint: str) -> None:
    """A UsageError unless a Beam job service answers a request (GetJobs) at `endpoint` within
    ANSWER_TIMEOUT_S: a refused port, a server that is not gRPC, and one that accepts and never
    answers (where Beam's launcher waited at "read: 0 pages" for its 30-day deadline)."""
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    channel = grpc.insecure_channel(endpoint)
    try:
        beam_job_api_pb2_grpc.JobServiceStub(channel).GetJobs(beam_job_api_pb2.GetJobsRequest(),
                                                             timeout=ANSWER_TIMEOUT_S)
    except grpc.RpcError as error:
        code = error.code()
        raise UsageError(f"--job_endpoint {endpoint}: no Beam job service answers there within "
                         f"{ANSWER_TIMEOUT_S:.0f} s ({code.name if code else 'no answer'}: "
                         f"{(error.details() or '').splitlines()[0][:160] if error.details() else ''})") from None
    finally:
        channel.close()


def prism_binary() -> Path:
    """Where `make prism` builds Beam's Prism at the SDK's own version."""
    import apache_beam

    return Path(__file__).resolve().parents[1] / ".cache" / "prism" / f"v{apache_beam.__version__}" / "prism"


def _check_prism(options: Any) -> None:
    """Prism's binary there before any work: `--prism_location` a file (or a URL Beam downloads), or
    by default the one `make prism` built; a UsageError otherwise (Beam would try GitHub's
    releases, which this project's machines cannot reach: a 31-frame traceback after the output
    folder was claimed)."""
    from apache_beam.options.pipeline_options import PortableOptions, PrismRunnerOptions

    if options.view_as(PortableOptions).job_endpoint:
        return
    prism = options.view_as(PrismRunnerOptions)
    location = prism.prism_location
    if location and is_remote(location):
        return
    if location and not os.path.isfile(location):
        raise UsageError(f"--prism_location {location}: no such file (`make prism` builds Prism at "
                         f"{prism_binary()})")
    if not location:
        if not prism_binary().is_file():
            raise UsageError(f"--runner PrismRunner: no Prism binary at {prism_binary()} (`make prism` builds "
                             "it; or --prism_location PATH)")
        prism.prism_location = str(prism_binary())


ENVIRONMENT_CONFIGS = {   # what each --environment_type reads from --environment_config
    "EXTERNAL": "HOST:PORT of an SDK worker pool (python -m apache_beam.runners.worker.worker_pool_main)",
    "PROCESS": 'a JSON object with the "command" that starts an SDK worker',
}


def _check_environment(options: Any) -> None:
    """An `--environment_config` its `--environment_type` reads, there before any work: a malformed
    one reached Prism's job server, whose Go code panicked (and took a shared set-up down); an
    EXTERNAL pool where nothing listens failed the job after its start."""
    import json

    from apache_beam.options.pipeline_options import PortableOptions

    portable = options.view_as(PortableOptions)
    kind = (portable.environment_type or "").upper()
    config = portable.environment_config
    if kind not in ENVIRONMENT_CONFIGS:
        return
    wrong = UsageError(f"--environment_config {config!r}: --environment_type {kind} takes {ENVIRONMENT_CONFIGS[kind]}")
    if not config:
        raise wrong
    if kind == "PROCESS":
        try:
            command = json.loads(config)
        except ValueError:
            raise wrong from None
        if not isinstance(command, dict) or not command.get("command"):
            raise wrong
        return
    host, _, port = config.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise wrong
    try:
        socket.create_connection((host, int(port)), timeout=ANSWER_TIMEOUT_S).close()
    except OSError as error:
        raise UsageError(f"--environment_config {config}: no SDK worker pool listens there ({error})") from None


@contextlib.contextmanager
def job_failures(options: Any, log_path: str | None) -> Iterator[None]:
    """A job that failed on a portable runner, or whose job service went away (the job server, its
    workers or the pool died; a deadline passed), as one `error:` line (a DataLossError: exit 1,
    nothing published) naming the runner, the failure's first line and the runner's log, where
    Beam raises a RuntimeError or a gRPC error with a multi-page traceback. Other errors pass."""
    import grpc

    runner = Runner.of(options)
    try:
        yield
    except (UsageError, DataLossError):
        raise
    except grpc.RpcError as error:
        if not runner.is_portable:
            raise
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else str(error)
        what = f"its job service stopped answering ({code.name if code else 'gRPC'}: {_first_line(details)})"
        raise DataLossError(f"the job on {runner}: {what}; nothing was published{_log_hint(log_path)}") from error
    except RuntimeError as error:
        if not runner.is_portable or "failed in state" not in str(error):
            raise
        state = str(error).split("failed in state", 1)[1]
        raise DataLossError(f"the job on {runner} failed in state {_first_line(state)[:300]}; nothing was "
                            f"published{_log_hint(log_path)}") from error


def _first_line(text: str | None) -> str:
    return (str(text or "").strip().splitlines() or [""])[0]


def _log_hint(log_path: str | None) -> str:
    return f" (the runner's log: {log_path})" if log_path else ""


def _die_with_parent() -> None:   # runs in the child between fork and exec
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _wait_until_listening(process: subprocess.Popen, endpoint: str, command: str) -> None:
    """Returns once the job server `process` listens on `endpoint`; a DataLossError (one line, exit 1,
    nothing published) when it exits first or does not listen within START_TIMEOUT_S."""
    host, port = endpoint.rsplit(":", 1)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise DataLossError(f"the job server {command} exited with status {process.returncode} before it "
                                "listened; its log is the run's pipeline.log")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise DataLossError(f"the job server {command} did not listen on {endpoint} within "
                                   f"{START_TIMEOUT_S:.0f} s") from None
            time.sleep(0.1)


@contextlib.contextmanager
def run_job(pipeline: Any, log_path: str | None = None, watching: tuple[contextlib.AbstractContextManager, ...] = (),
            wait: bool = True) -> Iterator[Any]:
    """The one way a command runs its built Beam job (`pipeline.run`, `model.embed`, `eval.scb`), on
    any runner: in a temporary folder of the run's own (`core.folders.private_tempdir`), the job
    server Beam would start here running for this job only (`local_job_server`: left to Beam, a
    Prism job server outlived the job until the process exited), `watching` (a progress bar, the
    run's write errors) around it, Ctrl-C ending local workers at once, a failed portable job one
    line (`job_failures`), and a job left unfinished by an error or Ctrl-C cancelled
    (`cancel_unfinished`). Yields the job's result once it ended (`wait` False: once submitted);
    read its metrics inside the block, where the job server still answers for them.
    `prepare_portable_run` must have seen the options (before any work)."""
    options = pipeline.options
    with private_tempdir(), local_job_server(options, log_path), job_failures(options, log_path):
        with contextlib.ExitStack() as around:
            for manager in (*watching, workers_end_on_interrupt(options)):
                around.enter_context(manager)
            result = pipeline.run()
            if wait:
                try:
                    result.wait_until_finish()
                except BaseException:   # a job that outlives this process ends before its caller goes on
                    cancel_unfinished(result)
                    raise
        yield result


def cancel_unfinished(result: Any) -> None:
    """Cancels the portable job of `result` (a Beam PipelineResult) when it has not ended, and
    waits up to STOP_TIMEOUT_S for its job service to say it ended: the launcher stopped waiting
    (Ctrl-C, an error), and a job on a job server that outlives the launcher (`--job_endpoint`)
    would otherwise write on into a folder whose lock the launcher is about to release. Nothing
    for a local runner's result (its job ran in the launcher's own call)."""
    from apache_beam.runners.portability.portable_runner import PipelineResult
    from apache_beam.runners.runner import PipelineState

    if not isinstance(result, PipelineResult):
        return
    with contextlib.suppress(Exception):   # the error that stopped the wait is the one reported
        if PipelineState.is_terminal(result.state):
            return
        result.cancel()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while not PipelineState.is_terminal(result.state) and time.monotonic() < deadline:
            time.sleep(0.2)


# A Flink mini-cluster's own services (its blob server, REST endpoint, RPC) on loopback: Flink binds
# every interface unless told (infra/flink_cluster.sh says the same to a session cluster).
FLINK_LOOPBACK_CONF = """jobmanager.bind-host: 127.0.0.1
jobmanager.rpc.address: 127.0.0.1
taskmanager.bind-host: 127.0.0.1
taskmanager.host: 127.0.0.1
rest.bind-address: 127.0.0.1
rest.address: 127.0.0.1
"""


def _job_server_environment(options: Any) -> dict[str, str]:
    """The job server's environment: this process's, and for Flink's a FLINK_CONF_DIR holding
    FLINK_LOOPBACK_CONF (in the run's private TMPDIR) unless the user names one."""
    environment = dict(os.environ)
    if Runner.of(options).kind == "flink" and "FLINK_CONF_DIR" not in environment:
        folder = tempfile.mkdtemp(prefix="flink-conf-")
        with open(os.path.join(folder, "flink-conf.yaml"), "w") as conf:
            conf.write(FLINK_LOOPBACK_CONF)
        environment["FLINK_CONF_DIR"] = folder
    return environment


@contextlib.contextmanager
def local_job_server(options: Any, log_path: str | None = None) -> Iterator[str | None]:
    """While the block runs, the job server Beam would start for `options`' runner, run by this
    process and named in `options`' `--job_endpoint` (yields it; None, and nothing started, when
    the runner needs none here). Its output is appended to `log_path` (the run's log), or goes to
    this process's stderr."""
    from apache_beam.options.pipeline_options import PortableOptions

    server = _beam_job_server(options)
    if server is None:
        yield None
        return
    command, endpoint = server.subprocess_cmd_and_endpoint()
    command = [str(part) for part in command]
    with open(log_path, "ab") if log_path else contextlib.nullcontext(2) as log:   # fd 2: this process's stderr
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   env=_job_server_environment(options),
                                   preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    portable = options.view_as(PortableOptions)
    try:
        _wait_until_listening(process, endpoint, command[0])
        portable.job_endpoint = endpoint
        yield endpoint
    finally:
        portable.job_endpoint = None
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
