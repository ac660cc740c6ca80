"""`make scale`'s training recipes, defined once: the Makefile and the Vertex AI specs read them.

    python -m infra.recipe NAME [--machine cpu] [--budget-minutes M] [--models DIR]   # `python -m model.train` flags

A recipe is one training setup (dataset, network, schedule) with what each machine runs of it:
its batch, epoch length, epochs and budget. The Makefile's scale variables are
`$(shell $(PY) -m infra.recipe NAME ...)` (the `cpu` machine: 2 shared cores); `infra.submit
train --recipe NAME --accelerator A` appends machine A's flags to that Vertex AI spec's arguments. No TensorFlow is
imported: the Makefile runs this once per training target.
"""
from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from core.cli import UsageError, flag, parse_config, run_cli
from core.records import PAPER_DATASET, TITLES_DATASET

# No shuffle buffer: the pipeline writes each split in a fixed pseudo-random order of article
# chunks (`pipeline.write.order`), and the trainer streams it shard by shard, so memory and the time to
# the first step do not grow with the data. (When the shards held each article's triplets in
# page-id order, these recipes needed a buffer of the whole split, 1.1 M triplets and ~2 GB, and
# minutes to fill it.)
_SCALE = ("--shuffle-buffer", "0")


# Where a recipe runs: `cpu` is `make scale`'s 2 shared cores; the others are the Vertex AI specs
# of infra/vertex/ (`infra.submit train --accelerator`).
MACHINES = ("cpu", "gpu", "multi-gpu", "multi-worker", "tpu")


@dataclass(frozen=True)
class Machine:
    """What one machine runs of a recipe: its own flags (batch, epoch length, epochs) and budget."""

    flags: tuple[str, ...]
    budget_minutes: float


# On the accelerators an epoch is a whole pass over the training split (`--steps none`) and the
# run is 10 epochs with early stopping (patience 3), as the paper trains; the budget only caps the
# bill. The batch stays the CPU recipe's per replica (the learning-rate schedule counts triplets,
# so it holds at any global batch): the global batch grows with the replicas (4 L4s, 4 TPU v5e
# chips, 4 CPU workers). None of these has been run on Vertex AI: the epoch count is the paper's,
# the budgets are caps, not measurements.
_PASSES = ("--steps", "none", "--epochs", "10", "--patience", "3")
_TRANSFORMER_PASSES = ("--steps", "none", "--epochs", "3", "--patience", "1")
_ACCELERATED = {"gpu": Machine(_PASSES, 480), "multi-gpu": Machine(_PASSES, 240),
                "multi-worker": Machine(_PASSES, 720), "tpu": Machine(_PASSES, 240), "jax-gpu": Machine(_PASSES, 240)}


@dataclass(frozen=True)
class Recipe:
    dataset: str
    flags: tuple[str, ...]                 # on every machine
    machines: Mapping[str, Machine]        # by MACHINES
    teacher: str | None = None             # a distillation: the recipe whose model it learns from

    def arguments(self, machine: str = "cpu", budget_minutes: float | None = None,
                  models: str = "models") -> list[str]:
        """The flags of `python -m model.train` on `machine`, with the budget (the machine's unless
        given); a distillation's `--teacher` is the teacher recipe's folder under `models` (each
        recipe's model dir is `models/NAME`: make scale's and a Vertex AI run's alike)."""
        entry = self.machines[machine]
        minutes = entry.budget_minutes if budget_minutes is None else budget_minutes
        teacher = ["--teacher", f"{models}/{self.teacher}"] if self.teacher else []
        return [*self.flags, *teacher, *entry.flags, "--budget-minutes", f"{minutes:g}"]


def _cpu(steps: int, budget_minutes: float, *flags: str) -> Machine:
    """make scale's 2 cores: epochs of `steps` steps, each ending in a validation point; the budget,
    not the epoch count, ends the run."""
    return Machine(("--steps", str(steps), "--epochs", "1000", "--patience", "1000", *flags), budget_minutes)


