"""Training throughput, today's trainer against the fast one, side by side in one run.

    python -m model.benchmark --data PIPELINE_OUT [--triplets 4096] [--encoder bilstm|minilm] [--out DIR]

Every variant trains on the *same* real training triplets (`--triplets` of the split, held in
memory as strings and repeated, so shard reading is not timed and every batch is full) for one
pass's worth of steps, with the same network size; only the input path and the model call
differ. The triplets are one chunk of `--article-chunk` consecutive triplets from each of many
articles, so a random batch shares about as few sentences as in a real training run over
thousands of articles, and an article-chunk batch about as many. The variants add one lever at a time:

* `baseline`: batches of 32 in the split's order, each role padded to its own longest sentence,
  the encoder called three times (anchor, positive, negative);
* `+one call`: the encoder called once on the batch's sentences stacked ([3n, t]);
* `+length groups`: batches of similar-length triplets (`model.training.arrays.LENGTH_BOUNDARIES`);
* `+batch B`: the trainer's batch size (`--batch-size`, default 128);
* `+article chunks`: batches made of chunks of `--article-chunk` triplets of one article
  (instead of length groups), each distinct sentence of the batch encoded once;
* `+length slices`: the distinct sentences encoded in `model.net.network.LENGTH_SLICES`
  length-sorted slices, each padded to its own longest sentence: the trainer's default;
* `+XLA`: the training step compiled with XLA (`jit_compile`); kept off in the trainer when
  it does not pay.

With `--workers 1,2` it measures scaling instead: the trainer's default (`+length slices`) as 1
process and as 2 worker processes of one MultiWorkerMirroredStrategy job over loopback
(TF_CONFIG), each replica with `--batch-size` triplets per step (so 2 workers train a global
batch twice as large), side by side in one run: triplets/s of each and their ratio to 1 process.

With `--encoder minilm` the Net is the transformer (`model.net.transformer`) and the variants are
`baseline` (as above), `+article chunks` (one call on the distinct sentences),
`+length slices 3` and `+2 layers frozen` (the embeddings and two lowest layers not trained).

With `--measure input` it times the input path alone instead, no model (Keras under its NumPy
backend where KERAS_BACKEND names none, so TensorFlow is not imported): the
trainer's training stream (`TripletInput.training_batches`: the shards read, parsed, grouped in
article chunks, tokenised and made arrays) of `--data`'s training split, for MiniLM- and
MPNet-size batches (`--input-encoders`: each one's tokenizer; `--batch-size` triplets of at most
`--max-tokens` tokens, infra/recipe.py's minilm-sen and mpnet-sen on `--machine gpu`: 128 and 64),
with the batches made in the calling thread (`0`: today's path, `tokenizers` using its own threads
for each batch) and in 1 and all (`os.cpu_count()`) input worker processes (`--input-workers` of
`python -m model.train`; the list here: `--input-workers 0,1,16`). Each is warmed (the workers
started, their queues filled) and then timed over `--triplets` training triplets, the best of
`--rounds`; prints triplets/s side by side and the ratio of the most workers to 1, and with
`--out` writes input_benchmark.json and input_benchmark.png.

    python -m model.benchmark --measure input --data PIPELINE_OUT [--triplets 32768] [--out DIR]

Prints triplets/s per variant and the ratio of the fast trainer's default (`+length slices`,
or `+XLA` when the trainer's default turns it on) to the baseline as `train_speedup`; with
`--out`, writes benchmark.json and benchmark.png. The first pass of each variant traces and
warms it; the second is timed, the variants taking turns, so that load from other processes
hits all alike.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass

from core.cli import UsageError, flag, parse_config, run_cli
from core.records import PAPER_DATASET
from model import KERAS_BACKEND_DEFAULTED, require_tensorflow_keras
from model.config import InputConfig, NetworkConfig, OptimizerConfig, TrainConfig
from model.net.wordpieces import wordpieces
from model.training.shards import open_run

MEASURES = ("train", "input")
INPUT_ENCODERS = ("minilm", "mpnet")   # the transformers' tokenizers (minilm-sen, mpnet-sen)


@dataclass(frozen=True)
class TrainerBenchmarkConfig:
    """Flags of `python -m model.benchmark`."""

    data: str = flag(help="pipeline output folder (local or gs://)")
    dataset: str = flag(PAPER_DATASET, help="triplet dataset whose training split is timed")
    triplets: int = flag(4096, help="training triplets per timed pass")
    batch_size: int = flag(OptimizerConfig.batch_size, help="the fast trainer's batch")
    article_chunk: int = flag(InputConfig.article_chunk, help="triplets of one article kept together in a batch")
    lstm_units: int = flag(NetworkConfig.lstm_units, help="BiLSTM units per direction")
    encoder: str = flag(NetworkConfig.encoder, help="Net: bilstm or minilm (the fine-tuned transformer)")
    rounds: int = flag(1, help="timed passes per variant; the best counts")
    workers: tuple[int, ...] = flag((), help="measure scaling instead: the trainer as this many worker processes "
                                            "(MultiWorkerMirroredStrategy on loopback), e.g. 1,2")
    measure: str = flag("train", help="train: the trainer's throughput (the variants, or --workers); input: the "
                                      "input path alone (read + tokenise + batch), no model")
    input_workers: tuple[int, ...] = flag((), help="--measure input: input worker processes compared, 0 = the "
                                                  "calling thread; none given = 0, 1 and os.cpu_count()")
    input_encoders: tuple[str, ...] = flag(INPUT_ENCODERS, help="--measure input: whose tokenizer (minilm, mpnet)")
    max_tokens: int = flag(InputConfig.max_tokens, help="--measure input: tokens kept per sentence")
    out: str | None = flag(None, help="folder for benchmark.json and benchmark.png (--measure input: "
                                      "input_benchmark.json and input_benchmark.png)")

    def __post_init__(self):   # the parser reads an empty tuple's items as strings
        try:
            workers = tuple(int(count) for count in self.workers)
        except ValueError:
            workers = ()
        if len(workers) != len(self.workers) or any(count < 1 for count in workers):
            raise UsageError(f"--workers takes process counts >= 1, e.g. 1,2; got {','.join(map(str, self.workers))}")
        object.__setattr__(self, "workers", workers)
        if self.measure not in MEASURES:
            raise UsageError(f"--measure must be one of {', '.join(MEASURES)}, got {self.measure!r}")
        try:
            input_workers = tuple(int(count) for count in self.input_workers)
        except ValueError:
            input_workers = (-1,)
        if any(count < 0 for count in input_workers):
            raise UsageError("--input-workers takes worker counts >= 0 (0: the calling thread), e.g. 0,1,16; got "
                             f"{','.join(map(str, self.input_workers))}")
        object.__setattr__(self, "input_workers",
                           input_workers or tuple(dict.fromkeys((0, 1, os.cpu_count() or 1))))
        unknown = set(self.input_encoders) - set(INPUT_ENCODERS)
        if unknown or not self.input_encoders:
            raise UsageError(f"--input-encoders takes {','.join(INPUT_ENCODERS)}; got {','.join(self.input_encoders)}")


def parse_args(argv: list[str] | None) -> TrainerBenchmarkConfig:
    return parse_config(TrainerBenchmarkConfig, argv, "python -m model.benchmark", __doc__.split("\n")[0])


def time_input(args: TrainerBenchmarkConfig, encoder: str, workers: int) -> float:
    """Training triplets/s of the input path alone (`TripletInput.training_batches`) with `encoder`'s
    tokenizer and `workers` input workers: the stream warmed (its first batch, which starts the
    workers, and as many as their queues hold), then the best of `rounds` passes of `triplets`."""
    from model.training.arrays import WORKER_BATCHES_AHEAD, TripletInput  # Keras: under the backend `main` chose

    config = TrainConfig.from_flags(data=args.data, model_dir="unused", dataset=args.dataset, encoder=encoder,
                                    batch_size=args.batch_size, max_tokens=args.max_tokens,
                                    article_chunk=args.article_chunk, input_workers=workers)
    source = TripletInput(config, open_run(args.data), wordpieces(args.max_tokens, encoder))
    stream = source.training_batches()
    try:
        for _ in itertools.islice(stream, 1 + workers * WORKER_BATCHES_AHEAD):
            pass
        steps = max(1, -(-args.triplets // args.batch_size))
        best = float("inf")
        for _ in range(args.rounds):
            start = time.perf_counter()
            for _ in itertools.islice(stream, steps):
                pass
            best = min(best, time.perf_counter() - start)
        return steps * args.batch_size / best
    finally:
        getattr(stream, "close", lambda: None)()   # workers end with their stream


def measure_input(args: TrainerBenchmarkConfig) -> dict:
    """`time_input` for every encoder and worker count of the flags, and each count's ratio to 1 worker."""
    rates = {encoder: {str(workers): time_input(args, encoder, workers) for workers in args.input_workers}
             for encoder in args.input_encoders}
    base = "1" if 1 in args.input_workers else str(args.input_workers[0])
    return {"measure": "input", "data": args.data, "dataset": args.dataset, "cpu_cores": os.cpu_count(),
            "batch_size": args.batch_size, "max_tokens": args.max_tokens, "article_chunk": args.article_chunk,
            "triplets": args.triplets, "rounds": args.rounds, "input_workers": list(args.input_workers),
            "triplets_per_s": rates, "ratio_to": base,
            "ratio": {encoder: {count: rate / rates[encoder][base] for count, rate in by_count.items()}
                      for encoder, by_count in rates.items()}}


