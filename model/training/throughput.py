"""The trainer's throughput, variant by variant and worker count by worker count: what
`python -m model.benchmark` runs and times (its docstring says what each variant is)."""
from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from core.records import ROLES
from model.config import NetworkKind, TrainConfig
from model.net.head import pair_distances
from model.net.network import LENGTH_SLICES, build_models
from model.net.text import ArrayIds, WordIds
from model.net.wordpieces import wordpieces
from model.training.arrays import Tokenizer, batch_arrays, batched, grouped, split_triplets
from model.training.shards import ARTICLE_ID, open_run
from model.training.strategies import make_strategy
from model.training.tf_input import dataset
from model.training.vocabulary import build_vocabulary, embedding_matrix

PAPER_EPOCH_TRIPLETS = 1_780_000


class RoleDistances(keras.layers.Layer):
    """The baseline's head: [d+, d-] from the three roles' embeddings."""

    def call(self, anchor, positive, negative):
        return keras.ops.stack([pair_distances(anchor, role, "l1") for role in (positive, negative)], axis=-1)


def three_call_triplet_model(sentence_encoder: keras.Model) -> keras.Model:
    """The baseline's triplet model: Net called once per role, same weights and output."""
    inputs = {key: keras.Input(shape=(None,), dtype="int32", name=key) for key in ROLES}
    return keras.Model(inputs, RoleDistances()(*(sentence_encoder(inputs[key]) for key in ROLES)))


def per_role_batches(triplets: list[dict], tokenizer: Tokenizer, batch_size: int) -> tf.data.Dataset:
    """The baseline's input: batches in the split's order, each role padded to its own longest sentence."""
    def batches():
        for chunk in batched(itertools.cycle(triplets), batch_size):
            yield {key: tokenizer([t[key] for t in chunk]) for key in ROLES}, np.zeros(len(chunk), np.int32)

    spec = ({key: tf.TensorSpec([None, None], tf.int32) for key in ROLES}, tf.TensorSpec([None], tf.int32))
    return tf.data.Dataset.from_generator(batches, output_signature=spec).prefetch(2)


def endless_batches(triplets: list[dict], tokenizer: Tokenizer, batch_size: int, article_chunk: int = 0,
                    group_by_length: bool = True, replicas: int = 1) -> tf.data.Dataset:
    """The trainer's batches (`model.training.arrays`) of `triplets`, repeated without end."""
    def batches():
        for group in grouped(itertools.cycle(triplets), batch_size * replicas, tokenizer,
                             article_chunk=article_chunk, group_by_length=group_by_length):
            yield batch_arrays(group, tokenizer, batch_size, replicas, static=False)

    return dataset(batches, replicas)


def variants(config: TrainConfig, triplets: list[dict], word_ids, matrix) -> dict:
    """name -> (compiled model, (batch size, endless batches of `triplets`)): the trainer's models
    (`model.net.network.build_models`), `slices=None` the three-call baseline."""
    def model(slices: int | None, jit: bool = False, frozen_layers: int = 0):
        varied = config.with_flags(jit_compile=jit, frozen_layers=frozen_layers)
        return build_models(varied, matrix, config.optimizer.batch_size, slices=slices,
                            head=None if slices else three_call_triplet_model)[1]

    def batches(batch_size, article_chunk=0, group_by_length=True):
        return batch_size, endless_batches(triplets, word_ids, batch_size, article_chunk, group_by_length)

    batch, chunk = config.optimizer.batch_size, config.inputs.article_chunk
    if config.network.kind.pretrained:   # the transformer: the same levers, and freezing its lower layers
        return {
            "baseline": (model(slices=None), (32, per_role_batches(triplets, word_ids, 32))),
            "+article chunks": (model(slices=1), batches(batch, article_chunk=chunk)),
            f"+length slices {LENGTH_SLICES}": (model(slices=LENGTH_SLICES), batches(batch, article_chunk=chunk)),
            "+2 layers frozen": (model(slices=LENGTH_SLICES, frozen_layers=2), batches(batch, article_chunk=chunk)),
        }
    return {
        "baseline": (model(slices=None), (32, per_role_batches(triplets, word_ids, 32))),
        "+one call": (model(slices=1), batches(32, group_by_length=False)),
        "+length groups": (model(slices=1), batches(32)),
        f"+batch {batch}": (model(slices=1), batches(batch)),
        "+article chunks": (model(slices=1), batches(batch, article_chunk=chunk)),
        **{f"+length slices {n}": (model(slices=n), batches(batch, article_chunk=chunk)) for n in (2, 3)},
        "+XLA": (model(slices=LENGTH_SLICES, jit=True), batches(batch, article_chunk=chunk)),
    }


