"""The trainer's one input path: a run's triplet shards -> the triplet model's batches as NumPy
arrays, for every backend and strategy (big_vision's shape: one input pipeline on the host CPU,
feeding any device).

Records are read by `core.tfrecord` (local, or through Beam's FileSystems for gs://) and
parsed by the pipeline's own protobuf class of `tf.train.Example` (`core.records.Example`):
an unreadable record is skipped and a corrupt shard ends where it breaks, and `count_records`
counts both beside training. The stream follows `shard_stream` (the shards in a seeded order per
pass, each read front to back, a resumed run from its first record not trained on); `grouped`
cuts it into batches (`--article-chunk` blocks of consecutive records, a `--shuffle-buffer`, or
with `--article-chunk 0` length groups); `batch_arrays` turns a batch into the model's inputs:
each replica's block holds its distinct sentences once, with each triplet's rows among them.

Nothing here imports TensorFlow: the sentences become ids through a `Tokenizer` (a transformer's
`model.net.wordpieces.WordPieces`, without TensorFlow; the BiLSTM's `model.net.text.ArrayIds`,
its in-graph tokenizer run on arrays), and a `--teacher` is any function of sentences. Keras reads
the batches as a `keras.utils.PyDataset` (`SplitBatches`, `StreamedBatches`); under TensorFlow,
`model.training.tf_input` hands the same batches to tf.distribute.
"""
from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gzip
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import pickle
import queue
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import keras
import numpy as np

from core.published import Run
from core.records import ROLES, SECTION_OF_ROLE, TRIPLET_FEATURES, Example, FeatureType
from core.tfrecord import CorruptRecordError, read_records
from model.config import TrainConfig
from model.training.input_worker import serve
from model.training.shards import (
    FEATURES,
    NO_SECTION,
    SECTIONS_PER_ARTICLE,
    STATIC_WIDTHS,
    shard_stream,
    triplet_split,
)

LOG = logging.getLogger(__name__)
Batch = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]   # (inputs, labels, sample weights)
Teacher = Callable[[list[str]], np.ndarray]   # sentences -> float32 [n, d] (`--teacher`)

# Upper bounds (exclusive) of the token-length groups of `--article-chunk 0`: a batch is padded to
# its longest sentence, and random batches of Wikipedia openers (mean 21 tokens, p90 33) would be
# padded to about 40, wasting half of the LSTM's steps.
LENGTH_BOUNDARIES = (12, 16, 20, 24, 28, 33, 40, 50)


class Tokenizer(Protocol):
    """Sentences -> int32 ids [n, t] (0 = padding, t the longest, at most `max_tokens`)."""

    max_tokens: int

    def __call__(self, sentences: list[str]) -> np.ndarray: ...


def shard_records(path: str, skip: int = 0) -> Iterator[bytes]:
    """The serialised records of one gzip TFRecord shard (local, or through Beam's FileSystems),
    from record `skip` on. A corrupt or truncated shard ends where it breaks, with a warning: a
    damaged frame, a gzip stream cut short or failing its CRC, or damaged deflate data
    (`zlib.error`, not an OSError), as `core.published.count_shard_records` reads one."""
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


def triplets_of(records: Iterable[bytes]) -> Iterator[dict]:
    return (triplet for triplet in map(parse_triplet, records) if triplet is not None)


def split_triplets(run: Run, dataset: str, split: str, rotation: int = 0) -> Iterator[dict]:
    """Every triplet of the split once, in its written order, from shard `rotation` on (wrapping round)."""
    paths = [run.path(shard.path) for shard in triplet_split(run, dataset, split).shards]
    rotation %= max(len(paths), 1)
    return triplets_of(itertools.chain.from_iterable(map(shard_records, paths[rotation:] + paths[:rotation])))


