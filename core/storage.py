"""Remote model dirs (gs:// or any other Beam scheme) staged in a local directory.

Keras and TensorFlow write a model dir (weights, backups, TensorBoard logs,
SavedModels) through `tf.io.gfile`, whose GCS filesystem has a hard-wired endpoint: it has no
endpoint override, ignores `STORAGE_EMULATOR_HOST` and calls www.googleapis.com, so it cannot
be pointed at `gcp-storage-emulator`. Beam's `FileSystems` is the project's one storage layer
(the pipeline writes with it, `model.training.arrays` and `eval` read with it); its GCS client honours the
emulator and is the one Dataflow and Vertex use. So TensorFlow only ever sees local paths: a
remote tree is downloaded into a local directory, worked on there, and mirrored back through
`FileSystems` (`TreeMirror.push` uploads what changed and deletes what was removed locally).
Files are copied byte for byte (no compression by extension: `.gz` stays gzip).
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile

from core.files import is_remote

LOG = logging.getLogger(__name__)
_CHUNK = 16 << 20


def _remote_file(root: str, relative: str) -> str:
    return f"{root.rstrip('/')}/{relative}"


def list_tree(remote: str) -> dict[str, int]:
    """Files under the remote dir `remote`: relative path (with `/`) -> size in bytes."""
    from apache_beam.io.filesystems import FileSystems

    prefix = remote.rstrip("/") + "/"
    found = FileSystems.match([prefix + "**"])[0].metadata_list
    return {meta.path[len(prefix):]: meta.size_in_bytes for meta in found
            if meta.path.startswith(prefix) and not meta.path.endswith("/")}


def download_tree(remote: str, local: str) -> list[str]:
    """Copies every file under `remote` into `local` (created if needed); returns relative paths."""
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    files = sorted(list_tree(remote))
    os.makedirs(local, exist_ok=True)
    for relative in files:
        target = os.path.join(local, *relative.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with FileSystems.open(_remote_file(remote, relative), compression_type=CompressionTypes.UNCOMPRESSED) as src, \
                open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
    LOG.info("downloaded %d file(s) from %s to %s", len(files), remote, local)
    return files


def _local_files(local: str, under: str = "") -> dict[str, tuple[int, int]]:
    """Files under `local/under`: relative path (with `/`) -> (size, mtime_ns)."""
    files = {}
    for folder, _, names in os.walk(os.path.join(local, under) if under else local):
        for name in names:
            path = os.path.join(folder, name)
            stat = os.stat(path)
            files[os.path.relpath(path, local).replace(os.sep, "/")] = (stat.st_size, stat.st_mtime_ns)
    return files


def upload_tree(local: str, remote: str, files: list[str] | None = None) -> list[str]:
    """Copies every file under `local` (or only the relative paths `files`) to `remote`."""
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    files = sorted(_local_files(local)) if files is None else list(files)
    for relative in files:
        with open(os.path.join(local, *relative.split("/")), "rb") as src, FileSystems.create(
                _remote_file(remote, relative), mime_type="application/octet-stream",
                compression_type=CompressionTypes.UNCOMPRESSED) as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
    return files


class TreeMirror:
    """A local staging directory kept in step with a remote directory.

    `pull()` downloads the remote tree (so a preempted job finds its backup); `push()` uploads
    the files added or changed locally since the last pull/push and deletes the remote copies
    of files deleted locally; `changed(under)` tells cheaply (stat only) whether a push of that
    subtree would do anything.
    """

    def __init__(self, local: str, remote: str):
        self.local, self.remote = local, remote.rstrip("/")
        self._synced: dict[str, tuple[int, int]] = {}

    def pull(self) -> list[str]:
        files = download_tree(self.remote, self.local)
        self._synced = _local_files(self.local)
        return files

    def _diff(self, under: str = ""):
        prefix = under.strip("/") + "/" if under else ""
        now = _local_files(self.local, under)
        changed = sorted(rel for rel, state in now.items() if self._synced.get(rel) != state)
        gone = sorted(rel for rel in self._synced if rel.startswith(prefix) and rel not in now)
        return now, changed, gone

    def changed(self, under: str = "") -> bool:
        _, changed, gone = self._diff(under)
        return bool(changed or gone)

    def push(self, under: str = "") -> int:
        """Mirrors the local tree (or its subtree `under`) to the remote; returns files touched."""
        from apache_beam.io.filesystems import FileSystems

        now, changed, gone = self._diff(under)
        upload_tree(self.local, self.remote, changed)
        if gone:
            FileSystems.delete([_remote_file(self.remote, rel) for rel in gone])
        for rel in gone:
            del self._synced[rel]
        self._synced.update({rel: now[rel] for rel in changed})
        if changed or gone:
            LOG.info("mirrored %s to %s: %d uploaded, %d deleted", self.local, self.remote, len(changed), len(gone))
        return len(changed) + len(gone)


@contextlib.contextmanager
def staged(path: str, push: bool = True):
    """Yields `(local dir, mirror)` for the dir `path`: a local path as it is (mirror None); a remote
    one pulled into a temporary directory, pushed back on exit when `push` (only one writer
    should push: the chief of a multi-worker job), then the temporary directory removed."""
    if not is_remote(path):
        yield str(path), None
        return
    with tempfile.TemporaryDirectory(prefix="staged-") as local:
        mirror = TreeMirror(local, str(path))
        mirror.pull()
        try:
            yield local, mirror
        finally:
            if push:
                mirror.push()


def top_level_entries(path: str) -> list[str]:
    if not is_remote(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    return sorted({relative.split("/", 1)[0] for relative in list_tree(path)})