def one_chunk_per_article(config: TrainConfig, n_triplets: int) -> list[dict]:
    """About `n_triplets` training triplets: the first `--article-chunk` consecutive triplets of one
    article, of each article, until enough, in memory; the same in every process (shards read in a
    fixed order), as the workers of a scaling run must build the same global batches."""
    chunks: list[list[dict]] = []
    articles: set[int] = set()
    run = open_run(config.inputs.data)
    for triplets in batched(split_triplets(run, config.inputs.dataset, "train"), config.inputs.article_chunk):
        chunk = [t for t in triplets if t[ARTICLE_ID] == triplets[0][ARTICLE_ID]]
        if chunk[0][ARTICLE_ID] not in articles:
            articles.add(chunk[0][ARTICLE_ID])
            chunks.append(chunk)
            if sum(map(len, chunks)) >= n_triplets:
                break
    return [triplet for chunk in chunks for triplet in chunk]


def sentence_ids(config: TrainConfig) -> tuple[Tokenizer, np.ndarray | None]:
    """(the tokenizer, the embedding matrix or None) of the configured Net, as the trainer builds them."""
    if config.network.kind.reads_word_vectors:
        vocabulary = build_vocabulary(config, open_run(config.inputs.data))
        word_ids = WordIds(vocabulary, config.inputs.num_oov_buckets, config.inputs.max_tokens)
        return ArrayIds(word_ids), embedding_matrix(vocabulary, word_ids, config)
    return wordpieces(config.inputs.max_tokens, config.network.encoder, config.network.checkpoint), None


