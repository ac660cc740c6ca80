"""QS3M: a query-specific Siamese similarity metric for passages (second seed), and its trainer.

Reads top to bottom: reading the passages file, embedding queries and passages with a fixed
encoder, the pair dataset, the layers and models (QS3M, QSS, QS3M-no-q) with their loss, then
training and the `python -m model.qs3m` entry point.

    python -m model.qs3m --passages 'OUT/passages/*.jsonl.gz' --output MODEL_DIR \
        [--encoder mean-vectors] [--models qs3m,qss,qs3m-noq] [--queries T,D,P] [--epochs 10]

The model dir (local or gs://) receives one `<kind>-<query>.keras` per trained model,
`config.json` (the config, encoder spec, pair counts and training history) and `training.png`.
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
import tempfile
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from tqdm import tqdm

from model.encoder import SentenceEncoder
from model.qs3m_pairs import LABELINGS, Pair, PassageRecordError, Query, query_from_record, sample_pairs
from pipeline.cli import run_cli
from pipeline.outputs import write_bytes

QUERY_REPRESENTATIONS = {"T": "title", "D": "lead paragraphs", "P": "mean of passages"}
MODEL_KINDS = ("qs3m", "qss", "qs3m-noq")
MODEL_LABELS = {"qs3m": "QS3M", "qss": "QSS", "qs3m-noq": "QS3M-no-q"}


# ---------------------------------------------------------------- reading and writing files

def read_bytes(path: str) -> bytes:
    """Whole file through Beam FileSystems (local or gs://), decompressed by its extension."""
    with FileSystems.open(path) as handle:
        return handle.read()


def read_queries(pattern: str) -> tuple[list[Query], list[dict]]:
    """Every article of the passages files matching `pattern`, plus dead letters for bad lines.

    A line that is not JSON or breaks the contract is set aside as a dead-letter record naming
    file and line, never silently dropped; a pattern that matches nothing is an error.
    """
    paths = sorted(m.path for result in FileSystems.match([pattern]) for m in result.metadata_list)
    if not paths:
        raise FileNotFoundError(f"--passages {pattern!r} matches no file")
    queries, dead_letters = [], []
    for path in paths:
        with FileSystems.open(path) as handle:
            for line_number, line in enumerate(iter(handle.readline, b""), start=1):
                if not line.strip():
                    continue
                try:
                    queries.append(query_from_record(json.loads(line)))
                except (json.JSONDecodeError, PassageRecordError) as error:
                    dead_letters.append({
                        "stage": "qs3m-read", "source": f"{path}:{line_number}", "page_id": None,
                        "title": None, "reason": type(error).__name__, "detail": str(error),
                    })
    return queries, dead_letters


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

def model_inputs(kind: str) -> tuple[str, ...]:
    """Names of the inputs a model kind reads; QS3M-no-q never sees the query."""
    return ("passage1", "passage2") if kind == "qs3m-noq" else ("query", "passage1", "passage2")


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


# ---------------------------------------------------------------- layers, loss, models

LOSS = "mean_squared_error"  # the seed trains the same-cluster probability with MSE


def dense_stack(units: Sequence[int], name: str):
    """A small ReLU MLP; NN1 is one such stack shared by the query and both passages."""
    return keras.Sequential([keras.layers.Dense(size, activation="relu") for size in units], name=name)


def same_cluster_head(units: Sequence[int], name: str = "nn2"):
    """NN2: an MLP ending in one sigmoid unit, the same-cluster probability."""
    return keras.Sequential(
        [*(keras.layers.Dense(size, activation="relu") for size in units), keras.layers.Dense(1, activation="sigmoid")],
        name=name,
    )


def standardizer(train_passages: np.ndarray | None, dim: int):
    """Per-dimension standardisation of the fixed vectors, adapted to the train-split passages.

    Mean word vectors share one large common direction, so raw cosines of any two passages sit
    near 1 and a small model barely moves off a constant prediction; centring and scaling the
    inputs (one layer shared by q, p1 and p2, saved with the model) removes that. None: identity.
    """
    if train_passages is None:
        return keras.layers.Identity(name="standardize")
    layer = keras.layers.Normalization(axis=-1, name="standardize")
    layer.adapt(np.asarray(train_passages, np.float32).reshape(-1, dim))
    return layer


def build_qs3m(dim: int, nn1_units: Sequence[int] = (64,), nn2_units: Sequence[int] = (32,), use_query: bool = True,
               train_passages: np.ndarray | None = None):
    """QS3M: z = [p1'-q', p2'-q', p1'-p2', p1', p2'] with x' = NN1(x); NN2(z) = P(same cluster).

    With `use_query=False` this is QS3M-no-q: the same network with the query terms left out,
    z = [p1'-p2', p1', p2'].
    """
    standardize, nn1 = standardizer(train_passages, dim), dense_stack(nn1_units, "nn1")
    passage1 = keras.Input((dim,), name="passage1")
    passage2 = keras.Input((dim,), name="passage2")
    p1, p2 = nn1(standardize(passage1)), nn1(standardize(passage2))
    parts = [keras.layers.Subtract(name="p1_minus_p2")([p1, p2]), p1, p2]
    inputs = {"passage1": passage1, "passage2": passage2}
    if use_query:
        query = keras.Input((dim,), name="query")
        q = nn1(standardize(query))
        parts = [keras.layers.Subtract(name="p1_minus_q")([p1, q]),
                 keras.layers.Subtract(name="p2_minus_q")([p2, q]), *parts]
        inputs = {"query": query, **inputs}
    z = keras.layers.Concatenate(name="z")(parts)
    return keras.Model(inputs, same_cluster_head(nn2_units)(z), name="qs3m" if use_query else "qs3m_noq")


def build_qss(dim: int, nn1_units: Sequence[int] = (64,), train_passages: np.ndarray | None = None):
    """QSS: passages scaled elementwise by s(q) in (0, 1)^d, compared by cosine, calibrated to a probability.

    The calibration is kept increasing in the cosine (non-negative weight, started at 1): left
    free, training on mean word vectors settled on a negative weight, i.e. a constant prediction.
    """
    standardize = standardizer(train_passages, dim)
    query = keras.Input((dim,), name="query")
    passage1 = keras.Input((dim,), name="passage1")
    passage2 = keras.Input((dim,), name="passage2")
    scale = keras.layers.Dense(dim, activation="sigmoid", name="query_scale")(
        dense_stack(nn1_units, "nn1")(standardize(query)))
    scaled1 = keras.layers.Multiply(name="scaled_p1")([standardize(passage1), scale])
    scaled2 = keras.layers.Multiply(name="scaled_p2")([standardize(passage2), scale])
    cosine = keras.layers.Dot(axes=1, normalize=True, name="cosine")([scaled1, scaled2])
    probability = keras.layers.Dense(1, activation="sigmoid", kernel_initializer="ones",
                                     kernel_constraint=keras.constraints.NonNeg(), name="calibrate")(cosine)
    return keras.Model({"query": query, "passage1": passage1, "passage2": passage2}, probability, name="qss")


def build_model(kind: str, dim: int, nn1_units: Sequence[int], nn2_units: Sequence[int], learning_rate: float,
                train_passages: np.ndarray | None = None):
    """One compiled model of `kind` with the MSE loss; inputs standardised on `train_passages` if given."""
    if kind == "qs3m":
        model = build_qs3m(dim, nn1_units, nn2_units, use_query=True, train_passages=train_passages)
    elif kind == "qs3m-noq":
        model = build_qs3m(dim, nn1_units, nn2_units, use_query=False, train_passages=train_passages)
    elif kind == "qss":
        model = build_qss(dim, nn1_units, train_passages=train_passages)
    else:
        raise ValueError(f"--models: unknown model kind {kind!r}; expected some of {MODEL_KINDS}")
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=LOSS,
                  metrics=[keras.metrics.BinaryAccuracy(name="accuracy")])
    return model


