"""The job on a portable runner: Beam's Prism (a Go binary, `make prism`), its SDK harness in the
launching process (LOOPBACK). Its outputs are the DirectRunner's byte for byte, its counters come
back through Beam's job service, and the launcher's guarantees hold with a job server process
beside it. How a portable runner reports counters is read through Beam's own `PortableMetrics`."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import apache_beam
import pytest
from apache_beam.metrics import monitoring_infos
from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions
from apache_beam.portability.api import beam_job_api_pb2, metrics_pb2
from apache_beam.runners.portability.portable_runner import PortableMetrics
from dump_support import ALL_NEGATIVES

from core import jobserver, published
from core.cli import UsageError
from core.counters import NAMESPACE, CountersMissingError, job_totals
from core.runner import Runner
from pipeline import run

REPO = Path(__file__).resolve().parents[2]
PRISM = REPO / ".cache" / "prism" / f"v{apache_beam.__version__}" / "prism"
FAST = ["--spacy-model", "blank:en"]
NOT_COMPARED = {"stats.json", "pipeline.log"}   # the runner's name and wall time; Beam's and Prism's logs


class _JobMetrics:
    """What a portable runner's PipelineResult.metrics() reads: Beam's PortableMetrics of a job
    service's GetJobMetricsResponse, here with the monitoring infos a runner would send."""

    def __init__(self, committed, attempted):
        response = beam_job_api_pb2.GetJobMetricsResponse(
            metrics=beam_job_api_pb2.MetricResults(committed=committed, attempted=attempted))
        self._metrics = PortableMetrics(response)

    def metrics(self):
        return self._metrics


def _counter(name: str, value: int, step: str) -> metrics_pb2.MonitoringInfo:
    return monitoring_infos.int64_user_counter(NAMESPACE, name, value, ptransform=step)


def test_counters_a_runner_reports_as_attempted_only_are_read_summed_over_steps():
    """Flink's job service reports attempted values and commits none; Prism the reverse."""
    infos = [_counter("pages_read", 150, "ReadDump/a"), _counter("pages_read", 56, "ReadDump/b"),
             _counter("articles_used", 63, "BuildArticles")]
    expected = {"pages_read": 206, "articles_used": 63}
    assert job_totals(_JobMetrics(committed=[], attempted=infos)) == expected
    assert job_totals(_JobMetrics(committed=infos, attempted=[])) == expected


def test_a_runner_that_reports_no_counters_fails_the_run_rather_than_reconciling_zeros(tmp_path):
    other = monitoring_infos.int64_user_counter("another", "pages_read", 206, ptransform="ReadDump")
    config, _ = run.parse_args(["--output", str(tmp_path / "out")])
    with pytest.raises(CountersMissingError, match="reported none of the job's counters"):
        run.counters_of(_JobMetrics(committed=[], attempted=[other]), config, Runner("FlinkRunner"))


def test_under_a_portable_runner_the_launcher_waits_on_a_job_for_days_unless_told_otherwise():
    """Beam's deadline of the launcher's stream of job states is --job_server_timeout (300 s):
    under Prism, the deadline of the whole job (the slow test below shows it)."""
    def deadline(*flags: str) -> int:
        options = PipelineOptions(list(flags))
        jobserver.prepare_portable_run(options)
        return options.view_as(PortableOptions).job_server_timeout

    assert deadline("--runner", "PrismRunner") == jobserver.JOB_WAIT_S >= 7 * 24 * 3600
    assert deadline("--runner", "PortableRunner", "--job_endpoint", "embed") == jobserver.JOB_WAIT_S
    assert deadline("--runner", "PrismRunner", "--job_server_timeout", "50") == 50
    assert deadline("--runner", "DirectRunner") == deadline() == 300


def test_a_job_endpoint_nothing_answers_is_one_error_naming_it_before_any_work(tmp_path):
    import socket

    with socket.socket() as sock:   # a port nothing listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        endpoint = f"localhost:{sock.getsockname()[1]}"
        with pytest.raises(UsageError, match=f"--job_endpoint {endpoint}: no Beam job service answers"):
            run.main(["--output", str(tmp_path / "out"), "--runner", "PrismRunner", "--job_endpoint", endpoint])
    assert not (tmp_path / "out").exists()


