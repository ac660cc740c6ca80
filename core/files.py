"""Whole-file writes and JSON reads, local or gs://: the one place a command writes a file so
that it appears complete or not at all (`write_complete`, `write_bytes`; a local folder:
`replace_folder`), and reads a file (`read_bytes`) or a JSON object it wrote back, checked
(`read_json_object`). Every stage (pipeline, model, eval, infra) writes and reads through it."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable

from core.cli import UsageError


def is_remote(path: str) -> bool:
    """True for any path with a scheme (`gs://...`): reached through Beam FileSystems, not the OS.
    The scheme's form is Beam's own (`FileSystems.get_scheme`), read without importing Beam."""
    return re.match(r"[a-zA-Z][-a-zA-Z0-9+.]*://", str(path)) is not None


def exists(path: str) -> bool:
    """Whether the file `path` exists, local or remote: Beam's `FileSystems.exists`, typed (Beam's is not)."""
    from apache_beam.io.filesystems import FileSystems

    return bool(FileSystems.exists(path))


def read_bytes(path: str) -> bytes:
    """Whole file through Beam FileSystems (local or gs://), decompressed by its extension."""
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path) as handle:
        return handle.read()


class JsonFileError(UsageError):
    """A JSON file a command reads back (a claim, a model dir's inputs or history, a report) is
    truncated, not JSON, or lacks a field its writer writes."""


def read_json_object(path: str, fields: dict[str, type | tuple[type, ...]] | None = None) -> dict:
    """The JSON object in the file `path` (local or remote), checked to hold `fields` (name:
    type): the one reader of every JSON file a command reads back. JsonFileError, one line
    naming the file and the field, for a truncated or non-JSON file, another JSON value than an
    object, or a missing or mistyped field: what a kill in the middle of a write by an older
    version, or an edit, leaves."""
    try:
        value = json.loads(read_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise JsonFileError(f"{path}: not a complete JSON file ({type(error).__name__}: {error}); it was cut "
                            "short or edited: restore it, or rerun the command that wrote it") from None
    if not isinstance(value, dict):
        raise JsonFileError(f"{path}: holds a JSON {type(value).__name__}, not an object; it was edited or is "
                            "not this file: restore it, or rerun the command that wrote it")
    for name, kind in (fields or {}).items():
        if name not in value:
            raise JsonFileError(f"{path}: field {name} is missing; restore the file, or rerun the command that "
                                "wrote it")
        if not isinstance(value[name], kind) or (isinstance(value[name], bool) and kind in (int, float)):
            raise JsonFileError(f"{path}: field {name} is {type(value[name]).__name__} {str(value[name])[:60]!r}, "
                                f"not {getattr(kind, '__name__', kind)}; restore the file, or rerun the command "
                                "that wrote it")
    return value


# `write_complete`'s temporary beside `path`: `path.<pid>-<8 hex digits>.partial`; one that stays
# (a kill mid-write, or an older wikisim) is a file of whoever lists `path` (`core.folders`).
PARTIAL = re.compile(r"(?P<of>.+)\.[0-9]+-[0-9a-f]{8}\.partial")


def partial_of(path: str) -> str | None:
    """The path whose `write_complete` temporary `path` is, or None when it is none."""
    match = PARTIAL.fullmatch(path)
    return match.group("of") if match else None


def write_complete(path: str, data: bytes, exclusive: bool = False) -> None:
    """Writes `path` so that it appears complete or not at all: a temporary file beside it,
    then (local) `os.link` when `exclusive` (FileExistsError if `path` exists) or `os.replace`.
    On a remote store the object is written in one request (GCS objects appear whole)."""
    if is_remote(path):
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.write(data)
        return
    temporary = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial"   # `PARTIAL` tells it
    fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:   # whatever fails (disk full, a file size limit, a kill's KeyboardInterrupt), no temporary stays
        try:
            written = memoryview(data)
            while written:   # a full disk first writes short, then fails: never a truncated file
                written = written[os.write(fd, written):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(temporary, path) if exclusive else os.replace(temporary, path)
    finally:
        with contextlib.suppress(OSError):   # gone once replaced; the error that got here is the one raised
            os.unlink(temporary)


def write_bytes(path: str, data: bytes) -> None:
    """Writes exactly `data` (no compression chosen by extension) to `path`, local or gs://, whole
    or not at all (`write_complete`: a kill mid-write leaves the earlier file, never half of
    one). Creates a local file's folder, as Beam's `FileSystems.create` does."""
    if not is_remote(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_complete(path, data)


def replace_folder(folder: str, write: Callable[[str], None]) -> None:
    """Replaces the local folder `folder` whole or not at all, as Orbax and TF's CheckpointManager
    replace a checkpoint: `write(partial)` fills `<folder>.partial/`, the current folder is renamed
    `<folder>.previous`, the new one renamed into place, and only then the previous one deleted.
    `recover_folder` undoes a kill between the two renames."""
    partial, previous = f"{folder}.partial", f"{folder}.previous"
    if os.path.isdir(partial):
        shutil.rmtree(partial)
    os.makedirs(partial)
    try:
        write(partial)
    except BaseException:   # a full disk: the half-written copy goes, not the room it takes
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if os.path.isdir(folder):
        os.rename(folder, previous)
    os.rename(partial, folder)
    if os.path.isdir(previous):
        shutil.rmtree(previous)


def recover_folder(folder: str) -> None:
    """Before a run reads `folder` (written by `replace_folder`): a kill between its two renames
    left the last good one as `<folder>.previous`, which is put back; a half-written
    `<folder>.partial` is removed."""
    partial, previous = f"{folder}.partial", f"{folder}.previous"
    if os.path.isdir(partial):
        shutil.rmtree(partial)
    if os.path.isdir(previous):
        if os.path.isdir(folder):
            shutil.rmtree(previous)
        else:
            os.rename(previous, folder)