def _distinct_sentences(triplets: list[dict], tokenizer: Tokenizer
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """One block: (ids [s, t] of its distinct sentences, shortest first; rows [n, 3] of each
    triplet's anchor, positive and negative among them; each sentence's section, numbered in the
    block (int32: JAX without x64 would truncate the int64 keys); the sentences, in that order)."""
    stacked = [triplet[role] for role in ROLES for triplet in triplets]
    row_of: dict[str, int] = {}
    row_of_sentence = np.array([row_of.setdefault(sentence, len(row_of)) for sentence in stacked], np.int64)
    distinct = list(row_of)
    ids = tokenizer(distinct) if distinct else np.zeros((0, 1), np.int32)
    order = np.argsort((ids != 0).sum(axis=1), kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    keys = np.array([triplet[article] * SECTIONS_PER_ARTICLE + triplet[index] for article, index in
                     (SECTION_OF_ROLE[role] for role in ROLES) for triplet in triplets], np.int64)
    sections = np.full(len(row_of), np.iinfo(np.int64).min)
    np.maximum.at(sections, row_of_sentence, keys)
    numbers: dict[int, int] = {}
    section_numbers = np.array([numbers.setdefault(key, len(numbers)) for key in sections[order].tolist()], np.int32)
    roles = rank[row_of_sentence].reshape(3, -1).T.astype(np.int32)
    return ids[order].astype(np.int32), roles, section_numbers, [distinct[i] for i in order]


def _ceil(count: int, size: int) -> int:
    return -(-count // size)


def _padded(rows: np.ndarray, size: int, value: int | float = 0) -> np.ndarray:
    return np.concatenate([rows, np.full((size - len(rows), *rows.shape[1:]), value, rows.dtype)])


def batch_arrays(triplets: list[dict], tokenizer: Tokenizer, batch_size: int, replicas: int = 1, *,
                 static: bool = True, largest: bool = False, teacher: Teacher | None = None) -> Batch:
    """A batch of triplets -> the triplet model's (inputs, labels, sample weights).

    The batch is cut into `replicas` blocks (the first ones full, as tf.distribute splits a
    batch); each holds its distinct sentences once (`sentences` [s, t], shortest first, padded
    with copies of the block's first: an all-padding row would make a transformer's masked mean
    divide 0 by 0), each triplet's rows in them (`roles` [n, 3]) and each sentence's section
    (`sections` [s], `NO_SECTION` on padding rows); with a `teacher`, its embedding of each
    sentence (`teacher` [s, d], zeros on padding rows). Blocks are stacked on a leading replica
    axis, so a strategy splits the batch into whole blocks. Labels and weights are flat, one per
    triplet (the reported loss and accuracy are weighted means over triplets,
    `model.net.head.weighted_scores`); a padding triplet weighs 0; the label is the constant 0 =
    "the positive is distances[..., 0]".

    `static` (`--static-shapes`, and always under JAX): a few fixed shapes: `batch_size` triplets
    a block, its sentences padded to a multiple of `batch_size` rows and to the smallest of
    `STATIC_WIDTHS` or `max_tokens` that holds them; otherwise the batch's own longest sentence
    and largest block. `largest`: always 3 x `batch_size` rows of `max_tokens`, as processes that
    feed one global batch need (each shapes its own part, and the parts must agree)."""
    per_replica = -(-len(triplets) // replicas)
    blocks = [_distinct_sentences(triplets[r * per_replica:(r + 1) * per_replica], tokenizer) for r in range(replicas)]
    longest = max(max(ids.shape[1] for ids, *_ in blocks), 1)
    most = max(len(ids) for ids, *_ in blocks)
    count = max(len(roles) for _, roles, *_ in blocks)
    if largest:
        longest, most = tokenizer.max_tokens, 3 * batch_size
    width, rows = longest, most
    if static:
        width = min(w for w in {*STATIC_WIDTHS, tokenizer.max_tokens} if longest <= w <= tokenizer.max_tokens)
        rows, count = -(-most // batch_size) * batch_size, batch_size
    sentences = []
    for ids, *_ in blocks:
        ids = np.pad(ids, [(0, 0), (0, width - ids.shape[1])])
        filler = ids[:1] if len(ids) else np.zeros((1, width), np.int32)
        sentences.append(np.concatenate([ids, np.repeat(filler, rows - len(ids), axis=0)]))
    inputs = {"sentences": np.stack(sentences),
              "roles": np.stack([_padded(roles, count) for _, roles, _, _ in blocks]),
              "sections": np.stack([_padded(sections, rows, NO_SECTION) for _, _, sections, _ in blocks])}
    if teacher is not None:
        inputs["teacher"] = np.stack([_padded(np.asarray(teacher(strings), np.float32), rows)
                                      for *_, strings in blocks])
    weights = np.concatenate([_padded(np.ones(len(roles), np.float32), count) for _, roles, _, _ in blocks])
    return inputs, np.zeros(replicas * count, np.int32), weights


@dataclasses.dataclass(frozen=True)
class BatchMaker:
    """`batch_arrays` with one input's settings: a group of triplets -> its Batch, in the trainer's
    thread or, pickled to them, in input workers (`in_workers`)."""

    tokenizer: Tokenizer
    replicas: int = 1
    static: bool = True
    largest: bool = False
    teacher: Teacher | None = None

    def __call__(self, triplets: list[dict], batch_size: int) -> Batch:
        return batch_arrays(triplets, self.tokenizer, batch_size, self.replicas, static=self.static,
                            largest=self.largest, teacher=self.teacher)


WORKER_BATCHES_AHEAD = 4   # batches in flight per worker: the memory bound of `in_workers`


def _receive(results: Any, process: Any, number: int) -> Any:
    """Worker `number`'s next result; its exception raised here; a worker that ended without one
    (killed, out of memory) a RuntimeError, not a wait for ever."""
    while True:
        try:
            kind, payload = results.get(timeout=1.0)
            break
        except queue.Empty:
            if process.is_alive():
                continue
            try:   # a result it sent just before it ended
                kind, payload = results.get(timeout=1.0)
                break
            except queue.Empty:
                raise RuntimeError(f"input worker {number} ended (exit code {process.exitcode}) without "
                                   "its batch") from None
    if kind == "error":
        error, text = payload
        error.add_note(f"raised in input worker {number}:\n{text}")
        raise error
    return payload


def in_workers(make: Callable[..., Any], tasks: Iterable[tuple], workers: int,
               ahead: int = WORKER_BATCHES_AHEAD) -> Iterator[Any]:
    """`make(*task)` of each task, made in `workers` spawned processes and yielded in the tasks'
    order: task i goes to worker i % workers and its result is read from that worker's queue, so
    the results are the ones `map(make, tasks)` gives, in its order. `tasks` is read here, lazily,
    at most `ahead` tasks per worker beyond the results taken (the memory bound). `make` is pickled
    to each worker once. A worker's exception is raised here, and a worker that dies is a
    RuntimeError; the workers end when the stream is closed or collected, and on their own when
    this process ends. The workers start at the first batch asked for (a few seconds: each
    imports NumPy, Keras and the tokenizer)."""
    context = multiprocessing.get_context("spawn")
    task_queues = [context.Queue() for _ in range(workers)]
    result_queues = [context.Queue() for _ in range(workers)]
    processes = [context.Process(target=serve, args=(task_queues[number], result_queues[number]),
                                 name=f"input-worker-{number}", daemon=True) for number in range(workers)]
    try:
        for process in processes:
            process.start()
        for channel in task_queues:
            channel.put(make)
        pending = iter(tasks)
        sent = received = 0
        while True:
            while sent < received + workers * ahead and (task := next(pending, None)) is not None:
                task_queues[sent % workers].put(task)
                sent += 1
            if received == sent:
                return
            number = received % workers
            result = _receive(result_queues[number], processes[number], number)
            received += 1
            yield result
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            if process.pid is not None:
                process.join(5)
                if process.is_alive():
                    process.kill()
                    process.join()
        with contextlib.suppress(Exception):   # a stream collected at interpreter exit: multiprocessing half gone
            for channel in task_queues + result_queues:
                channel.cancel_join_thread()   # a task a dead worker never read must not hold this process at exit
                channel.close()


def batched(items: Iterable, size: int) -> Iterator[list]:
    """Lists of `size` consecutive items (the last may be shorter)."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def shuffled(items: Iterable, buffer_size: int, seed: int) -> Iterator:
    """The items through a seeded shuffle buffer of `buffer_size` (tf.data's `shuffle`): each item
    out is drawn at random from the buffer, and the next one in takes its place."""
    rng = np.random.default_rng(seed)
    buffer: list = []
    for item in items:
        if len(buffer) < buffer_size:
            buffer.append(item)
            continue
        index = int(rng.integers(len(buffer)))
        yield buffer[index]
        buffer[index] = item
    yield from (buffer[index] for index in rng.permutation(len(buffer)))


def length_groups(triplets: Iterable[dict], tokenizer: Tokenizer, size: int) -> Iterator[list[dict]]:
    """Batches of `size` triplets of one length group (`LENGTH_BOUNDARIES`, by a triplet's longest
    sentence in tokens), each batched when full; at the end of the triplets, what each group holds."""
    groups: dict[int, list[dict]] = {}
    for chunk in batched(triplets, 1024):   # tokenised in large batches
        lengths = np.max([(tokenizer([triplet[role] for triplet in chunk]) != 0).sum(axis=1) for role in ROLES], axis=0)
        for triplet, length in zip(chunk, lengths.tolist()):
            group = bisect.bisect_right(LENGTH_BOUNDARIES, length)
            groups.setdefault(group, []).append(triplet)
            if len(groups[group]) == size:
                yield groups.pop(group)
    yield from (groups[group] for group in sorted(groups))


def grouped(triplets: Iterable[dict], size: int, tokenizer: Tokenizer, *, article_chunk: int,
            group_by_length: bool = True, shuffle_buffer: int = 0, seed: int = 0) -> Iterator[list[dict]]:
    """The triplets of each batch of `size`. With `article_chunk` > 0, blocks of that many
    consecutive triplets side by side: the pipeline wrote each article's triplets in chunks of 16
    (`pipeline.write.order`), so a batch holds about `size / article_chunk` articles whose shared
    sentences are encoded once; a `shuffle_buffer` (triplets) shuffles whole blocks. With
    `article_chunk` 0, triplets one by one (shuffled alike) and with `group_by_length` in
    `length_groups`. The split's order was drawn when it was written, so the stream needs no
    buffer to be shuffled; one keeps a second pass from repeating the first."""
    if article_chunk:
        blocks: Iterator[list[dict]] = batched(triplets, article_chunk)
        if shuffle_buffer:
            blocks = shuffled(blocks, max(1, shuffle_buffer // article_chunk), seed)
        return batched(itertools.chain.from_iterable(blocks), size)
    if shuffle_buffer:
        triplets = shuffled(triplets, shuffle_buffer, seed)
    return length_groups(triplets, tokenizer, size) if group_by_length else batched(triplets, size)


def in_order(config: TrainConfig, shuffle: bool = False) -> bool:
    """Whether `grouped` batches consecutive triplets (so a batch's place in the stream says which
    records it holds): article chunks or no length groups, and no shuffle buffer."""
    inputs = config.inputs
    return not (shuffle and inputs.shuffle_buffer) and (inputs.article_chunk > 0 or not inputs.group_by_length)


class TripletInput:
    """The trainer's input of one run: the validation and test batches, the training stream and
    the record counts. Batches hold `blocks` replicas' blocks; the stream feeds `replicas`
    replicas (a step takes `replicas / blocks` batches of each of its
    `--gradient-accumulation-steps` parts). In a job of several input pipelines (processes under
    `keras.distribution`, workers of a tf.distribute cluster), `process` of `processes` streams
    its own share of the shards (`shard_stream`'s FILE sharding) and scores every `processes`-th
    evaluation triplet or its shards of a split, in as many steps as every other."""

    def __init__(self, config: TrainConfig, run: Run, tokenizer: Tokenizer, teacher: Teacher | None = None,
                 teacher_dim: int | None = None, *, blocks: int = 1, replicas: int | None = None, process: int = 0,
                 processes: int = 1):
        self.config, self.run, self.tokenizer = config, run, tokenizer
        self.teacher, self.teacher_dim = teacher, teacher_dim
        self.blocks, self.replicas = blocks, replicas or blocks
        self.process, self.processes = process, processes
        self.dataset = config.inputs.dataset

    def share(self, process: int, processes: int, replicas: int) -> TripletInput:
        """This input as one of `processes` pipelines feeding `replicas` replicas a batch each."""
        return TripletInput(self.config, self.run, self.tokenizer, self.teacher, self.teacher_dim, blocks=1,
                            replicas=replicas, process=process, processes=processes)

    def _paths(self, split: str) -> list[tuple[str, int]]:
        return [(self.run.path(shard.path), shard.records or 0)
                for shard in triplet_split(self.run, self.dataset, split).shards]

    def _maker(self) -> BatchMaker:
        return BatchMaker(self.tokenizer, self.blocks, static=self.config.runtime.static_batches,
                          largest=self.processes > 1, teacher=self.teacher)

    def _arrays(self, group: list[dict], batch_size: int) -> Batch:
        return self._maker()(group, batch_size)

    def _made(self, groups: Iterable[list[dict]], batch_size: int) -> Iterator[Batch]:
        """The groups' batches: in the thread that reads them, or with `--input-workers N` made in
        N worker processes (`in_workers`): the same batches in the same order. A teacher (a model,
        and a device's) or a tokenizer that does not pickle (the BiLSTM's, a TensorFlow graph)
        stays in this process."""
        make, workers = self._maker(), self.config.inputs.input_workers
        if workers and self.teacher is not None:
            LOG.warning("--input-workers %d: a --teacher runs in the trainer's process; batches are made there",
                        workers)
            workers = 0
        if workers:
            try:
                pickle.dumps(make)
            except Exception as error:
                LOG.warning("--input-workers %d: the tokenizer does not pickle to a worker (%s: %s); batches are "
                            "made in the trainer's process", workers, type(error).__name__, error)
                workers = 0
        if not workers:
            return (make(group, batch_size) for group in groups)
        return in_workers(make, ((group, batch_size) for group in groups), workers)

    def _groups(self, triplets: Iterable[dict], size: int, shuffle: bool = False) -> Iterator[list[dict]]:
        """`grouped` by the flags (`shuffle`: through `--shuffle-buffer`, the training stream's)."""
        inputs = self.config.inputs
        return grouped(triplets, size, self.tokenizer, article_chunk=inputs.article_chunk,
                       group_by_length=inputs.group_by_length, shuffle_buffer=inputs.shuffle_buffer if shuffle else 0,
                       seed=self.config.runtime.seed)

    def _batches(self, triplets: Iterable[dict], batch_size: int) -> Iterator[Batch]:
        """`grouped` batches of `batch_size` triplets per block, as arrays."""
        for group in self._groups(triplets, batch_size * self.blocks):
            yield self._arrays(group, batch_size)

    def evaluation(self, split: str) -> SplitBatches:
        """A seeded sample of `--evaluation-triplets` (the split's shards from shard `seed` on, its
        first records), batched once and held for every pass; without one, the whole split,
        streamed again at every pass (each validation, the untrained and the test scores; held
        with a teacher, which embeds it once). As many steps as the records fill (a process's
        share: as many as the largest share, an empty share, of fewer shards or triplets than
        processes, all in batches weighing 0), or with length groups as `grouped` makes."""
        batch_size = self.config.optimizer.batch_size
        size, sample = batch_size * self.blocks, self.config.inputs.evaluation_triplets
        shards = self._paths(split)
        if sample:
            triplets = itertools.islice(split_triplets(self.run, self.dataset, split, self.config.runtime.seed), sample)
            held = list(self._batches(list(triplets)[self.process::self.processes], batch_size))
            total = min(sample, sum(count for _, count in shards))
            return SplitBatches(lambda: iter(held), max(len(held), _ceil(_ceil(total, self.processes), size)),
                                self._weightless)

        def stream() -> Iterator[Batch]:
            paths = [path for path, _ in shards[self.process::self.processes]]
            return self._batches(triplets_of(itertools.chain.from_iterable(map(shard_records, paths))), batch_size)

        shares_steps = max(_ceil(sum(count for _, count in shards[p::self.processes]), size)
                           for p in range(self.processes))
        if self.teacher is not None:
            held = list(stream())
            return SplitBatches(lambda: iter(held), max(len(held), shares_steps if self.processes > 1 else 0),
                                self._weightless)
        if in_order(self.config):
            return SplitBatches(stream, shares_steps, self._weightless)
        return SplitBatches(stream, sum(1 for _ in self._groups(split_triplets(self.run, self.dataset, split), size)))

    def _weightless(self) -> Batch:
        """A batch of this input's shape that weighs 0, for a share with no batch of its own to
        copy: one made-up triplet whose sentences are a word (an all-padding sentence would make
        a transformer's masked mean 0 / 0, a NaN that weight 0 does not cancel)."""
        triplet = {name: "padding" if name in ROLES else 0 for name in FEATURES}
        inputs, labels, weights = self._arrays([triplet], self.config.optimizer.batch_size)
        return inputs, labels, np.zeros_like(weights)

    def training_batches(self, resume_at_step: int = 0) -> Iterator[Batch]:
        """The endless training stream, in the parts a step's batch is fed in
        (`--gradient-accumulation-steps`), from the first batch a resumed run (`resume_at_step`:
        its backup's optimizer step) has not trained on: where batches are consecutive records
        (`in_order`), the stream starts at that record (what came before is not read); otherwise
        (a shuffle buffer or length groups reorder records across batches) it is read from its
        first record and the batches trained on are dropped before they become arrays."""
        optimizer = self.config.optimizer
        consecutive = in_order(self.config, shuffle=True)
        trained = resume_at_step * optimizer.gradient_accumulation_steps * self.replicas // self.blocks
        if resume_at_step:
            LOG.info("resuming the training stream after step %d: %s", resume_at_step,
                     "starting it at the first record not trained on" if consecutive else
                     "reading it from its first record and dropping the batches trained (--shuffle-buffer or "
                     "--article-chunk 0 reorder records across batches)")
        planned = shard_stream(self._paths("train"), self.config.runtime.seed, self.process, self.processes,
                               start=trained * optimizer.part_size * self.blocks if consecutive else 0)
        first = next(planned, None)   # too few shards for the pipelines: refused now, not in fit
        shards = itertools.chain([first] if first else [], planned)
        triplets = triplets_of(itertools.chain.from_iterable(shard_records(path, skip) for path, skip in shards))
        groups = self._groups(triplets, optimizer.part_size * self.blocks, shuffle=True)
        return self._made(groups if consecutive else itertools.islice(groups, trained, None), optimizer.part_size)

    def training(self, resume_at_step: int = 0) -> StreamedBatches:
        """`training_batches` as Keras reads them (a worker thread beside the step)."""
        return StreamedBatches(self.training_batches(resume_at_step))

    def count_records(self, split: str) -> dict[str, int]:
        """What reading the split loses against its manifest: `lost` records (a corrupt or truncated
        shard is read up to where it breaks) and `unparseable` ones (read but not a triplet)."""
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
    of its last batch weighing 0; one with no batch at all (a process's empty share) in
    `weightless()` batches, which weigh 0 too."""

    def __init__(self, batches: Callable[[], Iterator[Batch]], length: int,
                 weightless: Callable[[], Batch] | None = None):
        super().__init__(workers=1, max_queue_size=8)
        self.open_stream, self.length, self.weightless = batches, length, weightless
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
                if self.weightless is None:
                    raise IndexError(f"batch {index} of a split that holds none")
                self.last = self.weightless()
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
