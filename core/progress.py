"""Progress of a local run: pages read and gone on to parsing so far (`pipeline.read.pages`), pages/s
and the total the index lists.

Beam's local runners give the launching process no counters until the pipeline ends (and the
multi-process DirectRunner's workers are other processes), so each reading DoFn instance
reports its own running counts into a small file of a shared local folder (`PageCounts`),
and the launching process sums them into a tqdm bar (`show_progress`). Only for runners whose
workers share this machine's disk (DirectRunner, PrismRunner); on Dataflow the job's page
shows the counters.

While the job runs, the process's stderr (file descriptor 2, which worker processes inherit)
goes to a log file: Beam's worker logs stay there and the terminal shows the bar.

Every command's bars are `progress_bar`s: a bar on a terminal, sparse lines in a log file.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import IO, TYPE_CHECKING, Any, TypeVar

from core.files import write_complete
from core.runner import Runner

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions
    from tqdm import tqdm

T = TypeVar("T")

REPORT_EVERY_S = 1.0
LOG_LINE_EVERY_S = 30.0   # how often a progress bar writes to a stderr that is a file (a log), not a terminal


def _counts(line: str) -> str:
    """A bar's line without its times (`read: 40%|####  | 4/10 [00:02<00:03, 2.0 pages/s]` ->
    `read: 40%|####  | 4/10`): what says whether it tells anything the line before did not."""
    counts, bracket, times = line.rpartition(" [")
    return counts if bracket and times.endswith("]") else line


class _LogLines:
    """A log file as a progress bar's stream: each refresh a line of its own. tqdm redraws its bar
    behind a carriage return, which a file keeps: every refresh on one ever longer line. A refresh
    whose counts are the last line's is dropped (tqdm's closing redraw of a bar whose last update
    already wrote its end: the same counts, only a later time and rate)."""

    def __init__(self, stream: IO[str]):
        self.stream = stream
        self.last = ""

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line and _counts(line) != self.last:   # not tqdm's clearing writes, nor a repeat of the last counts
            self.stream.write(line + "\n")
            self.last = _counts(line)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def timed(seconds: MutableMapping[str, float], step: str) -> Iterator[None]:
    """Adds the wall time of the `with` block to `seconds[step]` (a report's or a profile's time per step)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[step] = seconds.get(step, 0.0) + time.perf_counter() - start


def progress_bar(iterable: Iterable[T] | None = None, **options: Any) -> tqdm[Any]:
    """tqdm with `options` (`desc`, `unit`, `total`, `file`: stderr by default) where a terminal
    shows it; on a stream that is not one (a log file) a line every LOG_LINE_EVERY_S seconds, not
    a bar redrawn ten times a second, and a last line when it closes."""
    from tqdm import tqdm

    stream = options.pop("file", None) or sys.stderr
    if not stream.isatty():
        every = max(options.pop("mininterval", 0.0), LOG_LINE_EVERY_S)
        options.update(file=_LogLines(stream), mininterval=every, maxinterval=every, leave=True,
                       dynamic_ncols=False)
    else:
        options["file"] = stream
    return tqdm(iterable, **options)


class PageCounts:
    """One reading DoFn instance's running counts, rewritten (atomically) at most once a second."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, f"{uuid.uuid4().hex}.json")
        self.pages = self.dead_letters = 0
        self.reported_at = 0.0
        launcher = int(os.path.basename(folder).split("-")[2])
        if os.getpid() != launcher:   # a worker process of a local multi-process run
            end_with_launcher()

    def add(self, pages: int = 0, dead_letters: int = 0) -> None:
        self.pages += pages
        self.dead_letters += dead_letters
        if time.monotonic() - self.reported_at >= REPORT_EVERY_S:
            self.flush()

    def flush(self) -> None:
        write_complete(self.path, json.dumps({"pages": self.pages, "dead_letters": self.dead_letters}).encode())
        self.reported_at = time.monotonic()


def total_counts(folder: str) -> tuple[int, int]:
    """(pages, dead letters) summed over every reader's file."""
    pages = dead = 0
    for name in os.listdir(folder):
        if name.endswith(".json"):
            try:
                with open(os.path.join(folder, name)) as handle:
                    counts = json.load(handle)
            except (OSError, ValueError):   # replaced while being read: counted at the next poll
                continue
            pages += counts["pages"]
            dead += counts["dead_letters"]
    return pages, dead


