"""Who owns a folder: the one module that claims, locks, leases and releases them, and tells a live
owner from a dead one, for run folders, model dirs, exports, reports and temporary folders.

One run owns its `--output` folder: claimed at the start, published by a manifest at the end.

* `claim_output` refuses a folder that holds anything but a previous run of this pipeline, and
  one that holds a run unless `--overwrite`. What `--overwrite` deletes is exactly what the
  previous run lists as its own: the files of its manifest (`core.published.Manifest`), or,
  for a run that ended unpublished or was killed, the files its record (`_UNPUBLISHED`, or its
  stale `_RUNNING` lock) names: its top-level files and what Beam's sinks wrote in its output
  folders (`part-*`, `beam-temp-part-*`), and a temporary `write_complete` left beside one of
  these or a record (`_UNPUBLISHED.<pid>-<hex>.partial`). Nothing is deleted because of its name alone: a
  folder `triplets-sen-backup` of the user's is a file no run lists, so the folder is refused.
  A symbolic link anywhere in the folder is refused before anything is deleted.
* The `_RUNNING` lock is written whole in one step (a temporary file, then `os.link`), under
  an exclusive `flock` of the folder while the claim decides, so of two runs one gets it; it
  records the run's pid, host, output folders and files. A dead run's stale lock is replaced in
  one step by one that also lists the files being deleted, until they are. A reader's live lease
  (`reading`) makes `--overwrite` refuse: no reader sees two runs' data.
* `publish_manifest` writes `manifest.json` last: every shard of every output with its size and
  the record count the run's counters give, read back from the files. Then the lock goes. A run
  that ends without publishing (`end_unpublished`) writes `_UNPUBLISHED` (what it wrote) and
  removes its lock; when `_UNPUBLISHED` cannot be written (a full disk) the lock stays, stale
  once the run's process is gone, and lists the same files.
* A folder the claim cannot write (read-only, no permission, no space for the lock) is refused
  naming it, before any work.

Beam's file sinks already write each output to a temp folder and rename it into place when the
step finishes; the manifest makes the whole run appear at once.

Every other writing command claims its folder with `claim_folder` (`COMMAND_CLAIM`: whose it is,
released by `end_claim`); a reader of a run holds a lease while it reads (`reading`); a run's and a
worker's temporary folders are theirs while their process lives (`private_tempdir`, `owned_tempdir`),
and the next one to start removes a dead one's.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

from core import parquet
from core.cli import UsageError
from core.dataset_info import dataset_infos, info_files
from core.files import is_remote, partial_of, read_bytes, read_json_object, write_bytes, write_complete
from core.published import (
    MANIFEST,
    MANIFEST_VERSION,
    RUN_FILES,
    STATS,
    Manifest,
    ManifestError,
    Output,
    Run,
    Shard,
    ShardError,
    check_record_count,
    check_storage,
    count_shard_records,
)
from core.records import TRIPLET_FEATURES
from core.storage import top_level_entries

LOG = logging.getLogger(__name__)

LOCK = "_RUNNING"          # a run is writing the folder (`claim_output`)
READERS = "_READERS"       # one lease file per command reading the folder (`reading`)
STALE_EMPTY_LOCK_S = 60.0  # an empty lock (a writer killed between create and write) older than this is stale
# What every writing command but `pipeline.run` (`model.train`, `model.soup`, `model.pretrained`,
# `model.export`, an eval report) records in the folder it claims (`claim_folder`): whose it is.
COMMAND_CLAIM = "claim.json"
UNPUBLISHED = "_UNPUBLISHED"   # what a run that ended without a manifest wrote
RECORD_FILES = (MANIFEST, UNPUBLISHED, LOCK)   # the files that list what a run wrote
SINK_PREFIXES = ("part-", "beam-temp-part-")   # what Beam's sinks name in an output folder
GLOB_CHARACTERS = "*?[]{}"


class OutputInUseError(UsageError):
    """The output folder holds another run's files, or a run is writing to it, or a reader reads it."""


