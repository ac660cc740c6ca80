"""What the trainer costs before its first step, at 1x and at N x the data, side by side in one run.

    python -m infra.scale_benchmark --data PIPELINE_OUT [--times 8] [--recipe triplets-sen] [--backend jax]
        [--gradient-accumulation-steps N] [--out DIR]

A dataset N times as large is made beside the benchmark's output: the same shards of the train
split, hard-linked N times under new names, and a manifest that lists every copy (validation
and test as they are), so nothing is copied and the trainer streams N times the records. Then
`python -m model.train` runs under `/usr/bin/time -v` (with `--backend`) with `make scale`'s recipe
(`infra/recipe.py`) for `--steps` steps on each dataset, one after the other, and the benchmark
prints, for each: the seconds from the process's start to its first training step (the time of
the trainer's `first training step` log line), the trainer's own `seconds_to_first_step` (from
the start of `train`), and the peak RSS; then the N x / 1 x ratios, which streaming should keep
at about 1 (a whole-split shuffle buffer made both grow with the data). With `--out`, writes
scale_benchmark.json there.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from core.cli import UsageError, flag, parse_config, run_cli
from core.files import is_remote
from core.published import MANIFEST, Manifest, Run, Shard
from core.records import PAPER_DATASET
from infra.recipe import RECIPES
from model.training.model_dir import ModelDir

FIRST_STEP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*first training step after")
MAX_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")


@dataclasses.dataclass(frozen=True)
class ScaleBenchmarkConfig:
    """Flags of `python -m infra.scale_benchmark`."""
    data: str = flag(help="a local pipeline run (its manifest lists the shards)")
    times: int = flag(8, help="how many times the train split the larger dataset holds")
    recipe: str = flag(PAPER_DATASET, help="make scale's training recipe (infra/recipe.py)")
    steps: int = flag(20, help="training steps of each run (the recipe's budget is not waited for)")
    backend: str = flag("tensorflow", help="the trainer's Keras backend (model.train --backend): tensorflow or jax")
    gradient_accumulation_steps: int = flag(1, help="parts each step's batch is fed in (model.train's flag): the "
                                                    "same updates in about 1/N of the activation memory")
    out: str | None = flag(None, help="folder for scale_benchmark.json and the datasets' model dirs")

    def __post_init__(self):
        if self.times < 2:
            raise UsageError(f"--times must be >= 2, got {self.times}")
        if is_remote(self.data):
            raise UsageError("--data must be a local run folder (the larger dataset is made of hard links)")


def repeated_run(data: str, dataset: str, times: int, folder: str) -> str:
    """A run folder whose train split is `data`'s, `times` over (hard links under new names)."""
    run = Run.open(data)

    def linked(shard: Shard, name: str) -> Shard:
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        os.link(run.path(shard.path), os.path.join(folder, name))
        return Shard(name, shard.size, shard.records)

    def copies(shards: tuple[Shard, ...]) -> tuple[Shard, ...]:
        return tuple(linked(shard, f"{dataset}/train/copy{copy:03d}-{shard.path.rsplit('/', 1)[1]}")
                     for copy in range(times) for shard in shards)

    train = run.output(f"{dataset}/train")
    outputs = {train.folder: dataclasses.replace(train, records=train.records * times, shards=copies(train.shards),
                                                 parquet=copies(train.parquet))}
    for split in ("validation", "test"):   # every file the manifest lists: the Parquet twins are checked too
        output = run.output(f"{dataset}/{split}")
        for shard in output.all_shards():
            linked(shard, shard.path)
        outputs[output.folder] = output
    manifest = dataclasses.replace(run.manifest, outputs=outputs, files=())
    with open(os.path.join(folder, MANIFEST), "w") as handle:
        json.dump(Manifest.to_json(manifest), handle, indent=2)
    return folder


def timed_training(data: str, model_dir: str, flags: list[str]) -> dict:
    """Runs the trainer under /usr/bin/time -v; its seconds to the first step and peak RSS."""
    started = time.time()
    done = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "model.train", "--data", data,
                           "--model-dir", model_dir, *flags], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode:
        raise RuntimeError(f"model.train failed on {data}: {done.stderr[-2000:]}")
    stamp = next(match.group(1) for line in done.stderr.splitlines() if (match := FIRST_STEP.match(line)))
    first_step = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    history = ModelDir(model_dir).history()
    if history is None:
        raise RuntimeError(f"model.train wrote no history into {model_dir}: {done.stderr[-2000:]}")
    peak_rss = MAX_RSS.search(done.stderr)
    if peak_rss is None:
        raise RuntimeError(f"model.train reported no peak RSS on {data}: {done.stderr[-2000:]}")
    return {"seconds_to_first_step_from_process_start": round(first_step - started, 1),
            "seconds_to_first_step_in_train": history.seconds_to_first_step,
            "peak_rss_mib": round(int(peak_rss.group(1)) / 1024, 1),
            "train_records": history.expected_records("train")}


def main(argv: list[str] | None = None) -> dict:
    config = parse_config(ScaleBenchmarkConfig, argv, "python -m infra.scale_benchmark", __doc__.split("\n\n")[0])

    recipe = RECIPES[config.recipe]
    flags = [*recipe.arguments(), "--dataset", recipe.dataset, "--steps", str(config.steps), "--epochs", "1",
             "--progress", "false", "--backend", config.backend,
             "--gradient-accumulation-steps", str(config.gradient_accumulation_steps)]
    out = config.out or tempfile.mkdtemp(prefix="scale-benchmark-")
    larger = repeated_run(config.data, recipe.dataset, config.times, os.path.join(out, f"data-{config.times}x"))
    results = {}
    for name, data in (("1x", config.data), (f"{config.times}x", larger)):
        results[name] = timed_training(data, os.path.join(out, f"model-{name}"), flags)
        print(f"{name:>4}: {results[name]}", flush=True)
    ratios = {key: round(results[f"{config.times}x"][key] / results["1x"][key], 3)
              for key in ("seconds_to_first_step_from_process_start", "seconds_to_first_step_in_train", "peak_rss_mib")}
    print(f"{config.times}x / 1x: {ratios}")
    summary = {"recipe": config.recipe, "backend": config.backend, "flags": flags, "runs": results, "ratios": ratios}
    with open(os.path.join(out, "scale_benchmark.json"), "w") as handle:
        json.dump(summary, handle, indent=2)
    return summary


if __name__ == "__main__":
    sys.exit(run_cli(main))
