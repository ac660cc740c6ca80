"""The device side of a kit (`infra.accelerator.kit`): checks the parts that have arrived, and once
every part kit.json lists is there and whole, unpacks them into DEST, installs the wheels into
DEST/site and prints the environment quality_run.sh needs. Standard library only: the accelerator
image's python3 runs it as a file, before anything of the kit is installed.

    python3 infra/accelerator/unpack.py --check PARTS      # mid-transfer: the parts here, whole or refused
    python3 infra/accelerator/unpack.py PARTS DEST         # all parts here: unpack, install, print exports
    eval "$(python3 infra/accelerator/unpack.py /tmp/kit /tmp/q)"   # then: infra/accelerator/quality_run.sh OUT

PARTS holds kit.json and the `part-NN.tar` files (one tar stream cut into parts: they are read in
kit.json's order as one stream, so a file may span parts). A part that is missing (final run), of
another size, or of another sha256 than kit.json lists is refused with one `error:` line, exit 1,
before anything is unpacked; each unpacked file is checked against kit.json's sha256 too. DEST is
new or a finished unpack of the same kit (then only the exports are printed again). Progress goes
to stderr; stdout holds only the `export` lines.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile

KIT_JSON = "kit.json"
KIT_FORMAT = 1
DONE = ".unpacked"   # in DEST: the kit's id once unpacked and installed
CHUNK = 1 << 20


class KitError(Exception):
    """A missing, corrupt or foreign part or file: one `error:` line."""


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def read_kit(parts_dir: str) -> dict:
    path = os.path.join(parts_dir, KIT_JSON)
    try:
        with open(path, encoding="utf-8") as handle:
            kit = json.load(handle)
    except FileNotFoundError:
        raise KitError(f"{path}: missing; carry the kit's {KIT_JSON} with its parts") from None
    except (OSError, ValueError) as error:
        raise KitError(f"{path}: not a kit.json ({type(error).__name__}: {error})") from None
    if not isinstance(kit, dict) or kit.get("format") != KIT_FORMAT or not isinstance(kit.get("parts"), list):
        raise KitError(f"{path}: not a kit.json of format {KIT_FORMAT}")
    return kit


def check_parts(parts_dir: str, kit: dict, final: bool) -> list[str]:
    """The parts kit.json lists that are not here yet; KitError for a present part of another size
    or sha256, and (`final`) for a missing one."""
    missing = []
    for part in kit["parts"]:
        path = os.path.join(parts_dir, part["name"])
        if not os.path.exists(path):
            missing.append(part["name"])
            continue
        size = os.path.getsize(path)
        if size != part["bytes"]:
            raise KitError(f"{path}: {size:,} bytes where kit.json lists {part['bytes']:,} (cut short or another "
                           "kit's): send that part again")
        if sha256_of(path) != part["sha256"]:
            raise KitError(f"{path}: its sha256 is not kit.json's (corrupt, or another kit's): send that part again")
    if missing and final:
        raise KitError(f"{parts_dir}: {len(missing)} of {len(kit['parts'])} parts missing ({', '.join(missing)}): "
                       "send them first (kit.json's calls)")
    return missing


class Chain(io.RawIOBase):
    """The parts, in order, read as one stream."""

    def __init__(self, paths: list[str]):
        self.paths = list(paths)
        self.handle: io.BufferedReader | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while True:
            if self.handle is None:
                if not self.paths:
                    return 0
                self.handle = open(self.paths.pop(0), "rb")
            handle = self.handle
            count = handle.readinto(buffer)
            if count:
                return count
            handle.close()
            self.handle = None


def unpack(parts_dir: str, dest: str, kit: dict) -> None:
    """Extracts the stream into `dest` (a fresh folder), each file checked against kit.json."""
    paths = [os.path.join(parts_dir, part["name"]) for part in kit["parts"]]
    expected = {entry["path"]: entry for entry in kit["files"]}
    with tarfile.open(fileobj=io.BufferedReader(Chain(paths), CHUNK), mode="r|") as stream:
        for member in stream:
            if member.name not in expected or not member.isfile():
                raise KitError(f"{member.name}: in the parts but not in kit.json's files (another kit's part?)")
            if hasattr(tarfile, "data_filter"):   # Python >= 3.11.4: no links, no paths out of dest
                stream.extract(member, dest, filter="data")
            else:
                stream.extract(member, dest)
    for name, entry in expected.items():
        path = os.path.join(dest, name)
        if not os.path.exists(path) or os.path.getsize(path) != entry["bytes"] or sha256_of(path) != entry["sha256"]:
            raise KitError(f"{path}: not the file kit.json lists (missing, cut short or corrupt)")


def install_wheels(dest: str, kit: dict) -> None:
    wheels = [os.path.join(dest, name) for name in kit.get("wheels", [])]
    if not wheels:
        return
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--target", os.path.join(dest, "site"), *wheels], stdout=sys.stderr)
    if done.returncode:
        raise KitError(f"pip install of the kit's {len(wheels)} wheels into {dest}/site failed (exit "
                       f"{done.returncode}; its output above)")


def exports(dest: str, kit: dict) -> list[str]:
    """The `export` lines quality_run.sh needs: PYTHONPATH (the wheels), MPNET_CHECKPOINT, DATA."""
    dest = os.path.abspath(dest)
    lines = []
    if kit.get("wheels"):
        site = shlex.quote(os.path.join(dest, "site"))
        lines.append(f'export PYTHONPATH={site}"${{PYTHONPATH:+:$PYTHONPATH}}"')
    if kit.get("mpnet"):
        lines.append(f"export MPNET_CHECKPOINT={shlex.quote(os.path.join(dest, kit['mpnet']))}")
    if kit.get("data"):
        lines.append(f"export DATA={shlex.quote(os.path.join(dest, kit['data']))}")
    return lines


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 2 and argv[0] == "--check":
            kit = read_kit(argv[1])
            missing = check_parts(argv[1], kit, final=False)
            here = len(kit["parts"]) - len(missing)
            print(f"{here} of {len(kit['parts'])} parts here and whole" +
                  (f"; still to send: {', '.join(missing)}" if missing else "; all here"), file=sys.stderr)
            return 0
        if len(argv) != 2 or argv[0].startswith("-"):
            print("usage: python3 infra/accelerator/unpack.py [--check] PARTS [DEST]", file=sys.stderr)
            return 2
        parts_dir, dest = argv
        kit = read_kit(parts_dir)
        marker = os.path.join(dest, DONE)
        if os.path.exists(marker):
            with open(marker, encoding="utf-8") as handle:
                if handle.read().strip() != kit["id"]:
                    raise KitError(f"{dest}: holds another kit's unpack; give a new DEST")
            print(f"{dest}: this kit is unpacked already", file=sys.stderr)
        else:
            if os.path.exists(dest) and os.listdir(dest):
                raise KitError(f"{dest}: not empty and not this kit's unpack; give a new DEST")
            check_parts(parts_dir, kit, final=True)
            parent = os.path.dirname(os.path.abspath(dest))
            os.makedirs(parent, exist_ok=True)
            # a new folder of its own beside DEST: nothing there is removed that this did not write
            staging = tempfile.mkdtemp(prefix=f".{os.path.basename(dest.rstrip('/'))}.partial-", dir=parent)
            unpack(parts_dir, staging, kit)
            install_wheels(staging, kit)
            with open(os.path.join(staging, DONE), "w", encoding="utf-8") as handle:
                handle.write(kit["id"] + "\n")
            if os.path.exists(dest):
                os.rmdir(dest)
            os.rename(staging, dest)
            print(f"{dest}: {len(kit['files'])} files unpacked, {len(kit.get('wheels', []))} wheels installed",
                  file=sys.stderr)
        print("\n".join(exports(dest, kit)))
        return 0
    except KitError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
