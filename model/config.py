"""TrainConfig: every knob of `python -m model.train`, one CLI flag per field (`core.cli.
parse_config`: `model_dir` -> `--model-dir`, booleans take true/false), grouped by concern:

* `inputs` (InputConfig): what is read and how it becomes batches: the pipeline output and
  dataset, the word vectors and the vocabulary (id space) built from them, tokens per sentence,
  batching and shuffling of the training stream, the evaluation sample, the records a split may lose;
* `network` (NetworkConfig): the Net and the triplet head: encoder, distance, sizes, dropout, and
  which of its weights are trained (word vectors, frozen transformer layers);
* `optimizer` (OptimizerConfig): how the weights are fitted: batch, learning rate and its
  schedule, weight decay, epochs, steps per epoch, early stopping;
* `runtime` (RuntimeConfig): where and how the run executes: the model dir (and `--overwrite`),
  distribution strategy, XLA and static shapes, the precision, the time budget, backups, the serving export,
  the seed, the progress bar.

The flags stay one flat namespace (a field's name is unique across the groups):
`TrainConfig.from_flags(data=..., model_dir=..., epochs=1)` builds a config from them,
`config.flags()` reads them back flat (the model dir's history "config" and its recorded inputs hold that form),
`config.with_flags(epochs=2)` is `dataclasses.replace` by flag."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from core.cli import config_flags, config_from_flags, flag, parse_config
from core.records import PAPER_DATASET, TRIPLET_DATASETS
from model.checkpoints import CHECKPOINTS
from model.similarity import Similarity

DISTRIBUTION_STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu", "data-parallel")
# `--backend`: the Keras backend the trainer runs under (KERAS_BACKEND, set before Keras loads).
BACKENDS = ("tensorflow", "jax")
# The strategies of each backend: tf.distribute's, and keras.distribution's DataParallel.
BACKEND_STRATEGIES = {"tensorflow": ("auto", "one_device", "mirrored", "multi_worker", "tpu"),
                      "jax": ("auto", "one_device", "data-parallel")}
VOCABULARIES = ("embeddings", "train")
# `--precision`: float32, or bfloat16 (Keras' mixed_bfloat16 policy, `model.net.network.DTYPE_POLICIES`).
PRECISIONS = ("float32", "bfloat16")


class NetworkKind(StrEnum):
    """`--encoder`, the kind of Net: the paper's BiLSTM over word vectors, or a pre-trained
    transformer checkpoint fine-tuned; what differs between them in training, export and plots
    is read from here (`model.net.network.build_net` builds either). Saved configs (a model dir's
    history and inputs) keep the flag's string, `NetworkKind(config["encoder"])` reads it back."""

    BILSTM = "bilstm"
    MINILM = "minilm"   # all-MiniLM-L6-v2
    MPNET = "mpnet"     # all-mpnet-base-v2 (model.checkpoints)

    @property
    def pretrained(self) -> bool:
        """A pre-trained checkpoint: before training it is the checkpoint off the shelf."""
        return self is not NetworkKind.BILSTM

    @property
    def reads_word_vectors(self) -> bool:
        """Reads word vectors (`--embeddings`, a vocabulary built from them), not a checkpoint's wordpieces."""
        return not self.pretrained

    @property
    def weight_decay(self) -> bool:
        """Fitted with AdamW's weight decay (`--weight-decay`), as transformers are fine-tuned; else plain Adam."""
        return self.pretrained

    @property
    def exports_sentence_transformers(self) -> bool:
        """The trainer also writes its weights for sentence-transformers (`model.formats.hf`), which has no BiLSTM."""
        return self.pretrained

    @property
    def defaults(self) -> dict[str, Any]:
        """The flags left at `none`: the paper's recipe for the BiLSTM; for the transformer, a
        fine-tuning learning rate, the cosine distance its checkpoint was trained with
        (docs/transformer.md compares the two distances) and its checkpoint's own dropout (None)."""
        if self is NetworkKind.BILSTM:
            return {"learning_rate": 1e-3, "distance": Similarity.L1, "dropout": 0.2}
        return {"learning_rate": 5e-5, "distance": Similarity.COSINE, "dropout": None}

    def label(self, lstm_units: int) -> str:
        """The Net's name in plot titles: `BiLSTM 300` (its units per direction), or the checkpoint's name."""
        return f"BiLSTM {lstm_units}" if self is NetworkKind.BILSTM else self.value


# The `--encoder` values, as its error message names them.
ENCODERS = tuple(kind.value for kind in NetworkKind)
DISTANCES = tuple(similarity.value for similarity in Similarity)
# `--loss`: the paper's triplet loss, the in-batch loss, or their sum (`model.net.network.LOSSES`).
LOSS_NAMES = ("triplet", "in-batch", "sum")


def _check_at_least_one(config: object, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(config, name)}")