def test_a_job_endpoint_that_accepts_and_never_answers_is_one_error_within_seconds(tmp_path, monkeypatch):
    """A port that completes TCP's handshake but is no job server: the launcher waited at "read: 0
    pages" for its 30-day deadline, holding the folder."""
    import socket

    monkeypatch.setattr(jobserver, "ANSWER_TIMEOUT_S", 1.0)
    with socket.socket() as sock:   # listening: the kernel accepts connections nobody ever serves
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        endpoint = f"localhost:{sock.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(UsageError, match=f"--job_endpoint {endpoint}: no Beam job service answers there "
                                             r"within 1 s \(DEADLINE_EXCEEDED"):
            run.main(["--output", str(tmp_path / "out"), "--runner", "PortableRunner", "--job_endpoint", endpoint])
    assert time.monotonic() - started < 30
    assert not (tmp_path / "out").exists()


def test_prism_without_its_binary_is_one_error_before_any_work(tmp_path, monkeypatch):
    out = tmp_path / "out"
    missing = tmp_path / "prism"
    with pytest.raises(UsageError, match=f"--prism_location {missing}: no such file .*make prism"):
        run.main(["--output", str(out), "--runner", "PrismRunner", "--prism_location", str(missing)])
    monkeypatch.setattr(jobserver, "prism_binary", lambda: missing)
    with pytest.raises(UsageError, match=f"--runner PrismRunner: no Prism binary at {missing} .*make prism"):
        run.main(["--output", str(out), "--runner", "PrismRunner"])
    assert not out.exists()   # nothing claimed: no _UNPUBLISHED for the next try to trip on


def test_prism_finds_the_binary_make_prism_built(monkeypatch, tmp_path):
    from apache_beam.options.pipeline_options import PrismRunnerOptions

    built = tmp_path / "prism"
    built.write_bytes(b"")
    monkeypatch.setattr(jobserver, "prism_binary", lambda: built)
    options = PipelineOptions(["--runner", "PrismRunner"])
    jobserver.prepare_portable_run(options)
    assert options.view_as(PrismRunnerOptions).prism_location == str(built)


@pytest.mark.parametrize("kind, config, complaint", [
    ("EXTERNAL", None, "takes HOST:PORT of an SDK worker pool"),
    ("EXTERNAL", "localhost", "takes HOST:PORT of an SDK worker pool"),
    ("EXTERNAL", "localhost:notaport", "takes HOST:PORT of an SDK worker pool"),
    ("PROCESS", "not json", 'takes a JSON object with the "command"'),
    ("PROCESS", '{"cmd": "boot"}', 'takes a JSON object with the "command"'),
])
def test_an_environment_config_its_type_cannot_read_is_one_error_before_any_work(tmp_path, kind, config, complaint):
    """A malformed one reached Prism's Go job server, which panicked (taking a shared set-up down)."""
    flags = ["--environment_type", kind, *(["--environment_config", config] if config else [])]
    with pytest.raises(UsageError, match=f"--environment_type {kind} {complaint}"):
        run.main(["--output", str(tmp_path / "out"), "--runner", "PrismRunner", "--job_endpoint", "embed", *flags])
    assert not (tmp_path / "out").exists()


def test_an_external_worker_pool_nothing_listens_at_is_one_error_before_any_work(tmp_path):
    import socket

    with socket.socket() as sock:   # bound, never listening
        sock.bind(("127.0.0.1", 0))
        pool = f"localhost:{sock.getsockname()[1]}"
        with pytest.raises(UsageError, match=f"--environment_config {pool}: no SDK worker pool listens there"):
            run.main(["--output", str(tmp_path / "out"), "--runner", "PrismRunner", "--job_endpoint", "embed",
                      "--environment_type", "EXTERNAL", "--environment_config", pool])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("failure, line", [
    (RuntimeError("Pipeline BeamApp-1 failed in state FAILED: java.lang.IllegalStateException: SDK harness "
                  "closed connection\n\tat org.apache.beam.Foo(Foo.java:1)"),
     "the job on FlinkRunner failed in state FAILED: java.lang.IllegalStateException: SDK harness closed "
     "connection; nothing was published (the runner's log: OUT/pipeline.log)"),
])
def test_a_failed_portable_job_is_one_line_naming_the_runner_and_its_log(failure, line):
    from core.cli import DataLossError

    options = PipelineOptions(["--runner", "FlinkRunner"])
    with pytest.raises(DataLossError) as raised, jobserver.job_failures(options, "OUT/pipeline.log"):
        raise failure
    assert str(raised.value) == line
    with pytest.raises(ValueError), jobserver.job_failures(options, None):   # not a job's failure: as it is
        raise ValueError("other")
    with pytest.raises(RuntimeError), jobserver.job_failures(PipelineOptions([]), None):   # a local runner's
        raise failure