def run(config: TrainConfig, n_triplets: int, rounds: int = 1) -> dict:
    word_ids, matrix = sentence_ids(config)
    triplets = one_chunk_per_article(config, n_triplets)
    n_triplets = len(triplets)                   # the split may be smaller
    timed = variants(config, triplets, word_ids, matrix)
    steps = {name: -(-n_triplets // batch_size) for name, (_, (batch_size, _)) in timed.items()}
    for name, (model, (_, batches)) in timed.items():    # trace and warm every variant on a whole pass
        model.fit(batches, epochs=1, steps_per_epoch=steps[name], verbose=0, shuffle=False)
    rates = {name: 0.0 for name in timed}
    for _ in range(rounds):
        for name, (model, (batch_size, batches)) in timed.items():
            start = time.perf_counter()
            model.fit(batches, epochs=1, steps_per_epoch=steps[name], verbose=0)
            rates[name] = max(rates[name], steps[name] * batch_size / (time.perf_counter() - start))
    fast = "+XLA" if config.runtime.jit_compile else (f"+length slices {LENGTH_SLICES}" if LENGTH_SLICES > 1
                                              else "+article chunks")
    return {
        "encoder": config.network.encoder,
        "device": ", ".join(d.name for d in tf.config.list_logical_devices() if d.device_type != "CPU") or "CPU",
        "cpu_cores": os.cpu_count(),
        "triplets_per_pass": n_triplets, "lstm_units": config.network.lstm_units, "rounds": rounds,
        "article_chunk": config.inputs.article_chunk, "length_slices": LENGTH_SLICES,
        "triplets_per_s": rates,
        "fast_variant": fast,
        "train_speedup": rates[fast] / rates["baseline"],
        "paper_epoch_hours": {name: PAPER_EPOCH_TRIPLETS / rate / 3600 for name, rate in rates.items()},
    }


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["triplets_per_s"])
    values = [results["triplets_per_s"][name] for name in names]
    figure, axis = plt.subplots(figsize=(7, 4))
    bars = axis.bar(names, values, color=["tab:grey"] + ["tab:blue"] * (len(names) - 1))
    axis.bar_label(bars, labels=[f"{v:.0f}" for v in values])
    axis.set_ylabel("training triplets / s")
    network = NetworkKind(results["encoder"]).label(results["lstm_units"])
    axis.set_title(f"Trainer throughput, {network} ({results['device']}, "
                   f"{results['cpu_cores']} cores): {results['fast_variant']} = "
                   f"{results['train_speedup']:.2f}x baseline",
                   fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def time_worker(config: TrainConfig, n_triplets: int, rounds: int) -> dict:
    """One process of a scaling run (TF_CONFIG names its cluster, none when alone): the trainer's
    model and input (`endless_batches`, one block per replica, sharded by DATA) on the
    same in-memory triplets as `run`; a warm-up pass, then `rounds` timed passes of one pass's
    worth of global batches each. Wall seconds of the best pass; also the seconds of the input
    pipeline alone over the same batches (what every worker spends tokenising global batches) and
    the bytes of one gradient all-reduce (trainable weights, float32): the step-time model's inputs
    (docs/distributed.md)."""
    strategy = make_strategy("multi_worker" if os.environ.get("TF_CONFIG") else "one_device")
    word_ids, matrix = sentence_ids(config)
    triplets = one_chunk_per_article(config, n_triplets)
    replicas = strategy.num_replicas_in_sync
    batch_size = config.optimizer.batch_size
    global_batch = batch_size * replicas
    steps = -(-len(triplets) // global_batch)
    batches = endless_batches(triplets, word_ids, batch_size, config.inputs.article_chunk, replicas=replicas)
    with strategy.scope():
        _, model = build_models(config, matrix, global_batch)
    model.fit(batches, epochs=1, steps_per_epoch=steps, verbose=0)
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        model.fit(batches, epochs=1, steps_per_epoch=steps, verbose=0)
        seconds.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in batches.take(steps):
        pass
    return {"replicas": replicas, "global_batch": global_batch, "steps": steps, "seconds": min(seconds),
            "input_seconds": time.perf_counter() - start,
            "gradient_bytes": 4 * sum(int(np.prod(weight.shape)) for weight in model.trainable_weights)}


WORKER_SCRIPT = ("import json, sys; from model.config import TrainConfig; from model.training.throughput import "
                 "time_worker; a = json.loads(sys.argv[1]); "
                 "print('RESULT' + json.dumps(time_worker(TrainConfig.from_flags(**a['config']), a['triplets'], "
                 "a['rounds'])))")


def scaling(config: TrainConfig, workers: tuple[int, ...], n_triplets: int, rounds: int) -> dict:
    """Triplets/s of the trainer as 1, 2, ... worker processes on this machine, one count after the
    other in this run; every worker process gets a 15-minute timeout."""
    rates, details = {}, {}
    for count in workers:
        ports = []
        for _ in range(count):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                ports.append(sock.getsockname()[1])
        processes = []
        for task in range(count):
            env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
            if count > 1:
                env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                                               "task": {"type": "worker", "index": task}})
            payload = json.dumps({"config": config.flags(), "triplets": n_triplets, "rounds": rounds})
            processes.append(subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, payload], env=env,
                                              stdout=subprocess.PIPE, text=True))
        try:
            outputs = [process.communicate(timeout=900)[0] for process in processes]
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
        if any(process.returncode for process in processes):
            raise RuntimeError(f"a benchmark worker of {count} failed: exit codes "
                               f"{[process.returncode for process in processes]}")
        results = [json.loads(next(line for line in out.splitlines() if line.startswith("RESULT"))[6:])
                   for out in outputs]
        slowest = max(result["seconds"] for result in results)   # a step ends when every worker's does
        rates[count] = results[0]["steps"] * results[0]["global_batch"] / slowest
        details[count] = {"step_seconds": slowest / results[0]["steps"],
                          "input_triplets_per_s": results[0]["steps"] * results[0]["global_batch"]
                          / results[0]["input_seconds"], "gradient_bytes": results[0]["gradient_bytes"]}
    return {"encoder": config.network.encoder, "cpu_cores": os.cpu_count(),
            "batch_size_per_replica": config.optimizer.batch_size, "lstm_units": config.network.lstm_units,
            "triplets_per_pass": n_triplets, "rounds": rounds,
            "triplets_per_s": {str(count): rate for count, rate in rates.items()},
            "ratio_to_1": {str(count): rate / rates[workers[0]] for count, rate in rates.items()},
            "per_count": {str(count): detail for count, detail in details.items()}}
