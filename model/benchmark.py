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

Prints triplets/s per variant and the ratio of the fast trainer's default (`+length slices`,
or `+XLA` when the trainer's default turns it on) to the baseline as `train_speedup`; with
`--out`, writes benchmark.json and benchmark.png. The first pass of each variant traces and
warms it; the second is timed, the variants taking turns, so that load from other processes
hits all alike.
"""
from __future__ import annotations

import json
import logging
import sys
import tempfile
from dataclasses import dataclass

from model.config import InputConfig, NetworkConfig, OptimizerConfig, TrainConfig
from pipeline.cli import UsageError, flag, parse_config, parse_first, run_cli
from pipeline.records import PAPER_DATASET


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
    out: str | None = flag(None, help="folder for benchmark.json and benchmark.png")

    def __post_init__(self):   # the parser reads an empty tuple's items as strings
        try:
            workers = tuple(int(count) for count in self.workers)
        except ValueError:
            workers = ()
        if len(workers) != len(self.workers) or any(count < 1 for count in workers):
            raise UsageError(f"--workers takes process counts >= 1, e.g. 1,2; got {','.join(map(str, self.workers))}")
        object.__setattr__(self, "workers", workers)


def parse_args(argv: list[str] | None) -> TrainerBenchmarkConfig:
    return parse_config(TrainerBenchmarkConfig, argv, "python -m model.benchmark", __doc__.split("\n")[0])


def main(argv: list[str] | None = None) -> dict:
    from model import require_tensorflow_keras

    require_tensorflow_keras("model.benchmark")
    args = parse_args(argv)
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


if __name__ == "__main__":   # the flags first: --help and a bad flag answer before TensorFlow loads
    parse_first(parse_args)
    sys.exit(run_cli(main))
