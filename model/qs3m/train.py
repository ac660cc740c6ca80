"""Trains the QS3M models on train-split pairs: `python -m model.qs3m` (or `model.qs3m.train`).

    python -m model.qs3m --passages OUT|'GLOB' --output MODEL_DIR [--encoder mean-vectors] \
        [--models qs3m,qss,qs3m-noq] [--queries T,D,P] [--epochs 10] [--max-train-queries N]

The model dir (local or gs://) receives one `<kind>-<query>.keras` per trained model,
`config.json` (the config, encoder spec, pair counts and training history) and `training.png`.
"""
from __future__ import annotations

import dataclasses
import io
import json
import sys
from typing import Any

from core.cli import flag, parse_config, run_cli
from core.files import write_bytes
from core.folders import reading_if_run
from model import require_tensorflow_keras
from model.encoding.encoder import SentenceEncoder
from model.encoding.encoders import EncoderSpec, load_encoders
from model.qs3m.data import QUERY_REPRESENTATIONS, QueryEmbeddings, embed_queries, pair_dataset, read_queries
from model.qs3m.network import MODEL_KINDS, build_model, model_name, save_model
from model.qs3m.pairs import LABELINGS, Pair, sample_pairs

# ---------------------------------------------------------------- training

@dataclasses.dataclass(frozen=True)
class Qs3mConfig:
    """Every flag of `python -m model.qs3m`."""

    passages: str = flag(help="a pipeline run folder (its manifest lists passages/) or a glob of passages files, "
                              "local or gs://")
    output: str = flag(help="model dir for the .keras models, config.json and training.png (local or gs://)")
    encoder: str = flag("mean-vectors", help="the fixed passage encoder (a model.encoding.encoders spec; "
                                                                "never fine-tuned)")
    models: tuple[str, ...] = flag(MODEL_KINDS, help="models to train: any of qs3m, qss, qs3m-noq")
    queries: tuple[str, ...] = flag(("T", "D", "P"), help="query representations: T title, D lead paragraphs, "
                                                          "P mean of passages")
    labeling: str = flag("flat", help="clusters the pairs are labelled by: flat (sections) or hierarchical")
    nn1_units: tuple[int, ...] = flag((64,), help="units of the passage projection layers")
    nn2_units: tuple[int, ...] = flag((32,), help="units of the same-cluster head's hidden layers")
    epochs: int = flag(10, help="training epochs per model (early stopping on validation MSE)")
    batch_size: int = flag(64, help="pairs per batch")
    learning_rate: float = flag(1e-3, help="Adam learning rate")
    max_pairs_per_query: int = flag(200, help="pairs per article, half same-section, half different-section")
    patience: int = flag(3, help="early stopping: epochs without a better validation MSE")
    max_train_queries: int | None = flag(None, help="train on a seeded sample of this many train-split articles; "
                                                    "none = all")
    max_validation_queries: int | None = flag(None, help="early-stop on a seeded sample of this many validation "
                                                         "articles; none = all")
    seed: int = flag(0, help="seed of the pair sample, the article samples and each model's initialisation")

    def __post_init__(self):
        unknown = [kind for kind in self.models if kind not in MODEL_KINDS]
        if unknown or not self.models:
            raise ValueError(f"--models: expected some of {MODEL_KINDS}, got {self.models}")
        unknown = [rep for rep in self.queries if rep not in QUERY_REPRESENTATIONS]
        if unknown or not self.queries:
            raise ValueError(f"--queries: expected some of T, D, P, got {self.queries}")
        if self.labeling not in LABELINGS:
            raise ValueError(f"--labeling must be one of {LABELINGS}, got {self.labeling!r}")
        for name in ("max_train_queries", "max_validation_queries"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1 or none, got {getattr(self, name)}")
        for name in ("epochs", "batch_size", "max_pairs_per_query", "patience"):
            if getattr(self, name) < (2 if name == "max_pairs_per_query" else 1):
                raise ValueError(f"--{name.replace('_', '-')} is too small: {getattr(self, name)}")


def train(config: Qs3mConfig, encoder: SentenceEncoder) -> dict[str, Any]:
    """Trains every requested model on train-split pairs (validation split for early stopping).

    Returns and writes `config.json`; models go to `<output>/<name>.keras`.
    """
    by_split, dead_letters = {}, []
    for split, limit in (("train", config.max_train_queries), ("validation", config.max_validation_queries)):
        by_split[split], dead = read_queries(config.passages, (split,), limit, config.seed)
        dead_letters += dead if split == "train" else []   # each read sees every line: count bad ones once
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
        model, histories[name] = _fit_model(config, kind, representation, pairs, embeddings)
        save_model(model, f"{config.output.rstrip('/')}/{name}.keras")
        trained[name] = {"kind": kind, "query": None if kind == "qs3m-noq" else representation,
                         "path": f"{name}.keras"}
    summary = {
        "config": dataclasses.asdict(config),
        "encoder_name": getattr(encoder, "name", type(encoder).__name__),
        "embedding_dim": int(dim),
        "models": trained,
        "counts": {
            "dead_letters": len(dead_letters),
            **{f"articles_{split}": len(chosen) for split, chosen in by_split.items()},
            **{f"pairs_{split}": len(chosen) for split, chosen in pairs.items()},
            **{f"positive_pairs_{split}": int(sum(pair.same_cluster for pair in chosen))
               for split, chosen in pairs.items()},
            "lead_missing_train": embeddings["train"].lead_missing,
        },
        "history": histories,
        "dead_letters": dead_letters,
    }
    write_bytes(f"{config.output.rstrip('/')}/config.json", json.dumps(summary, indent=2).encode())
    write_bytes(f"{config.output.rstrip('/')}/training.png", training_plot(histories))
    return summary


def _fit_model(config: Qs3mConfig, kind: str, representation: str, pairs: dict[str, list[Pair]],
               embeddings: dict[str, QueryEmbeddings]) -> tuple[Any, dict[str, list[float]]]:
    """(one model trained on the train pairs, its history per epoch); with validation pairs, it
    stops early and keeps its best epoch."""
    import keras

    keras.utils.set_random_seed(config.seed)  # each model's start depends only on the seed
    model = build_model(kind, embeddings["train"].passages.shape[1], config.nn1_units, config.nn2_units,
                        config.learning_rate, train_passages=embeddings["train"].passages)
    train_data = pair_dataset(pairs["train"], embeddings["train"], representation, kind,
                              config.batch_size, shuffle_seed=config.seed)
    validation_data, callbacks = None, []
    if pairs.get("validation"):
        validation_data = pair_dataset(pairs["validation"], embeddings["validation"], representation, kind,
                                       config.batch_size)
        callbacks = [keras.callbacks.EarlyStopping(patience=config.patience, restore_best_weights=True)]
    history = model.fit(train_data, validation_data=validation_data, epochs=config.epochs,
                        callbacks=callbacks, verbose=1)
    return model, {key: [float(v) for v in values] for key, values in history.history.items()}


def training_plot(histories: dict[str, dict[str, list[float]]]) -> bytes:
    """PNG of `training_figure`."""
    figure = training_figure(histories)   # pyplot on the Agg backend from here
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    return buffer.getvalue()


def training_figure(histories: dict[str, dict[str, list[float]]]):
    """Train / validation MSE per epoch for each model."""
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
    return figure


# ---------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> dict[str, Any]:
    require_tensorflow_keras("model.qs3m")
    config = parse_config(Qs3mConfig, argv, "python -m model.qs3m", __doc__.splitlines()[0])
    (encoder,) = load_encoders([EncoderSpec.parse(config.encoder)])
    with reading_if_run(config.passages):
        summary = train(config, encoder)
    print(json.dumps(summary["counts"], indent=2))
    print(f"QS3M models, config.json and training.png in {config.output}")
    return summary


if __name__ == "__main__":
    sys.exit(run_cli(main))
