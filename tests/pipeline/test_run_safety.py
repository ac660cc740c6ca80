"""No run exits 0 with lost or mixed data: output folders owned by one run, lost input fails the
run, readers take only published (manifest) runs. Faults are planted in copies of the real
excerpt (a few of its streams)."""
import bz2
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from core import folders, published
from pipeline import run
from pipeline.read import dump_writers
from pipeline.read.dumps import embedded_dump_path

pytestmark = pytest.mark.slow   # pipeline runs in subprocesses

REPO = Path(__file__).resolve().parents[2]
PAGES, PER_STREAM = 40, 10
FAST = ["--spacy-model", "blank:en"]


@pytest.fixture(scope="module")
def small_multistream(tmp_path_factory):
    """The excerpt's first 40 pages as a 4-stream multistream dump with its index."""
    header, pages = dump_writers.dump_parts(embedded_dump_path())
    folder = tmp_path_factory.mktemp("dump")
    dump, index = folder / "small-multistream.xml.bz2", folder / "small-multistream-index.txt.bz2"
    dump_writers.write_multistream_dump(header, [next(pages) for _ in range(PAGES)], str(dump), str(index), PER_STREAM)
    return dump, index


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pipeline.run", *args], cwd=REPO, capture_output=True, text=True)


def test_a_published_run_has_a_manifest_of_every_shard_and_a_reused_output_is_refused(small_multistream, tmp_path):
    dump, _ = small_multistream
    out = tmp_path / "out"
    stats = run.main(["--output", str(out), "--input", str(dump), *FAST])
    opened = published.Run.open(str(out))
    train_shards, train_records = opened.paths("triplets-sen/train"), opened.output("triplets-sen/train").records
    assert train_records == stats["counters"]["triplets-sen/train"] > 0
    assert all(Path(path).exists() for path in train_shards)
    assert opened.output("scb").records == stats["counters"]["scb_articles"]
    assert not (out / folders.LOCK).exists()
    # A second run into the same folder (e.g. with another worker count) refuses before any work.
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    result = _cli("--output", str(out), "--input", str(dump), *FAST)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: --output {out} already holds a run")
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    # A file no run lists, even one named like a shard, is not deleted: --overwrite refuses.
    stray = out / "triplets-sen" / "train" / "part-00000-of-00009.tfrecord.gz"
    stray.write_bytes(b"stray shard")
    result = _cli("--output", str(out), "--input", str(dump), "--overwrite", *FAST)
    assert result.returncode == 2 and "triplets-sen/train/part-00000-of-00009.tfrecord.gz" in result.stderr
    assert stray.read_bytes() == b"stray shard" and (out / published.MANIFEST).exists()
    # --overwrite replaces it: exactly the first run's files go, nothing of it is left beside the second.
    stray.unlink()
    run.main(["--output", str(out), "--input", str(dump), "--overwrite", *FAST])
    assert published.Run.open(str(out)).output("triplets-sen/train").records == train_records


def test_a_folder_being_written_or_holding_other_files_is_refused(tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / folders.LOCK).write_text("{}")          # a run is writing here (or died here)
    with pytest.raises(folders.OutputInUseError, match="lock"):
        folders.claim_output(str(busy), overwrite=False, folders=["scb"])
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("mine")
    with pytest.raises(folders.OutputInUseError, match="thesis.tex"):
        folders.claim_output(str(other), overwrite=True, folders=["scb"])
    assert (other / "thesis.tex").read_text() == "mine"


def test_a_lock_of_a_dead_process_is_stale_and_replaced_only_with_overwrite(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    (out / folders.LOCK).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "folders": ["scb"],
                                                "files": [published.RUN_LOG]}))
    (out / "scb" / "beam-temp-part-1234").mkdir(parents=True)               # what the dead run left
    (out / "scb" / "beam-temp-part-1234" / "a.jsonl.gz").write_bytes(b"partial")
    (out / published.RUN_LOG).write_text("log")
    with pytest.raises(folders.OutputInUseError, match="stale"):
        folders.claim_output(str(out), overwrite=False, folders=["scb"])
    folders.claim_output(str(out), overwrite=True, folders=["scb"])
    assert sorted(os.listdir(out)) == [folders.LOCK]                          # exactly what its lock lists, gone
    assert json.loads((out / folders.LOCK).read_text())["pid"] == os.getpid()