def check_output_path(out: str, flag: str = "--output") -> None:
    """Refuses a path with glob characters: Beam's FileSystems would read them as a pattern."""
    found = sorted({char for char in out if char in GLOB_CHARACTERS})
    if found:
        raise OutputInUseError(f"{flag} {out}: the path holds {' '.join(found)}, which Beam reads as a glob "
                               "pattern; choose a path without them")


def _files(out: str) -> list[str]:
    """Every file under `out`, relative, with `/`; OutputInUseError naming a symbolic link."""
    from apache_beam.io.filesystems import FileSystems

    if is_remote(out):
        prefix = out + "/"
        return sorted(meta.path[len(prefix):] for meta in FileSystems.match([f"{prefix}**"])[0].metadata_list)
    found = []
    for folder, names, files in os.walk(out):
        for name in names + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                raise OutputInUseError(f"--output {out}: {os.path.relpath(path, out)} is a symbolic link; a run "
                                       "never writes one, so nothing is replaced: remove it or choose another folder")
        found += [os.path.relpath(os.path.join(folder, name), out).replace(os.sep, "/") for name in files]
    return sorted(found)


def _record_of(out: str, name: str) -> dict:
    try:
        record = json.loads(read_bytes(f"{out}/{name}") or b"{}")
    except (ValueError, OSError):
        return {}
    return record if isinstance(record, dict) else {}


def listed_files(out: str, files: list[str]) -> set[str]:
    """The files of `files` (all under `out`) that the previous run there lists as its own: its
    records (`RECORD_FILES`), what they list, and a temporary `write_complete` left beside any of
    these (`_UNPUBLISHED.<pid>-<hex>.partial`: a kill mid-write, or an older version's failed
    write), read as the record it was meant to be when it is whole."""
    present = set(files)
    names: set[str] = set(RECORD_FILES)
    if MANIFEST in present:
        try:
            names |= set(Manifest.parse(read_bytes(f"{out}/{MANIFEST}"), f"{out}/{MANIFEST}").written_files())
        except ManifestError as error:
            raise OutputInUseError(f"--output {out}: its previous run's manifest is not valid, so what that run "
                                   f"wrote is unknown and nothing is replaced ({error})") from None
    for record_name in (path for path in files if (partial_of(path) or path) in (UNPUBLISHED, LOCK)):
        record = _record_of(out, record_name)
        listed = record.get("files", [])
        folders = [folder for folder in record.get("folders", []) if isinstance(folder, str)]
        names |= {name for name in (listed if isinstance(listed, list) else []) if isinstance(name, str)}
        names |= {path for path in files for folder in folders
                  if path.startswith(folder + "/") and path[len(folder) + 1:].startswith(SINK_PREFIXES)}
    names |= {path for path in files if partial_of(path) in names}
    return names & present


@contextlib.contextmanager
def claiming(out: str) -> Iterator[bool]:
    """An exclusive `flock` of the local folder while a claim decides (yields whether this call
    created the folder); nothing for a remote one. Every command's claim decides under it."""
    if is_remote(out):
        yield False
        return
    created = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    handle = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield created
    finally:
        os.close(handle)


def claim_output(out: str, overwrite: bool, folders: list[str]) -> None:
    """Checks the folder is free (or, with `overwrite`, clears the previous run's files) and writes
    the lock naming `folders`, the output folders this run writes. Raises OutputInUseError naming
    the folder before anything is written."""
    check_output_path(out)
    if not is_remote(out) and os.path.exists(out) and not os.path.isdir(out):
        raise OutputInUseError(f"--output {out} is a file, not a folder")
    created = False
    try:
        with _unwritable_refused(out), claiming(out) as created:
            _claim_run_folder(out, overwrite, folders)
    except OutputInUseError:
        if created:   # a refused claim leaves nothing behind
            with contextlib.suppress(OSError):
                os.rmdir(out)
        raise
    except Exception as err:   # a remote store that cannot be reached: no credentials, no such bucket
        if not is_remote(out):
            raise
        raise OutputInUseError(f"--output {out} cannot be written: {type(err).__name__}: "
                               f"{str(err).splitlines()[0][:300] if str(err) else ''}") from err