def similarity_matrix(model, kind: str, passages: np.ndarray, query: np.ndarray, chunk: int = 16384) -> np.ndarray:
    """Predicted same-cluster probability for every passage pair of one query, made symmetric.

    QS3M's z is not symmetric in (p1, p2), so both orders are scored and averaged; the diagonal
    is 1. The model is called eagerly in chunks: `predict` would retrace for every query size.
    """
    count = len(passages)
    first, second = (grid.ravel() for grid in np.meshgrid(np.arange(count), np.arange(count), indexing="ij"))
    scores = np.empty(count * count, np.float32)
    for start in range(0, count * count, chunk):
        rows = slice(start, start + chunk)
        features = {"query": np.repeat(query[None, :], len(first[rows]), axis=0),
                    "passage1": passages[first[rows]], "passage2": passages[second[rows]]}
        inputs = {name: features[name] for name in model_inputs(kind)}
        scores[rows] = np.asarray(model(inputs, training=False)).reshape(-1)
    scores = scores.reshape(count, count)
    scores = (scores + scores.T) / 2.0
    np.fill_diagonal(scores, 1.0)
    return scores


def model_name(kind: str, query_representation: str) -> str:
    return kind if kind == "qs3m-noq" else f"{kind}-{query_representation}"


def save_model(model, path: str) -> None:
    """Keras writes a local .keras file; Beam FileSystems copies it to `path` (local or gs://)."""
    with tempfile.TemporaryDirectory() as scratch:
        local = os.path.join(scratch, "model.keras")
        model.save(local)
        with open(local, "rb") as handle:
            write_bytes(path, handle.read())


