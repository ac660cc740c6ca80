"""Progress bars (`core.progress.progress_bar`) as a user sees them, from real processes: a
bar redrawn in place on a terminal, and in a log file a line now and then that reads as counts
(not `0triplet`, not the same bar written over and over on one line)."""
import fcntl
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# About a second of reading 50 batches of 4,096 triplets behind a bar
READING = ("import time\nfrom core.progress import progress_bar\n"
           "with progress_bar(desc='read triplets-sen/test', unit=' triplets', unit_scale=True) as bar:\n"
           "    for _ in range(50):\n        time.sleep(0.02)\n        bar.update(4096)\n")


def test_a_bar_written_to_a_log_file_is_a_first_and_a_last_line_reading_as_counts(tmp_path):
    log = tmp_path / "log"
    with open(log, "w") as stderr:
        subprocess.run([sys.executable, "-c", READING], cwd=REPO, stderr=stderr, check=True, timeout=120)
    text = log.read_text()
    assert "\r" not in text
    first, last = text.splitlines()   # a line every 30 s: the second's only its last
    assert first.startswith("read triplets-sen/test: 0.00 triplets [00:00")
    assert last.startswith("read triplets-sen/test: 205k triplets [00:0") and "k triplets/s]" in last


def test_a_bar_on_a_terminal_is_redrawn_in_place(tmp_path):
    main, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # a new pty is 0 columns wide
    process = subprocess.Popen([sys.executable, "-c", READING], cwd=REPO, stderr=terminal)
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:   # the terminal's other end closed: the process is gone
            break
        if not chunk:
            break
        shown += chunk
    os.close(main)
    assert process.wait(timeout=120) == 0
    text = shown.decode()
    assert text.count("\r") > 3 and "205k triplets" in text


# A DirectRunner job's worker, as Beam starts them (a shell), interrupted by Ctrl-C in the block;
# prints the worker's exit status and SIGINT's handler after, or what went otherwise.
INTERRUPTED_JOB = """
import os, signal, subprocess, threading, time
from apache_beam.options.pipeline_options import PipelineOptions
from core.progress import workers_end_on_interrupt
DIRECT, DATAFLOW = PipelineOptions([]), PipelineOptions(["--runner=DataflowRunner"])
worker = subprocess.Popen(["sh", "-c", "sleep 600 & wait"])
try:
    with workers_end_on_interrupt(DIRECT):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)
    print("not interrupted")
except KeyboardInterrupt:
    print("worker", worker.wait(timeout=30))
    echo = threading.Thread(target=lambda: 1 / 0)   # a thread failing because its worker ended
    echo.start()
    echo.join()
finally:
    worker.kill()
print("restored", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
try:
    with workers_end_on_interrupt(DIRECT):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(60)
        except KeyboardInterrupt as error:   # as Beam re-raises it from a DoFn of the in-memory runner
            raise RuntimeError("KeyboardInterrupt [while running 'Step']") from error
except KeyboardInterrupt:
    print("unwrapped")
with workers_end_on_interrupt(DATAFLOW):
    print("other runners untouched", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


def test_ctrl_c_during_a_direct_job_ends_the_processes_it_started_at_once():
    """The worker ends (SIGTERM) and KeyboardInterrupt is raised as usual, with no traceback from
    the threads that fail because of it (Beam, left to itself, ended its workers through broken
    gRPC streams, with their tracebacks).
    An interrupt Beam wrapped in a RuntimeError leaves the block as the KeyboardInterrupt it was.
    SIGINT's handler is restored after the block, and left alone for other runners. Ctrl-C's
    disposition as in a terminal (a background test run starts its children with SIGINT ignored)."""
    import signal

    done = subprocess.run([sys.executable, "-c", INTERRUPTED_JOB], cwd=REPO, capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.stdout.split("\n")[:4] == [f"worker {-signal.SIGTERM}", "restored True", "unwrapped",
                                           "other runners untouched True"], done.stdout + done.stderr[-2000:]
    assert "Traceback" not in done.stderr   # the interrupt's echo in other threads is not shown


def test_a_bar_in_a_log_writes_each_count_once_and_its_last_line_once(monkeypatch):
    """tqdm's closing redraw repeats the counts its last refresh wrote (only the time and rate
    differ): a log keeps one line of them."""
    import io
    import time

    from core import progress

    monkeypatch.setattr(progress, "LOG_LINE_EVERY_S", 0.0)
    log = io.StringIO()
    bar = progress.progress_bar(desc="read", unit=" pages", total=10, file=log)
    for _ in range(10):
        bar.update(1)
        bar.refresh()   # the refresh a 30 s interval would make
        time.sleep(0.01)
    bar.refresh()   # nothing new since the last line
    time.sleep(0.02)
    bar.close()
    lines = log.getvalue().splitlines()
    counts = [line.split(" [")[0] for line in lines]
    assert [a for a, b in zip(counts, counts[1:]) if a == b] == []
    assert [line for line in lines if "10/10" in line] == [lines[-1]]


def test_the_runs_log_is_named_only_when_it_holds_something(tmp_path):
    """The in-memory DirectRunner's log stays empty: the launcher pointed users at a 0-byte file."""
    from pipeline.run import log_line

    log = tmp_path / "pipeline.log"
    log.write_bytes(b"")
    assert log_line(str(log)) is None and log_line(None) is None and log_line(str(tmp_path / "none")) is None
    log.write_text("WARNING a\nWARNING b\n")
    assert log_line(str(log)) == f"pipeline: Beam's log (2 lines) in {log}"