@contextlib.contextmanager
def _unwritable_refused(out: str) -> Iterator[None]:
    """A folder the claim cannot write (a read-only mount, no permission, no space left for the
    lock): OutputInUseError naming it, before any work."""
    try:
        yield
    except OSError as err:
        if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise OutputInUseError(f"--output {out} is not writable ({err.strerror})") from err
        if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise OutputInUseError(f"--output {out} has no room for the run's {LOCK} lock ({err.strerror}); free "
                                   "space there or choose another folder") from err
        raise


def _claim_run_folder(out: str, overwrite: bool, folders: list[str]) -> None:
    owner = live_lock_owner(out)
    if owner:   # never replaced, even with --overwrite: the run writing there would crash or be mixed
        raise OutputInUseError(f"--output {out} is being written by another run ({owner}, its {LOCK} lock); "
                               "wait for it or choose another folder")
    files = [path for path in _files(out) if not path.startswith(READERS + "/")]
    listed = listed_files(out, files)
    others = [path for path in files if path not in listed]
    if others:
        raise OutputInUseError(f"--output {out} holds files no run of this pipeline lists as its own "
                               f"({', '.join(others[:3])}); choose an empty or new folder")
    if files and not overwrite:
        what = "a stale lock of a run that died" if LOCK in files else "a run"
        raise OutputInUseError(f"--output {out} already holds {what} ({', '.join(files[:3])}...); pass "
                               "--overwrite to replace it, or choose an empty or new folder")
    stale = read_bytes(f"{out}/{LOCK}") if LOCK in files else None   # checked above
    previous = sorted(set(files) - {LOCK})
    own = run_files(folders)
    lock = json.dumps(owner_record(folders=folders, files=sorted({*own, *previous}))).encode()
    try:   # a stale lock is replaced in one step, under the folder's flock: a failed write keeps it
        write_complete(f"{out}/{LOCK}", lock, exclusive=stale is None)
    except FileExistsError as err:
        raise OutputInUseError(f"--output {out}: another run took it a moment ago") from err
    readers = live_readers(out)
    if readers:
        if stale is None:
            _delete_files(out, [LOCK])
        else:   # the dead run's lock back, as it was
            write_complete(f"{out}/{LOCK}", stale)
        raise OutputInUseError(f"--output {out} is being read ({len(readers)} reader(s), e.g. {readers[0]}); "
                               "replacing it now would mix two runs' data under them: wait for them to finish")
    _delete_files(out, previous)   # the lock lists them until they are gone
    _remove_empty_sink_folders(out, folders)
    if previous:
        write_complete(f"{out}/{LOCK}", json.dumps(owner_record(folders=folders, files=own)).encode())


def run_files(folders: list[str]) -> list[str]:
    """The files a run writing `folders` writes besides their shards and its manifest: its
    top-level files and its triplet datasets' TFDS metadata (`core.dataset_info`)."""

    return [*RUN_FILES, *info_files(folders)]


def _remove_empty_sink_folders(out: str, folders: list[str]) -> None:
    """The sinks' temporary folders (`beam-temp-part-*`) that a killed run left empty in `folders`
    (local): Beam makes them when the job starts, so a run killed before it wrote into them left
    folders holding no file, which no file deletion removes."""
    if is_remote(out):
        return
    for folder in folders:
        with contextlib.suppress(OSError):
            for name in os.listdir(os.path.join(out, folder)):
                if name.startswith(SINK_PREFIXES[1]):
                    with contextlib.suppress(OSError):   # not empty: left as it is
                        os.rmdir(os.path.join(out, folder, name))


def _delete_files(out: str, relative: list[str]) -> None:
    """Deletes exactly these files, then (local) the folders they leave empty, up to `out`."""
    from apache_beam.io.filesystems import FileSystems

    if not relative:
        return
    FileSystems.delete([f"{out}/{path}" for path in relative])
    if is_remote(out):
        return
    for folder in sorted({os.path.dirname(path) for path in relative}, key=len, reverse=True):
        while folder:
            try:
                os.rmdir(os.path.join(out, folder))
            except OSError:   # not empty: something else lives there
                break
            folder = os.path.dirname(folder)


