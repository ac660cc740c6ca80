"""The manifest is input like any other: `Manifest.parse` refuses, in one line naming the file and
the field, what could make a reader score a shard twice, read another folder or skip a check;
`Run` reads it once. The lock and the readers' leases are written whole."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from core import files, folders, published
from core.published import MANIFEST, Manifest, ManifestError, Run


@pytest.fixture
def run_folder(tmp_path):
    """A run folder with two real (empty) jsonl.gz shards, published by `write_manifest`."""
    import gzip

    for name in ("part-00000-of-00002.jsonl.gz", "part-00001-of-00002.jsonl.gz"):
        (tmp_path / "scb").mkdir(exist_ok=True)
        (tmp_path / "scb" / name).write_bytes(gzip.compress(b'{"a": 1}\n'))
    folders.write_manifest(str(tmp_path), {"scb": 2})
    return tmp_path


def _edit(folder, change):
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_the_manifest_carries_its_version_files_and_the_triplet_schema(run_folder):
    from core.records import TRIPLET_FEATURES

    opened = Run.open(str(run_folder))
    assert opened.manifest.format_version == published.MANIFEST_VERSION
    assert opened.manifest.triplet_features == TRIPLET_FEATURES
    assert opened.paths("scb") == [str(run_folder / "scb" / f"part-0000{i}-of-00002.jsonl.gz") for i in range(2)]
    assert opened.verify("scb") == 0
    assert Manifest.parse(json.dumps(opened.manifest.to_json()).encode(), "x") == opened.manifest


@pytest.mark.parametrize("change, field", [
    (lambda m: m["outputs"]["scb"]["shards"].append(m["outputs"]["scb"]["shards"][0]), r"shards\[2\].* a second time"),
    (lambda m: m["outputs"]["scb"]["shards"].__setitem__(0, "../../other-run/scb/part-0.jsonl.gz"),
     r"shards\[0\].*leaves the run folder"),
    (lambda m: m["outputs"]["scb"]["shards"].__setitem__(0, "../../../etc/passwd"), r"shards\[0\].*leaves the run"),
    (lambda m: m["outputs"]["scb"]["shards"].__setitem__(0, "/etc/passwd"), r"shards\[0\].*not a path relative"),
    (lambda m: m["outputs"]["scb"]["shards"].__setitem__(0, "gs://other/scb/part-0"), r"shards\[0\].*not a path rel"),
    (lambda m: m["outputs"]["scb"]["shards"].__setitem__(0, "passages/part-0.jsonl.gz"), r"outside its folder scb/"),
    (lambda m: m["outputs"]["scb"].__setitem__("shard_bytes", []), r"shard_bytes must list one count per shard"),
    (lambda m: m["outputs"]["scb"].__setitem__("shard_records", []), r"shard_records must list one count per shard"),
    (lambda m: m["outputs"]["scb"]["shard_bytes"].__setitem__(1, -5), r"shard_bytes\[1\] is negative"),
    (lambda m: m["outputs"]["scb"].__setitem__("records", "2"), r"records is str '2', not an integer"),
    (lambda m: m["outputs"]["scb"].pop("records"), r"records is missing"),
    (lambda m: m.__setitem__("format_version", "3"), r"format_version is str '3', not an integer"),
    (lambda m: m.__setitem__("format_version", published.MANIFEST_VERSION + 1),
     rf"format_version {published.MANIFEST_VERSION + 1} is unknown"),
    (lambda m: m["outputs"]["scb"].__setitem__("parquet", dict(m["outputs"]["scb"])),   # the same shards again
     r"parquet\.shards\[0\].* a second time"),
    (lambda m: m["outputs"]["scb"].__setitem__("parquet", {"shards": ["scb/a.parquet"], "shard_bytes": [1],
                                                           "shard_records": [1]}),
     r"parquet\.shards must list one Parquet twin per shard \(2\), got 1"),
    (lambda m: m["outputs"]["scb"].__setitem__("parquet", {"shards": ["passages/a.parquet", "scb/b.parquet"],
                                                           "shard_bytes": [1, 1], "shard_records": [1, 1]}),
     r"parquet\.shards\[0\].*outside its folder scb/"),
    (lambda m: m.pop("outputs"), r"field outputs is missing or empty"),
])
def test_an_edited_manifest_is_one_error_naming_the_file_and_the_field(run_folder, change, field):
    _edit(run_folder, change)
    with pytest.raises(ManifestError, match=f"{run_folder / MANIFEST}: .*{field}"):
        Run.open(str(run_folder))


@pytest.mark.slow   # a real eval.triplets process per manifest
@pytest.mark.parametrize("content", [b"", b"[]", b'{"format_version": 3}', b"\xff\xfe not utf-8"])
def test_an_empty_or_foreign_manifest_is_one_error_line_not_a_traceback(run_folder, content):
    (run_folder / MANIFEST).write_bytes(content)
    done = subprocess.run([sys.executable, "-m", "eval.triplets", "--data", str(run_folder), "--output",
                           str(run_folder.parent / "report")], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {run_folder / MANIFEST}: "), last
    assert not (run_folder.parent / "report").exists()


def test_a_lock_is_written_whole_and_an_empty_one_goes_stale_after_a_minute(tmp_path):
    (tmp_path / folders.LOCK).write_bytes(b"")        # a writer killed between create and write
    assert folders.live_lock_owner(str(tmp_path)) == "a run starting now (its lock is being written)"
    old = time.time() - folders.STALE_EMPTY_LOCK_S - 5
    os.utime(tmp_path / folders.LOCK, (old, old))
    assert folders.live_lock_owner(str(tmp_path)) is None
    folders.claim_output(str(tmp_path), overwrite=True, folders=["scb"])   # replaced, not blocked for ever
    lock = json.loads((tmp_path / folders.LOCK).read_text())
    assert lock["pid"] == os.getpid() and lock["folders"] == ["scb"]
    assert oct((tmp_path / folders.LOCK).stat().st_mode & 0o777) == "0o644"
    with pytest.raises(FileExistsError):                # exclusive: never replaces a lock that is there
        files.write_complete(str(tmp_path / folders.LOCK), b"{}", exclusive=True)
    assert [name for name in os.listdir(tmp_path) if "partial" in name] == []


def test_a_reader_lease_is_taken_and_released_and_a_dead_readers_lease_is_stale(run_folder):
    with folders.reading(Run.open(str(run_folder))):
        leases = folders.live_readers(str(run_folder))
        assert len(leases) == 1 and f"-{os.getpid()}-" in leases[0]
    assert folders.live_readers(str(run_folder)) == [] and not (run_folder / folders.READERS).exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run_folder / folders.READERS).mkdir()
    stale = run_folder / folders.READERS / f"{socket.gethostname()}-{dead.pid}-x.json"
    stale.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid}))
    assert folders.live_readers(str(run_folder)) == [] and not stale.exists()


def test_a_reader_refuses_a_folder_a_run_is_writing(run_folder):
    (run_folder / folders.LOCK).write_text(json.dumps(folders.owner_record()))   # this live process
    with pytest.raises(folders.FolderBusyError, match=f"{run_folder} is being written by a pipeline run"):
        with folders.reading(Run.open(str(run_folder))):
            pass
    assert folders.live_readers(str(run_folder)) == []


@pytest.mark.parametrize("path", ["x[1]", "x*", "run?", "a{b}"])
def test_an_output_path_with_glob_characters_is_refused_before_anything_is_claimed(tmp_path, path):
    with pytest.raises(folders.OutputInUseError, match="which Beam reads as a glob pattern"):
        folders.claim_output(str(tmp_path / path), overwrite=True, folders=["scb"])
    assert os.listdir(tmp_path) == []


def test_a_record_names_a_live_process_by_its_pid_and_start_not_its_pid_alone(run_folder):
    """Real processes: a live one is live; once dead it is stale; PID 1 is alive, but a record
    naming it without its start (written by hand, or an older wikisim) or with another start is
    not its: a reused pid never blocks a folder for ever."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    record = {**folders.owner_record(), "pid": process.pid, "process_start": folders._process_start(process.pid)}
    assert folders.process_alive(record) is True
    assert folders.process_alive({**record, "pid": 1}) is False
    assert folders.process_alive({"host": socket.gethostname(), "pid": 1}) is False
    assert folders.process_alive({**record, "host": "elsewhere"}) is None     # another host: cannot tell
    process.kill()
    process.wait()
    assert folders.process_alive(record) is False
    (run_folder / folders.LOCK).write_text(json.dumps({"host": socket.gethostname(), "pid": 1}))
    assert folders.live_lock_owner(str(run_folder)) is None
    with folders.reading(Run.open(str(run_folder))):     # a reader does not refuse a stale lock
        pass