@contextlib.contextmanager
def show_progress(folder: str, pages_total: Callable[[], int] | None, log_path: str,
                  interval_s: float = 2.0) -> Iterator[None]:
    """While the block runs: a bar of pages read (of the total `pages_total` counts in a background
    thread, when the job can tell it: every input has an index) on the terminal's stderr, and everything else
    written to fd 2 (Beam's logs, worker processes' output) appended to `log_path`."""
    terminal = os.fdopen(os.dup(2), "w")
    if not terminal.isatty():   # a log file gets a line every 30 s, not a redrawn bar
        interval_s = max(interval_s, LOG_LINE_EVERY_S)
    bar = progress_bar(desc="read", unit=" pages", file=terminal, mininterval=interval_s, dynamic_ncols=True)
    done = threading.Event()

    def count_total():
        assert pages_total is not None, "only started with a counter"
        total = pages_total()
        if not done.is_set():
            bar.total = total
            bar.refresh()

    def poll():
        while not done.wait(interval_s):
            pages, dead = total_counts(folder)
            bar.set_postfix_str(f"dead letters {dead:,}", refresh=False)
            bar.update(pages - bar.n)

    threads = [threading.Thread(target=poll, daemon=True)]
    if pages_total is not None:
        threads.append(threading.Thread(target=count_total, daemon=True))
    sys.stderr.flush()
    saved_stderr = os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        for thread in threads:
            thread.start()
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        done.set()
        threads[0].join()
        pages, dead = total_counts(folder)
        bar.set_postfix_str(f"dead letters {dead:,}", refresh=False)
        bar.update(pages - bar.n)
        bar.close()
        terminal.close()


def progress_folder() -> str:
    """A fresh folder named after the launching process (`PageCounts` tells workers by it)."""
    return tempfile.mkdtemp(prefix=f"wikisim-progress-{os.getpid()}-")


def end_with_launcher(poll_s: float = 1.0) -> None:
    """Ends this worker process once its parent, the launching process, is gone: Beam's local
    multi-process runner starts its workers as plain subprocesses, which a killed launcher
    would leave running (reparented) for ever. A daemon thread polls the parent pid."""
    if any(thread.name == "end-with-launcher" for thread in threading.enumerate()):
        return   # one watcher per worker process, however many DoFn instances it runs
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="end-with-launcher", daemon=True).start()


def _descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, from Linux's /proc (none where it is absent)."""
    found: list[int] = []
    parents = [pid]
    while parents:
        parent = parents.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as listed:
                    children = [int(child) for child in listed.read().split()]
            except OSError:
                continue
            found += children
            parents += children
    return found


@contextlib.contextmanager
def workers_end_on_interrupt(options: PipelineOptions) -> Iterator[None]:
    """Ctrl-C while the block runs a DirectRunner job (run with `options`) ends the
    processes this one started (its local workers) at once, then raises KeyboardInterrupt as
    usual: Beam's multi-process DirectRunner, left to itself, ended its workers through the
    broken gRPC streams, in seconds and with their tracebacks (`eval.scb`, 2 workers: 2.3 s and a
    `grpc.RpcError`, against 0.6 s and one line). Other runners' jobs are ended their own way (a
    job server's cancel).
    Only where SIGINT has Python's default handler, from the main thread; restored after. An
    interrupt that lands inside a DoFn of the in-memory runner, which Beam re-raises as a
    RuntimeError naming its step, leaves the block as the KeyboardInterrupt it was. What
    the ended workers' threads and logs then say (a worker "exited with return code -15", a
    harness's KeyboardInterrupt) is the interrupt's echo, not a fault: silenced from then on (the
    process is ending), so Ctrl-C stays one line `interrupted` (`core.cli.run_cli`)."""
    import logging
    import signal

    if (not Runner.of(options).is_direct
            or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return

    interrupts = []

    def interrupted(signum, frame):
        interrupts.append(signum)
        threading.excepthook = lambda args: None   # for good: the process is on its way out
        logging.disable(logging.CRITICAL)
        for child in reversed(_descendants(os.getpid())):   # the deepest first: workers before their shells
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGTERM)
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    except Exception as error:
        if interrupts:   # Beam re-raises a DoFn's KeyboardInterrupt as "RuntimeError: KeyboardInterrupt [while ...]"
            raise KeyboardInterrupt from error
        raise
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