def _check_at_least_one_or_none(config: object, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(config, name) is not None and getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1 or none, got {getattr(config, name)}")


@dataclass(frozen=True, kw_only=True)
class InputConfig:
    data: str = flag(help="pipeline output folder (holds manifest.json), local or gs://")
    dataset: str = flag(PAPER_DATASET, help=f"triplet dataset to train on: one of {', '.join(TRIPLET_DATASETS)}")
    embeddings: str | None = flag(None, help="GloVe-format text file of word vectors (local or gs://); "
                                             "none = the embedded GloVe 6B 50d")
    vocabulary: str = flag("embeddings", help="embeddings: every word of the vector file; train: words of the "
                                              "training split only")
    min_count: int = flag(1, help="--vocabulary train: keep words seen this often in training")
    num_oov_buckets: int = flag(1, help="hash buckets for words without a vector")
    max_tokens: int = flag(64, help="tokens kept per sentence")
    article_chunk: int = flag(16, help="triplets of one article kept together in a batch, their shared sentences "
                                       "encoded once; 0 = triplets shuffled one by one")
    group_by_length: bool = flag(True, help="with --article-chunk 0: batches of similar-length triplets")
    shuffle_buffer: int = flag(0, help="training triplets in a shuffle buffer (in --article-chunk blocks); 0: none, "
                                       "the order the pipeline wrote the split in is the shuffle")
    evaluation_triplets: int | None = flag(None, help="seeded sample of validation/test triplets scored per "
                                                      "epoch and at the end; none = all")
    max_lost_fraction: float = flag(0.001, help="fail the run before export when more of a split's records "
                                                "are lost or unparseable")
    input_workers: int = flag(0, help="processes that tokenise and batch the training stream (the same batches "
                                      "in the same order); 0 = in the trainer's input thread")

    def __post_init__(self) -> None:
        if self.dataset not in TRIPLET_DATASETS:
            raise ValueError(f"--dataset must be one of {TRIPLET_DATASETS}, got {self.dataset!r}")
        if self.vocabulary not in VOCABULARIES:
            raise ValueError(f"--vocabulary must be one of {VOCABULARIES}, got {self.vocabulary!r}")
        _check_at_least_one(self, ("min_count", "num_oov_buckets", "max_tokens"))
        if self.article_chunk < 0:
            raise ValueError(f"--article-chunk must be >= 0, got {self.article_chunk}")
        if self.input_workers < 0:
            raise ValueError(f"--input-workers must be >= 0, got {self.input_workers}")
        _check_at_least_one_or_none(self, ("evaluation_triplets",))
        if not 0.0 <= self.max_lost_fraction <= 1.0:
            raise ValueError(f"--max-lost-fraction is a fraction in [0, 1], got {self.max_lost_fraction}")


@dataclass(frozen=True, kw_only=True)
class NetworkConfig:
    encoder: str = flag("bilstm", help="Net: bilstm (the paper's, over word vectors), minilm (all-MiniLM-L6-v2 "
                                       "fine-tuned) or mpnet (all-mpnet-base-v2 fine-tuned); for the two "
                                       "checkpoints --embeddings, --vocabulary and the BiLSTM sizes do not apply")
    checkpoint: str | None = flag(None, help="--encoder minilm or mpnet: the checkpoint's sentence-transformers "
                                             "folder; none = the installed one (make setup; make mpnet-checkpoint)")
    distance: str | None = flag(None, help="triplet head distance: l1 (the paper's) or cosine; none = the "
                                           "encoder's default (bilstm l1, minilm cosine)")
    lstm_units: int = flag(300, help="BiLSTM units per direction (the paper: 300)")
    attention_size: int = flag(200, help="attention layer size (the paper: 200)")
    dropout: float | None = flag(None, help="dropout rate (fraction dropped): on the BiLSTM outputs, or in the "
                                            "transformer; none = the encoder's default (bilstm 0.2, minilm its "
                                            "checkpoint's)")
    fine_tune_embeddings: bool = flag(False, help="train the word vectors too (the paper keeps them frozen)")
    frozen_layers: int = flag(0, help="--encoder minilm or mpnet: the embeddings and this many lowest transformer "
                                      "layers are not trained (0 = all are)")
    transformer_layers: int | None = flag(None, help="--encoder minilm or mpnet: keep only the checkpoint's "
                                                     "lowest N of its transformer layers (minilm 6, mpnet 12), a "
                                                     "smaller and faster Net (a distilled student's); none = all")

    def __post_init__(self) -> None:
        if self.encoder not in ENCODERS:
            raise ValueError(f"--encoder must be one of {ENCODERS}, got {self.encoder!r}")
        if self.distance is not None and self.distance not in DISTANCES:
            raise ValueError(f"--distance must be one of {DISTANCES} or none, got {self.distance!r}")
        _check_at_least_one(self, ("lstm_units", "attention_size"))
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout is a rate in [0, 1), got {self.dropout}")
        if self.frozen_layers < 0:
            raise ValueError(f"--frozen-layers must be >= 0, got {self.frozen_layers}")
        if self.checkpoint is not None and not self.kind.pretrained:
            raise ValueError(f"--checkpoint is a transformer checkpoint's folder: --encoder {self.encoder} reads none")
        if self.transformer_layers is not None and self.kind.pretrained:
            layers = CHECKPOINTS[self.encoder].layers
            if not 1 <= self.transformer_layers <= layers:
                raise ValueError(f"--transformer-layers must be in 1..{layers} for --encoder {self.encoder} or none, "
                                 f"got {self.transformer_layers}")

    @property
    def kind(self) -> NetworkKind:
        """`encoder` as its NetworkKind."""
        return NetworkKind(self.encoder)


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    batch_size: int = flag(128, help="triplets per replica per step; global batch = batch size x replicas")
    gradient_accumulation_steps: int = flag(1, help="parts each step's batch is fed in: Keras' optimizer averages "
                                                    "their gradients into the one update (its gradient_accumulation_"
                                                    "steps), the same step in about 1/N of the activation memory; "
                                                    "--batch-size a multiple of N, --loss triplet (in-batch "
                                                    "negatives would be a part's)")
    learning_rate: float | None = flag(None, help="peak learning rate; none = the encoder's default (bilstm: Adam "
                                                  "1e-3, the paper's; minilm: AdamW 5e-5)")
    warmup_triplets: int = flag(0, help="training triplets over which the learning rate rises linearly from 0")
    learning_rate_half_life: int | None = flag(None, help="training triplets over which the learning rate "
                                                         "halves (exponential decay); none = constant")
    weight_decay: float = flag(0.01, help="--encoder minilm: AdamW weight decay (not on biases and layer norms)")
    loss: str = flag("triplet", help="triplet (the paper's), in-batch (each anchor against every distinct sentence "
                                     "of its batch but its own section's: InfoNCE with the triplet's negative "
                                     "among them) or sum (both)")
    teacher: str | None = flag(None, help="a trained model dir (or any strings-in encoder export): train the "
                                          "--encoder to reproduce its embeddings of the batches' sentences (cosine "
                                          "distance) instead of the --loss; the head's distance is then cosine")
    epochs: int = flag(4, help="epochs; after each: validation, best checkpoint, a learning-curve point")
    steps: int | None = flag(50, help="steps per epoch over the repeated training stream; none = one pass per "
                                      "epoch (the demo's 4 x 50 steps x 128 triplets: two passes over 12 k)")
    patience: int = flag(2, help="early stopping: epochs without a better validation accuracy")

    def __post_init__(self) -> None:
        _check_at_least_one(self, ("epochs", "batch_size", "gradient_accumulation_steps"))
        _check_at_least_one_or_none(self, ("steps", "learning_rate_half_life"))
        if self.batch_size % self.gradient_accumulation_steps:
            raise ValueError(f"--batch-size {self.batch_size} is not a multiple of --gradient-accumulation-steps "
                             f"{self.gradient_accumulation_steps}")
        if self.loss not in LOSS_NAMES:
            raise ValueError(f"--loss must be one of {', '.join(LOSS_NAMES)}, got {self.loss!r}")
        if self.gradient_accumulation_steps > 1 and self.loss != LOSS_NAMES[0]:
            raise ValueError(f"--loss {self.loss} scores each anchor against its batch: with "
                             "--gradient-accumulation-steps it would be against a part's; use --loss triplet")
        if self.warmup_triplets < 0 or self.weight_decay < 0:
            raise ValueError("--warmup-triplets and --weight-decay must be >= 0")
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise ValueError(f"--learning-rate must be > 0 or none, got {self.learning_rate}")

    @property
    def part_size(self) -> int:
        """Triplets per replica in each part of a step's batch (`--gradient-accumulation-steps`):
        what the training stream batches and one forward and backward pass holds."""
        return self.batch_size // self.gradient_accumulation_steps


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    model_dir: str = flag(help="where vocabulary, backups, checkpoints, logs, history, plots and the encoder go")
    overwrite: bool = flag(False, help="start over: delete what --model-dir holds from an earlier run")
    backend: str = flag("tensorflow", help="Keras backend: tensorflow, or jax (Keras `fit` under JAX; a "
                                           "transformer's shards read as NumPy arrays, without TensorFlow)")
    distribution_strategy: str = flag("auto", help="with --backend tensorflow, a tf.distribute strategy: auto, "
                                                   "one_device, mirrored, multi_worker, tpu; with --backend jax: "
                                                   "auto or one_device (one device), data-parallel "
                                                   "(keras.distribution.DataParallel over every local device)")
    jit_compile: bool = flag(False, help="XLA for the training step (slower on CPU)")
    static_shapes: bool = flag(False, help="every batch of a few fixed shapes (token widths bucketed, distinct "
                                           "sentences and triplets padded to fixed counts, one Net call): the "
                                           "XLA-compiled step a TPU needs; implies --jit-compile true")
    budget_minutes: float | None = flag(None, help="wall-clock training budget; stops after the current step, "
                                                   "still validates that epoch")
    checkpoint_every: int = flag(50, help="steps between backups (and TensorBoard scalars)")
    serving_version: int | None = flag(None, help="also export the encoder to the model dir's numbered "
                                                  "version folder N, which TensorFlow Serving loads")
    precision: str = flag("float32", help="float32, or bfloat16: the Net computes in bfloat16 from float32 "
                                          "variables (Keras' mixed_bfloat16 policy), faster where the chip has "
                                          "bfloat16 units (GPUs, TPUs); the loss, metrics and exports stay float32")
    seed: int = flag(0, help="seed of initialisation, shuffling and the evaluation samples")
    progress: bool = flag(True, help="Keras progress bar (false: one line per epoch)")

    def __post_init__(self) -> None:
        if self.distribution_strategy not in DISTRIBUTION_STRATEGIES:
            raise ValueError(f"--distribution-strategy must be one of {DISTRIBUTION_STRATEGIES}, "
                             f"got {self.distribution_strategy!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.distribution_strategy not in BACKEND_STRATEGIES[self.backend]:
            raise ValueError(f"--distribution-strategy {self.distribution_strategy} is not one of --backend "
                             f"{self.backend}'s: {', '.join(BACKEND_STRATEGIES[self.backend])}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.distribution_strategy == "tpu" and not self.static_shapes:
            raise ValueError("--distribution-strategy tpu needs --static-shapes true (a TPU compiles one "
                             "program per input shape)")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise ValueError(f"--budget-minutes must be > 0 or none, got {self.budget_minutes}")
        _check_at_least_one(self, ("checkpoint_every",))
        _check_at_least_one_or_none(self, ("serving_version",))

    @property
    def static_batches(self) -> bool:
        """Batches of a few fixed shapes (`--static-shapes`): asked for, or under JAX, which
        compiles every step and cannot cut a batch to a width that depends on its data."""
        return self.static_shapes or self.backend == "jax"


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    inputs: InputConfig
    network: NetworkConfig = NetworkConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    runtime: RuntimeConfig

    @classmethod
    def from_flags(cls, **values: Any) -> TrainConfig:
        """A TrainConfig from flag values by field name, whichever group holds the field."""
        return config_from_flags(cls, values)

    def flags(self) -> dict[str, Any]:
        """Every flag's value by field name, flat (what `from_flags` takes)."""
        return config_flags(self)

    def with_flags(self, **changes: Any) -> TrainConfig:
        """A copy with the given flags (by field name) changed."""
        return config_from_flags(TrainConfig, {**self.flags(), **changes})

    def __post_init__(self) -> None:
        if self.optimizer.teacher and self.optimizer.loss != LOSS_NAMES[0]:
            raise ValueError(f"--teacher trains on the teacher's embeddings: --loss {self.optimizer.loss} does not "
                             "apply")

    def default(self, name: str) -> Any:
        """The value the flag `name` takes when left at none: the encoder's default (with a
        teacher, the distance is cosine, the similarity distillation fits)."""
        if name == "distance" and self.optimizer.teacher:
            return Similarity.COSINE
        return self.network.kind.defaults[name]

    def resolved(self, name: str) -> Any:
        """A flag's value, or its `default` where it is left at none."""
        value = self.flags()[name]
        return self.default(name) if value is None else value


def vertex_model_dir() -> str | None:
    """The model dir a Vertex AI job gives the trainer: its base output directory, of which Vertex
    sets AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR to folders of it: the
    model dir's own VERTEX_MODEL (the encoder, exported there too), CHECKPOINTS and LOGS
    (`model.training.model_dir`). None outside Vertex AI."""
    model = os.environ.get("AIP_MODEL_DIR")
    return model.rstrip("/").rsplit("/", 1)[0] if model else None


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """TrainConfig from the command line (`--strategy`, its old name, still accepted); in a Vertex
    AI job `--model-dir` defaults to `vertex_model_dir()` (a `--model-dir` given still wins)."""
    argv = sys.argv[1:] if argv is None else argv
    model_dir = vertex_model_dir()
    if model_dir:
        argv = ["--model-dir", model_dir, *argv]
    return parse_config(TrainConfig, argv, "python -m model.train",
                        "Trains the triplet network and exports the sentence encoder.",
                        renamed={"strategy": "distribution_strategy"})
