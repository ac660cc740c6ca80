"""QS3M's inputs: the pipeline's passages file read into queries, their passages embedded once
with a fixed encoder, and the (query, passage, passage, same-cluster) pair dataset."""
from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

import numpy as np
from tqdm import tqdm

from core import records
from core.published import MANIFEST, Run
from core.splits import stable_hash
from model.encoding.encoder import SentenceEncoder
from model.qs3m.network import model_inputs
from model.qs3m.pairs import Pair, Query, query_from_record

QUERY_REPRESENTATIONS = {"T": "title", "D": "lead paragraphs", "P": "mean of passages"}


# ---------------------------------------------------------------- reading and writing files

def passages_files(source: str) -> list[str]:
    """The passages files of `source`: a pipeline run folder (listed from its manifest, so only a
    published run is read) or a glob of JSON-lines files."""
    from apache_beam.io.filesystems import FileSystems

    if FileSystems.exists(f"{source.rstrip('/')}/{MANIFEST}"):
        run = Run.open(source)
        run.verify(records.PASSAGES)   # every article the run wrote, or a ShardError
        return run.paths(records.PASSAGES)
    paths = sorted(m.path for result in FileSystems.match([source]) for m in result.metadata_list)
    if not paths:
        raise FileNotFoundError(f"--passages {source!r} is neither a run folder with {MANIFEST} "
                                "nor a glob that matches a file")
    return paths


def read_queries(source: str, splits: Sequence[str] | None = None, max_queries: int | None = None,
                 seed: int = 0, articles_per_split: dict[str, int] | None = None) -> tuple[list[Query], list[dict]]:
    """The articles of `source` (see `passages_files`) in `splits` (default: all), plus dead
    letters for bad lines.

    Streamed: only the queries kept are held. With `max_queries`, a seeded sample of that many
    (the smallest `stable_hash(seed, article_id)`, the same in every run whatever the file order).
    A line that is not JSON or breaks the contract is set aside as a dead-letter record naming
    file and line, never silently dropped. `articles_per_split`, when given, receives the count of
    every valid article read, per split (kept or not).
    """
    from apache_beam.io.filesystems import FileSystems

    kept: list[tuple[int, int, Query]] = []   # a max-heap on the hash (negated) when sampling
    dead_letters = []
    progress = tqdm(desc="read passages", unit=" articles", leave=False)
    for path in passages_files(source):
        with FileSystems.open(path) as handle:
            for line_number, line in enumerate(iter(handle.readline, b""), start=1):
                if not line.strip():
                    continue
                progress.update()
                try:
                    query = query_from_record(records.PassagesRecord.from_json(line))
                except records.RecordError as error:
                    dead_letters.append({
                        "stage": "qs3m-read", "source": f"{path}:{line_number}", "page_id": None,
                        "title": None, "reason": type(error).__name__, "detail": str(error),
                    })
                    continue
                if articles_per_split is not None:
                    articles_per_split[query.split] = articles_per_split.get(query.split, 0) + 1
                if splits is not None and query.split not in splits:
                    continue
                entry = (-stable_hash("qs3m-sample", seed, query.article_id), int(progress.n), query)
                if max_queries is None:
                    kept.append(entry)
                elif len(kept) < max_queries:
                    heapq.heappush(kept, entry)
                elif entry[0] > kept[0][0]:
                    heapq.heapreplace(kept, entry)
    progress.close()
    if max_queries is not None:   # in file order, like the whole set
        kept.sort(key=lambda entry: entry[1])
    return [query for _, _, query in kept], dead_letters


# ---------------------------------------------------------------- fixed embeddings

@dataclasses.dataclass
class QueryEmbeddings:
    """Fixed encoder outputs for a list of queries.

    `passages` stacks every query's passages; query i owns rows `offsets[i]:offsets[i + 1]`.
    `queries[r]` holds one vector per query for representation r in T, D, P.
    """

    passages: np.ndarray
    offsets: np.ndarray
    queries: dict[str, np.ndarray]
    lead_missing: int

    def passages_of(self, query_index: int) -> np.ndarray:
        return self.passages[self.offsets[query_index]:self.offsets[query_index + 1]]


