"""Measures training throughput with TFRecord input vs in-memory tensors, and encoder speed.

    python -m model.benchmark --data PIPELINE_OUT [--steps 30] [--batch-size 32] [--out DIR]

TFRecord input: the trainer's own tf.data pipeline (interleaved gzip shards, parse, shuffle,
in-graph tokenisation, batch, prefetch). In-memory: the same batches cached in memory as
token-id tensors (`take(k).cache().repeat()`, filled before timing), so the model's compute is
identical and only the input differs. A ratio >= 0.9 means input is not the bottleneck.
Also reports encoder sentences/s through the exported SavedModel and the projected time of one
paper-size epoch (1.78 M triplets). Prints a table; with --out writes benchmark.json and a PNG.
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time

import tensorflow as tf

from model.config import TrainConfig
from model.data import triplet_strings
from model.encoder import SavedModelEncoder
from model.network import ExportableEncoder
from model.text import WordIds
from model.train import build_models, build_vocabulary, embedding_matrix, make_strategy, split_batches

PAPER_EPOCH_TRIPLETS = 1_780_000


def _triplets_per_second(model, inputs: dict, steps: int, global_batch: int, rounds: int) -> dict:
    """Best rate of `rounds` timed fits per input, the inputs taking turns so that load from
    other processes on the machine hits both alike; each input is traced and warmed first."""
    for batches in inputs.values():
        model.fit(batches, epochs=1, steps_per_epoch=max(3, steps // 5), verbose=0)
    rates = {name: 0.0 for name in inputs}
    for _ in range(rounds):
        for name, batches in inputs.items():
            start = time.perf_counter()
            model.fit(batches, epochs=1, steps_per_epoch=steps, verbose=0)
            rates[name] = max(rates[name], steps * global_batch / (time.perf_counter() - start))
    return rates


def run(config: TrainConfig, steps: int, encode_sentences: int, rounds: int = 2) -> dict:
    strategy = make_strategy(config.strategy)
    global_batch = config.batch_size * strategy.num_replicas_in_sync
    vocabulary = build_vocabulary(config)
    word_ids = WordIds(vocabulary, config.num_oov_buckets, config.max_tokens)
    matrix = embedding_matrix(vocabulary, word_ids, config)
    with strategy.scope():
        encoder, model = build_models(config, matrix)

    from_records = split_batches(config, "train", word_ids, global_batch)
    in_memory = from_records.take(steps).cache().repeat()
    for _ in in_memory.take(steps):    # fill the cache before timing
        pass
    rates = _triplets_per_second(model, {"tfrecord": from_records, "in_memory": in_memory}, steps, global_batch,
                                 rounds)
    record_rate, memory_rate = rates["tfrecord"], rates["in_memory"]

    with tempfile.TemporaryDirectory() as export_dir:
        ExportableEncoder(word_ids, encoder).export(export_dir)
        sentences = [t["anchor"].numpy().decode() for t in triplet_strings(config.data, config.dataset, "train")
                     .take(encode_sentences)]
        sentences = (sentences * (encode_sentences // max(1, len(sentences)) + 1))[:encode_sentences]
        saved = SavedModelEncoder(export_dir)
        saved.encode(sentences[:64])
        start = time.perf_counter()
        saved.encode(sentences)
        encode_rate = len(sentences) / (time.perf_counter() - start)

    return {
        "device": ", ".join(d.name for d in tf.config.list_logical_devices() if d.device_type != "CPU") or "CPU",
        "strategy": type(strategy).__name__, "replicas": strategy.num_replicas_in_sync,
        "global_batch_size": global_batch, "lstm_units": config.lstm_units, "timed_steps": steps, "rounds": rounds,
        "tfrecord_triplets_per_s": record_rate, "in_memory_triplets_per_s": memory_rate,
        "tfrecord_over_in_memory": record_rate / memory_rate,
        "encoder_sentences_per_s": encode_rate,
        "paper_epoch_minutes_at_tfrecord_rate": PAPER_EPOCH_TRIPLETS / record_rate / 60,
    }


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    labels = ["TFRecord input", "in-memory tensors"]
    values = [results["tfrecord_triplets_per_s"], results["in_memory_triplets_per_s"]]
    axis.bar(labels, values, color=["tab:blue", "tab:grey"])
    axis.set_ylabel("training triplets / s")
    axis.set_title(f"ratio {results['tfrecord_over_in_memory']:.2f} ({results['device']}, "
                   f"batch {results['global_batch_size']})")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m model.benchmark", description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="pipeline output folder (local or gs://)")
    parser.add_argument("--dataset", default="triplets-sen")
    parser.add_argument("--steps", type=int, default=30, help="timed training steps per input kind")
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    parser.add_argument("--lstm-units", type=int, default=300)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--rounds", type=int, default=2, help="timed fits per input kind; the best counts")
    parser.add_argument("--encode-sentences", type=int, default=2000)
    parser.add_argument("--out", help="folder for benchmark.json and benchmark.png")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work_dir = args.out or tempfile.mkdtemp(prefix="model-benchmark-")
    config = TrainConfig(data=args.data, model_dir=work_dir, dataset=args.dataset, batch_size=args.batch_size,
                         lstm_units=args.lstm_units, strategy=args.strategy, steps=args.steps)
    results = run(config, args.steps, args.encode_sentences, args.rounds)
    for key, value in results.items():
        print(f"{key:40s} {value:.3f}" if isinstance(value, float) else f"{key:40s} {value}")
    if args.out:
        with tf.io.gfile.GFile(f"{args.out}/benchmark.json", "w") as handle:
            json.dump(results, handle, indent=2)
        plot(results, f"{args.out}/benchmark.png")
    return results


if __name__ == "__main__":
    main()
