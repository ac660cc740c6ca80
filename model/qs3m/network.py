"""QS3M's layers, loss and models (QS3M, QSS, QS3M-no-q), read top to bottom, and saving them."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

import numpy as np

from core.files import read_bytes, write_bytes

MODEL_KINDS = ("qs3m", "qss", "qs3m-noq")
MODEL_LABELS = {"qs3m": "QS3M", "qss": "QSS", "qs3m-noq": "QS3M-no-q"}


def model_inputs(kind: str) -> tuple[str, ...]:
    """Names of the inputs a model kind reads; QS3M-no-q never sees the query."""
    return ("passage1", "passage2") if kind == "qs3m-noq" else ("query", "passage1", "passage2")


# ---------------------------------------------------------------- layers, loss, models

LOSS = "mean_squared_error"  # the seed trains the same-cluster probability with MSE


def dense_stack(units: Sequence[int], name: str):
    """A small ReLU MLP; NN1 is one such stack shared by the query and both passages."""
    import keras

    return keras.Sequential([keras.layers.Dense(size, activation="relu") for size in units], name=name)


def same_cluster_head(units: Sequence[int], name: str = "nn2"):
    """NN2: an MLP ending in one sigmoid unit, the same-cluster probability."""
    import keras

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
    import keras

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
    import keras

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
    import keras

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
    import keras

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
    matrix = scores.reshape(count, count)
    matrix = (matrix + matrix.T) / 2.0
    np.fill_diagonal(matrix, 1.0)
    return matrix


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
    import keras

    with tempfile.TemporaryDirectory() as scratch:
        local = os.path.join(scratch, "model.keras")
        with open(local, "wb") as handle:
            handle.write(read_bytes(path))
        return keras.models.load_model(local)