def load_model(path: str):
    """Inverse of `save_model`."""
    with tempfile.TemporaryDirectory() as scratch:
        local = os.path.join(scratch, "model.keras")
        with open(local, "wb") as handle:
            handle.write(read_bytes(path))
        return keras.models.load_model(local)


# ---------------------------------------------------------------- training

@dataclasses.dataclass
class TrainConfig:
    """Every flag of `python -m model.qs3m` (flag = field name with dashes; lists comma-separated)."""

    passages: str                           # passages files, e.g. 'OUT/passages/*.jsonl.gz' (local or gs://)
    output: str                             # model dir (local or gs://)
    encoder: str = "mean-vectors"           # an model.encoders spec; fixed, never fine-tuned
    models: tuple[str, ...] = MODEL_KINDS   # any of qs3m, qss, qs3m-noq
    queries: tuple[str, ...] = ("T", "D", "P")  # title, lead paragraphs, mean of passages
    labeling: str = "flat"                  # clusters the pairs are labelled by: flat | hierarchical
    nn1_units: tuple[int, ...] = (64,)
    nn2_units: tuple[int, ...] = (32,)
    epochs: int = 10
    batch_size: int = 64
    learning_rate: float = 1e-3
    max_pairs_per_query: int = 200          # per article, half same-section, half different-section
    patience: int = 3                       # early stopping on validation MSE
    seed: int = 0

    def __post_init__(self):
        unknown = [kind for kind in self.models if kind not in MODEL_KINDS]
        if unknown or not self.models:
            raise ValueError(f"--models: expected some of {MODEL_KINDS}, got {self.models}")
        unknown = [rep for rep in self.queries if rep not in QUERY_REPRESENTATIONS]
        if unknown or not self.queries:
            raise ValueError(f"--queries: expected some of T, D, P, got {self.queries}")
        if self.labeling not in LABELINGS:
            raise ValueError(f"--labeling must be one of {LABELINGS}, got {self.labeling!r}")
        for name in ("epochs", "batch_size", "max_pairs_per_query", "patience"):
            if getattr(self, name) < (2 if name == "max_pairs_per_query" else 1):
                raise ValueError(f"--{name.replace('_', '-')} is too small: {getattr(self, name)}")