def publish_manifest(out: str, counts: dict[str, int], orders: dict[str, dict] | None = None) -> Manifest:
    """`write_manifest`, then the lock is removed: the run is published (or, when the files do
    not hold what the counters say, refused and recorded as unpublished: the run is over)."""
    try:
        manifest = write_manifest(out, counts, orders)
    except BaseException:
        end_unpublished(out, "its files do not hold what its counters say")
        raise
    _delete_files(out, [LOCK])
    return manifest


def write_manifest(out: str, counts: dict[str, int], orders: dict[str, dict] | None = None) -> Manifest:
    """Writes `manifest.json` (`MANIFEST_VERSION`): every output's shards with their sizes and
    record counts, read back from the files, and the record count the run's counters give
    (`counts` maps an output folder, e.g. `triplets-sen/train` or `scb`, to its records; `orders`
    a triplet folder to how its records are ordered, `pipeline.write.order.order_record`). Where
    the two differ, records were lost or mixed on the way to the files: ShardError, and nothing
    is published. A triplet split's Parquet twins must hold what its TFRecord shards hold, shard
    by shard; its dataset's TFDS metadata is written from them, before the manifest."""
    from apache_beam.io.filesystems import FileSystems


    outputs = {}
    for folder, n_records in counts.items():
        metadata = sorted(FileSystems.match([f"{out}/{folder}/part-*"])[0].metadata_list, key=lambda meta: meta.path)
        shards: list[Shard] = []
        twins: list[Shard] = []
        for meta in metadata:
            count, broken = count_shard_records(meta.path)
            if broken:
                raise ShardError(f"{meta.path}: {broken} after {count:,} records, as written by this run")
            shard = Shard(meta.path[len(out) + 1:], meta.size_in_bytes, count)
            (twins if meta.path.endswith(parquet.SUFFIX) else shards).append(shard)
        check_record_count(f"{out}/{folder}", sum(shard.records or 0 for shard in shards), n_records)
        if twins and [twin.records for twin in twins] != [shard.records for shard in shards]:
            raise ShardError(f"{out}/{folder}: its Parquet files hold {[twin.records for twin in twins]} records, its "
                             f"TFRecord shards {[shard.records for shard in shards]}, as written by this run")
        outputs[folder] = Output(folder, n_records, tuple(shards), (orders or {}).get(folder), tuple(twins))
    infos = dataset_infos({folder: output for folder, output in outputs.items() if output.parquet})
    for path, content in infos.items():
        write_bytes(f"{out}/{path}", content)
    files = (*(name for name in RUN_FILES if FileSystems.exists(f"{out}/{name}")), *infos)
    manifest = Manifest(MANIFEST_VERSION, outputs, dict(TRIPLET_FEATURES), STATS, files)
    write_complete(f"{out}/{MANIFEST}", json.dumps(manifest.to_json(), indent=2, sort_keys=True).encode("utf-8"))
    return manifest


def record_submitted_job(out: str, job: dict, run: dict) -> None:
    """Adds the Dataflow job a `--wait false` run submitted (`job`: id, project, region) and what
    publishing it needs (`run`: the run's flags and input) to the folder's lock, which the job
    then holds (`submitted_job`) until `pipeline.publish` ends it."""
    write_complete(f"{out}/{LOCK}", json.dumps({**_record_of(out, LOCK), "job": job, "run": run}).encode())


