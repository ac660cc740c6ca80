"""TrainConfig: every knob of `python -m model.train`; the CLI flags mirror it one to one."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from pipeline.records import TRIPLET_DATASETS

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
VOCABULARIES = ("embeddings", "train")


@dataclass(frozen=True)
class TrainConfig:
    data: str                              # pipeline output folder, local or gs://
    model_dir: str                         # checkpoints, logs, history, plots, encoder/
    dataset: str = "triplets-sen"
    embeddings: str | None = None          # GloVe text file (local/gs://); None = embedded GloVe 6B 50d
    fine_tune_embeddings: bool = False
    epochs: int = 4                        # after each: validation, checkpoint, a learning-curve point
    steps: int | None = 50                 # steps per epoch, the data repeated; None = one pass per epoch.
                                           # 4 x 50 steps x 128 triplets: two passes over the demo's 12 k
    batch_size: int = 128                  # per replica; global batch = batch_size x replicas
    learning_rate: float = 1e-3
    article_chunk: int = 16                # triplets of one article kept together in a batch, their shared
                                           # sentences encoded once; 0 = triplets shuffled one by one
    group_by_length: bool = True           # with --article-chunk 0: batches of similar-length triplets
    vocabulary: str = "embeddings"         # "embeddings": every word with a vector; "train": training words
    jit_compile: bool = False              # XLA for the training step
    budget_minutes: float | None = None    # wall-clock training budget; stops after the current step
    evaluation_triplets: int | None = None  # validation/test triplets scored per epoch and at the end; None = all
    max_lost_fraction: float = 0.001      # fail when more of a split's records are lost or unparseable
    overwrite: bool = False                # start over: delete what --model-dir holds from an earlier run
    lstm_units: int = 300
    attention_size: int = 200
    dropout: float = 0.2                   # a rate (fraction dropped) on the BiLSTM outputs
    max_tokens: int = 64
    num_oov_buckets: int = 1
    min_count: int = 1                     # --vocabulary train: training-split words seen this often
    shuffle_buffer: int = 10000
    patience: int = 2                      # early stopping on validation triplet accuracy
    checkpoint_every: int = 50             # steps between BackupAndRestore backups
    strategy: str = "auto"
    seed: int = 0
    progress: bool = True                  # Keras progress bar

    def __post_init__(self):
        if self.dataset not in TRIPLET_DATASETS:
            raise ValueError(f"--dataset must be one of {TRIPLET_DATASETS}, got {self.dataset!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"--strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout is a rate in [0, 1), got {self.dropout}")
        for name in ("epochs", "batch_size", "lstm_units", "attention_size", "max_tokens",
                     "num_oov_buckets", "min_count", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.article_chunk < 0:
            raise ValueError(f"--article-chunk must be >= 0, got {self.article_chunk}")
        for name in ("steps", "evaluation_triplets"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1 or none, got {getattr(self, name)}")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise ValueError(f"--budget-minutes must be > 0 or none, got {self.budget_minutes}")
        if not 0.0 <= self.max_lost_fraction <= 1.0:
            raise ValueError(f"--max-lost-fraction is a fraction in [0, 1], got {self.max_lost_fraction}")
        if self.vocabulary not in VOCABULARIES:
            raise ValueError(f"--vocabulary must be one of {VOCABULARIES}, got {self.vocabulary!r}")


def _flag_type(field: dataclasses.Field):
    """int/float/str from the annotation; an optional field also takes `none`."""
    kind = str(field.type)
    parse = int if kind.startswith("int") else float if kind.startswith("float") else str
    if kind.endswith("| None"):
        return lambda text: None if text.lower() == "none" else parse(text)
    return parse


def _parse_bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """One flag per TrainConfig field (`model_dir` -> `--model-dir`); booleans take true/false."""
    parser = argparse.ArgumentParser(prog="python -m model.train", description=__doc__)
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        required = field.default is dataclasses.MISSING
        if field.type == "bool":
            parser.add_argument(flag, type=_parse_bool, default=field.default, metavar="true|false")
        else:
            parser.add_argument(flag, type=_flag_type(field), required=required,
                                default=None if required else field.default)
    try:
        return TrainConfig(**vars(parser.parse_args(argv)))
    except ValueError as error:   # a value the config refuses: argparse's one-line error, exit 2
        parser.error(str(error))