def test_a_stale_index_fails_the_run_naming_the_cause(small_multistream, tmp_path):
    dump, index = small_multistream
    lines = bz2.decompress(index.read_bytes()).decode().splitlines()
    stale = tmp_path / "stale-index.txt.bz2"                  # every offset 7 bytes off
    stale.write_bytes(bz2.compress("".join(f"{int(o) + 7}:{rest}\n" for o, rest in
                                           (line.split(":", 1) for line in lines)).encode()))
    out = tmp_path / "out"
    result = _cli("--output", str(out), "--input", str(dump), "--index", str(stale), *FAST)
    assert result.returncode == 1
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("error: ") and f"of the {PAGES} pages its index lists" in message
    assert "index of another dump" in message
    stats = json.loads((out / "stats.json").read_text())          # written before failing, for inspection
    assert stats["reconciliation"]["index_pages"] == PAGES and stats["reconciliation"]["pages_read"] < PAGES
    assert not (out / published.MANIFEST).exists()                   # never published: readers refuse it


def test_a_truncated_dump_without_index_is_a_loss_of_unknown_size(small_multistream, tmp_path):
    dump, _ = small_multistream
    cut = tmp_path / "cut.xml.bz2"                    # no index beside it: one sequential read
    data = dump.read_bytes()
    cut.write_bytes(data[: len(data) * 6 // 10])
    out = tmp_path / "out"
    result = _cli("--output", str(out), "--input", str(cut), *FAST)
    assert result.returncode == 1
    assert "unknown number of pages" in result.stderr.strip().splitlines()[-1]
    assert json.loads((out / "stats.json").read_text())["reconciliation"]["streams_lost_unknown_pages"] == 1
    # Accepting the loss is explicit.
    result = _cli("--output", str(out), "--input", str(cut), "--overwrite", "--max-lost-fraction", "1", *FAST)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (out / published.MANIFEST).exists()


@pytest.mark.parametrize("kind", ["file", "read-only"])
def test_an_unusable_output_is_one_error_line_before_any_work(small_multistream, tmp_path, kind):
    import os

    if kind == "read-only" and os.geteuid() == 0:
        pytest.skip("root may write into read-only folders")
    dump, _ = small_multistream
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("not a folder")
        expected = f"error: --output {out} is a file, not a folder"
    else:
        tmp_path.chmod(0o555)
        expected = f"error: --output {out} is not writable"
    try:
        result = _cli("--output", str(out), "--input", str(dump), *FAST)
    finally:
        tmp_path.chmod(0o755)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(expected)


def test_a_page_without_its_own_id_is_not_named_by_its_revision_id():
    from pipeline.read.dumps import page_id_and_title

    page = b"<page><title>No id</title><ns>0</ns><revision><id>987</id><text>x</text></revision></page>"
    assert page_id_and_title(page) == (None, "No id")
    assert page_id_and_title(page.replace(b"<ns>0</ns>", b"<ns>0</ns><id>12</id>")) == (12, "No id")


def test_a_second_run_into_a_folder_being_written_refuses_and_the_first_completes(small_multistream, tmp_path):
    import time

    dump, _ = small_multistream
    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-m", "pipeline.run", "--output", str(out), "--seed", "0", *FAST],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)   # the whole excerpt
    deadline = time.monotonic() + 300
    while not (out / folders.LOCK).exists():
        assert first.poll() is None and time.monotonic() < deadline, "the first run never took the folder"
        time.sleep(0.2)
    second = _cli("--output", str(out), "--input", str(dump), "--seed", "1", *FAST)
    assert second.returncode == 2 and "being written by another run" in second.stderr.strip().splitlines()[-1]
    forced = _cli("--output", str(out), "--input", str(dump), "--seed", "1", "--overwrite", *FAST)
    assert forced.returncode == 2 and f"pid {first.pid}" in forced.stderr.strip().splitlines()[-1]
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr[-2000:]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["config"]["seed"] == 0 and (out / published.MANIFEST).exists()


def test_a_local_run_shows_pages_read_of_the_index_total_and_keeps_beam_logs_in_a_file(small_multistream, tmp_path):
    dump, _ = small_multistream
    out = tmp_path / "out"
    result = _cli("--output", str(out), "--input", str(dump), *FAST,
                  "--direct_running_mode=multi_processing", "--direct_num_workers=2")
    assert result.returncode == 0, result.stderr[-2000:]
    *_, bar, said = result.stderr.replace("\r", "\n").strip().splitlines()
    assert bar.startswith("read: 100%") and f" {PAGES}/{PAGES} " in bar   # the total from the index
    assert said.startswith("pipeline: Beam's log (") and said.endswith(f" lines) in {out / published.RUN_LOG}")
    assert "apache_beam" not in result.stderr                                # worker logs are not on the terminal
    assert "Worker:" in (out / published.RUN_LOG).read_text()                      # but in the run's log file
    assert json.loads((out / published.STATS).read_text())["counters"]["pages_read"] == PAGES


def test_a_plain_xml_dump_cut_inside_a_page_is_a_loss_and_publishes_nothing(tmp_path):
    header, pages = dump_writers.dump_parts(embedded_dump_path())
    xml = header + b"".join(next(pages) for _ in range(PAGES)) + b"</mediawiki>\n"
    cut = tmp_path / "cut.xml"
    cut.write_bytes(xml[: len(xml) * 6 // 10])       # plain XML: decoding cannot fail, the file just ends
    out = tmp_path / "out"
    result = _cli("--output", str(out), "--input", str(cut), *FAST)
    assert result.returncode == 1 and "unknown number of pages" in result.stderr.strip().splitlines()[-1]
    assert not (out / published.MANIFEST).exists() and not (out / folders.LOCK).exists()
    whole = tmp_path / "whole.xml"
    whole.write_bytes(xml)
    assert _cli("--output", str(tmp_path / "whole"), "--input", str(whole), *FAST).returncode == 0


def test_a_dump_without_an_article_exits_1_naming_the_counters_and_publishes_nothing(tmp_path):
    header, pages = dump_writers.dump_parts(embedded_dump_path())
    redirects = [page for page in (next(pages) for _ in range(PAGES)) if b"<redirect" in page]
    assert redirects
    dump = tmp_path / "redirects.xml"
    dump.write_bytes(header + b"".join(redirects) + b"</mediawiki>\n")
    out = tmp_path / "out"
    result = _cli("--output", str(out), "--input", str(dump), *FAST)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "no article was kept" in last and f"pages_redirect {len(redirects)}" in last
    assert not (out / published.MANIFEST).exists() and not (out / folders.LOCK).exists()


def test_a_write_that_fails_for_lack_of_space_is_one_error_line_and_releases_the_lock(small_multistream, tmp_path):
    import resource

    dump, _ = small_multistream
    out = tmp_path / "out"

    def small_disk():   # files beyond 8 KiB fail with EFBIG, as on a full disk (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 10, 8 << 10))

    result = subprocess.run([sys.executable, "-m", "pipeline.run", "--output", str(out), "--input", str(dump), *FAST],
                            cwd=REPO, capture_output=True, text=True, preexec_fn=small_disk, timeout=600)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and last.startswith(f"error: writing {out} failed") and "File too large" in last
    assert "Traceback" not in result.stderr
    assert not (out / folders.LOCK).exists() and not (out / published.MANIFEST).exists()
    rerun = _cli("--output", str(out), "--input", str(dump), *FAST)         # no lock left: --overwrite not forced
    assert rerun.returncode == 2 and "already holds a run" in rerun.stderr


def _running(pid: int) -> bool:
    """Alive and not a zombie (whose parent, here init, has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                children.append(int(entry.name))
    return children


def test_worker_processes_end_when_their_launcher_is_killed(tmp_path):
    import glob
    import signal
    import time

    launcher = subprocess.Popen([sys.executable, "-m", "pipeline.run", "--output", str(tmp_path / "out"), *FAST,
                                 "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)   # the whole excerpt
    deadline = time.monotonic() + 300
    # Reading has begun in a worker once a worker's page counts appear in the launcher's progress folder.
    counts = f"{tempfile.gettempdir()}/wikisim-run-{launcher.pid}-*/wikisim-progress-{launcher.pid}-*/*.json"
    while not glob.glob(counts):
        assert launcher.poll() is None and time.monotonic() < deadline, "the workers never started reading"
        time.sleep(0.1)
    workers = _children(launcher.pid)
    assert launcher.poll() is None and len(workers) >= 2
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 30
    while alive := [pid for pid in workers if _running(pid)]:
        assert time.monotonic() < deadline, f"worker processes {alive} outlived their launcher"
        time.sleep(0.5)


# ---------------------------------------------------------------- hostile runs (each a real run)

def _published(small_multistream, out):
    dump, _ = small_multistream
    run.main(["--output", str(out), "--input", str(dump), *FAST])
    return dump


def test_overwrite_never_deletes_a_users_folder_whatever_its_name(small_multistream, tmp_path):
    out = tmp_path / "out"
    dump = _published(small_multistream, out)
    backup = out / "triplets-sen-backup-2019"
    backup.mkdir()
    (backup / "README.txt").write_text("k")
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    result = _cli("--output", str(out), "--input", str(dump), "--overwrite", *FAST)
    assert result.returncode == 2 and "triplets-sen-backup-2019/README.txt" in result.stderr.strip().splitlines()[-1]
    assert (backup / "README.txt").read_text() == "k"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before     # the published run untouched too


def test_overwrite_through_a_symbolic_link_is_refused_before_anything_is_deleted(small_multistream, tmp_path):
    out = tmp_path / "out"
    dump = _published(small_multistream, out)
    elsewhere = tmp_path / "elsewhere"
    (out / "passages").rename(elsewhere)
    (out / "passages").symlink_to(elsewhere)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    result = _cli("--output", str(out), "--input", str(dump), "--overwrite", *FAST)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "passages is a symbolic link" in result.stderr.strip().splitlines()[-1]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("fault", ["half the streams", "lines dropped", "lines duplicated"])
def test_an_index_that_does_not_reconcile_exits_1_and_publishes_nothing(small_multistream, tmp_path, fault):
    dump, index = small_multistream
    lines = bz2.decompress(index.read_bytes()).decode().splitlines()
    offsets = sorted({int(line.split(":", 1)[0]) for line in lines})
    if fault == "half the streams":
        kept = [line for line in lines if int(line.split(":", 1)[0]) in offsets[: len(offsets) // 2]]
    elif fault == "lines dropped":
        kept = [line for number, line in enumerate(lines) if number % 7 != 3]
    else:
        kept = [line for line in lines for _ in range(2)]
    edited = tmp_path / "edited-index.txt.bz2"
    edited.write_bytes(bz2.compress(("\n".join(kept) + "\n").encode()))
    out = tmp_path / "out"
    result = _cli("--output", str(out), "--input", str(dump), "--index", str(edited), *FAST)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert last.startswith("error: ") and ("do not reconcile" in last or "pages its index lists" in last), last
    assert not (out / published.MANIFEST).exists() and not (out / folders.LOCK).exists()
    assert (out / folders.UNPUBLISHED).exists() and (out / published.STATS).exists()   # kept for inspection
    rerun = _cli("--output", str(out), "--input", str(dump), "--overwrite", *FAST)    # replaced by a good run
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert not (out / folders.UNPUBLISHED).exists() and (out / published.MANIFEST).exists()


def test_a_glob_that_matches_one_dump_twice_is_refused(small_multistream, tmp_path):
    dump, _ = small_multistream
    (tmp_path / "wiki.xml.bz2").write_bytes(dump.read_bytes())
    (tmp_path / "wiki.xml").write_bytes(bz2.decompress(dump.read_bytes()))
    out = tmp_path / "out"
    result = _cli("--output", str(out), "--input", str(tmp_path / "wiki.xml*"), *FAST)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "the same dump compressed and not" in last
    assert str(tmp_path / "wiki.xml") in last and str(tmp_path / "wiki.xml.bz2") in last
    assert not out.exists()


def test_pages_with_an_id_read_twice_are_kept_once_and_counted(tmp_path):
    header, pages = dump_writers.dump_parts(embedded_dump_path())
    first = [next(pages) for _ in range(PAGES)]
    dump = tmp_path / "twice.xml"
    dump.write_bytes(header + b"".join(first + first[:PAGES // 2]) + b"</mediawiki>\n")
    once = tmp_path / "once.xml"
    once.write_bytes(header + b"".join(first) + b"</mediawiki>\n")
    twice = run.main(["--output", str(tmp_path / "twice"), "--input", str(dump), *FAST])
    single = run.main(["--output", str(tmp_path / "once"), "--input", str(once), *FAST])
    assert twice["counters"]["pages_duplicate_id"] == PAGES // 2 and twice["reconciliation"]["balanced"]
    assert twice["counters"]["pages_read"] == PAGES + PAGES // 2
    for name in ("articles_used", "triplets-sen/train", "triplets-titles/train", "scb_articles"):
        assert twice["counters"][name] == single["counters"][name], name
    letters = [json.loads(line) for path in (tmp_path / "twice" / "dead_letters").glob("*.jsonl.gz")
               for line in __import__("gzip").decompress(path.read_bytes()).splitlines()]
    assert sum(letter["reason"] == "duplicate_page_id" for letter in letters) == PAGES // 2


def test_overwrite_refuses_while_a_reader_holds_the_run_and_the_reader_is_not_mixed(small_multistream, tmp_path):
    import time

    out = tmp_path / "out"
    dump = _published(small_multistream, out)
    manifest = (out / published.MANIFEST).read_bytes()
    reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from core.folders import reading
        from core.published import Run
        with reading(Run.open({str(out)!r})) as run:
            print("reading", flush=True)
            sys.stdin.readline()        # reads until told to stop
            run.verify("triplets-sen/train")
        """)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert reader.stdout.readline().strip() == "reading"
    result = _cli("--output", str(out), "--input", str(dump), "--overwrite", *FAST)
    assert result.returncode == 2 and "is being read" in result.stderr.strip().splitlines()[-1]
    assert (out / published.MANIFEST).read_bytes() == manifest and not (out / folders.LOCK).exists()
    reader.stdin.write("done\n")
    reader.stdin.flush()
    assert reader.wait(timeout=120) == 0, reader.stderr.read()[-2000:]
    time.sleep(0.1)
    rerun = _cli("--output", str(out), "--input", str(dump), "--overwrite", *FAST)   # no reader now
    assert rerun.returncode == 0, rerun.stderr[-2000:]


def test_an_output_path_with_brackets_is_one_error_line_and_claims_nothing(small_multistream, tmp_path):
    dump, _ = small_multistream
    out = tmp_path / "x[1]"
    result = _cli("--output", str(out), "--input", str(dump), *FAST)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "which Beam reads as a glob pattern" in result.stderr.strip().splitlines()[-1]
    assert not out.exists()


def _run_holding_its_lock(out, env: dict, output) -> subprocess.Popen:
    """A real `pipeline.run` into `out`, returned a second after it took the folder (its lock is there)."""
    import signal
    import time

    # Ctrl-C's disposition as in a terminal, also where the tests run in the background (which
    # starts every child with SIGINT ignored)
    run = subprocess.Popen([sys.executable, "-m", "pipeline.run", "--output", str(out), *FAST], cwd=REPO,
                           stdout=output, stderr=output, text=True, env=env,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while not (out / folders.LOCK).exists():
        assert run.poll() is None and time.monotonic() < deadline, "the run never took the folder"
        time.sleep(0.1)
    time.sleep(1)
    return run


def test_ctrl_c_is_one_line_exit_130_with_the_lock_released_and_no_temporary_folder_left(tmp_path):
    import signal

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    out = tmp_path / "out"
    launcher = _run_holding_its_lock(out, {**os.environ, "TMPDIR": str(temporary)}, subprocess.PIPE)
    launcher.send_signal(signal.SIGINT)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 130 and stderr.strip().splitlines()[-1] == "interrupted", stderr[-2000:]
    assert "Traceback" not in stderr
    assert not (out / folders.LOCK).exists() and not (out / published.MANIFEST).exists()
    assert json.loads((out / folders.UNPUBLISHED).read_text())["why"] == "interrupted"
    assert os.listdir(temporary) == []
    refused = subprocess.run([sys.executable, "-m", "pipeline.run", "--output", str(tmp_path / "x[1]"), *FAST],
                             cwd=REPO, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(temporary)})
    assert refused.returncode == 2 and os.listdir(temporary) == []          # a refusal leaves none either


# ---------------------------------------------------------------- full disks, read-only mounts, kills

def _limited(max_bytes: int):
    """A preexec_fn: every file the process writes stops at `max_bytes` (a write beyond fails with
    EFBIG, as one on a full disk fails with ENOSPC: short first, then an error)."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))


def _left(out: Path) -> dict[str, bytes]:
    return {str(path.relative_to(out)): path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}


def test_a_full_disk_that_fails_the_unpublished_record_keeps_the_lock_and_overwrite_recovers(
        small_multistream, tmp_path):
    """The full disk fails the shards, then `_UNPUBLISHED` too (larger than the lock: its `why` is
    300 characters here, the output's path being long): the lock stays, whole, with no temporary
    beside it, and lists what the run wrote, so `--overwrite` replaces it once there is room."""
    dump, _ = small_multistream
    out = tmp_path / ("o" * 200)
    config, _ = run.parse_args(["--output", str(out), *FAST])
    output_folders = list(run.output_counters(config))
    lock = json.dumps(folders.owner_record(folders=output_folders, files=folders.run_files(output_folders)))
    args = [sys.executable, "-m", "pipeline.run", "--output", str(out), "--input", str(dump), *FAST]
    full = subprocess.run(args, cwd=REPO, capture_output=True, text=True, preexec_fn=_limited(len(lock) + 150))
    last = full.stderr.strip().splitlines()[-1]
    assert full.returncode == 1 and last.startswith(f"error: writing {out} failed") and "File too large" in last
    assert "Traceback" not in full.stderr
    left = _left(out)
    assert folders.LOCK in left and folders.UNPUBLISHED not in left and not any(".partial" in name for name in left)
    assert json.loads(left[folders.LOCK])["folders"] == list(run.output_counters(config))
    # No room even for the next run's lock: one line, exit 2, the dead run's lock kept as it was.
    no_room = subprocess.run([*args, "--overwrite"], cwd=REPO, capture_output=True, text=True, preexec_fn=_limited(64))
    assert no_room.returncode == 2 and "Traceback" not in no_room.stderr
    assert no_room.stderr.strip().splitlines()[-1].startswith(f"error: --output {out} has no room for the run's")
    assert _left(out) == left
    rerun = _cli("--output", str(out), "--input", str(dump), "--overwrite", *FAST)     # room again
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert (out / published.MANIFEST).exists() and not (out / folders.LOCK).exists()
    assert not any("beam-temp" in name for name in _left(out)) and published.Run.open(str(out)).verify("scb") == 0


def test_a_full_disk_when_the_run_writes_its_own_files_after_the_job_is_one_error_line(tmp_path):
    """The job's shards fit (a dump of redirects only: empty shards), its plot (about 20 kB) does
    not: one line, exit 1, no temporary left, and the run recorded unpublished."""
    header, pages = dump_writers.dump_parts(embedded_dump_path())
    dump = tmp_path / "redirects.xml"
    dump.write_bytes(header + b"".join(page for page in (next(pages) for _ in range(PAGES)) if b"<redirect" in page)
                     + b"</mediawiki>\n")
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "pipeline.run", "--output", str(out), "--input", str(dump), *FAST],
                            cwd=REPO, capture_output=True, text=True, preexec_fn=_limited(12_000))
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert last.startswith(f"error: writing {out} failed") and "File too large" in last
    left = _left(out)
    assert published.STATS in left and published.TRIPLETS_PLOT not in left and not any(".partial" in n for n in left)
    assert folders.UNPUBLISHED in left and folders.LOCK not in left


def test_temporaries_an_older_version_left_beside_its_records_are_its_own_but_a_users_file_is_not(tmp_path):
    """An older version's failed write of `_UNPUBLISHED` on a full disk left its temporary (here
    whole: killed after writing it, before the rename) and no lock; `--overwrite` reads it as
    the record it was meant to be, and deletes it with the run's files and other temporaries."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    (out / "scb").mkdir(parents=True)
    (out / "scb" / "part-00000-of-00001.jsonl.gz").write_bytes(b"partial")
    (out / published.RUN_LOG).write_text("log")
    record = {"host": socket.gethostname(), "pid": dead.pid, "folders": ["scb"], "files": list(published.RUN_FILES)}
    (out / f"{folders.UNPUBLISHED}.{dead.pid}-0a1b2c3d.partial").write_text(json.dumps(record))
    (out / f"{published.MANIFEST}.{dead.pid}-89abcdef.partial").write_bytes(b"")     # cut short: empty
    (out / f"{published.STATS}.{dead.pid}-01234567.partial").write_bytes(b"{")
    mine = out / f"{folders.UNPUBLISHED}.mine.partial"          # not a temporary of the run's: the user's
    mine.write_text("keep")
    with pytest.raises(folders.OutputInUseError, match=r"_UNPUBLISHED\.mine\.partial"):
        folders.claim_output(str(out), overwrite=True, folders=["scb"])
    assert len(os.listdir(out)) == 6
    mine.unlink()
    with pytest.raises(folders.OutputInUseError, match="already holds a run"):
        folders.claim_output(str(out), overwrite=False, folders=["scb"])
    folders.claim_output(str(out), overwrite=True, folders=["scb"])
    assert sorted(os.listdir(out)) == [folders.LOCK]
    assert json.loads((out / folders.LOCK).read_text())["files"] == list(published.RUN_FILES)


def _in_mount_namespace(shell: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`shell` run in a private mount namespace (its mounts vanish with it); skips where none can be made."""
    import shutil

    unshare = shutil.which("unshare")
    prefix = [unshare, "--mount"] if os.geteuid() == 0 else [unshare, "--mount", "--map-root-user"]
    probe = tmp_path / "probe"
    probe.mkdir()
    if not unshare or subprocess.run([*prefix, "mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(probe)],
                                     capture_output=True).returncode:
        pytest.skip("no private mount namespace here (unshare --mount is refused): a read-only mount needs one")
    return subprocess.run([*prefix, "sh", "-c", shell], cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("where", ["the mount itself", "a folder to create in it"])
def test_a_read_only_mount_is_one_error_line_naming_output_exit_2(small_multistream, tmp_path, where):
    """A real read-only file system (a tmpfs mounted `ro` in a private mount namespace): EROFS,
    which no file permission (root ignores those) gives."""
    dump, _ = small_multistream
    mount = tmp_path / "ro"
    mount.mkdir()
    out = mount if where == "the mount itself" else mount / "out"
    command = shlex.join([sys.executable, "-m", "pipeline.run", "--output", str(out), "--input", str(dump), *FAST])
    result = _in_mount_namespace(f"mount -t tmpfs -o ro tmpfs {shlex.quote(str(mount))} && exec {command}", tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == f"error: --output {out} is not writable (Read-only file system)"


def _gzip_of_size(data: bytes, size: int) -> bytes:
    """`data` gzipped into exactly `size` bytes: the header's file name field takes the rest."""
    import gzip
    import io

    def compressed(name: str) -> bytes:
        buffer = io.BytesIO()
        with gzip.GzipFile(filename=name, mode="wb", fileobj=buffer, mtime=0) as handle:
            handle.write(data)
        return buffer.getvalue()

    shortest = len(compressed("x"))
    assert size >= shortest
    return compressed("x" * (1 + size - shortest))


@pytest.mark.parametrize("max_lost_fraction", [0.0, 1.0])
def test_a_foreign_shard_of_the_same_size_is_refused_naming_the_shard(tmp_path, max_lost_fraction):
    """Another run's shard of the same size, whole but with fewer records, is not a loss to allow:
    `verify` names it, whatever --max-lost-fraction."""
    shard = tmp_path / "scb" / "part-00000-of-00002.jsonl.gz"
    shard.parent.mkdir()
    shard.write_bytes(_gzip_of_size(b"".join(b'{"article": %d}\n' % i for i in range(5)), 120))
    (tmp_path / "scb" / "part-00001-of-00002.jsonl.gz").write_bytes(_gzip_of_size(b'{"article": 9}\n', 120))
    folders.write_manifest(str(tmp_path), {"scb": 6})
    assert published.Run.open(str(tmp_path)).verify("scb") == 0
    shard.write_bytes(_gzip_of_size(b'{"article": 7}\n{"article": 8}\n', 120))    # another run's, same size
    with pytest.raises(published.ShardError, match=rf"^{re.escape(str(shard))}: 2 records where the run wrote 5, at"):
        published.Run.open(str(tmp_path)).verify("scb", max_lost_fraction)


def test_a_killed_runs_temporary_folder_is_removed_by_the_next_run(small_multistream, tmp_path):
    """SIGKILL leaves the run's private TMPDIR folder (nothing of it runs to remove it); the next
    run removes it, and leaves a live process's folder alone."""
    import signal

    dump, _ = small_multistream
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "TMPDIR": str(temporary)}
    out = tmp_path / "out"
    killed = _run_holding_its_lock(out, env, subprocess.DEVNULL)   # the whole excerpt
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    left = [name for name in os.listdir(temporary) if name.startswith(f"wikisim-run-{killed.pid}-")]
    assert len(left) == 1
    live = temporary / f"wikisim-run-{os.getpid()}-live"          # a live process's (this one's): kept
    live.mkdir()
    rerun = subprocess.run([sys.executable, "-m", "pipeline.run", "--output", str(out), "--input", str(dump),
                            "--overwrite", *FAST], cwd=REPO, capture_output=True, text=True, env=env)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert os.listdir(temporary) == [live.name]