def end_unpublished(out: str, why: str) -> None:
    """The run is over without a manifest: `_UNPUBLISHED` keeps its lock's record of what it
    writes (so a rerun with `--overwrite` deletes exactly that), and the lock is removed. When
    that record cannot be written (the disk is full), the lock stays: once this process is gone
    it is a dead run's stale lock, which lists the same files."""
    from apache_beam.io.filesystems import FileSystems

    if not FileSystems.exists(f"{out}/{LOCK}"):
        return
    record = {**_record_of(out, LOCK), "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "why": why}
    try:
        write_complete(f"{out}/{UNPUBLISHED}", json.dumps(record).encode())
    except Exception:   # the error that ended the run is the one reported, not this one
        return
    _delete_files(out, [LOCK])


# ------------------------------------------------------------------ owners, locks and readers' leases


class FolderBusyError(UsageError):
    """A run is writing the folder a reader asked for, or a reader holds the folder a run would replace."""

@contextlib.contextmanager
def reading(run: Run) -> Iterator[Run]:
    """Holds a reader's lease on the run's folder while the block reads it: a `pipeline.run
    --overwrite` refuses the folder meanwhile, and a run still being written is refused here."""
    lease = take_lease(run.root)
    try:
        owner = live_lock_owner(run.root)
        if owner:
            raise FolderBusyError(f"{run.root} is being written by a pipeline run ({owner}); wait for it to "
                                  "publish, or read another run")
        yield run
    finally:
        if lease:
            release_lease(lease)


def reading_if_run(source: str) -> contextlib.AbstractContextManager:
    """A reader's lease when `source` is a run folder (it holds a manifest), nothing for a glob of files."""
    from apache_beam.io.filesystems import FileSystems

    path = f"{source.rstrip('/')}/{MANIFEST}"
    check_storage(path)
    if FileSystems.exists(path):
        return reading(Run.open(source))
    return contextlib.nullcontext()

def _process_start(pid: int) -> str | None:
    """What tells this process `pid` from a later one given the same pid: the boot's id and the
    process's start time in clock ticks since boot (`/proc/PID/stat`, field 22). None where
    there is no /proc (not Linux) or no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
    except (OSError, IndexError):
        return None
    return f"{boot}:{int(fields[19])}"   # fields[0] is field 3 (state): starttime is field 22

def owner_record(**extra: Any) -> dict:
    """Who writes or reads a folder: host, pid and the process's start (`_process_start`), so a
    live process that reused a dead owner's pid is not taken for it; `extra` adds fields."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid()),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra}

def _delete(path: str) -> None:
    from apache_beam.io.filesystems import FileSystems

    with contextlib.suppress(Exception):
        FileSystems.delete([path])

def process_alive(owner: dict) -> bool | None:
    """Whether the process an owner record (`owner_record`) names is alive: None when it runs on
    another host (which cannot be checked from here). Where /proc tells a process's start, a
    record is alive only if its pid runs and started when the record says: a record without that
    start (written by hand, or by an older wikisim) names no process that can be told from a
    later holder of its pid, so it is stale."""
    if owner.get("host") != socket.gethostname():
        return None
    try:
        pid = int(owner["pid"])
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (KeyError, ValueError, TypeError, OverflowError):
        return False
    except PermissionError:   # alive, another user's
        pass
    start = _process_start(pid)
    return start is None or owner.get("process_start") == start

def _owner_of(path: str) -> tuple[dict | None, float | None]:
    """(owner record or None when empty/unreadable, age in seconds or None when unknown)."""
    from apache_beam.io.filesystems import FileSystems

    try:
        raw = read_bytes(path)
    except Exception:   # gone since it was listed
        return None, None
    age = None
    if not is_remote(path):
        with contextlib.suppress(OSError):
            age = time.time() - os.stat(path).st_mtime
    else:
        with contextlib.suppress(Exception):
            age = time.time() - FileSystems.last_updated(path)
    try:
        owner = json.loads(raw)
    except ValueError:
        return None, age
    return (owner if isinstance(owner, dict) and owner.get("pid") else None), age

def record_is_stale(owner: dict | None, age: float | None) -> bool:
    """A lock, lease or claim record no live process holds: its process is dead (or its pid was
    reused), or it is empty or invalid (a writer killed between create and write) and older
    than STALE_EMPTY_LOCK_S."""
    if owner is None:
        return age is not None and age > STALE_EMPTY_LOCK_S
    return process_alive(owner) is False

def live_lock_owner(out: str) -> str | None:
    """'pid N on HOST' when the folder's `_RUNNING` lock belongs to a live run (or one on another
    host, which cannot be checked from here), or the Dataflow job a `--wait false` run submitted
    (`submitted_job`: live until `pipeline.publish` ends it, whatever became of the process that
    submitted it); None without a lock or with a stale one (`record_is_stale`)."""
    from apache_beam.io.filesystems import FileSystems

    path = f"{out}/{LOCK}"
    if not FileSystems.exists(path):
        return None
    owner, age = _owner_of(path)
    job = submitted_job(owner)
    if job:
        return (f"Dataflow job {job['id']} in {job.get('project')}/{job.get('region')}, submitted with --wait false; "
                f"once it ends, python -m pipeline.publish --output {out} publishes the run or releases the folder")
    if record_is_stale(owner, age):
        return None
    if owner is None:
        return "a run starting now (its lock is being written)"
    return f"pid {owner['pid']} on {owner.get('host')}"

def submitted_job(owner: dict | None) -> dict | None:
    """The Dataflow job a lock record names (`pipeline.run --wait false` writes it once the job is
    submitted: {"id", "project", "region"}), or None for a lock held by a running process."""
    job = (owner or {}).get("job")
    return job if isinstance(job, dict) and isinstance(job.get("id"), str) and job["id"] else None

def take_lease(root: str) -> str | None:
    """Writes this process's reader lease; None (with a warning) where the folder is read-only.
    The leases of readers that died holding theirs (SIGKILL: no release ran) go then too
    (`live_readers`), or a folder read often and never overwritten would gather them for ever."""
    path = f"{root}/{READERS}/{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
    try:
        for attempt in range(3):   # another reader's release may remove the empty folder in between
            if not is_remote(root):
                os.makedirs(f"{root}/{READERS}", exist_ok=True)
            try:
                write_complete(path, json.dumps(owner_record()).encode())
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
    except OSError as error:
        LOG.warning("%s: no reader lease (%s); a pipeline.run --overwrite by someone who can write there would "
                    "not see this reader", root, error)
        return None
    live_readers(root)
    return path

def release_lease(path: str) -> None:
    """Removes a reader's lease, and the leases' folder when it is left empty (local)."""
    _delete(path)
    if not is_remote(path):
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))

