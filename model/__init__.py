"""The triplet network, its trainer, and every sentence encoder the evaluation jobs score.

Importing `model` loads nothing heavy (no TensorFlow, no PyTorch): each module imports what it
uses, and the entry points parse their flags first. What it does set is TensorFlow's C++ log
level, quiet by default (`TF_CPP_MIN_LOG_LEVEL=3`); set the variable yourself (e.g. to 0)
to bring TensorFlow's logs back.

No log level reaches the lines TensorFlow's C++ libraries print while they load, before their
logging is set up (absl's "All log messages before absl::InitializeLog() is called are written to
STDERR", `cudart_stub` on a machine without CUDA, twice). So while quiet, the first
`import tensorflow` runs with the process's stderr (file descriptor 2) pointed at /dev/null, and
put back as soon as it returns: an import error still raises, with its traceback, after. The
Python loggers of TensorFlow and absl are set to WARNING too: their INFO lines ("Assets written
to ...", printed twice through two handlers) say nothing a user acts on.
"""
import contextlib
import importlib.abc
import importlib.util
import logging
import os
import sys

from core.cli import UsageError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Set to 1: every process of the project runs as on an image without TensorFlow (an accelerator's):
# `import tensorflow` fails and `tensorflow_installed()` says no, so the commands take their
# TensorFlow-free routes (JAX's Keras, ONNX, arrays). What `infra/accelerator/quality_run.sh`'s
# `DRY=1` rehearsal and the tests of those routes run under, here where TensorFlow is installed.
WITHOUT_TENSORFLOW = "WIKISIM_WITHOUT_TENSORFLOW"


@contextlib.contextmanager
def _stderr_silenced():
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class _QuietLoader(importlib.abc.Loader):
    """The real loader of a module, run with stderr silenced; once loaded, the module names its
    real loader again."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with _stderr_silenced():
            self.loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self.loader


class _QuietTensorFlowLoad(importlib.abc.MetaPathFinder):
    """On the first `import tensorflow`: the spec the other finders give, its loader wrapped in
    `_QuietLoader`; then leaves `sys.meta_path`."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


if os.environ["TF_CPP_MIN_LOG_LEVEL"] != "0":
    if "tensorflow" not in sys.modules:
        sys.meta_path.insert(0, _QuietTensorFlowLoad())
    logging.getLogger("tensorflow").setLevel(logging.WARNING)   # "Assets written to ...", twice
    # absl's INFO lines (renamed SavedModel inputs) are filtered, not raised past: absl reads its
    # logger's level as its verbosity, which its handler applies to every logger's records.
    logging.getLogger("absl").addFilter(lambda record: record.levelno >= logging.WARNING)


class _TensorFlowKeptOut(importlib.abc.MetaPathFinder):
    """`import tensorflow` (or tensorflow_text) fails as where it is not installed (`keep_tensorflow_out`)."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("tensorflow", "tensorflow_text"):
            raise ModuleNotFoundError(f"No module named {name!r} (kept out of this process)", name=name)
        return None


def keep_tensorflow_out() -> None:
    """From now on this process imports TensorFlow as one where it is not installed: a library that
    tries it (keras-hub does at its import, for tokenizers a JAX run of a transformer does not use)
    goes on without it, so the process is the one an accelerator image without TensorFlow runs,
    and its memory JAX's alone. Where TensorFlow is loaded already, nothing changes."""
    if "tensorflow" not in sys.modules and not any(isinstance(finder, _TensorFlowKeptOut) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TensorFlowKeptOut())


def without_tensorflow() -> bool:
    """Whether this process runs as on an image without TensorFlow (WITHOUT_TENSORFLOW=1)."""
    return os.environ.get(WITHOUT_TENSORFLOW) == "1"


if without_tensorflow():
    keep_tensorflow_out()


def keras_backend_here() -> str:
    """The Keras backend a command that runs under either one takes, set in KERAS_BACKEND before
    Keras loads: the one KERAS_BACKEND names, else TensorFlow where it is installed, else JAX
    (an accelerator image). Where Keras is loaded already, its backend, and the environment as it is."""
    if "keras" in sys.modules:
        return sys.modules["keras"].backend.backend()
    backend = os.environ.get("KERAS_BACKEND") or ("tensorflow" if tensorflow_installed() else "jax")
    os.environ["KERAS_BACKEND"] = backend
    return backend


def require_tensorflow_keras(command: str) -> None:
    """A UsageError (one `error:` line, exit 2) when KERAS_BACKEND names another backend than
    TensorFlow for a command whose Keras code runs under TensorFlow alone (it builds a strings-in
    SavedModel, or trains outside `model.train`); called before Keras loads. Only `model.train
    --backend jax` trains under JAX."""
    if not tensorflow_installed():
        why = f"{WITHOUT_TENSORFLOW}=1 runs it as if TensorFlow were not installed" if without_tensorflow() else (
            "TensorFlow is not installed here")
        raise UsageError(f"{command} runs Keras under TensorFlow: {why}")
    backend = os.environ.get("KERAS_BACKEND")
    if backend and backend != "tensorflow":
        raise UsageError(f"KERAS_BACKEND={backend}: {command} runs Keras under TensorFlow; unset KERAS_BACKEND "
                         "(model.train --backend jax is the command that trains under JAX)")


def tensorflow_importable() -> bool:
    """Whether this process can import TensorFlow: installed, and not kept out (`keep_tensorflow_out`)."""
    return tensorflow_installed() and not any(isinstance(finder, _TensorFlowKeptOut) for finder in sys.meta_path)


def tensorflow_installed() -> bool:
    """Whether TensorFlow is installed (a new process can import it), also in a process that keeps
    it out (`keep_tensorflow_out`: `model.train` of a transformer under JAX)."""
    import importlib.machinery

    return not without_tensorflow() and importlib.machinery.PathFinder.find_spec("tensorflow") is not None


# Keras' own default backend is TensorFlow, and `import keras` fails where TensorFlow is not
# installed: there (an accelerator image) every command's Keras is JAX's unless KERAS_BACKEND says.
KERAS_BACKEND_DEFAULTED = "KERAS_BACKEND" not in os.environ and not tensorflow_installed()
if KERAS_BACKEND_DEFAULTED:
    os.environ["KERAS_BACKEND"] = "jax"
