"""`make scale`'s training recipes, defined once: the Makefile and the Vertex AI specs read them.

    python -m infra.recipe NAME [--budget-minutes M]    # the flags of `python -m model.train`, one line

The Makefile's scale variables are `$(shell $(PY) -m infra.recipe NAME ...)`; `infra.submit
train --recipe NAME` appends the same flags to a Vertex AI spec's arguments. No TensorFlow is
imported: the Makefile runs this once per training target.
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

from pipeline.cli import UsageError, flag, parse_config, run_cli
from pipeline.records import PAPER_DATASET, TITLES_DATASET

# No shuffle buffer: the pipeline writes each split in a fixed pseudo-random order of article
# chunks (`pipeline.order`), and the trainer streams it shard by shard, so memory and the time to
# the first step do not grow with the data. (When the shards held each article's triplets in
# page-id order, these recipes needed a buffer of the whole split, 1.1 M triplets and ~2 GB, and
# minutes to fill it.) Epochs are `--steps` long and end in a validation point; the wall-clock
# budget, not the epoch count, ends the run.
_SCALE = ("--shuffle-buffer", "0", "--epochs", "1000", "--patience", "1000")


@dataclass(frozen=True)
class Recipe:
    dataset: str
    flags: tuple[str, ...]
    budget_minutes: float

    def arguments(self, budget_minutes: float | None = None) -> list[str]:
        """The flags of `python -m model.train`, with the budget (this recipe's unless given)."""
        minutes = self.budget_minutes if budget_minutes is None else budget_minutes
        return [*self.flags, "--budget-minutes", f"{minutes:g}"]


RECIPES = {
    # The learning rate halves every 200 k triplets: at a constant 1e-3 validation accuracy
    # stopped rising after about 270 k triplets of the 2019 data.
    PAPER_DATASET: Recipe(PAPER_DATASET, (*_SCALE, "--evaluation-triplets", "5000", "--steps", "300",
                                            "--learning-rate-half-life", "200000"), 75),
    TITLES_DATASET: Recipe(TITLES_DATASET, (*_SCALE, "--evaluation-triplets", "5000", "--steps", "150"), 15),
    # The transformer: AdamW 5e-5 after a 16 k-triplet warmup, halving every 100 k triplets; batches of
    # 64 (more optimizer steps for the triplets a CPU budget affords); the embeddings and the two lowest
    # of six layers frozen, as in the run of docs/transformer.md (python -m model.benchmark --encoder
    # minilm measured no speed gain from freezing them: 48.5 vs 48.7 triplets/s).
    "minilm-sen": Recipe(PAPER_DATASET, (*_SCALE, "--evaluation-triplets", "2000", "--encoder", "minilm",
                                          "--frozen-layers", "2", "--batch-size", "64", "--steps", "250",
                                          "--warmup-triplets", "16000", "--learning-rate-half-life", "100000"), 85),
}


@dataclass(frozen=True)
class RecipeConfig:
    """Flags of `python -m infra.recipe`."""

    name: str = flag(help=f"the recipe: one of {', '.join(RECIPES)}")
    budget_minutes: float | None = flag(None, help="wall-clock training budget; none = the recipe's")

    def __post_init__(self):
        if self.name not in RECIPES:
            raise UsageError(f"--name must be one of {', '.join(RECIPES)}, got {self.name!r}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and not argv[0].startswith("-"):   # `python -m infra.recipe NAME ...`, the Makefile's spelling
        argv = ["--name", *argv]
    config = parse_config(RecipeConfig, argv, "python -m infra.recipe", __doc__.split("\n\n")[0])
    print(shlex.join(RECIPES[config.name].arguments(config.budget_minutes)))


if __name__ == "__main__":
    sys.exit(run_cli(main))
