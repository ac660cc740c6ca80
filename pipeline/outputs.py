"""One run owns its `--output` folder: claimed at the start, published by a manifest at the end.

* `claim_output` refuses a folder that already holds a run (or anything else) unless
  `--overwrite`, which deletes what a run of this pipeline writes and only that; it then
  writes the `_RUNNING` lock, so a second run started into the same folder refuses too.
* `publish_manifest` writes `manifest.json` (`records.MANIFEST`) last: every shard of every
  output with the record count the run's counters give. Readers (the trainer, eval) list
  shards from it, so a folder without one (a run that died, or still runs) is refused, and
  files left by anything else are never read. Then the lock is removed.

Beam's file sinks already write each output to a temp folder and rename it into place when the
step finishes; the manifest makes the whole run appear at once.
"""
from __future__ import annotations

import json
import os
import socket
import time

from pipeline import records
from pipeline.cli import UsageError

LOCK = "_RUNNING"
STATS = "stats.json"
TRIPLETS_PLOT = "triplets.png"
LOG = "pipeline.log"   # Beam's log of a local run (`pipeline.progress`)
# Top-level files and folders a run writes, besides its `triplets-*` dataset folders.
RUN_FILES = (records.MANIFEST, STATS, TRIPLETS_PLOT, LOG, LOCK)
RUN_FOLDERS = (records.SCB, records.PASSAGES, records.DEAD_LETTERS)


class OutputInUseError(UsageError):
    """The output folder holds another run's files, or a run is writing to it."""


def _entries(out: str) -> list[str]:
    """Names directly under `out` (files and first-level folders), local or remote."""
    from apache_beam.io.filesystems import FileSystems

    if not FileSystems.exists(out):
        return []
    if "://" not in out:
        return sorted(os.listdir(out))
    names = {meta.path[len(out) + 1:].split("/", 1)[0] for meta in FileSystems.match([f"{out}/**"])[0].metadata_list}
    return sorted(names)


def read_bytes(path: str) -> bytes:
    """Whole file through Beam FileSystems (local or gs://), decompressed by its extension."""
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path) as handle:
        return handle.read()


def write_bytes(path: str, data: bytes) -> None:
    """Writes exactly `data` (no compression chosen by extension) through Beam's FileSystems, so
    `path` may be local or gs://. The one such helper: eval and model import it."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(data)


def claim_output(out: str, overwrite: bool) -> None:
    """Checks the folder is free (or, with `overwrite`, clears a previous run's files) and writes
    the lock. Raises OutputInUseError naming the folder before any work is done."""
    if "://" not in out and os.path.exists(out) and not os.path.isdir(out):
        raise OutputInUseError(f"--output {out} is a file, not a folder")
    try:
        _claim(out, overwrite)
    except PermissionError as err:
        raise OutputInUseError(f"--output {out} is not writable ({err.strerror})") from err
    except OutputInUseError:
        raise
    except Exception as err:   # a remote store that cannot be reached: no credentials, no such bucket
        if "://" not in out:
            raise
        raise OutputInUseError(f"--output {out} cannot be written: {type(err).__name__}: "
                               f"{str(err).splitlines()[0][:300] if str(err) else ''}") from err


def live_lock_owner(out: str) -> str | None:
    """'pid N on HOST' when the folder's lock belongs to a process that is alive (or that runs on
    another host, which cannot be checked from here); None for a stale lock of a dead process."""
    try:
        owner = json.loads(read_bytes(f"{out}/{LOCK}") or b"{}")
    except (ValueError, OSError):
        owner = {}
    pid, host = owner.get("pid"), owner.get("host")
    if not pid:   # being written this instant (O_EXCL taken, contents not yet): a live run
        return "a run starting now"
    if host != socket.gethostname():
        return f"pid {pid} on {host}"
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return f"pid {pid} on {host}"


def _claim(out: str, overwrite: bool) -> None:
    from apache_beam.io.filesystems import FileSystems

    entries = _entries(out)
    if LOCK in entries:
        owner = live_lock_owner(out)
        if owner:   # never replaced, even with --overwrite: the run writing there would crash or be mixed
            raise OutputInUseError(f"--output {out} is being written by another run ({owner}, its {LOCK} lock); "
                                   "wait for it or choose another folder")
        if not overwrite:
            raise OutputInUseError(f"--output {out} has a stale {LOCK} lock of a run that died; pass --overwrite "
                                   "to replace what it left")
    foreign = [name for name in entries if name not in RUN_FILES + RUN_FOLDERS
               and not name.startswith(("beam-temp-", "triplets-"))]
    if foreign:
        raise OutputInUseError(f"--output {out} holds files this pipeline does not write ({', '.join(foreign[:3])}); "
                               "choose an empty or new folder")
    if entries and not overwrite:
        raise OutputInUseError(f"--output {out} already holds a run ({', '.join(entries[:3])}...); pass "
                               "--overwrite to replace it, or choose an empty or new folder")
    if entries:
        FileSystems.delete([f"{out}/{name}" for name in entries])
    if "://" not in out:
        os.makedirs(out, exist_ok=True)
        try:   # O_EXCL: of two runs racing for the folder, one gets the lock
            handle = os.open(f"{out}/{LOCK}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError as err:
            raise OutputInUseError(f"--output {out}: another run took it a moment ago") from err
        os.close(handle)
    write_bytes(f"{out}/{LOCK}", json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode())


def publish_manifest(out: str, counts: dict[str, int]) -> dict:
    """`write_manifest`, then the lock is removed: the run is published (or, when the files do
    not hold what the counters say, refused with the lock removed: the run is over)."""
    try:
        return write_manifest(out, counts)
    finally:
        release(out)


def write_manifest(out: str, counts: dict[str, int]) -> dict:
    """Writes `manifest.json` (`records.MANIFEST_VERSION`): every output's shards with their
    sizes and record counts, read back from the files, and the record count the run's counters
    give (`counts` maps an output folder, e.g. `triplets-sen/train` or `scb`, to its records).
    Where the two differ, records were lost or mixed on the way to the files: ShardError,
    and nothing is published."""
    from apache_beam.io.filesystems import FileSystems

    outputs = {}
    for folder, n_records in counts.items():
        metadata = sorted(FileSystems.match([f"{out}/{folder}/part-*"])[0].metadata_list, key=lambda meta: meta.path)
        shard_records = []
        for meta in metadata:
            count, broken = records.count_shard_records(meta.path)
            if broken:
                raise records.ShardError(f"{meta.path}: {broken} after {count:,} records, as written by this run")
            shard_records.append(count)
        records.check_record_count(f"{out}/{folder}", sum(shard_records), n_records)
        outputs[folder] = {"records": n_records, "shards": [meta.path[len(out) + 1:] for meta in metadata],
                           "shard_bytes": [meta.size_in_bytes for meta in metadata], "shard_records": shard_records}
    manifest = records.manifest(outputs, STATS)
    write_bytes(f"{out}/{records.MANIFEST}", json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8"))
    return manifest


def release(out: str) -> None:
    """Removes the lock (the run is over, published or not), if it is still there."""
    from apache_beam.io.filesystems import FileSystems

    if FileSystems.exists(f"{out}/{LOCK}"):
        FileSystems.delete([f"{out}/{LOCK}"])