@pytest.mark.parametrize("content", [b"", b"[]", b"{not json", json.dumps({"host": socket.gethostname(),
                                                                            "pid": 1}).encode()])
def test_a_stale_lease_empty_invalid_or_of_a_reused_pid_never_blocks_overwrite(run_folder, content):
    (run_folder / folders.READERS).mkdir()
    lease = run_folder / folders.READERS / "host-1-abc.json"
    lease.write_bytes(content)
    two_days_ago = time.time() - 2 * 86400
    os.utime(lease, (two_days_ago, two_days_ago))
    assert folders.live_readers(str(run_folder)) == [] and not lease.exists()
    files = {path.relative_to(run_folder).as_posix() for path in run_folder.rglob("*") if path.is_file()}
    (run_folder / folders.UNPUBLISHED).write_text(json.dumps({"files": sorted(files), "folders": ["scb"]}))
    folders.claim_output(str(run_folder), overwrite=True, folders=["scb"])   # not refused as being read
    assert json.loads((run_folder / folders.LOCK).read_text())["pid"] == os.getpid()


def test_a_runs_provenance_names_its_dump_never_a_local_path(run_folder):
    """What a model card says a model was trained on: the dump's file name, wiki and date, pages
    read and articles kept, from the run's stats.json; nothing where the run records none."""
    assert Run.open(str(run_folder)).provenance() == {}          # no stats.json
    stats = {"input": "/home/me/dumps/enwiki-20190720-pages-articles-multistream.xml.bz2",
             "reconciliation": {"pages_read": 18825, "outcomes": {"articles_used": 8635}}}
    (run_folder / "stats.json").write_text(json.dumps(stats))
    assert Run.open(str(run_folder)).provenance() == {
        "dump": "enwiki-20190720-pages-articles-multistream.xml.bz2", "wiki": "enwiki", "dump_date": "2019-07-20",
        "pages": 18825, "articles": 8635}
    (run_folder / "stats.json").write_text("{cut sho")
    assert Run.open(str(run_folder)).provenance() == {}          # a damaged record names nothing


