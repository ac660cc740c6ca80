"""A model dir claimed by a training run: tied to its inputs (INPUTS), refused when it
holds anything else, another live run or state from other inputs; and the record counts a
finished run is checked against (`--max-lost-fraction`)."""
from __future__ import annotations

import json
import os
import shutil
from enum import Enum

from core.files import read_json_object, write_complete
from core.folders import claim_is_live, claiming, owner_record, refuse_links
from core.published import Run
from model.config import TrainConfig
from model.training.model_dir import CLAIM, RUN_ENTRIES
from model.training.shards import TripletDataError, TripletDataLoss, open_run

# What a model dir's state (vocabulary, backups, checkpoints) was built from: a rerun or a resumed
# run must see the same, or it would silently continue on other data or another id space.
STATE_INPUTS = ("data", "dataset", "encoder", "embeddings", "vocabulary", "min_count", "num_oov_buckets", "max_tokens")


# Flags a resumed run may change: how long and how loudly it runs, and checks; any other change
# (batch size, learning rate, network...) would continue the backup as another run than
# its history says, so it is refused unless --overwrite.
RESUME_MAY_CHANGE = ("model_dir", "overwrite", "budget_minutes", "progress", "serving_version", "epochs",
                     "patience", "max_lost_fraction", "jit_compile", "checkpoint_every",
                     "precision")   # the weights are float32 under either

PATH_FLAGS = ("data", "embeddings", "teacher")   # compared without a trailing slash


def recorded_flags(config: TrainConfig, flags: dict | None = None) -> dict:
    """The flags a model dir's state depends on, as they take effect: a flag left at none is its
    default (`TrainConfig.default`), a path has no trailing slash; so a rerun that spells a
    default out (`--dropout 0.2`) or ends `--data` with `/` continues the same run. `flags`:
    recorded ones (an earlier INPUTS) instead of `config`'s."""
    recorded = {}
    for name, value in (config.flags() if flags is None else flags).items():
        if value is None and name in config.network.kind.defaults:
            value = config.default(name)
        if name in PATH_FLAGS and isinstance(value, str):
            value = value.rstrip("/") or value
        recorded[name] = str(value) if isinstance(value, Enum) else value
    return recorded


def claim_model_dir(config: TrainConfig, model_dir: str, run: Run | None = None) -> None:
    """Ties `model_dir` to its inputs in INPUTS (the config fields of STATE_INPUTS, the
    SHA-256 of the data's manifest, `recorded_flags` and the training process: `owner_record`).
    Refused (a UsageError naming the folder or file): a non-empty folder that is not a model dir
    (no claim, or entries a run does not write: the user's files, a dataset), one that holds a
    symbolic link anywhere, one a live training process writes, and one holding state from other
    inputs, with the first difference named, unless `--overwrite`, which deletes what a run wrote
    (RUN_ENTRIES) and nothing else. The claim decides under an exclusive flock of the folder.
    `run`: the data, opened (by default, opened here)."""
    digest = (run or open_run(config.inputs.data)).sha256
    flags = recorded_flags(config)
    inputs = {**{name: flags[name] for name in STATE_INPUTS}, "manifest_sha256": digest,
              "flags": {name: value for name, value in flags.items() if name not in RESUME_MAY_CHANGE},
              "owner": owner_record()}
    refuse_links(model_dir, "--model-dir")
    with claiming(model_dir):
        leftovers = sorted(name.rstrip("/") for name in os.listdir(model_dir))
        foreign = [name for name in leftovers if name not in RUN_ENTRIES]
        if leftovers and (foreign or CLAIM not in leftovers):
            raise TripletDataError(
                f"--model-dir {config.runtime.model_dir} holds files a training run does not write "
                f"({', '.join((foreign or leftovers)[:3])}); choose an empty or new folder")
        previous = read_json_object(f"{model_dir}/{CLAIM}") if leftovers else {}
        if claim_is_live(previous.get("owner") or {}):
            raise TripletDataError(f"--model-dir {config.runtime.model_dir} is being trained by pid "
                                   f"{previous['owner'].get('pid')} (since {previous['owner'].get('started')}); wait "
                                   "for it, or use another --model-dir")
        if config.runtime.overwrite:
            for name in leftovers:
                entry = f"{model_dir}/{name}"
                shutil.rmtree(entry) if os.path.isdir(entry) else os.remove(entry)
        elif leftovers:
            _refuse_other_inputs(config, inputs, previous)
        write_complete(f"{model_dir}/{CLAIM}", json.dumps(inputs, indent=2).encode())


def _refuse_other_inputs(config: TrainConfig, inputs: dict, previous: dict) -> None:
    """TripletDataError naming the first input or flag in which a resume differs from the run
    its model dir holds (`previous`: that run's INPUTS)."""
    changed = [name for name in STATE_INPUTS + ("manifest_sha256",)
               if recorded_flags(config, {name: previous.get(name)}).get(name) != inputs[name]]
    if changed:
        name = changed[0]
        raise TripletDataError(
            f"--model-dir {config.runtime.model_dir} holds a run on other inputs ({name}: "
            f"{previous.get(name)!r} -> {inputs[name]!r}); pass --overwrite true to start over, or use a new "
            "--model-dir")
    before = recorded_flags(config, previous.get("flags", inputs["flags"]))
    differing = [f"--{name.replace('_', '-')} {before.get(name)} -> {value}" for name, value in
                 inputs["flags"].items()   # a flag the run's version did not have (`--backend`) is its default
                 if name not in STATE_INPUTS and name in before and before[name] != value]
    if differing:
        raise TripletDataError(
            f"--model-dir {config.runtime.model_dir} holds a run with other flags ({', '.join(differing)}); "
            "resuming it so would train another run than its history records: pass the same flags, "
            "--overwrite true to start over, or a new --model-dir")


def check_lost_records(config: TrainConfig, run: Run, counts: dict[str, dict]) -> None:
    """TripletDataLoss when a split lost more than `--max-lost-fraction` of its records; a split
    holding more records than its manifest lists (mixed data), or a shard fewer than allowed, is
    named by `Run.verify` (ShardError naming the shard)."""
    inputs = config.inputs
    for split, count in counts.items():
        lost = count["lost"] + count["unparseable"]
        if count["read"] != count["expected"]:
            run.verify(f"{inputs.dataset}/{split}", inputs.max_lost_fraction)
        if lost > inputs.max_lost_fraction * max(count["expected"], 1):
            raise TripletDataLoss(
                f"{inputs.data}/{inputs.dataset}/{split}: {lost:,} of {count['expected']:,} records lost to corrupt or "
                f"truncated shards or unparseable (> --max-lost-fraction {inputs.max_lost_fraction})")
