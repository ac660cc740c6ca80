"""A published run as its readers see it: the manifest, parsed and checked once; the run's own files.

* `Manifest.parse` turns `manifest.json` into types and refuses, in one line naming the file and
  the field, anything a reader could be misled by: a format version this code does not know,
  shard paths that are absolute, leave the run folder (`..`) or repeat, counts and sizes that are
  missing or negative, per-shard lists of another length than the shards'. A manifest is input
  like any other: editing it must not make a reader score a shard twice or read another folder.
* `Run.open(data)` reads it once; a command asks the `Run` for an output's shards (`paths`),
  checks their sizes (`check_sizes`, seconds) or verifies them whole (`verify`: sizes, then
  every shard's records counted against the manifest).
* `core.folders.reading(run)` holds a lease (`_READERS/<host>-<pid>-<nonce>.json`) while a command reads the
  run: `pipeline.run --overwrite` refuses a folder with a live reader, and a reader refuses a
  folder that a run is writing (its `_RUNNING` lock). Each side writes its own file first and
  then looks for the other's, so of a reader and a writer starting together at least one sees
  the other: a reader never reads two runs' shards. A folder the reader cannot write to (a
  read-only bucket) gets no lease; whoever can overwrite it then could, and the log says so. A
  reader killed outright (SIGKILL) leaves its lease; the next reader or writer of the folder on
  its host removes it (its process is dead); one of another host's readers stays.

TFDS's `DatasetInfo`/`SplitInfo` are the model: what a dataset holds is read from one file, into
types, before any record is.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import re
from typing import Any

from core import parquet
from core.cli import DataLossError, UsageError
from core.files import is_remote, read_bytes, read_json_object
from core.records import TRIPLET_FEATURES
from core.tfrecord import CorruptRecordError, read_records

LOG = logging.getLogger(__name__)

# Written last by a run (`core.folders`): {"format_version": 5, "outputs": {folder: {"records": n,
# "shards": [path relative to the run folder, ...], "shard_bytes": [size, ...], "shard_records":
# [n, ...], "order": how a triplet split is ordered, or null, "parquet": a triplet split's Parquet
# twins as {"shards", "shard_bytes", "shard_records"} (`core.parquet`), or null}},
# "triplet_features": TRIPLET_FEATURES, "stats": "stats.json", "files": [the run's other files:
# top-level ones and each triplet dataset's TFDS metadata, `core.dataset_info`]}; folders are
# `<dataset>/<split>`, `scb`, `passages` and `dead_letters`. Version 4 had no `parquet`, version 3
# no `files` and no `order` (its triplets lay in page order, article by article), version 2 no
# `triplet_features` either (they were these), version 1 (no version field) no per-shard sizes or
# counts.
MANIFEST = "manifest.json"
MANIFEST_VERSION = 5
READABLE_MANIFEST_VERSIONS = (1, 2, 3, 4, MANIFEST_VERSION)


class ManifestError(UsageError):
    """A run folder without a (readable, valid) manifest, or without the output asked for."""


class ShardError(DataLossError):
    """A shard the manifest lists is missing, or not what the run wrote (size or record count)."""


@dataclasses.dataclass(frozen=True)
class Shard:
    path: str                # relative to the run folder, with `/`
    size: int | None         # bytes the run wrote (None: a version-1 manifest)
    records: int | None      # records the run wrote (None: a version-1 manifest)


@dataclasses.dataclass(frozen=True)
class Output:
    folder: str              # `triplets-sen/train`, `scb`, ...
    records: int
    shards: tuple[Shard, ...]
    order: dict | None = None   # how a triplet split's records are ordered (`pipeline.write.order.order_record`)
    parquet: tuple[Shard, ...] = ()   # a triplet split's Parquet twins of `shards` (`core.parquet`)

    def all_shards(self) -> tuple[Shard, ...]:
        return (*self.shards, *self.parquet)


def _require(condition: bool, where: str, field: str, why: str) -> None:
    if not condition:
        raise ManifestError(f"{where}: field {field} {why}; the manifest is damaged or was edited (rerun "
                            "pipeline.run, or restore it)")


def _count(value: Any, where: str, field: str) -> int:
    _require(value is not None, where, field, "is missing")
    _require(isinstance(value, int) and not isinstance(value, bool), where, field,
             f"is {type(value).__name__} {value!r}, not an integer")
    _require(value >= 0, where, field, f"is negative ({value})")
    return value


def _relative_path(value: Any, where: str, field: str) -> str:
    """A path inside the run folder: relative, normalised, no `..`, no scheme."""
    _require(isinstance(value, str) and value != "", where, field, f"is {value!r}, not a path")
    _require(not is_remote(value) and not value.startswith(("/", "\\")) and ":" not in value.split("/")[0],
             where, field, f"is {value!r}, not a path relative to the run folder")
    _require(posixpath.normpath(value) == value and ".." not in value.split("/") and "\\" not in value,
             where, field, f"is {value!r}, which leaves the run folder or is not normalised")
    return value


def _shards(entry: Any, version: int, where: str, field: str, folder: str, seen: set[str]) -> tuple[Shard, ...]:
    """The shards `entry` lists ({"shards", "shard_bytes", "shard_records"}), each a path inside
    `folder` listed once in the whole manifest (`seen`), with a size and a count from version 2."""
    _require(isinstance(entry, dict), where, field, "is not an object")
    shards = entry.get("shards")
    _require(isinstance(shards, list), where, f"{field}.shards", "is missing or not a list")
    paths = [_relative_path(shard, where, f"{field}.shards[{i}]") for i, shard in enumerate(shards)]
    for i, path in enumerate(paths):
        _require(path not in seen, where, f"{field}.shards[{i}]", f"lists {path} a second time")
        _require(path.startswith(folder + "/"), where, f"{field}.shards[{i}]",
                 f"is {path}, outside its folder {folder}/")
        seen.add(path)
    per_shard: dict[str, list[int | None]] = {}
    for key in ("shard_bytes", "shard_records"):
        if version == 1:
            per_shard[key] = [None] * len(paths)
            continue
        values = entry.get(key)
        _require(isinstance(values, list) and len(values) == len(paths), where, f"{field}.{key}",
                 f"must list one count per shard ({len(paths)}), got "
                 f"{len(values) if isinstance(values, list) else values!r}")
        per_shard[key] = [_count(value, where, f"{field}.{key}[{i}]") for i, value in enumerate(values)]
    return tuple(Shard(path, size, n) for path, size, n in zip(paths, per_shard["shard_bytes"],
                                                               per_shard["shard_records"]))


def _shards_json(shards: tuple[Shard, ...]) -> dict:
    return {"shards": [shard.path for shard in shards], "shard_bytes": [shard.size for shard in shards],
            "shard_records": [shard.records for shard in shards]}


@dataclasses.dataclass(frozen=True)
class Manifest:
    format_version: int
    outputs: dict[str, Output]
    triplet_features: dict[str, str]
    stats: str | None
    files: tuple[str, ...]   # top-level files the run wrote besides its outputs' shards

    @classmethod
    def parse(cls, raw: bytes, where: str) -> Manifest:
        """The manifest in `raw` (read from `where`); ManifestError naming `where` and the field."""
        try:
            fields = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ManifestError(f"{where}: not a JSON manifest ({type(error).__name__}: {error}); the run "
                                "folder is damaged (rerun pipeline.run)") from None
        _require(isinstance(fields, dict), where, "(top level)", f"is a {type(fields).__name__}, not an object")
        version = fields.get("format_version", 1)
        _require(isinstance(version, int) and not isinstance(version, bool), where, "format_version",
                 f"is {type(version).__name__} {version!r}, not an integer")
        if version not in READABLE_MANIFEST_VERSIONS:
            raise ManifestError(f"{where}: format_version {version} is unknown to this code (it reads "
                                f"{', '.join(map(str, READABLE_MANIFEST_VERSIONS))}); upgrade wikisim")
        outputs = fields.get("outputs")
        _require(isinstance(outputs, dict) and bool(outputs), where, "outputs", "is missing or empty")
        parsed: dict[str, Output] = {}
        seen: set[str] = set()
        for folder, entry in outputs.items():
            field = f"outputs[{folder!r}]"
            _relative_path(folder, where, f"{field} (its name)")
            _require(isinstance(entry, dict), where, field, "is not an object")
            shards = _shards(entry, version, where, field, folder, seen)
            ordering = entry.get("order")
            _require(ordering is None or isinstance(ordering, dict), where, f"{field}.order", "is not an object")
            twins = entry.get("parquet")   # a pipeline run's triplet splits have them; a hand-made run may not
            parquet = _shards(twins, version, where, f"{field}.parquet", folder, seen) if twins is not None else ()
            _require(not parquet or len(parquet) == len(shards), where, f"{field}.parquet.shards",
                     f"must list one Parquet twin per shard ({len(shards)}), got {len(parquet)}")
            parsed[folder] = Output(folder, _count(entry.get("records"), where, f"{field}.records"), shards, ordering,
                                    parquet)
        features = fields.get("triplet_features", dict(TRIPLET_FEATURES))
        _require(isinstance(features, dict) and all(isinstance(v, str) for v in features.values()), where,
                 "triplet_features", "is not an object of type names")
        stats = fields.get("stats")
        files = tuple(_relative_path(name, where, f"files[{i}]") for i, name in enumerate(fields.get("files", [])))
        return cls(version, parsed, features, stats if isinstance(stats, str) else None, files)

    def to_json(self) -> dict:
        return {"format_version": self.format_version, "triplet_features": self.triplet_features,
                "stats": self.stats, "files": list(self.files), "outputs": {
                    folder: {"records": output.records, **_shards_json(output.shards), "order": output.order,
                             "parquet": _shards_json(output.parquet) if output.parquet else None}
                    for folder, output in self.outputs.items()}}

    def written_files(self) -> list[str]:
        """Every file the run lists as its own, relative to the run folder: shards (both forms),
        stats, the rest, this manifest."""
        shards = [shard.path for output in self.outputs.values() for shard in output.all_shards()]
        return sorted({*shards, *self.files, *([self.stats] if self.stats else []), MANIFEST})


def file_sizes(paths: list[str]) -> dict[str, int | None]:
    """{path: size in bytes, or None when it does not exist}, local or remote (one listing per folder)."""
    from apache_beam.io.filesystems import FileSystems

    sizes: dict[str, int | None] = dict.fromkeys(paths)
    for folder in sorted({path.rsplit("/", 1)[0] for path in paths}):
        for meta in FileSystems.match([f"{folder}/*"])[0].metadata_list:
            if meta.path in sizes:
                sizes[meta.path] = meta.size_in_bytes
    return sizes


def count_shard_records(path: str) -> tuple[int, str | None]:
    """(records, why the shard broke off or None) of one shard, read back through Beam
    FileSystems: TFRecord frames (length, CRC, data, CRC: `core.tfrecord.read_records`) of a
    `.tfrecord.gz`, lines of a `.jsonl.gz`, rows of a `.parquet` (its footer's count). A shard
    that ends inside a record, fails a CRC or stops decompressing counts the records before the
    break, as the trainer reads them (`model.training.arrays.shard_records`): the gzip stream is
    decompressed here in small steps (`gzip.GzipFile` over the raw bytes), since Beam's GZIP
    reader decompresses megabytes at a time and, on damaged deflate data, gave none of the
    records before the damage (0 counted where the trainer had read thousands)."""
    import gzip
    import zlib

    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    if path.endswith(parquet.SUFFIX):
        return parquet.count_rows(path)
    count = 0
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw, \
                gzip.GzipFile(fileobj=raw, mode="rb") as handle:
            if ".tfrecord" in path:
                for _ in read_records(handle):
                    count += 1
            else:
                while block := handle.read(1 << 20):
                    count += block.count(b"\n")
    except CorruptRecordError as error:
        return count, str(error).removeprefix(": ")
    except (zlib.error, EOFError, OSError) as error:
        return count, f"stops decompressing ({error})"
    return count, None


def check_record_count(where: str, read: int, expected: int, max_lost_fraction: float = 0.0) -> int:
    """Records read against what the manifest says: more is always wrong (mixed or replaced
    data), fewer is a loss allowed up to `max_lost_fraction`. Returns the loss."""
    if read > expected:
        raise ShardError(f"{where}: {read:,} records where the manifest lists {expected:,} (mixed or replaced shards)")
    lost = expected - read
    if lost > max_lost_fraction * max(expected, 1):
        raise ShardError(f"{where}: {read:,} of the {expected:,} records the manifest lists ({lost:,} lost "
                         f"> --max-lost-fraction {max_lost_fraction})")
    return lost


STORAGE_WAIT_S = 30.0   # how long a reader waits for a gs:// path's storage to answer before refusing it
_REACHED_BUCKETS: set[str] = set()   # buckets this process has reached (`check_storage`: once each)


def _one_line(error: BaseException, limit: int = 300) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())[:limit]}"


def storage_errors() -> tuple[type[BaseException], ...]:
    """What reaching a file can raise besides a wrong path: OSError (Beam's BeamIOError, a
    local permission), Google's API errors (RetryError, Forbidden, ...) and auth errors."""
    try:
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import GoogleAuthError
    except ImportError:   # without Beam's gcp extra there is no gs:// either
        return (OSError,)
    return (OSError, GoogleAPIError, GoogleAuthError)


def check_storage(path: str) -> None:
    """Before a reader touches a `gs://` path: there are credentials (unless STORAGE_EMULATOR_HOST
    points the clients at an emulator) and the path's bucket answers within STORAGE_WAIT_S, or a
    UsageError naming `path`, in seconds; not Beam's minutes of retries (its credentials 4
    times, then every request for 2 minutes, anonymously) ending in a RetryError. Once per
    bucket and process. A bucket read without credentials (a public one) is refused too; local
    paths and other schemes are not checked."""
    if not path.startswith("gs://"):
        return
    bucket, _, name = path[len("gs://"):].partition("/")
    if bucket in _REACHED_BUCKETS:
        return
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud.storage import Client
    from google.cloud.storage.retry import DEFAULT_RETRY

    try:
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            client = Client(project=None)
        else:
            credentials, project = google.auth.default()
            client = Client(credentials=credentials, project=project)
        client.bucket(bucket).blob(name or MANIFEST).exists(timeout=STORAGE_WAIT_S / 3,
                                                            retry=DEFAULT_RETRY.with_timeout(STORAGE_WAIT_S))
    except DefaultCredentialsError:
        raise UsageError(f"{path}: no Google Cloud credentials to read it with (set GOOGLE_APPLICATION_CREDENTIALS "
                         "to a service account key, or run gcloud auth application-default login)") from None
    except storage_errors() as error:
        raise UsageError(f"{path}: its storage did not answer within {STORAGE_WAIT_S:.0f} s or refused it "
                         f"({_one_line(error)})") from None
    _REACHED_BUCKETS.add(bucket)


@dataclasses.dataclass(frozen=True)
class Run:
    """A published pipeline run, opened once (`open`): its folder and its validated manifest."""
    root: str
    manifest: Manifest
    sha256: str   # of the manifest's bytes: what a model dir records of the data it was trained on

    @classmethod
    def open(cls, data: str) -> Run:
        """ManifestError naming the folder when it holds no manifest (a run that failed or still
        runs, or a wrong path), or naming the field of one that is not valid; a UsageError naming
        the manifest when its storage cannot be reached or read (`check_storage`)."""
        from apache_beam.io.filesystems import FileSystems

        root = data.rstrip("/")
        path = f"{root}/{MANIFEST}"
        check_storage(path)
        try:
            found = FileSystems.exists(path)
            raw = read_bytes(path) if found else b""
        except storage_errors() as error:
            raise ManifestError(f"{path}: cannot be read ({_one_line(error)})") from None
        if not found:
            raise ManifestError(f"{data} has no {MANIFEST}: not the output of a finished pipeline.run "
                                "(it failed, still runs, or the path is wrong)")
        return cls(root, Manifest.parse(raw, path), hashlib.sha256(raw).hexdigest())

    def provenance(self) -> dict:
        """What the run was made from, as a model card names it (never a local path): the dump's
        file name, its wiki and date (`enwiki-20190720-...`), the pages read and the articles
        kept, from the run's stats.json; {} where the run records none."""
        if not self.manifest.stats:
            return {}
        try:
            stats = read_json_object(self.path(self.manifest.stats))
        except (UsageError, OSError):
            return {}
        dump = posixpath.basename(str(stats.get("input") or "").rstrip("/"))
        reconciliation = stats.get("reconciliation") or {}
        found = {"dump": dump or None, "pages": reconciliation.get("pages_read"),
                 "articles": (reconciliation.get("outcomes") or {}).get("articles_used")}
        dated = re.match(r"([a-z_]+wiki)-(\d{4})(\d\d)(\d\d)", dump)
        if dated:
            found.update(wiki=dated.group(1), dump_date="-".join(dated.group(2, 3, 4)))
        return {key: value for key, value in found.items() if value is not None}

    def output(self, folder: str) -> Output:
        if folder not in self.manifest.outputs:
            raise ManifestError(f"{self.root}/{MANIFEST} lists no {folder} (it lists "
                                f"{', '.join(sorted(self.manifest.outputs))})")
        return self.manifest.outputs[folder]

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def paths(self, folder: str) -> list[str]:
        return [self.path(shard.path) for shard in self.output(folder).shards]

    def check_sizes(self, folder: str) -> None:
        """ShardError naming the first shard that is missing or not of the size the run wrote:
        a missing, truncated or replaced shard is refused in seconds, before anything is read.
        A triplet split's Parquet twins are checked with its TFRecord shards."""
        shards = self.output(folder).all_shards()
        found = file_sizes([self.path(shard.path) for shard in shards])
        for shard in shards:
            size = found[self.path(shard.path)]
            if size is None:
                raise ShardError(f"{self.path(shard.path)}: missing (the manifest lists it); the run folder is "
                                 "incomplete")
            if shard.size is not None and size != shard.size:
                raise ShardError(f"{self.path(shard.path)}: {size:,} bytes where the run wrote {shard.size:,} "
                                 "(truncated, replaced or corrupt); rerun the pipeline or restore the shard")

    def verify(self, folder: str, max_lost_fraction: float = 0.0) -> int:
        """What a consumer checks before it reads an output whole: each shard there with its size,
        then its records counted and compared with the manifest, both ways, shard by shard
        (ShardError naming the shard or the folder). A shard of the size the run wrote that reads
        whole but holds another count of records is not the run's (another run's shard of the
        same size): refused naming it, whatever `max_lost_fraction`. Returns the records lost to
        shards that break off, allowed up to `max_lost_fraction` of the output. A triplet split's
        Parquet twins are verified too, each whole (`verify_parquet`)."""
        self.check_sizes(folder)
        output = self.output(folder)
        self.verify_parquet(output)
        lost = 0
        for shard in output.shards:
            read, broken = count_shard_records(self.path(shard.path))
            if shard.records is None:   # a version-1 manifest: the folder's total only
                lost -= read
                continue
            if read > shard.records or (broken is None and read != shard.records):
                raise ShardError(f"{self.path(shard.path)}: {read:,} records where the run wrote {shard.records:,}, "
                                 "at the same size: a shard of another run (mixed or replaced shards); rerun the "
                                 "pipeline or restore the shard")
            lost += shard.records - read
        if output.shards and output.shards[0].records is None:
            lost += output.records
        return check_record_count(f"{self.root}/{folder}", output.records - lost, output.records, max_lost_fraction)

    def verify_parquet(self, output: Output) -> None:
        """Each Parquet twin holds, by its footer, the records the run wrote to it: ShardError
        naming the first that is not whole or holds another count. No loss is allowed: a twin is
        read whole or not at all, and its records are already checked in its TFRecord shard."""
        for shard in output.parquet:
            read, broken = count_shard_records(self.path(shard.path))
            if broken or read != shard.records:
                raise ShardError(f"{self.path(shard.path)}: {broken or f'{read:,} records'} where the run wrote "
                                 f"{shard.records:,} records; rerun the pipeline or restore the file")


# The run's top-level files besides its outputs and manifest.
STATS = "stats.json"
TRIPLETS_PLOT = "triplets.png"
RUN_LOG = "pipeline.log"   # Beam's log of a local run (`core.progress`)
RUN_FILES = (STATS, TRIPLETS_PLOT, RUN_LOG)   # a run's top-level files besides its outputs and manifest


