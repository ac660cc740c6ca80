"""Shared fixtures: a real GCS emulator on loopback, and the pipeline run once on the embedded dump.

The tiers: a test that uses one of the session's heavy fixtures (`SLOW_FIXTURES`) or is marked
`slow` (real training, worker processes, whole pipeline runs) is outside `make test-fast`."""
import os
import socket
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import pytest
from dump_support import ALL_NEGATIVES

from model.encoding.encoders import load_pytorch_first

load_pytorch_first()   # with the minilm extra: PyTorch before any test's TensorFlow (model.encoding.encoders)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def gcs_emulator():
    """Starts `gcp-storage-emulator` on loopback and points every GCS client at it.

    Yields a function that returns a fresh `gs://` prefix in the emulator's bucket.
    """
    port = _free_port()
    bucket = "wikisim-test"
    proc = subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator"),
            "start", "--host", "127.0.0.1", "--port", str(port),
            "--in-memory", "--default-bucket", bucket,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError as err:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("gcp-storage-emulator did not start") from err
            time.sleep(0.2)
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    try:
        yield lambda: f"gs://{bucket}/{uuid.uuid4().hex}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if previous is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = previous


@pytest.fixture(scope="session")
def embedded_pipeline_output(tmp_path_factory) -> Path:
    """The pipeline's outputs on the embedded real Wikipedia excerpt (DirectRunner), run once per session."""
    from pipeline import run as pipeline_run

    out = tmp_path_factory.mktemp("pipeline-out")
    pipeline_run.main(["--output", str(out), "--runner", "DirectRunner", *ALL_NEGATIVES])
    return out


@pytest.fixture(scope="session")
def tiny_model(embedded_pipeline_output, tmp_path_factory):
    """A tiny encoder trained for a few steps on the embedded triplets-sen (not to be good, to be real)."""
    from model.config import TrainConfig
    from model.train import train

    model_dir = tmp_path_factory.mktemp("eval-models") / "triplets-sen"
    train(TrainConfig.from_flags(data=str(embedded_pipeline_output), model_dir=str(model_dir), epochs=1, steps=3,
                                 batch_size=16, lstm_units=8, attention_size=4, patience=1, progress=False,
                                 vocabulary="train"))
    return str(model_dir)


@pytest.fixture(scope="session")
def fine_tuned(embedded_pipeline_output, tmp_path_factory):
    """A model dir of MiniLM fine-tuned for two steps (its Keras and sentence-transformers exports),
    and model.train's summary."""
    from model.config import TrainConfig
    from model.train import train

    model_dir = tmp_path_factory.mktemp("models") / "minilm-sen"
    with warnings.catch_warnings(record=True) as caught:   # what its log would show: TRAINING_WARNINGS
        warnings.simplefilter("always")
        summary = train(TrainConfig.from_flags(data=str(embedded_pipeline_output), model_dir=str(model_dir),
                                               encoder="minilm", epochs=1, steps=2, batch_size=8, max_tokens=32,
                                               warmup_triplets=8, evaluation_triplets=16, progress=False))
    (model_dir.parent / TRAINING_WARNINGS).write_text("\n".join(str(warning.message) for warning in caught))
    return model_dir, summary


# Beside `fine_tuned`'s model dir: the warnings its training raised, one a line.
TRAINING_WARNINGS = "training-warnings.txt"


# Fixtures that run the real pipeline, train, or start the emulator: minutes, not seconds.
SLOW_FIXTURES = {"embedded_pipeline_output", "tiny_model", "fine_tuned", "gcs_emulator"}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: outside the fast tier (make test-fast): real runs, training, processes")


def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
