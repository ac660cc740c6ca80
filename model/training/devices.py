"""Where a training runs, as the trainer asks of it (replicas, a scope, whether this process is
the chief): a tf.distribute strategy under TensorFlow (`model.training.strategies`), or under
JAX `KerasDevices` (`keras.distribution`). Nothing here loads TensorFlow under JAX."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
import types
from typing import TYPE_CHECKING, TypeAlias

from core.cli import UsageError
from core.folders import owned_tempdir
from model.config import TrainConfig
from model.training.shards import needs_tensorflow

if TYPE_CHECKING:
    import tensorflow as tf

LOG = logging.getLogger(__name__)

# How long one of several processes waits at the coordinator for the others (seconds), beside
# Keras' own KERAS_DISTRIBUTION_* variables: hosts of a job may start minutes apart.
WAIT_VARIABLE = "WIKISIM_PROCESSES_WAIT_SECONDS"
DEFAULT_WAIT_S = 600
# How long a process goes on without a sign of life from another of its job before it ends in one
# `error:` line (seconds; `watch_peers`); JAX's own heartbeat timeout is set beyond it.
PEER_VARIABLE = "WIKISIM_PEER_TIMEOUT_SECONDS"
DEFAULT_PEER_S = 60
# What a JaxRuntimeError says when a collective lost the process at its other end (gloo over TCP,
# JAX's coordination service): `watch_peers` names the lost process for it.
LOST_PEER_SIGNS = ("Gloo", "gloo", "Connection reset", "Connection closed", "Connection refused", "UNAVAILABLE",
                   "heartbeat")
# Flags that only shape a process's own log: they may differ between the processes of a job.
OWN_FLAGS = frozenset({"progress"})


class KerasDevices:
    """What the trainer asks of its strategy (replicas, a scope, whether it is the chief), under
    the JAX backend, from `keras.distribution`: one device, or with `data-parallel` every device
    (`DataParallel`: the weights replicated, each global batch split on its block axis, one
    compiled program over all of them). Set before the model is built, as Keras requires.

    Several processes (a multi-node GPU job, a TPU pod slice) run the same command, each with
    `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator first), `KERAS_DISTRIBUTION_NUM_PROCESSES`
    and `KERAS_DISTRIBUTION_PROCESS_ID`, which `keras.distribution.initialize()` reads; JAX's CPU
    collectives between processes go through gloo. Each process feeds its own devices' blocks of
    every global batch, read from its own share of the shards; process 0 is the chief, and the
    others write to a folder of their own (`worker_temp_dir`), as tf.distribute's workers do."""

    cluster_resolver = None   # one process: the chief, as `is_chief` reads it

    def __init__(self, name: str, tensorflow_input: bool = False, article_chunks: bool = True,
                 flags: dict | None = None):
        import keras

        if tensorflow_input:   # TensorFlow tokenises or teaches on the CPU; the GPUs are JAX's
            import tensorflow as tf

            tf.config.set_visible_devices([], "GPU")
        self.processes = int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES") or 1)
        if self.processes > 1 and (name != "data-parallel" or not article_chunks):
            raise UsageError(f"KERAS_DISTRIBUTION_NUM_PROCESSES={self.processes}: several processes train one model "
                             "with --distribution-strategy data-parallel and --article-chunk > 0 (the processes' "
                             "evaluation shares must run as many steps)")
        if self.processes > 1:
            import jax

            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            peer_s = join_processes(self.processes)
            self.process_id = jax.process_index()
            watch_peers(self.process_id, self.processes, peer_s)
            agree_on_flags(flags or {}, self.process_id, self.processes)
            self.cluster_resolver = types.SimpleNamespace(task_type="worker", task_id=self.process_id)
        else:
            self.process_id = 0
        devices = keras.distribution.list_devices()
        self.num_replicas_in_sync = len(devices) if name == "data-parallel" else 1
        self.local_replicas = self.num_replicas_in_sync // self.processes
        if name == "data-parallel":
            # each process reads its own shards (`TripletInput`): Keras is not to shard them again
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices,
                                                                                auto_shard_dataset=False))
        LOG.info("JAX backend: process %d of %d, %d device(s) (%s), %d replica(s)", self.process_id, self.processes,
                 len(devices), ", ".join(devices), self.num_replicas_in_sync)

    def scope(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


Strategy: TypeAlias = "tf.distribute.Strategy | KerasDevices"   # what `strategy_of` gives


def _seconds(variable: str, default: int) -> int:
    """A whole number >= 1 of seconds from `variable`, or `default`; UsageError otherwise."""
    try:
        seconds = int(os.environ.get(variable) or default)
    except ValueError:
        seconds = 0
    if seconds < 1:
        raise UsageError(f"{variable}={os.environ[variable]}: a whole number of seconds >= 1")
    return seconds


def coordinator_address() -> str:
    return (os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES") or "").split(",")[0] or \
        "the coordinator the cluster names"


def join_processes(processes: int) -> int:
    """`keras.distribution.initialize()` on the job `KERAS_DISTRIBUTION_*` describe, with its wait
    said and bounded: JAX waits at the coordinator for every process without a word, and a wait
    that times out ends in a C++ abort (SIGABRT and a stack), which Python cannot catch. So the
    wait is logged at once, and a watchdog thread ends one that lasts `WAIT_VARIABLE` seconds in
    one `error:` line, exit 1, before JAX would abort (nothing is claimed or written yet). Keras'
    own initialize also agrees on a random seed, which `run_job` has set already (`--seed`).
    Returns `PEER_VARIABLE`'s seconds (`watch_peers`); JAX's heartbeat timeout, after which it
    aborts every process of a job that lost one, is set to twice that, so `watch_peers` ends first."""
    import jax

    addresses = os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES") or ""
    coordinator = addresses.split(",")[0] or None
    process_id = os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID")
    wait_s = _seconds(WAIT_VARIABLE, DEFAULT_WAIT_S)
    peer_s = _seconds(PEER_VARIABLE, DEFAULT_PEER_S)
    where = coordinator_address()
    LOG.info("process %s of %d: waiting up to %d s for the other processes at %s (%s)", process_id or "?", processes,
             wait_s, where, WAIT_VARIABLE)

    def give_up() -> None:
        print(f"error: process {process_id or '?'} of {processes}: the other processes did not join at {where} within "
              f"{wait_s} s ({WAIT_VARIABLE}); start the same command in every process, with "
              "KERAS_DISTRIBUTION_JOB_ADDRESSES naming process 0's address", file=sys.stderr, flush=True)
        os._exit(1)

    watchdog = threading.Timer(wait_s, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=processes,
                                   process_id=int(process_id) if process_id is not None else None,
                                   initialization_timeout=wait_s + 60,   # the watchdog's, not JAX's abort
                                   heartbeat_timeout_seconds=2 * peer_s)   # watch_peers', not JAX's abort
    finally:
        watchdog.cancel()
    return peer_s


def watch_peers(process_id: int, processes: int, peer_s: int) -> None:
    """Ends this process in one `error:` line, exit 1, when another process of the job dies mid-run
    (killed, out of memory, its host lost). JAX alone left the survivor in a collective or in its
    exit's shutdown barrier until its heartbeat timeout, then aborted in C++ (SIGABRT and a stack,
    minutes later). Two ways out, whichever comes first:

    - a collective that fails (gloo's "Connection reset by peer": a JaxRuntimeError) and ends the
      command: `sys.excepthook` prints the error line once the command's own cleanup has run on
      the way out (claims released), and exits at once, without JAX's shutdown barrier, which
      would wait for the dead process (`LOST_PEER_SIGNS`; any other JaxRuntimeError prints its
      traceback, then exits as promptly);
    - a wait that never ends: every process counts up a key of its own in JAX's key-value store
      every few seconds and reads the others'; a process whose count stands still for `peer_s`
      seconds (`PEER_VARIABLE`), or a coordinator (process 0, which holds the store) that stops
      answering as long, ends this one in the line.

    The counting goes on while a process waits at its exit for the others (the chief exports last)."""
    from jax._src import distributed

    client = distributed.global_state.client
    assert client is not None, "watch_peers runs after join_processes"
    where = coordinator_address()
    peers = [index for index in range(processes) if index != process_id]
    rerun = "see its log, then start the same command in every process again (it resumes from its backup)"

    def end(reason: str) -> None:
        print(f"error: process {process_id} of {processes}: {reason}; {rerun}", file=sys.stderr, flush=True)
        os._exit(1)

    now = time.monotonic()
    seen: dict[int, tuple[int | None, float]] = {peer: (None, now) for peer in peers}
    answered = [now]   # when the coordinator last answered

    def beat() -> None:
        interval = max(0.5, min(5.0, peer_s / 6))
        while True:
            try:
                client.key_value_increment(f"wikisim/alive/{process_id}", 1)
                for peer in peers:
                    try:
                        count = int(client.key_value_try_get(f"wikisim/alive/{peer}"))
                    except Exception:   # NOT_FOUND: it has not counted yet
                        count = None
                    if count != seen[peer][0]:
                        seen[peer] = (count, time.monotonic())
                answered[0] = time.monotonic()
            except Exception:   # the store is gone with process 0
                pass
            time.sleep(interval)

    def check() -> None:
        while True:
            time.sleep(1)
            now = time.monotonic()
            if now - answered[0] > peer_s:
                end(f"the job's coordinator (process 0 at {where}) stopped answering for {peer_s} s "
                    f"({PEER_VARIABLE}): it died or hangs")
            for peer, (_, since) in seen.items():
                if now - since > peer_s:
                    end(f"process {peer} of the job (coordinator {where}) gave no sign of life for {peer_s} s "
                        f"({PEER_VARIABLE}): it died or hangs")

    def collective_failed(kind: type[BaseException], error: BaseException, trace: types.TracebackType | None) -> None:
        import jax

        if not isinstance(error, jax.errors.JaxRuntimeError):
            return default_hook(kind, error, trace)
        said = " ".join(str(error).split())
        if not any(sign in said for sign in LOST_PEER_SIGNS):   # not a lost peer: its traceback, then out
            default_hook(kind, error, trace)
            sys.stderr.flush()
            os._exit(1)   # without the shutdown barrier, which would hold the others in their collectives
        others = f"process {peers[0]}" if len(peers) == 1 else "another process"
        end(f"{others} of the job (coordinator {where}) is gone mid-run: a collective failed "
            f"({said[:240]}{'...' if len(said) > 240 else ''})")

    default_hook = sys.excepthook
    sys.excepthook = collective_failed
    for job in (beat, check):
        threading.Thread(target=job, name=f"wikisim-peers-{job.__name__}", daemon=True).start()


def agree_on_flags(flags: dict, process_id: int, processes: int) -> None:
    """Every process must run the same command: different flags (a batch size, a seed) would
    train on other shapes or data and end in a collective's mismatch deep in gloo, an abort.
    Each process posts its flags to JAX's key-value store and reads every other's; any that
    differ are a UsageError here, in every process, naming them."""
    from jax._src import distributed

    client = distributed.global_state.client
    assert client is not None, "agree_on_flags runs after join_processes"
    posted = json.dumps({name: value for name, value in flags.items() if name not in OWN_FLAGS}, sort_keys=True,
                        default=str)
    client.key_value_set(f"wikisim/flags/{process_id}", posted)
    mine, wait_ms = json.loads(posted), 1000 * int(os.environ.get(WAIT_VARIABLE) or DEFAULT_WAIT_S)
    differing = []
    for other in (index for index in range(processes) if index != process_id):
        theirs = json.loads(client.blocking_key_value_get(f"wikisim/flags/{other}", wait_ms))
        differing += [f"--{name.replace('_', '-')} {mine.get(name)} here, {theirs.get(name)} in process {other}"
                      for name in sorted({*mine, *theirs}) if mine.get(name) != theirs.get(name)]
    if differing:
        raise UsageError(f"process {process_id} of {processes}: the processes run different flags ("
                         f"{'; '.join(differing)}); start the same command in every process")


def device_kind() -> str:
    """The first local device's kind under JAX ("NVIDIA H200", "cpu"): a run on an accelerator
    records it, and its learning curve is drawn against training minutes there."""
    import jax

    return str(jax.devices()[0].device_kind)


def strategy_of(config: TrainConfig) -> Strategy:
    """`--distribution-strategy` under `--backend`: a tf.distribute strategy, or `KerasDevices`."""
    if config.runtime.backend == "jax":
        return KerasDevices(config.runtime.distribution_strategy, tensorflow_input=needs_tensorflow(config) is not None,
                            article_chunks=config.inputs.article_chunk > 0, flags=config.flags())
    from model.training.strategies import make_strategy  # TensorFlow's, which a JAX run may not load

    return make_strategy(config.runtime.distribution_strategy)


def processes_of(strategy: Strategy) -> int:
    """The processes training one model: `KerasDevices`' own count, or the tasks of a
    tf.distribute cluster (chief and workers of `TF_CONFIG`); 1 for a strategy of one process."""
    if isinstance(strategy, KerasDevices):
        return strategy.processes
    resolver = getattr(strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    return sum(len(cluster.get(task, [])) for task in ("chief", "worker")) or 1


def is_chief(strategy: Strategy) -> bool:
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver is None or resolver.task_type in (None, "chief") or (
        resolver.task_type == "worker" and resolver.task_id == 0)


def worker_temp_dir(strategy: tf.distribute.Strategy) -> contextlib.AbstractContextManager[str]:
    """The folder a non-chief worker writes to, Keras' multi-worker saving rule (every worker runs
    the same callbacks and saves, but only the chief's files count: the others write to a
    temporary folder of their own): `workertemp_<task id>-*` in the system's temporary folder
    (TMPDIR), outside the model dir, so nothing of the worker's lands there; deleted at the end,
    and a killed worker's by the next one to start (`core.folders.owned_tempdir`)."""
    return owned_tempdir(f"workertemp_{strategy.cluster_resolver.task_id}-")
