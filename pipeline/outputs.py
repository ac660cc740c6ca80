"""One run owns its `--output` folder: claimed at the start, published by a manifest at the end.

* `claim_output` refuses a folder that holds anything but a previous run of this pipeline, and
  one that holds a run unless `--overwrite`. What `--overwrite` deletes is exactly what the
  previous run lists as its own: the files of its manifest (`pipeline.published.Manifest`), or,
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
  (`pipeline.published.Run.reading`) makes `--overwrite` refuse: no reader sees two runs' data.
* `publish_manifest` writes `manifest.json` last: every shard of every output with its size and
  the record count the run's counters give, read back from the files. Then the lock goes. A run
  that ends without publishing (`end_unpublished`) writes `_UNPUBLISHED` (what it wrote) and
  removes its lock; when `_UNPUBLISHED` cannot be written (a full disk) the lock stays, stale
  once the run's process is gone, and lists the same files.
* A folder the claim cannot write (read-only, no permission, no space for the lock) is refused
  naming it, before any work.

Beam's file sinks already write each output to a temp folder and rename it into place when the
step finishes; the manifest makes the whole run appear at once.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Iterator

from pipeline.cli import UsageError
from pipeline.files import is_remote, partial_of, read_bytes, write_bytes, write_complete
from pipeline.published import (
    LOCK,
    MANIFEST,
    MANIFEST_VERSION,
    READERS,
    Manifest,
    ManifestError,
    Output,
    Shard,
    ShardError,
    check_record_count,
    count_shard_records,
    live_lock_owner,
    live_readers,
    owner_record,
)
from pipeline.records import TRIPLET_FEATURES

STATS = "stats.json"
TRIPLETS_PLOT = "triplets.png"
LOG = "pipeline.log"   # Beam's log of a local run (`pipeline.progress`)
UNPUBLISHED = "_UNPUBLISHED"   # what a run that ended without a manifest wrote
RUN_FILES = (STATS, TRIPLETS_PLOT, LOG)   # a run's top-level files besides its outputs and manifest
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
    import fcntl

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
            _claim(out, overwrite, folders)
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


def _claim(out: str, overwrite: bool, folders: list[str]) -> None:
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
    top-level files and its triplet datasets' TFDS metadata (`pipeline.dataset_info`)."""
    from pipeline.dataset_info import info_files

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
    a triplet folder to how its records are ordered, `pipeline.order.order_record`). Where
    the two differ, records were lost or mixed on the way to the files: ShardError, and nothing
    is published. A triplet split's Parquet twins must hold what its TFRecord shards hold, shard
    by shard; its dataset's TFDS metadata is written from them, before the manifest."""
    from apache_beam.io.filesystems import FileSystems

    from pipeline import parquet
    from pipeline.dataset_info import dataset_infos

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
    then holds (`pipeline.published.submitted_job`) until `pipeline.publish` ends it."""
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
