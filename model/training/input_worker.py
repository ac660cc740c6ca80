"""An input worker of `model.training.arrays.in_workers`: the code a spawned worker runs first.

It sets the worker's own environment before anything imports Keras: Keras (which the batches'
module imports, for its PyDatasets) under its NumPy backend, so that no worker imports TensorFlow
or claims a device (JAX would take most of a GPU's memory), and `tokenizers` on one thread (the
workers are the parallelism). Set here, in the worker, the trainer's own environment is never
changed while its threads run. Nothing here imports the batches' module: the first task
(`make`, pickled) brings it in, after the environment is set.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import traceback
from typing import Any

WORKER_ENVIRONMENT = {"KERAS_BACKEND": "numpy", "CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu",
                      "TOKENIZERS_PARALLELISM": "false"}


def _exit_with(sentinel: Any) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


def serve(tasks: Any, results: Any) -> None:
    """`make`, the first item of `tasks` (sent there, not as the process's argument: `Process.start`
    writes those to the child's pipe itself, and would wait for ever on one that died before
    reading a large tokenizer), then `make(*task)` of each further task, in order, into `results`,
    until None. A failure is sent back as the exception and its traceback (an exception that does
    not pickle as a RuntimeError of its text). It exits when the trainer does, however that ends
    (its queues would not tell it), and leaves Ctrl-C to the trainer."""
    os.environ.update(WORKER_ENVIRONMENT)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()
    make = tasks.get()
    while (task := tasks.get()) is not None:
        try:
            results.put(("batch", make(*task)))
        except BaseException as error:   # every failure goes back to the trainer
            text = traceback.format_exc()
            try:
                pickle.loads(pickle.dumps(error))
            except Exception:
                error = RuntimeError(f"{type(error).__name__}: {error}")
            results.put(("error", (error, text)))