def live_readers(root: str) -> list[str]:
    """The lease files of live readers of the folder (another host's count as live); stale ones
    (`record_is_stale`: a dead process's, or an empty one long past) are removed. A writer asks
    before replacing a run, a reader when it takes its lease."""
    from apache_beam.io.filesystems import FileSystems

    folder = f"{root}/{READERS}"
    if not FileSystems.exists(folder) and not is_remote(root):
        return []
    live = []
    for meta in FileSystems.match([f"{folder}/*.json"])[0].metadata_list:
        if record_is_stale(*_owner_of(meta.path)):
            _delete(meta.path)
            continue
        live.append(meta.path)
    return live


# ------------------------------------------------------------------ a command's folder: model dirs, exports, reports

def refuse_links(path: str, flag: str) -> None:
    """UsageError naming the first symbolic link at or under the local folder `path`: a command
    deletes and writes only its own files, never through a link into another folder."""

    if is_remote(path):
        return
    if os.path.islink(path.rstrip("/") or path):
        raise UsageError(f"{flag} {path} is a symbolic link; a command writes only a real folder: pass the folder "
                         "it points to, or another one")
    for folder, names, files in os.walk(path):
        for name in names + files:
            if os.path.islink(os.path.join(folder, name)):
                raise UsageError(f"{flag} {path} holds a symbolic link "
                                 f"({os.path.relpath(os.path.join(folder, name), path)}); a command never writes "
                                 "one, so nothing is replaced through it: remove it or choose another folder")

def claim_is_live(claim: dict) -> bool:
    """Whether a live process other than this one holds the claim (`process_alive`; another
    host's cannot be checked from here, and a finished command's claim stays: taken as ended)."""

    ours = claim.get("pid") == os.getpid() and claim.get("host") == socket.gethostname()
    return not ours and bool(process_alive(claim))

