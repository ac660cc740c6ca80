"""The job on Apache Flink and Apache Spark: Beam 2.50's Java job servers (`make flink`, `make spark`,
infra/flink/ and infra/spark/) that the launcher starts per run, on a Flink mini-cluster inside it
(`--flink_master=[local]`), on a standalone Flink session cluster of separate JVMs
(infra/flink_cluster.sh) and on Spark's `local[2]`. SDK 2.77 on a 2.50 job server is a pairing Beam
does not promise, so every real run here compares bytes and counters with the DirectRunner's."""
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from apache_beam.options.pipeline_options import FlinkRunnerOptions, JobServerOptions, PipelineOptions, PortableOptions
from dump_support import ALL_NEGATIVES

from core import jobserver, published
from core.cli import UsageError
from pipeline import run

REPO = Path(__file__).resolve().parents[2]
JAR = jobserver.JOB_SERVER_JARS["flink"]
FAST = ["--spacy-model", "blank:en"]
LOOPBACK_ADDRESSES = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
NOT_COMPARED = {"stats.json", "pipeline.log"}   # the runner's name and wall time; the runners' logs


@pytest.mark.parametrize("runner", ["flink", "spark"])
def test_a_java_runner_without_its_job_server_is_one_error_that_says_make_before_any_work(tmp_path, runner):
    out = tmp_path / "out"
    missing = tmp_path / "no-such.jar"
    flags = ["--runner", f"{runner.capitalize()}Runner", f"--{runner}_job_server_jar", str(missing)]
    with pytest.raises(UsageError, match=f"--{runner}_job_server_jar {missing}: no such file .*make {runner}"):
        run.main(["--output", str(out), *flags])
    assert not out.exists()   # nothing claimed: no _UNPUBLISHED for the next try to trip on
    done = subprocess.run([sys.executable, "-m", "pipeline.run", "--output", str(out), *flags],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and f"make {runner}" in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("master, local", [
    ("[local]", True), ("[auto]", True), ("localhost:8081", True), ("http://127.0.0.1:8081", True),
    ("flink-jm.example.com:8081", False), ("http://10.0.0.7:8081", False)])
def test_a_flink_master_on_this_machine_is_told_from_a_remote_one(master, local):
    assert jobserver.flink_master_is_local(master) is local


def _prepared(*flags: str) -> PipelineOptions:
    options = PipelineOptions(["--runner", "FlinkRunner", "--flink_job_server_jar", sys.executable, *flags])
    jobserver.prepare_portable_run(options)
    return options


def test_on_a_local_flink_the_sdk_workers_run_in_the_launcher_and_stay_for_the_job():
    """LOOPBACK for a mini-cluster or a loopback cluster (Beam's own default for a cluster is Docker);
    the environment cache that keeps two TaskManagers from stopping each other's workers; the job
    server's quiet logging. What the user sets is kept."""
    options = _prepared("--flink_master=localhost:8081")
    portable = options.view_as(PortableOptions)
    assert portable.environment_type == "LOOPBACK" and jobserver.sdk_workers_in_launcher(options)
    assert portable.environment_cache_millis == jobserver.FLINK_ENVIRONMENT_CACHE_MS
    jvm = options.view_as(JobServerOptions).job_server_jvm_properties
    assert set(jobserver.JOB_SERVER_JVM_PROPERTIES["flink"]) <= set(jvm)
    assert f"-Djava.io.tmpdir={tempfile.gettempdir()}" in jvm

    with socket.socket() as pool:   # an SDK worker pool's port, listening (prepare_portable_run checks)
        pool.bind(("127.0.0.1", 0))
        pool.listen()
        kept = _prepared("--flink_master=flink-jm.example.com:8081", "--environment_type", "EXTERNAL",
                         "--environment_config", f"localhost:{pool.getsockname()[1]}",
                         "--environment_cache_millis", "5", "--job_server_jvm_properties=-Xmx2g")
    assert kept.view_as(PortableOptions).environment_type == "EXTERNAL"
    assert int(kept.view_as(PortableOptions).environment_cache_millis) == 5
    assert kept.view_as(JobServerOptions).job_server_jvm_properties == ["-Xmx2g"]
    embedded = _prepared("--flink_master=[local]")   # one TaskManager: nothing to collide, released as it goes
    assert embedded.view_as(PortableOptions).environment_type == "LOOPBACK"
    assert int(embedded.view_as(PortableOptions).environment_cache_millis) == 0
    remote = _prepared("--flink_master=flink-jm.example.com:8081")
    assert remote.view_as(PortableOptions).environment_type is None   # Beam's default: the user decides
    assert remote.view_as(FlinkRunnerOptions).flink_master == "flink-jm.example.com:8081"


# ---------------------------------------------------------------- real runs on Flink

def _built(runner: str) -> Path:
    jar = jobserver.JOB_SERVER_JARS[runner]
    if not jar.is_file():
        if shutil.which("mvn") and shutil.which("java"):
            pytest.fail(f"no {runner} job server at {jar}: `make {runner}` builds it (as make test does)")
        pytest.skip(f"the {runner} job server needs Java and Maven (`make {runner}`), and neither is here")
    return jar


@pytest.fixture(scope="module")
def flink_jar() -> Path:
    return _built("flink")


@pytest.fixture(scope="module")
def spark_jar() -> Path:
    return _built("spark")


@pytest.mark.slow
def test_make_flink_and_make_spark_print_the_jars_the_launcher_starts(flink_jar, spark_jar):
    for target, jar in (("flink", flink_jar), ("spark", spark_jar)):
        done = subprocess.run(["make", "-s", target], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        assert REPO / done.stdout.strip().splitlines()[-1] == jar


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.run", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=900)


def _files(out: Path) -> dict[str, bytes]:
    return {str(path.relative_to(out)): path.read_bytes() for path in sorted(out.rglob("*"))
            if path.is_file() and path.name not in NOT_COMPARED}


def _assert_the_directrunners_run(out: Path, direct: Path, runner: str) -> None:
    """Every shard, Parquet twin, JSON-lines file and the manifest the DirectRunner's bytes; the same
    counters and reconciliation; a published run that Run.verify accepts."""
    theirs, ours = _files(direct), _files(out)
    assert sorted(ours) == sorted(theirs)
    assert sum(name.endswith(".tfrecord.gz") for name in theirs) >= 12
    assert [name for name, data in ours.items() if data != theirs[name]] == []
    stats = json.loads((out / "stats.json").read_text())
    direct_stats = json.loads((direct / "stats.json").read_text())
    assert stats["runner"] == runner
    assert stats["counters"] == direct_stats["counters"]
    assert stats["reconciliation"] == direct_stats["reconciliation"] and stats["reconciliation"]["balanced"]
    opened = published.Run.open(str(out))
    assert all(opened.verify(folder) == 0 for folder in opened.manifest.outputs)


def _job_servers(jar: Path = JAR) -> list[psutil.Process]:
    """Live JVMs of one of Beam's Java job servers (this checkout's jar; Flink's by default)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] != psutil.STATUS_ZOMBIE and str(jar) in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("runner, flags", [("flink", ["--flink_master=[local]"]), ("spark", [])])
def test_a_java_job_server_the_launcher_starts_listens_on_loopback_only(runner, flags):
    """Beam 2.50's own drivers bound the job and artifact services on every interface: a job
    server started for one local run took jobs, and their code, from the network. (The Fn API
    servers a TaskManager opens for its SDK workers during a job still do: docs/pipeline.md.)"""
    _built(runner)
    options = PipelineOptions(["--runner", f"{runner.capitalize()}Runner", *flags])
    jobserver.prepare_portable_run(options)
    with jobserver.local_job_server(options) as endpoint:
        assert endpoint is not None
        [server] = _job_servers(jobserver.JOB_SERVER_JARS[runner])
        listening = {conn.laddr for conn in server.net_connections("tcp") if conn.status == psutil.CONN_LISTEN}
        assert int(endpoint.rsplit(":", 1)[1]) in {address.port for address in listening}
        assert {address.ip for address in listening} <= LOOPBACK_ADDRESSES, listening
    assert _job_servers(jobserver.JOB_SERVER_JARS[runner]) == []


@pytest.mark.slow
def test_flink_local_writes_the_directrunners_outputs_byte_for_byte(flink_jar, embedded_pipeline_output, tmp_path):
    """The excerpt at parallelism 2 on a mini-cluster in the job server, every negative strategy;
    no JVM outlives the command."""
    out = tmp_path / "flink"
    done = _cli("--output", str(out), "--runner", "FlinkRunner", "--flink_master=[local]", "--parallelism=2",
                *ALL_NEGATIVES)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert _job_servers() == []
    _assert_the_directrunners_run(out, embedded_pipeline_output, "FlinkRunner")


@pytest.mark.slow
def test_a_sigkilled_launcher_takes_its_flink_job_server_along_and_overwrite_reclaims_the_folder(flink_jar, tmp_path):
    out = tmp_path / "out"
    flags = ["--runner", "FlinkRunner", "--flink_master=[local]", *FAST]
    launcher = subprocess.Popen([sys.executable, "-m", "pipeline.run", "--output", str(out), *flags],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Reading has begun once the reading DoFn's page counts appear in the launcher's progress folder.
    pattern = f"wikisim-run-{launcher.pid}-*/wikisim-progress-{launcher.pid}-*/*.json"
    deadline = time.monotonic() + 300
    while not list(Path(tempfile.gettempdir()).glob(pattern)):
        assert launcher.poll() is None and time.monotonic() < deadline, "the job never started reading"
        time.sleep(0.1)
    servers = _job_servers()
    assert launcher.poll() is None and len(servers) == 1
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    _, alive = psutil.wait_procs(servers, timeout=30)
    assert alive == [], "Flink's job server outlived its launcher"

    refused = _cli("--output", str(out), *flags)
    assert refused.returncode == 2 and "stale lock" in refused.stderr.strip().splitlines()[-1]
    reclaimed = _cli("--output", str(out), "--overwrite", *flags)
    assert reclaimed.returncode == 0, reclaimed.stderr[-3000:]
    opened = published.Run.open(str(out))
    assert all(opened.verify(folder) == 0 for folder in opened.manifest.outputs)
    assert _job_servers() == []


@pytest.mark.slow
def test_spark_local_writes_the_directrunners_outputs_byte_for_byte(spark_jar, embedded_pipeline_output, tmp_path):
    """The excerpt on Spark's `local[2]` inside Beam's Spark job server, every negative strategy; its
    job server is gone afterwards."""
    out = tmp_path / "spark"
    done = _cli("--output", str(out), "--runner", "SparkRunner", "--spark_master_url=local[2]", *ALL_NEGATIVES)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert _job_servers(spark_jar) == []
    _assert_the_directrunners_run(out, embedded_pipeline_output, "SparkRunner")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rest(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.load(response)


@pytest.mark.slow
def test_a_two_taskmanager_session_cluster_runs_the_job_byte_for_byte(flink_jar, embedded_pipeline_output, tmp_path):
    """infra/flink_cluster.sh: a JobManager and two TaskManagers, each its own JVM, on loopback; the
    launcher's job runs there at parallelism 2 (Flink's REST API shows both TaskManagers and the job
    FINISHED) and writes the DirectRunner's bytes; Ctrl-C stops every part of the cluster."""
    rest_port = _free_port()
    # Ctrl-C as a terminal sends it: SIGINT at its default in the script (a test run started in the
    # background inherits it ignored, and a shell cannot trap a signal ignored on entry).
    cluster = subprocess.Popen(["infra/flink_cluster.sh", str(rest_port), "2"], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert cluster.stderr is not None
        ready = cluster.stderr.readline()   # once the REST API lists every TaskManager
        assert ready.startswith(f"flink session cluster: http://127.0.0.1:{rest_port}, 2 TaskManagers"), ready
        assert len(_rest(rest_port, "/taskmanagers")["taskmanagers"]) == 2
        parts = [part for part in psutil.Process(cluster.pid).children() if part.name() == "java"]
        assert len(parts) == 3
        out = tmp_path / "cluster"
        done = _cli("--output", str(out), "--runner", "FlinkRunner", f"--flink_master=localhost:{rest_port}",
                    "--parallelism=2", *ALL_NEGATIVES)
        assert done.returncode == 0, done.stderr[-3000:]
        jobs = _rest(rest_port, "/jobs/overview")["jobs"]
        assert [job["state"] for job in jobs] == ["FINISHED"]
        _assert_the_directrunners_run(out, embedded_pipeline_output, "FlinkRunner")
        cluster.send_signal(signal.SIGINT)
        cluster.wait(timeout=60)
        _, alive = psutil.wait_procs(parts, timeout=30)
        assert alive == []
    finally:
        if cluster.poll() is None:
            cluster.terminate()
            cluster.wait(timeout=60)


def test_the_cluster_script_refuses_a_busy_port_in_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(["infra/flink_cluster.sh", str(port), "2"], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: REST_PORT {port}: something already listens on "
                                                f"127.0.0.1:{port}"]