# ---------------------------------------------------------------- real runs on Prism

@pytest.fixture(scope="module")
def prism() -> str:
    if not os.access(PRISM, os.X_OK):
        pytest.fail(f"no Prism binary at {PRISM}: `make prism` builds it (make test does)")
    return str(PRISM)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.run", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=900)


def _files(out: Path) -> dict[str, bytes]:
    return {str(path.relative_to(out)): path.read_bytes() for path in sorted(out.rglob("*"))
            if path.is_file() and path.name not in NOT_COMPARED}


def _processes_running(binary: str) -> list[int]:
    """Live (not zombie) processes whose command is `binary`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if command == binary and state != "Z":
                found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_prism_writes_the_directrunners_outputs_byte_for_byte(prism, embedded_pipeline_output, tmp_path):
    """The excerpt with every negative strategy: every shard, Parquet twin, JSON-lines file and the
    manifest the same bytes as the DirectRunner's, the same counters and reconciliation, a run
    that Run.verify accepts, and no job server left once the command is over."""
    out = tmp_path / "prism"
    done = _cli("--output", str(out), "--runner", "PrismRunner", "--prism_location", prism, *ALL_NEGATIVES)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert _processes_running(prism) == []

    direct = _files(embedded_pipeline_output)
    assert sorted(_files(out)) == sorted(direct)
    assert sum(name.endswith(".tfrecord.gz") for name in direct) >= 12
    assert [name for name, data in _files(out).items() if data != direct[name]] == []

    stats = json.loads((out / "stats.json").read_text())
    direct_stats = json.loads((embedded_pipeline_output / "stats.json").read_text())
    assert stats["runner"] == "PrismRunner"
    assert stats["counters"] == direct_stats["counters"]
    assert stats["reconciliation"] == direct_stats["reconciliation"] and stats["reconciliation"]["balanced"]
    opened = published.Run.open(str(out))
    for folder, output in opened.manifest.outputs.items():
        assert opened.verify(folder) == 0
        assert sum(shard.records for shard in output.shards) == output.records


@pytest.mark.slow
def test_a_sigkilled_launcher_takes_its_prism_job_server_along_and_overwrite_reclaims_the_folder(prism, tmp_path):
    out = tmp_path / "out"
    launcher = subprocess.Popen([sys.executable, "-m", "pipeline.run", "--output", str(out), "--runner",
                                 "PrismRunner", "--prism_location", prism, *FAST],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Reading has begun once the reading DoFn's page counts appear in the launcher's progress folder.
    counts = Path(tempfile.gettempdir()).glob
    pattern = f"wikisim-run-{launcher.pid}-*/wikisim-progress-{launcher.pid}-*/*.json"
    deadline = time.monotonic() + 300
    while not list(counts(pattern)):
        assert launcher.poll() is None and time.monotonic() < deadline, "the job never started reading"
        time.sleep(0.1)
    servers = _processes_running(prism)
    assert launcher.poll() is None and len(servers) == 1
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 30
    while [pid for pid in servers if pid in _processes_running(prism)]:
        assert time.monotonic() < deadline, f"Prism's job server {servers} outlived its launcher"
        time.sleep(0.5)

    refused = _cli("--output", str(out), "--runner", "PrismRunner", "--prism_location", prism, *FAST)
    assert refused.returncode == 2 and "stale lock" in refused.stderr.strip().splitlines()[-1]
    reclaimed = _cli("--output", str(out), "--overwrite", "--runner", "PrismRunner", "--prism_location", prism, *FAST)
    assert reclaimed.returncode == 0, reclaimed.stderr[-3000:]
    opened = published.Run.open(str(out))
    assert all(opened.verify(folder) == 0 for folder in opened.manifest.outputs)
    assert not list(out.rglob("beam-temp-*"))


@pytest.mark.slow
def test_beams_job_server_timeout_is_the_deadline_of_a_prism_job(prism, tmp_path):
    """Why `jobserver.prepare_portable_run` raises it: with Beam's 300 s a longer job failed."""
    done = _cli("--output", str(tmp_path / "out"), "--runner", "PrismRunner", "--prism_location", prism,
                "--job_server_timeout", "2", *FAST)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the job on PrismRunner: its job service stopped answering (DEADLINE_EXCEEDED")
    assert not (tmp_path / "out" / "manifest.json").exists()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _processes_under(root: int) -> list[int]:
    """Every live descendant of process `root`."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _snapshot(out: Path) -> dict[str, tuple[int, int]]:
    return {str(path): (path.stat().st_size, path.stat().st_mtime_ns) for path in out.rglob("*") if path.is_file()}


@pytest.mark.slow
def test_ctrl_c_on_a_standalone_set_up_cancels_the_job_before_the_lock_goes(prism, tmp_path):
    """On a job server that outlives the launcher (infra/prism_cluster.sh: Prism and a pool of SDK
    worker processes), the job would write on after Ctrl-C ended the command and released the
    folder; the launcher cancels it first."""
    job_port, pool_port = _free_port(), _free_port()
    cluster = subprocess.Popen(["infra/prism_cluster.sh", str(job_port), str(pool_port)], cwd=REPO,
                               env={**os.environ, "PY": sys.executable},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (_listening(job_port) and _listening(pool_port)):
            assert cluster.poll() is None and time.monotonic() < deadline, "the set-up never listened"
            time.sleep(0.2)
        out = tmp_path / "out"
        # PortableRunner: no page-count folder, whose removal at the launcher's exit would fail the
        # job's reading DoFn (and so end the job) by accident.
        launcher = subprocess.Popen(
            [sys.executable, "-m", "pipeline.run", "--output", str(out), "--runner", "PortableRunner",
             "--job_endpoint", f"localhost:{job_port}", "--environment_type", "EXTERNAL",
             "--environment_config", f"localhost:{pool_port}", *FAST],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # a terminal's Ctrl-C
        # The job has begun once the pool started its SDK worker (a child of the pool's process).
        while not [pid for pid in _processes_under(cluster.pid) if b"SdkHarness" in _cmdline(pid)]:
            assert launcher.poll() is None and time.monotonic() < deadline + 180, "the job never started"
            time.sleep(0.1)
        time.sleep(2)
        launcher.send_signal(signal.SIGINT)
        _, stderr = launcher.communicate(timeout=120)
        assert launcher.returncode == 130 and stderr.strip().splitlines()[-1] == "interrupted", stderr[-2000:]
        assert not (out / "_RUNNING").exists() and (out / "_UNPUBLISHED").exists()
        written = _snapshot(out)
        time.sleep(30)   # the excerpt's job takes less on its own
        assert _snapshot(out) == written, "the job wrote on after the command ended"
        assert not (out / "manifest.json").exists()
    finally:
        cluster.terminate()
        cluster.wait(timeout=30)


def test_the_prism_set_up_refuses_a_busy_port_in_one_line():
    """It printed its ready line, then Prism panicked on the port, and its own error line never came."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(["infra/prism_cluster.sh", str(port), str(_free_port())], cwd=REPO, capture_output=True,
                              text=True, timeout=60, env={**os.environ, "PY": sys.executable})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: port {port}: something already listens on 127.0.0.1:{port}"]


@pytest.mark.slow
def test_a_part_of_the_prism_set_up_that_dies_ends_it_in_one_error_line(prism):
    """`set -e` ended the script at `wait -n` before its error line (and so silently)."""
    job_port, pool_port = _free_port(), _free_port()
    cluster = subprocess.Popen(["infra/prism_cluster.sh", str(job_port), str(pool_port)], cwd=REPO,
                               env={**os.environ, "PY": sys.executable}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert cluster.stderr is not None
        ready = cluster.stderr.readline()   # its ready line, once both parts listen
        assert ready.startswith(f"prism job server: localhost:{job_port}"), ready
        [server] = [pid for pid in _processes_under(cluster.pid)
                    if _cmdline(pid).split(b"\0")[0].endswith(b"/prism")]
        os.kill(server, signal.SIGKILL)
        _, stderr = cluster.communicate(timeout=60)
        assert cluster.returncode == 1
        assert stderr.strip().splitlines()[-1] == "error: a part of the set-up exited; stopping the other"
        assert not [pid for pid in _processes_under(cluster.pid)]
    finally:
        if cluster.poll() is None:
            cluster.terminate()
            cluster.wait(timeout=30)