def encode_in_batches(encoder: SentenceEncoder, texts: list[str], batch_size: int, what: str) -> np.ndarray:
    """Encodes `texts` in chunks with a progress bar, so long corpora show where they are."""
    chunks = [
        np.asarray(encoder.encode(texts[start:start + batch_size]), dtype=np.float32)
        for start in tqdm(range(0, len(texts), batch_size), desc=f"encode {what}", unit="batch", leave=False)
    ]
    if len({chunk.shape[1] for chunk in chunks}) > 1:
        raise ValueError(f"encoder {getattr(encoder, 'name', encoder)!r} gives a different width per call "
                         f"({sorted({chunk.shape[1] for chunk in chunks})}); QS3M needs one fixed vector space "
                         "(an encoder fitted per call, like tfidf, cannot embed its passages)")
    return np.concatenate(chunks) if chunks else np.zeros((0, 0), np.float32)


def embed_queries(queries: Sequence[Query], encoder: SentenceEncoder, batch_size: int = 256) -> QueryEmbeddings:
    """Embeds passages once and builds the three query representations from the same encoder.

    D encodes the lead paragraphs joined as one text; an article without a lead falls back to
    its title and is counted in `lead_missing`.
    """
    texts = [passage for query in queries for passage in query.passages]
    passages = encode_in_batches(encoder, texts, batch_size, "passages")
    offsets = np.concatenate([[0], np.cumsum([len(query.passages) for query in queries])]).astype(np.int64)
    titles = encode_in_batches(encoder, [query.title for query in queries], batch_size, "titles")
    leads = [" ".join(query.lead) if query.lead else query.title for query in queries]
    descriptions = encode_in_batches(encoder, leads, batch_size, "leads")
    means = np.stack([passages[offsets[i]:offsets[i + 1]].mean(axis=0) if offsets[i + 1] > offsets[i]
                      else np.zeros(passages.shape[1], np.float32) for i in range(len(queries))])
    return QueryEmbeddings(
        passages=passages,
        offsets=offsets,
        queries={"T": titles, "D": descriptions, "P": means.astype(np.float32)},
        lead_missing=sum(1 for query in queries if not query.lead),
    )


# ---------------------------------------------------------------- pair dataset

def pair_features(pairs: Sequence[Pair], embeddings: QueryEmbeddings) -> dict[str, np.ndarray]:
    """Row indices of the query vector and both passage vectors for each pair."""
    query_index = np.array([pair.query_index for pair in pairs], dtype=np.int64)
    base = embeddings.offsets[query_index] if len(pairs) else np.zeros(0, np.int64)
    return {
        "query": query_index,
        "passage1": base + np.array([pair.first for pair in pairs], dtype=np.int64),
        "passage2": base + np.array([pair.second for pair in pairs], dtype=np.int64),
    }


def pair_dataset(pairs: Sequence[Pair], embeddings: QueryEmbeddings, query_representation: str, kind: str,
                 batch_size: int, shuffle_seed: int | None = None):
    """tf.data of ({input name: vector}, same-cluster label); vectors are gathered per batch in graph."""
    import tensorflow as tf

    indices = pair_features(pairs, embeddings)
    tables = {"query": tf.constant(embeddings.queries[query_representation]),
              "passage1": tf.constant(embeddings.passages), "passage2": tf.constant(embeddings.passages)}
    names = model_inputs(kind)
    labels = np.array([pair.same_cluster for pair in pairs], dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(({name: indices[name] for name in names}, labels))
    if shuffle_seed is not None:
        dataset = dataset.shuffle(len(pairs), seed=shuffle_seed, reshuffle_each_iteration=True)
    return dataset.batch(batch_size).map(
        lambda rows, label: ({name: tf.gather(tables[name], rows[name]) for name in names}, label),
        num_parallel_calls=tf.data.AUTOTUNE,
    ).prefetch(tf.data.AUTOTUNE)