def claim_folder(path: str, command: str, writes: tuple[str, ...], flag: str, overwrite: bool | None) -> None:
    """Claims the folder `path` for `command`, which writes entries whose names start with one
    of `writes`, as `model.train` claims its model dir: a folder holding anything else, or
    another command's output (no COMMAND_CLAIM of `command`), is refused (a UsageError naming
    `flag`), before any work, with or without `overwrite`; so is one a live process still
    writes (its claim names host, pid and the process's start: `owner_record`;
    a claim of another host cannot be checked and is taken as ended). The claim decides under an
    exclusive flock of the (local) folder, so of two commands started together one is refused.
    `overwrite` None: the command replaces its own files as it writes (an eval report); False: a
    folder with its earlier output is refused; True: that output is deleted first (only the
    entries `writes` names, never through a symbolic link)."""

    check_output_path(path, flag)
    if not is_remote(path) and os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a file, not a folder")
    refuse_links(path, flag)
    created = False
    try:
        with claiming(path.rstrip("/")) as created:
            _claim_command_folder(path, command, writes, flag, overwrite)
    except UsageError:
        if created:   # a refused claim leaves nothing behind
            with contextlib.suppress(OSError):
                os.rmdir(path)
        raise

def _claim_command_folder(path: str, command: str, writes: tuple[str, ...], flag: str, overwrite: bool | None) -> None:
    from apache_beam.io.filesystems import FileSystems


    root = path.rstrip("/")
    found = top_level_entries(path)
    entries = [name for name in found if name != COMMAND_CLAIM]
    previous = read_json_object(f"{root}/{COMMAND_CLAIM}", {"command": str}) if COMMAND_CLAIM in found else None
    if previous and claim_is_live(previous):
        raise UsageError(f"{flag} {path} is being written by {previous['command']} (pid {previous.get('pid')} on "
                         f"{previous.get('host')}, since {previous.get('started')}); wait for it or choose another "
                         "folder")
    foreign = [name for name in entries if not name.startswith(writes)]
    if entries and (foreign or (previous or {}).get("command") != command):
        raise UsageError(f"{flag} {path} holds files {command} does not write ({', '.join((foreign or entries)[:3])})"
                         "; choose an empty or new folder")
    if entries and overwrite is False:
        raise UsageError(f"{flag} {path} already holds the output of an earlier {command} ({', '.join(entries[:3])})"
                         "; pass --overwrite true to replace it, or choose an empty or new folder")
    if entries and overwrite:
        FileSystems.delete([f"{root}/{name}" for name in entries])
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)
    write_complete(f"{root}/{COMMAND_CLAIM}", json.dumps(owner_record(command=command)).encode())