def test_a_sigkilled_readers_lease_goes_when_the_next_reader_takes_one_but_a_live_or_foreign_one_stays(run_folder):
    """Real readers: one SIGKILLed while it holds its lease (no release runs), one alive; the
    next reader's lease clears the dead one's only. Another host's lease cannot be judged here."""
    reader = (f"import sys, time\nfrom core.folders import reading\nfrom core.published import Run\n"
              f"with reading(Run.open({str(run_folder)!r})):\n"
              f"    print('reading', flush=True)\n    time.sleep(120)\n")
    killed, alive = (subprocess.Popen([sys.executable, "-c", reader], stdout=subprocess.PIPE, text=True)
                     for _ in range(2))
    try:
        for process in (killed, alive):
            assert process.stdout.readline() == "reading\n"
        killed.kill()
        killed.wait()
        leases = run_folder / folders.READERS
        dead_lease = next(leases.glob(f"*-{killed.pid}-*.json"))
        foreign = leases / "elsewhere-1-abc.json"
        foreign.write_text(json.dumps({**folders.owner_record(), "host": "elsewhere", "pid": 1}))
        with folders.reading(Run.open(str(run_folder))):
            assert not dead_lease.exists()
            held = sorted(path.name.split("-")[-2] for path in leases.glob("*.json"))
            assert held == sorted([str(alive.pid), str(os.getpid()), "1"])
    finally:
        alive.kill()
        alive.wait()
    assert foreign.exists() and not list(leases.glob(f"*-{os.getpid()}-*.json"))