def train(config: TrainConfig, encoder: SentenceEncoder) -> dict[str, Any]:
    """Trains every requested model on train-split pairs (validation split for early stopping).

    Returns and writes `config.json`; models go to `<output>/<name>.keras`.
    """
    queries, dead_letters = read_queries(config.passages)
    by_split = {split: [query for query in queries if query.split == split] for split in ("train", "validation")}
    if not by_split["train"]:
        raise ValueError(f"--passages {config.passages!r} has no train-split article to train on")
    embeddings = {split: embed_queries(chosen, encoder) for split, chosen in by_split.items() if chosen}
    pairs = {split: sample_pairs([query.labels(config.labeling) for query in chosen], config.seed + offset,
                                 config.max_pairs_per_query)
             for offset, (split, chosen) in enumerate(by_split.items()) if chosen}
    if not pairs["train"]:
        raise ValueError("no train-split article has two clusters to sample balanced pairs from")
    dim = embeddings["train"].passages.shape[1]
    # QS3M-no-q ignores the query, so it is trained once whatever --queries lists.
    plan = {model_name(kind, rep): (kind, rep) for kind in config.models for rep in config.queries}
    histories: dict[str, dict[str, list[float]]] = {}
    trained: dict[str, dict[str, Any]] = {}
    for number, (name, (kind, representation)) in enumerate(plan.items(), start=1):
        print(f"[qs3m] model {number}/{len(plan)}: {name} on {len(pairs['train'])} train pairs", file=sys.stderr)
        keras.utils.set_random_seed(config.seed)  # each model's start depends only on the seed
        model = build_model(kind, dim, config.nn1_units, config.nn2_units, config.learning_rate,
                            train_passages=embeddings["train"].passages)
        train_data = pair_dataset(pairs["train"], embeddings["train"], representation, kind,
                                  config.batch_size, shuffle_seed=config.seed)
        validation_data, callbacks = None, []
        if pairs.get("validation"):
            validation_data = pair_dataset(pairs["validation"], embeddings["validation"], representation, kind,
                                           config.batch_size)
            callbacks = [keras.callbacks.EarlyStopping(patience=config.patience, restore_best_weights=True)]
        history = model.fit(train_data, validation_data=validation_data, epochs=config.epochs,
                            callbacks=callbacks, verbose=1)
        histories[name] = {key: [float(v) for v in values] for key, values in history.history.items()}
        save_model(model, f"{config.output.rstrip('/')}/{name}.keras")
        trained[name] = {"kind": kind, "query": None if kind == "qs3m-noq" else representation,
                         "path": f"{name}.keras"}
    summary = {
        "config": dataclasses.asdict(config),
        "encoder_name": getattr(encoder, "name", type(encoder).__name__),
        "embedding_dim": int(dim),
        "models": trained,
        "counts": {
            "articles": len(queries),
            "dead_letters": len(dead_letters),
            **{f"articles_{split}": len(chosen) for split, chosen in by_split.items()},
            **{f"pairs_{split}": len(chosen) for split, chosen in pairs.items()},
            **{f"positive_pairs_{split}": int(sum(pair.same_cluster for pair in chosen)) for split, chosen in pairs.items()},
            "lead_missing_train": embeddings["train"].lead_missing,
        },
        "history": histories,
        "dead_letters": dead_letters,
    }
    write_bytes(f"{config.output.rstrip('/')}/config.json", json.dumps(summary, indent=2).encode())
    write_bytes(f"{config.output.rstrip('/')}/training.png", training_plot(histories))
    return summary


def training_plot(histories: dict[str, dict[str, list[float]]]) -> bytes:
    """PNG of train / validation MSE per epoch for each model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for index, (name, history) in enumerate(histories.items()):
        color = f"C{index % 10}"
        axis.plot(range(1, len(history["loss"]) + 1), history["loss"], color=color, label=f"{name} train")
        if "val_loss" in history:
            axis.plot(range(1, len(history["val_loss"]) + 1), history["val_loss"], color=color, linestyle="--",
                      label=f"{name} validation")
    axis.set_xlabel("epoch")
    axis.set_ylabel("MSE loss")
    axis.set_title("QS3M training")
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    return buffer.getvalue()


# ---------------------------------------------------------------- entry point

def parser_for(config_type: type, description: str) -> argparse.ArgumentParser:
    """One flag per config field (`--field-name`); fields without a default are required strings,
    tuples are comma-separated lists of their default's item type."""
    parser = argparse.ArgumentParser(description=description)
    for field in dataclasses.fields(config_type):
        default = field.default
        flag = "--" + field.name.replace("_", "-")
        if default is dataclasses.MISSING:
            parser.add_argument(flag, required=True)
        elif isinstance(default, tuple):
            item_type = type(default[0]) if default else str
            parser.add_argument(flag, default=default,
                                type=lambda text, item_type=item_type: tuple(item_type(v) for v in text.split(",") if v))
        else:
            parser.add_argument(flag, default=default, type=type(default))
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    config = TrainConfig(**vars(parser_for(TrainConfig, __doc__.splitlines()[0]).parse_args(argv)))
    from model.encoders import load_encoders

    (encoder,) = load_encoders([config.encoder])
    summary = train(config, encoder)
    print(json.dumps(summary["counts"], indent=2))
    return summary


if __name__ == "__main__":
    sys.exit(run_cli(main))
