"""A pipeline run's triplet splits as the trainer reads them, without TensorFlow: which shards,
in which order, from which record, and the names of what training reads of a triplet
(`model.training.arrays` reads them)."""
from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator

import numpy as np

from core import records
from core.cli import DataLossError, UsageError
from core.published import MANIFEST, ManifestError, Output, Run
from core.records import ROLES, SECTION_OF_ROLE
from model.config import TrainConfig
from model.training.model_dir import INPUTS

LOG = logging.getLogger(__name__)

# What training reads of a triplet: its three sentences, its article (batches mix articles), and
# the sections its sentences come from (`records.SECTION_OF_ROLE`: the in-batch loss must not take
# a sentence of the anchor's own section for a negative).
ARTICLE_ID = "article_id"
FEATURES = tuple(name for name in records.TRIPLET_FEATURES
                 if name in (*ROLES, ARTICLE_ID, *(name for pair in SECTION_OF_ROLE.values() for name in pair)))
# A section's key: its article id times this, plus its index in the article (`arrays.batch_arrays`).
SECTIONS_PER_ARTICLE = 1 << 20
# The section key of the padding rows of a batch's sentences: never a candidate.
NO_SECTION = -1

# Token widths of `--static-shapes` batches (with `max_tokens` itself): every batch is padded to
# the smallest that holds its longest sentence, so XLA compiles one step per width (times the row
# counts of `arrays.batch_arrays`) instead of one per batch.
STATIC_WIDTHS = (16, 32)


class TripletDataError(UsageError):
    """The pipeline output lacks the shards asked for, or the model dir holds another run."""


class TripletDataLoss(DataLossError):
    """Reading a split lost more records than allowed (corrupt or truncated shards)."""


def open_run(data: str) -> Run:
    """`Run.open`, with the trainer's error (a TripletDataError naming the folder)."""
    try:
        return Run.open(data)
    except ManifestError as error:
        raise TripletDataError(str(error)) from None


def verify_split(run: Run, dataset: str, split: str, max_lost_fraction: float = 0.0) -> int:
    """`Run.verify` of one split (every shard there, of its size and record count), with the
    trainer's error for a run folder that lacks the split. Returns the records lost."""
    triplet_split(run, dataset, split)
    return run.verify(f"{dataset}/{split}", max_lost_fraction)


def triplet_split(run: Run, dataset: str, split: str) -> Output:
    """The split's manifest entry (shards, per-shard records and sizes, order); the run's triplets
    must carry the features training reads, of the types it parses. A run without the split, or
    with other features, is one TripletDataError naming the manifest."""
    written = run.manifest.triplet_features
    differing = [f"{name} ({written.get(name, 'missing')})" for name in FEATURES
                 if written.get(name) != records.TRIPLET_FEATURES[name]]
    if differing:
        raise TripletDataError(f"{run.root}/{MANIFEST}: its triplets carry {', '.join(differing)}, not as "
                               "this code parses them; rerun the pipeline with this version")
    try:
        return run.output(f"{dataset}/{split}")
    except ManifestError as error:
        hint = (f" (pipeline.run writes {dataset} only when given --negatives {dataset.rsplit('-', 1)[1]})"
                if dataset.startswith("triplets-sen-") else "")
        raise TripletDataError(f"{error}{hint}") from None


def list_shards(data: str, dataset: str, split: str) -> list[str]:
    """Paths of the split's shards as the run's manifest lists them (a folder without a manifest,
    one from a failed or unfinished run, is refused); an error names the folder."""
    run = open_run(data)
    return [run.path(shard.path) for shard in triplet_split(run, dataset, split).shards]


def shard_stream(shards: list[tuple[str, int]], seed: int, pipeline: int = 0, pipelines: int = 1,
                 start: int = 0) -> Iterator[tuple[str, int]]:
    """(shard path, records to skip in it) in the order input pipeline `pipeline` of `pipelines`
    reads a split, pass after pass, for ever: pass p permutes the shards by (seed, p) and gives
    this pipeline every `pipelines`-th of them (FILE sharding: workers read disjoint shards, each
    record once per pass across them). `start` skips that many of this pipeline's records
    without reading them: whole shards by the manifest's per-shard records, then the first
    records of one shard. `shards`: (path, records) in the manifest's order."""
    if len(shards) < pipelines:
        raise TripletDataError(f"{len(shards)} shard(s) cannot feed {pipelines} input pipelines: each worker reads "
                               "its own shards; rerun the pipeline on more data, or train on fewer workers")
    if not sum(count for _, count in shards):
        return
    for passes in itertools.count():
        order = np.random.default_rng([seed, passes]).permutation(len(shards))
        mine = [shards[i] for i in order[pipeline::pipelines]]
        total = sum(count for _, count in mine)
        if start >= total:
            start -= total
            continue
        for path, count in mine:
            if start >= count:
                start -= count
                continue
            # Logged where it tells something: which shards each worker of a multi-worker job opens,
            # and where a resumed run starts; a single pipeline's every shard is noise in a log.
            LOG.log(logging.INFO if pipelines > 1 or start else logging.DEBUG,
                    "input pipeline %d of %d, pass %d: %s from record %d", pipeline, pipelines, passes, path, start)
            yield path, start
            start = 0


def needs_tensorflow(config: TrainConfig) -> str | None:
    """What in `config` needs TensorFlow under the JAX backend, or None: the BiLSTM (its
    tokenizer is tensorflow-text's, in the graph it exports) and a teacher that is an export alone
    (a SavedModel; a teacher's model dir runs its Net under JAX: `model.encoding.trained_net`)."""
    if config.network.kind.reads_word_vectors:
        return f"--encoder {config.network.encoder} (word vectors: the in-graph tokenizer of model.net.text)"
    teacher = config.optimizer.teacher
    if teacher and not os.path.exists(os.path.join(teacher, INPUTS)):
        return "--teacher (an export without its model dir: a SavedModel runs in TensorFlow)"
    return None