def plot_input(results: dict, path: str) -> None:
    """Grouped bars: triplets/s of each encoder's batches at each worker count."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    encoders, counts = list(results["triplets_per_s"]), [str(count) for count in results["input_workers"]]
    figure, axis = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(counts)
    for slot, count in enumerate(counts):
        values = [results["triplets_per_s"][encoder][count] for encoder in encoders]
        label = "calling thread" if count == "0" else f"{count} worker{'s' * (count != '1')}"
        bars = axis.bar([index + (slot - (len(counts) - 1) / 2) * width for index in range(len(encoders))],
                        values, width, label=label)
        axis.bar_label(bars, labels=[f"{value:.0f}" for value in values], fontsize=8)
    axis.set_xticks(range(len(encoders)), [f"{encoder}-size batches" for encoder in encoders])
    axis.set_ylabel("training triplets / s (input alone)")
    axis.set_title(f"Input path: read + tokenise + batch ({results['batch_size']} triplets, "
                   f"{results['max_tokens']} tokens; {results['cpu_cores']} cores)", fontsize=9)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main_input(args: TrainerBenchmarkConfig) -> dict:
    results = measure_input(args)
    counts = [str(count) for count in results["input_workers"]]
    top = counts[-1] if len(counts) > 1 else counts[0]
    heads = ["calling thread" if count == "0" else f"{count} worker{'s' * (count != '1')}" for count in counts]
    print(f"input path alone (read + tokenise + batch), triplets/s: batch {args.batch_size}, {args.max_tokens} "
          f"tokens, {results['cpu_cores']} cores")
    ratio_head = f"{top} / {results['ratio_to']}"
    print(f"{'batches':<14}" + "".join(f"{head:>16}" for head in heads) + f"{ratio_head:>12}")
    for encoder, rates in results["triplets_per_s"].items():
        print(f"{encoder + '-size':<14}" + "".join(f"{rates[count]:>16.0f}" for count in counts)
              + f"{results['ratio'][encoder][top]:>12.2f}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "input_benchmark.json"), "w") as handle:
            json.dump(results, handle, indent=2)
        plot_input(results, os.path.join(args.out, "input_benchmark.png"))
        print(f"input_benchmark.json and input_benchmark.png in {args.out}")
    return results


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.measure == "input":   # no model: Keras only for its PyDataset, under NumPy where none is set
        if "keras" not in sys.modules and (KERAS_BACKEND_DEFAULTED or "KERAS_BACKEND" not in os.environ):
            os.environ["KERAS_BACKEND"] = "numpy"
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return main_input(args)
    require_tensorflow_keras("model.benchmark")
    import tensorflow as tf

    from model.training.throughput import plot, run, scaling

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work_dir = args.out or tempfile.mkdtemp(prefix="model-benchmark-")
    config = TrainConfig.from_flags(data=args.data, model_dir=work_dir, dataset=args.dataset,
                                    batch_size=args.batch_size, article_chunk=args.article_chunk,
                                    lstm_units=args.lstm_units, encoder=args.encoder)
    if args.workers:
        results = scaling(config, args.workers, args.triplets, args.rounds)
        print(f"{'workers':>7} {'triplets/s':>10} {'x 1 worker':>10}   (batch {args.batch_size} per worker, "
              f"{results['cpu_cores']} cores)")
        for count, rate in results["triplets_per_s"].items():
            detail = results["per_count"][count]
            print(f"{count:>7} {rate:>10.1f} {results['ratio_to_1'][count]:>10.2f}   "
                  f"step {detail['step_seconds']:.3f} s, "
                  f"input pipeline alone {detail['input_triplets_per_s']:.0f} triplets/s, all-reduce "
                  f"{detail['gradient_bytes'] / 1e6:.2f} MB")
        if args.out:
            with tf.io.gfile.GFile(f"{args.out}/scaling.json", "w") as handle:
                json.dump(results, handle, indent=2)
        return results
    results = run(config, args.triplets, args.rounds)
    print(f"{'variant':<16} {'triplets/s':>10} {'x baseline':>10} {'paper epoch':>12}")
    for name, rate in results["triplets_per_s"].items():
        print(f"{name:<16} {rate:>10.1f} {rate / results['triplets_per_s']['baseline']:>10.2f} "
              f"{results['paper_epoch_hours'][name]:>10.1f} h")
    print(f"train_speedup ({results['fast_variant']} / baseline): {results['train_speedup']:.2f}")
    if args.out:
        with tf.io.gfile.GFile(f"{args.out}/benchmark.json", "w") as handle:
            json.dump(results, handle, indent=2)
        plot(results, f"{args.out}/benchmark.png")
        print(f"benchmark.json and benchmark.png in {args.out}")
    return results


if __name__ == "__main__":
    sys.exit(run_cli(main))