def end_claim(output: str, command: str) -> str:
    """Replaces the live claim of the written folder `output` by one naming only the command and
    when it ended (no host, no pid: the folder is published as it is); `claim_folder` still takes
    it as model.export's (`--overwrite` replaces the folder) and as ended. Returns `output`."""


    ended = {"command": command, "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_complete(f"{output.rstrip('/')}/{COMMAND_CLAIM}", json.dumps(ended).encode())
    return output


# ------------------------------------------------------------------ a run's own temporary folder

_PRIVATE_TEMPDIRS: list[str] = []   # this process's `private_tempdir`s, innermost last


@contextlib.contextmanager
def private_tempdir() -> Iterator[str]:
    """A temporary folder of this run's own, made the process's (and its worker processes')
    TMPDIR while the block runs, then removed: Beam's local runners leave empty `tmp*`,
    `beam-temp*` and `beam-requirements-cache` folders in the system's temporary folder on
    every run, which piled up. A run killed before it removes its folder (SIGKILL, a lost
    machine) leaves it; the next run removes it (`remove_dead_runs_folders`). Entered again
    inside its block (a command's job inside its run), it is the same folder."""
    if _PRIVATE_TEMPDIRS and tempfile.tempdir == _PRIVATE_TEMPDIRS[-1]:   # inside one already: the same
        yield _PRIVATE_TEMPDIRS[-1]
        return
    remove_dead_runs_folders(tempfile.gettempdir())
    previous_env, previous_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    folder = tempfile.mkdtemp(prefix=f"wikisim-run-{os.getpid()}-")
    with contextlib.suppress(OSError):   # no room: without it, the pid in the folder's name tells its run
        write_complete(os.path.join(folder, RUN_OWNER), json.dumps(owner_record()).encode())
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    _PRIVATE_TEMPDIRS.append(folder)
    try:
        yield folder
    finally:
        _PRIVATE_TEMPDIRS.pop()
        tempfile.tempdir = previous_tempdir
        if previous_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous_env
        shutil.rmtree(folder, ignore_errors=True)
RUN_FOLDER = re.compile(r"wikisim-run-(?P<pid>[0-9]+)-")   # `private_tempdir`'s folders
RUN_OWNER = "wikisim-run-owner.json"   # in each: `owner_record` of the run that made it

def remove_dead_runs_folders(parent: str) -> list[str]:
    """Removes the folders `private_tempdir` made in `parent` for runs whose process is gone (this
    user's, on this host); returns them. A folder is its run's while its process lives
    (`process_alive` of the owner record inside; without one, written by an
    older wikisim or being written now, while a process of the pid in its name runs)."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = RUN_FOLDER.match(entry.name)
        try:
            mine = entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.getuid()
        except OSError:   # removed meanwhile
            continue
        if match and mine and not _run_alive(entry.path, int(match.group("pid"))):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed

def _run_alive(folder: str, pid: int) -> bool:
    """Whether the run that made `folder` (a `private_tempdir`) may still be running."""

    try:
        with open(os.path.join(folder, RUN_OWNER)) as handle:
            owner = json.load(handle)
    except (OSError, ValueError):
        owner = None
    if isinstance(owner, dict) and owner.get("pid") == pid:
        return process_alive(owner) is not False   # another host's (a shared TMPDIR) is left alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # alive, another user's
        pass
    return True


ALIVE = ".alive"   # beside an `owned_tempdir`: locked by its process while it lives


def _alive_file(folder: str) -> str:
    return os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}{ALIVE}")


@contextlib.contextmanager
def owned_tempdir(prefix: str) -> Iterator[str]:
    """A folder `<prefix>*` of this process's own in the system's temporary folder (TMPDIR),
    deleted at the end. A killed process cannot delete its own (a transformer worker's backups:
    half a GB), so the process holds a lock on the folder's ALIVE file while it lives, which the
    kernel releases however the process ends, and every process starting one with the same
    prefix first deletes the folders whose lock nobody holds (`remove_dead_owned_dirs`)."""
    parent = tempfile.gettempdir()
    remove_dead_owned_dirs(parent, prefix)
    alive, starting = tempfile.mkstemp(prefix=f".{prefix}", suffix=".starting", dir=parent)
    folder = os.path.join(parent, os.path.basename(starting)[1:-len(".starting")])
    try:
        fcntl.flock(alive, fcntl.LOCK_EX)   # locked before it takes its name: no sweep finds it unlocked
        os.mkdir(folder, 0o700)
        os.rename(starting, _alive_file(folder))
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for path in (starting, _alive_file(folder)):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        os.close(alive)


def remove_dead_owned_dirs(parent: str, prefix: str) -> list[str]:
    """Deletes the `<prefix>*` folders in `parent` whose process is gone (nobody holds the lock on
    their ALIVE file: `owned_tempdir`); returns them. Folders without one are left alone."""
    removed = []
    for path in glob.glob(os.path.join(parent, f".{glob.escape(prefix)}*{ALIVE}")):
        try:
            alive = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:   # held: its process lives
            continue
        finally:
            os.close(alive)
        folder = os.path.join(parent, os.path.basename(path)[1:-len(ALIVE)])
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        removed.append(folder)
    if removed:
        LOG.info("deleted %d temporary folder(s) of killed processes: %s", len(removed), ", ".join(removed))
    return removed