RECIPES = {
    # The learning rate halves every 200 k triplets: at a constant 1e-3 validation accuracy
    # stopped rising after about 270 k triplets of the 2019 data.
    PAPER_DATASET: Recipe(PAPER_DATASET, (*_SCALE, "--evaluation-triplets", "5000", "--learning-rate-half-life",
                                            "200000"), {"cpu": _cpu(300, 75), **_ACCELERATED}),
    TITLES_DATASET: Recipe(TITLES_DATASET, (*_SCALE, "--evaluation-triplets", "5000"),
                           {"cpu": _cpu(150, 15), **_ACCELERATED}),
    # The transformer: AdamW 5e-5 after a 16 k-triplet warmup, halving every 100 k triplets; the
    # embeddings and the two lowest of six layers frozen, as in the run of docs/transformer.md
    # (python -m model.benchmark --encoder minilm measured no speed gain from freezing them: 48.5 vs
    # 48.7 triplets/s). On 2 cores, batches of 64 (more optimizer steps for the triplets a CPU
    # budget affords); on an accelerator the BiLSTM's 128, and 3 passes: each pass of the 2019
    # split is 1 M triplets, beyond the 64 k after which the CPU run's curve was flat.
    "minilm-sen": Recipe(PAPER_DATASET, (*_SCALE, "--evaluation-triplets", "2000", "--encoder", "minilm",
                                          "--frozen-layers", "2", "--warmup-triplets", "16000",
                                          "--learning-rate-half-life", "100000"),
                         {"cpu": _cpu(250, 85, "--batch-size", "64"),
                          **{name: Machine(_TRANSFORMER_PASSES, machine.budget_minutes)
                             for name, machine in _ACCELERATED.items()}}),
    # The distilled fast encoder: MiniLM's lowest 2 of 6 layers trained to reproduce minilm-sen's
    # embeddings of the training sentences (cosine), for users who embed all of Wikipedia on CPU
    # workers; AdamW 1e-4 after a 3,200-triplet warmup. On the 2019 data it beat the BiLSTM
    # student (GloVe, projected to 384-d) at half the triplets: validation 0.711 at 16 k triplets
    # against 0.688 at 58 k (docs/transformer.md). The teacher runs in the input pipeline, beside
    # the student's step.
    "minilm-student": Recipe(PAPER_DATASET, (*_SCALE, "--evaluation-triplets", "2000", "--encoder", "minilm",
                                             "--transformer-layers", "2", "--learning-rate", "1e-4",
                                             "--warmup-triplets", "3200", "--learning-rate-half-life", "200000"),
                             {"cpu": _cpu(125, 45, "--batch-size", "64"), **_ACCELERATED}, teacher="minilm-sen"),
    # The larger backbone: all-mpnet-base-v2 (110 M parameters, 768-d; --encoder mpnet), the
    # embeddings and its 4 lowest of 12 layers frozen (minilm-sen's third), AdamW 2e-5 (the
    # sentence-transformers fine-tuning default for a base-size model) after the same warmup. On
    # 2 cores, batches of 32 over 60 minutes; on an accelerator minilm-sen's passes.
    "mpnet-sen": Recipe(PAPER_DATASET, (*_SCALE, "--evaluation-triplets", "2000", "--encoder", "mpnet",
                                         "--frozen-layers", "4", "--learning-rate", "2e-5",
                                         "--warmup-triplets", "16000", "--learning-rate-half-life", "100000"),
                        {"cpu": _cpu(100, 60, "--batch-size", "32"),
                         **{name: Machine(_TRANSFORMER_PASSES, machine.budget_minutes)
                            for name, machine in _ACCELERATED.items()}}),
    # mpnet-sen distilled into all of MiniLM-L6 (its 384-d embeddings projected to the teacher's 768
    # by the student's Dense layer): a MiniLM-sized encoder, int8 ONNX-exportable, that keeps what the
    # larger backbone learned. minilm-student's schedule.
    "mpnet-distilled": Recipe(PAPER_DATASET, (*_SCALE, "--evaluation-triplets", "2000", "--encoder", "minilm",
                                              "--learning-rate", "1e-4", "--warmup-triplets", "3200",
                                              "--learning-rate-half-life", "200000"),
                              {"cpu": _cpu(125, 45, "--batch-size", "64"), **_ACCELERATED}, teacher="mpnet-sen"),
}


def recipes_table() -> str:
    """What every recipe runs on every machine, as the Markdown table of infra/README.md."""
    rows = ["| recipe | machine | `python -m model.train` flags (beside the spec's own) |", "| --- | --- | --- |"]
    for name, recipe in RECIPES.items():
        rows += [f"| `{name}` | {machine} | `{shlex.join(['--dataset', recipe.dataset, *recipe.arguments(machine)])}` |"
                 for machine in MACHINES]
    return "\n".join(rows) + "\n"


@dataclass(frozen=True)
class RecipeConfig:
    """Flags of `python -m infra.recipe`."""

    name: str = flag(help=f"the recipe: one of {', '.join(RECIPES)}")
    machine: str = flag("cpu", help=f"where it runs: one of {', '.join(MACHINES)} (cpu: make scale's 2 cores)")
    budget_minutes: float | None = flag(None, help="wall-clock training budget; none = the recipe's")
    models: str = flag("models", help="the folder of the run's model dirs (a distillation's teacher is one)")

    def __post_init__(self):
        if self.name not in RECIPES:
            raise UsageError(f"--name must be one of {', '.join(RECIPES)}, got {self.name!r}")
        if self.machine not in MACHINES:
            raise UsageError(f"--machine must be one of {', '.join(MACHINES)}, got {self.machine!r}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and not argv[0].startswith("-"):   # `python -m infra.recipe NAME ...`, the Makefile's spelling
        argv = ["--name", *argv]
    config = parse_config(RecipeConfig, argv, "python -m infra.recipe", __doc__.split("\n\n")[0])
    print(shlex.join(RECIPES[config.name].arguments(config.machine, config.budget_minutes, config.models)))


if __name__ == "__main__":
    sys.exit(run_cli(main))
