"""The trainer's input as NumPy arrays, without TensorFlow: how Keras' JAX backend reads a
transformer's triplets (an accelerator image has no TensorFlow at all, and a CPU run saves the
memory TensorFlow takes).

It is tf.data's input (`model.training.data`) in NumPy, not another recipe: the same stream (the
shards in `shard_stream`'s order, each read front to back, a resumed run from its first record
not trained on), the same `--article-chunk` batches of consecutive records, the same model
inputs (`shared_sentences` padded to the fixed shapes of `static_batch`), array for array
(tests/model/test_model_arrays.py), with the same wordpiece ids (`model.net.wordpieces`). It
covers what the accelerator recipes use: article chunks, no `--shuffle-buffer`, no `--teacher`
(`model.training.shards.needs_tf_data` names what is not). Records are parsed by the pipeline's own protobuf class of
`tf.train.Example` (`pipeline.records.Example`) and framed by `pipeline.tfrecord`; an unreadable
record is skipped and a corrupt shard ends where it breaks, as under tf.data, and
`count_records` counts both beside training.
"""
from __future__ import annotations

import gzip
import itertools
import logging
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np

from model.config import TrainConfig
from model.net.wordpieces import WordPieces, wordpieces
from model.training.shards import (
    FEATURES,
    NO_SECTION,
    SECTIONS_PER_ARTICLE,
    STATIC_WIDTHS,
    shard_stream,
    triplet_split,
)
from pipeline.published import Run
from pipeline.records import ROLES, SECTION_OF_ROLE, TRIPLET_FEATURES, Example, FeatureType
from pipeline.tfrecord import CorruptRecordError, read_records

LOG = logging.getLogger(__name__)
Batch = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]   # (inputs, labels, sample weights)


def shard_records(path: str, skip: int = 0) -> Iterator[bytes]:
    """The serialised records of one gzip TFRecord shard (local, or through Beam's FileSystems),
    from record `skip` on. A corrupt or truncated shard ends where it breaks, with a warning: a
    damaged frame, a gzip stream cut short or failing its CRC, or damaged deflate data
    (`zlib.error`, not an OSError), as `pipeline.published.count_shard_records` reads one."""
    handle: Any
    if "://" in path:
        from apache_beam.io.filesystems import CompressionTypes, FileSystems

        handle = FileSystems.open(path, compression_type=CompressionTypes.GZIP)
    else:
        handle = gzip.open(path, "rb")
    with handle:
        try:
            yield from itertools.islice(read_records(handle, path), skip, None)
        except (CorruptRecordError, EOFError, OSError, zlib.error) as error:
            LOG.warning("%s: read up to a damaged record (%s); the rest of the shard is skipped", path, error)


def parse_triplet(record: bytes) -> dict | None:
    """The features training reads (`shards.FEATURES`: sentences as str, the rest int), or None
    for a record that is not a triplet Example of this contract."""
    try:
        example: Any = Example.FromString(record)
        features = example.features.feature
        triplet: dict = {}
        for name in FEATURES:
            if TRIPLET_FEATURES[name] is FeatureType.BYTES:
                (value,) = features[name].bytes_list.value
                triplet[name] = value.decode("utf-8")
            else:
                (triplet[name],) = features[name].int64_list.value
        return triplet
    except Exception:   # protobuf's DecodeError, a missing or repeated feature, bytes that are not UTF-8
        return None


def triplets_of(records: Iterator[bytes]) -> Iterator[dict]:
    return (triplet for triplet in map(parse_triplet, records) if triplet is not None)


def _distinct_sentences(triplets: list[dict], pieces: WordPieces) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block: (ids [s, t] of its distinct sentences, shortest first; rows [n, 3] of each
    triplet's anchor, positive and negative among them; each sentence's section, numbered in the
    block). `model.training.data._distinct_sentences`, in NumPy."""
    stacked = [triplet[role] for role in ROLES for triplet in triplets]
    row_of: dict[str, int] = {}
    row_of_sentence = np.array([row_of.setdefault(sentence, len(row_of)) for sentence in stacked], np.int64)
    ids = pieces(list(row_of))
    order = np.argsort((ids != 0).sum(axis=1), kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    keys = np.array([triplet[article] * SECTIONS_PER_ARTICLE + triplet[index] for article, index in
                     (SECTION_OF_ROLE[role] for role in ROLES) for triplet in triplets], np.int64)
    sections = np.full(len(row_of), np.iinfo(np.int64).min)
    np.maximum.at(sections, row_of_sentence, keys)
    numbers: dict[int, int] = {}
    section_numbers = np.array([numbers.setdefault(key, len(numbers)) for key in sections[order].tolist()], np.int32)
    return ids[order], rank[row_of_sentence].reshape(3, -1).T.astype(np.int32), section_numbers


def _padded(rows: np.ndarray, size: int, value: int | float = 0) -> np.ndarray:
    return np.concatenate([rows, np.full((size - len(rows), *rows.shape[1:]), value, rows.dtype)])


def batch_arrays(triplets: list[dict], pieces: WordPieces, batch_size: int, replicas: int = 1,
                 largest: bool = False) -> Batch:
    """A batch of triplets -> the triplet model's (inputs, labels, weights) in the fixed shapes of
    tf.data's `static_batch(shared_sentences(...))`: `replicas` blocks (the first ones full) of
    `batch_size` triplets (padding weighs 0), their distinct sentences padded to a multiple of
    `batch_size` rows (with copies of the block's first) and to the smallest of `STATIC_WIDTHS`
    or `max_tokens` that holds them. `largest`: always the largest of those shapes (3 x
    `batch_size` rows of `max_tokens`), as processes that feed one global batch need: each
    shapes its own part, and the parts must agree."""
    per_replica = -(-len(triplets) // replicas)
    blocks = [_distinct_sentences(triplets[r * per_replica:(r + 1) * per_replica], pieces) for r in range(replicas)]
    longest = pieces.max_tokens if largest else max(1, *(ids.shape[1] for ids, _, _ in blocks))
    width = min(w for w in {*STATIC_WIDTHS, pieces.max_tokens} if w >= longest and w <= pieces.max_tokens)
    most = 3 * batch_size if largest else max(len(ids) for ids, _, _ in blocks)
    rows = -(-most // batch_size) * batch_size
    sentences = []
    for ids, _, _ in blocks:
        ids = np.pad(ids, [(0, 0), (0, width - ids.shape[1])])
        filler = ids[:1] if len(ids) else np.zeros((1, width), np.int32)
        sentences.append(np.concatenate([ids, np.repeat(filler, rows - len(ids), axis=0)]))
    inputs = {"sentences": np.stack(sentences),
              "roles": np.stack([_padded(roles, batch_size) for _, roles, _ in blocks]),
              "sections": np.stack([_padded(sections, rows, NO_SECTION) for _, _, sections in blocks])}
    weights = np.concatenate([_padded(np.ones(len(roles), np.float32), batch_size) for _, roles, _ in blocks])
    return inputs, np.zeros(replicas * batch_size, np.int32), weights


class ArrayInput:
    """The trainer's input of one run under the JAX backend: the validation and test batches, the
    training stream and the record counts, as `model.train` asks tf.data's for them. In a job of
    several processes, `process` of `processes` feeds its `replicas` local devices' blocks of each
    global batch from its own share of the shards (`shard_stream`'s FILE sharding, as tf.data's
    input pipelines do), and every process runs the same number of evaluation steps."""

    def __init__(self, config: TrainConfig, run: Run, replicas: int, process: int = 0, processes: int = 1):
        self.config, self.run, self.replicas = config, run, replicas
        self.process, self.processes = process, processes
        self.dataset = config.inputs.dataset
        self.process_batch = config.optimizer.batch_size * replicas   # this process's share of a step's batch
        self.pieces = wordpieces(config.inputs.max_tokens, config.network.encoder, config.network.checkpoint)

    def _paths(self, split: str) -> list[tuple[str, int]]:
        return [(self.run.path(shard.path), shard.records or 0)
                for shard in triplet_split(self.run, self.dataset, split).shards]

    def _batches(self, triplets: Iterator[dict], batch_size: int | None = None) -> Iterator[Batch]:
        """Batches of `batch_size` triplets per replica (default `--batch-size`)."""
        batch_size = batch_size or self.config.optimizer.batch_size
        while chunk := list(itertools.islice(triplets, batch_size * self.replicas)):
            yield batch_arrays(chunk, self.pieces, batch_size, self.replicas, largest=self.processes > 1)

    def evaluation(self, split: str) -> keras.utils.PyDataset:
        """A seeded sample of `--evaluation-triplets` (`model.training.data.triplet_sample`: the
        split's shards from shard `seed` on, its first records), held for every epoch; without
        one, the whole split, streamed again at every pass (each validation, the untrained and
        the test scores), in as many batches as its manifest's records fill. Each process scores
        its share: every `processes`-th triplet of the sample, or its shards of the split."""
        shards, size = self._paths(split), self.config.inputs.evaluation_triplets
        if not size:
            mine = shards[self.process::self.processes]
            steps = max(-(-sum(count for _, count in shards[p::self.processes]) // self.process_batch)
                        for p in range(self.processes))

            def stream() -> Iterator[Batch]:
                records = itertools.chain.from_iterable(shard_records(path) for path, _ in mine)
                return self._batches(triplets_of(records))

            return SplitBatches(stream, steps)
        paths = [path for path, _ in shards]
        rotation = self.config.runtime.seed % max(len(paths), 1)
        records = itertools.chain.from_iterable(map(shard_records, paths[rotation:] + paths[:rotation]))
        sample = list(itertools.islice(triplets_of(records), size))[self.process::self.processes]
        held = list(self._batches(iter(sample)))   # batched once, read at every pass
        per_process = -(-size // self.processes)
        return SplitBatches(lambda: iter(held), -(-per_process // self.process_batch))

    def training(self, resume_at_step: int = 0) -> keras.utils.PyDataset:
        """The endless training stream, from the first record a resumed run has not trained on, in
        the parts a step's batch is fed in (`--gradient-accumulation-steps`)."""
        shards = shard_stream(self._paths("train"), self.config.runtime.seed, self.process, self.processes,
                              start=resume_at_step * self.process_batch)
        records = itertools.chain.from_iterable(shard_records(path, skip) for path, skip in shards)
        return StreamedBatches(self._batches(triplets_of(records), self.config.optimizer.part_size))

    def count_records(self, split: str) -> dict[str, int]:
        """What reading the split loses against its manifest (`model.training.data.count_records`)."""
        read = unparseable = 0
        for path, _ in self._paths(split):
            for record in shard_records(path):
                read += 1
                unparseable += parse_triplet(record) is None
        expected = triplet_split(self.run, self.dataset, split).records
        return {"expected": expected, "read": read, "lost": max(0, expected - read), "unparseable": unparseable}


class SplitBatches(keras.utils.PyDataset):
    """An evaluation's batches, read from `batches()` at every pass (a whole split is streamed
    from its shards rather than held: the 2019 validation split is 126 k triplets; a sample is
    held, batched once): `length` batches, so that every pass, and every device and process under
    `keras.distribution`, runs the same number of steps. Asked for batch 0 (a new pass, or Keras
    peeking at the shapes), or out of order, the stream starts again; Keras' worker thread and
    its peek are served one at a time. A stream shorter than `length` (a process's smaller share,
    a split that lost records: `count_records` names the loss before the export) ends in copies
    of its last batch weighing 0."""

    def __init__(self, batches: Callable[[], Iterator[Batch]], length: int):
        super().__init__(workers=1, max_queue_size=8)
        self.open_stream, self.length = batches, length
        self.stream: Iterator[Batch] = iter(())
        self.next_index = 0
        self.last: Batch | None = None
        self.serving = threading.Lock()

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Batch:
        with self.serving:
            return self._batch(index)

    def _batch(self, index: int) -> Batch:
        if index != self.next_index or index == 0:
            self.stream = itertools.islice(self.open_stream(), index, None)
        self.next_index = index + 1
        batch = next(self.stream, None)
        if batch is None:
            if self.last is None:
                raise IndexError(f"batch {index} of a split that holds none")
            inputs, labels, weights = self.last
            return inputs, labels, np.zeros_like(weights)
        self.last = batch
        return batch


class StreamedBatches(keras.utils.PyDataset):
    """An endless stream of batches, made one after the other in a Keras worker thread beside the
    training step (`workers=1`: Keras asks for them in order, and this checks it does). The batches
    Keras peeks at to learn the shapes may be asked for again after the worker has read ahead, so
    the last few are kept for it; the worker and the peek are served one at a time."""

    KEPT = 16

    def __init__(self, batches: Iterator[Batch]):
        super().__init__(workers=1, max_queue_size=8)
        self.batches = batches
        self.kept: dict[int, Batch] = {}
        self.next_index = 0
        self.serving = threading.Lock()

    @property
    def num_batches(self) -> None:
        return None

    def __getitem__(self, index: int) -> Batch:
        with self.serving:
            return self._batch(index)

    def _batch(self, index: int) -> Batch:
        if index in self.kept:
            return self.kept[index]
        if index != self.next_index:
            raise RuntimeError(f"the training stream is read in order: batch {index} asked for, {self.next_index} next")
        self.kept[index] = next(self.batches)
        self.kept.pop(index - self.KEPT, None)
        self.next_index = index + 1
        return self.kept[index]
