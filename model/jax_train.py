"""Fine-tunes the transformer Net on an accelerator under Keras 3's JAX backend, with no TensorFlow:
the paper-scale recipe (every layer trained, a pass or more over the train split) that 2 CPU cores
cannot run.

    python -m model.jax_train --bundle BUNDLE --output DIR [--epochs 2] [--batch-size 128]
        [--learning-rate 5e-5] [--budget-seconds 360]

BUNDLE is `python -m model.jax_bundle`'s folder (the split's wordpiece ids and the
checkpoint, NumPy files): batches are read without TensorFlow, which accelerator images lack.
The Net is `model.backbone.mean_pooled_encoder` over keras-hub's `BertBackbone`, the loss the
paper's (`model.losses.triplet_loss`) on `COSINE_SCALE` x (1 - cosine) distances, as
`model.train --encoder minilm` trains it; AdamW with weight decay 0.01 (none on biases and layer
norms), bfloat16 compute with float32 weights. The learning rate rises linearly over the first
10 % of the run, then falls linearly to 0 at its end; the run's end is the smaller of `--epochs`
passes and what `--budget-seconds` allows at the step time measured over the first steps, so a
budget cut still ends the schedule. With `--distill-layers N`, the Net's lowest N layers
are a student trained to reproduce the whole Net's embeddings (the bundle packed `--start-from` a
fine-tuned run: sentence-transformers' layer-reduction distillation). DIR gets `delta-*.npz`
(each weight's change, float16, in files of at most 15 MiB) and `history.json`, which
`python -m model.jax_unpack` turns into a model dir every eval job reads. The device
commands are in docs/transformer.md.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pipeline.cli import UsageError, flag, parse_config, run_cli

# Tokens per sentence, as the exported encoder keeps them (`model.transformer.BertIds`).
MAX_TOKENS = 64
# Bytes per delta file: what a device call may send back is limited per file.
DELTA_FILE_BYTES = 15 << 20
WARMUP_SHARE = 0.1
TIMED_STEPS = 30


@dataclass(frozen=True, kw_only=True)
class JaxTrainConfig:
    bundle: str = flag(help="python -m model.jax_bundle's folder")
    output: str = flag(help="where to write delta-*.npz and history.json")
    epochs: float = flag(2.0, help="passes over the bundle's train triplets at most")
    batch_size: int = flag(128, help="triplets per step")
    learning_rate: float = flag(5e-5, help="the peak learning rate (AdamW)")
    weight_decay: float = flag(0.01, help="AdamW's weight decay")
    budget_seconds: float = flag(360.0, help="training seconds at most (compilation and validation not counted)")
    eval_every: int = flag(1000, help="steps between validation points")
    seed: int = flag(0, help="seed of the batch order")
    loss: str = flag("triplet", help="triplet (the paper's), in-batch (InfoNCE over every sentence of the batch, "
                                     "the triplet's negative included) or sum; model.train's --loss")
    distill_layers: int | None = flag(None, help="train the bundle Net's lowest this many layers (a student "
                                                 "started from them) to reproduce the whole Net's embeddings "
                                                 "(mean 1 - cosine) instead; none = fine-tune the Net on triplets")


def padded_sentences(split: dict) -> np.ndarray:
    """int32 [sentences, MAX_TOKENS]: each distinct sentence's wordpiece ids, 0 = padding."""
    starts = split["starts"]
    lengths = np.diff(starts)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    columns = np.arange(len(split["ids"])) - np.repeat(starts[:-1], lengths)
    padded = np.zeros((len(lengths), MAX_TOKENS), np.int32)
    padded[rows, columns] = split["ids"]
    return padded


def triplet_ids(sentences: np.ndarray, triplets: np.ndarray) -> np.ndarray:
    """[3 n, MAX_TOKENS]: the anchors, then the positives, then the negatives of `triplets` [n, 3]."""
    return sentences[triplets.T.reshape(-1)]


def learning_rate_at(step: int, total: int, peak: float) -> float:
    warmup = max(1, int(WARMUP_SHARE * total))
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * max(0.0, (total - step) / max(1, total - warmup))


def bundle_description(bundle: str) -> dict:
    with open(os.path.join(bundle, "backbone.json"), encoding="utf-8") as handle:
        return json.load(handle)


def build(bundle: str, layers: int | None = None):
    """Net over the bundle's checkpoint, or over its lowest `layers` transformer layers (each weight
    taken from the bundle's by its path)."""
    import keras
    import keras_hub

    from model.backbone import mean_pooled_encoder

    described = bundle_description(bundle)
    keras.config.set_dtype_policy("mixed_bfloat16")
    # The checkpoint's config names float32: bfloat16 compute here, its float32 weights kept.
    backbone_config = {**described["config"], "dtype": "mixed_bfloat16"}
    if layers is not None:
        backbone_config["num_layers"] = layers
    encoder = mean_pooled_encoder(keras_hub.models.BertBackbone.from_config(backbone_config))
    index_of = {path: index for index, path in enumerate(described["weights"])}
    unknown = [weight.path for weight in encoder.weights if weight.path not in index_of]
    if unknown:
        raise SystemExit(f"{bundle}: no weight {unknown[0]} (a bundle of another keras-hub BertBackbone)")
    start = np.load(os.path.join(bundle, "weights.npz"))
    encoder.set_weights([start[f"w{index_of[weight.path]:04d}"].astype(np.float32) for weight in encoder.weights])
    return encoder


def unit(embeddings):
    """float32 rows scaled to unit length (JAX)."""
    import jax.numpy as jnp

    embeddings = embeddings.astype("float32")
    return embeddings / jnp.maximum(jnp.linalg.norm(embeddings, axis=-1, keepdims=True), 1e-12)


def cosines(left, right):
    return (unit(left) * unit(right)).sum(-1)


def distances(embeddings):
    """[n, 2]: the scaled cosine distances anchor-positive and anchor-negative of `triplet_ids` rows'
    embeddings, as `model.network` scores a triplet."""
    import jax.numpy as jnp

    from model.losses import COSINE_SCALE

    anchor, positive, negative = jnp.split(embeddings, 3)
    return COSINE_SCALE * (1.0 - jnp.stack([cosines(anchor, positive), cosines(anchor, negative)], axis=-1))


def triplet_scorer(encoder, ids: np.ndarray, batch: int = 500):
    """A function of the encoder's (trainable, non-trainable) weights: the share of the triplets in
    `ids` (`triplet_ids` rows) whose anchor is nearer its positive than its negative."""
    import jax

    @jax.jit
    def embed(trainable, non_trainable, rows):
        return encoder.stateless_call(trainable, non_trainable, rows, training=False)[0]

    count = len(ids) // 3
    roles = [ids[role * count:(role + 1) * count] for role in range(3)]

    def accuracy(trainable, non_trainable) -> float:
        pair = np.concatenate([np.asarray(distances(embed(trainable, non_trainable, np.concatenate(
            [role[start:start + batch] for role in roles])))) for start in range(0, count, batch)])
        return float((pair[:, 0] < pair[:, 1]).mean())
    return accuracy


def train(config: JaxTrainConfig) -> dict:
    import jax
    import jax.numpy as jnp
    import keras

    from model.config import LOSS_NAMES
    from model.losses import COSINE_SCALE, MASKED_SCORE, in_batch_loss, triplet_and_in_batch_loss, triplet_loss

    if config.loss not in LOSS_NAMES:
        raise UsageError(f"--loss must be one of {', '.join(LOSS_NAMES)}, got {config.loss!r}")
    paper_loss = dict(zip(LOSS_NAMES, (triplet_loss, in_batch_loss, triplet_and_in_batch_loss)))[config.loss]

    train_split = np.load(os.path.join(config.bundle, "train.npz"))
    validation_split = np.load(os.path.join(config.bundle, "validation.npz"))
    train_sentences, train_triplets = padded_sentences(train_split), train_split["triplets"]
    validation_ids = triplet_ids(padded_sentences(validation_split), validation_split["triplets"])
    encoder = build(config.bundle, config.distill_layers)
    teacher = build(config.bundle) if config.distill_layers else None
    teacher_weights = (([v.value for v in teacher.trainable_variables],
                        [v.value for v in teacher.non_trainable_variables]) if teacher else None)
    optimizer = keras.optimizers.AdamW(config.learning_rate, weight_decay=config.weight_decay)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta", "layer_norm"])
    optimizer.build(encoder.trainable_variables)
    rate_slot = next(slot for slot, variable in enumerate(optimizer.variables)
                     if variable.path.endswith("learning_rate"))

    def in_batch_scores(embeddings):
        """[n, 1 + 3 n]: minus each anchor's scaled cosine distance to its positive, then to every
        sentence of the batch (anchors, positives, negatives), its own anchor and positive left out
        (`MASKED_SCORE`), as `model.network.in_batch_scores` leaves out the anchor's section. A
        batch here is triplets drawn from the whole split, so another triplet of the anchor's
        section is rare; without section keys in the bundle it is not masked."""
        count = embeddings.shape[0] // 3
        anchors, positives = unit(embeddings[:count]), unit(embeddings[count:2 * count])
        candidates = -COSINE_SCALE * (1.0 - anchors @ unit(embeddings).T)
        own = jnp.arange(count)
        candidates = candidates.at[own, own].set(MASKED_SCORE).at[own, own + count].set(MASKED_SCORE)
        positive = -COSINE_SCALE * (1.0 - (anchors * positives).sum(-1, keepdims=True))
        return jnp.concatenate([positive, candidates], -1)

    def loss_of(trainable, non_trainable, ids, taught):
        """`--loss` on the batch's triplets, or with the teacher's embeddings `taught` the
        mean cosine distance of each sentence's embedding to the teacher's (sentence-transformers'
        distillation, with cosine so the student's norms are free, as `model.network`'s)."""
        embeddings, non_trainable = encoder.stateless_call(trainable, non_trainable, ids, training=True)
        pair = distances(embeddings)
        accuracy = (pair[:, 0] < pair[:, 1]).mean()
        if teacher is None:
            outputs = pair if config.loss == "triplet" else jnp.concatenate([pair, in_batch_scores(embeddings)], -1)
            return paper_loss(None, outputs).mean(), (non_trainable, accuracy)
        return (1.0 - cosines(embeddings, taught)).mean(), (non_trainable, accuracy)

    @jax.jit
    def teach(weights, ids):
        return teacher.stateless_call(*weights, ids, training=False)[0] if teacher else None

    @jax.jit
    def train_step(state, ids, rate, taught):
        trainable, non_trainable, optimizer_state = state
        gradient_of = jax.value_and_grad(loss_of, has_aux=True)
        (loss, (non_trainable, accuracy)), grads = gradient_of(trainable, non_trainable, ids, taught)
        optimizer_state = [rate if slot == rate_slot else value for slot, value in enumerate(optimizer_state)]
        trainable, optimizer_state = optimizer.stateless_apply(optimizer_state, grads, trainable)
        return (trainable, non_trainable, optimizer_state), loss, accuracy

    count = len(validation_ids) // 3
    score_validation = triplet_scorer(encoder, validation_ids)

    def validation_accuracy(state) -> float:
        return score_validation(state[0], state[1])

    state = ([v.value for v in encoder.trainable_variables], [v.value for v in encoder.non_trainable_variables],
             [v.value for v in optimizer.variables])
    start_weights = [np.asarray(weight) for weight in encoder.get_weights()]
    untrained = validation_accuracy(state)
    print(f"{jax.devices()[0].device_kind}: {len(train_triplets)} train triplets; validation accuracy "
          f"untrained {untrained:.4f}", flush=True)
    order = np.random.default_rng(config.seed).permutation(len(train_triplets))
    per_epoch = len(order) // config.batch_size
    total = int(config.epochs * per_epoch)
    curve, trained_seconds, step, timed_from = [], 0.0, 0, None
    while step < total:
        batch = order[(step % per_epoch) * config.batch_size:][:config.batch_size]
        ids = triplet_ids(train_sentences, train_triplets[batch])
        began = time.perf_counter()
        taught = teach(teacher_weights, ids) if teacher else None
        state, loss, accuracy = train_step(state, ids, jnp.float32(learning_rate_at(step, total, config.learning_rate)),
                                           taught)
        if step == 2:   # compiled and warm: time from here, then size the run to the budget
            jax.block_until_ready(loss)
            timed_from = time.perf_counter()
        step += 1
        if timed_from is not None and step == 3 + TIMED_STEPS:
            jax.block_until_ready(loss)
            seconds_per_step = (time.perf_counter() - timed_from) / TIMED_STEPS
            total = max(step, min(total, int(config.budget_seconds / seconds_per_step)))
            print(f"{seconds_per_step * 1e3:.1f} ms per step of {config.batch_size}: {total} steps "
                  f"({total * config.batch_size} triplets)", flush=True)
        trained_seconds += time.perf_counter() - began
        if step % config.eval_every == 0 or step >= total:
            jax.block_until_ready(loss)
            point = {"step": step, "triplets_seen": step * config.batch_size, "wall_seconds": round(trained_seconds, 1),
                     "cpu_seconds": round(time.process_time(), 1), "loss": float(loss),
                     "train_batch_accuracy": float(accuracy), "val_triplet_accuracy": validation_accuracy(state)}
            curve.append(point)
            print(json.dumps(point), flush=True)
    for variable, value in zip(encoder.trainable_variables, state[0]):
        variable.assign(value)
    for variable, value in zip(encoder.non_trainable_variables, state[1]):
        variable.assign(value)
    write_deltas(config.output, [np.asarray(weight) - start for weight, start in
                                 zip(encoder.get_weights(), start_weights)])
    summary = history(config, curve, untrained, jax.devices()[0].device_kind, count)
    summary["weights"] = [weight.path for weight in encoder.weights]
    with open(os.path.join(config.output, "history.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
    return summary


def write_deltas(output: str, deltas: list[np.ndarray]) -> list[str]:
    """`delta-K.npz` files of at most DELTA_FILE_BYTES: weight `wNNNN` as float16, a weight larger
    than a file split by rows into `wNNNN.P` parts (`model.jax_bundle` joins them)."""
    os.makedirs(output, exist_ok=True)
    parts: list[tuple[str, np.ndarray]] = []
    for index, delta in enumerate(deltas):
        half = delta.astype(np.float16)
        if half.nbytes <= DELTA_FILE_BYTES:
            parts.append((f"w{index:04d}", half))
        else:
            rows = max(1, DELTA_FILE_BYTES // half[0].nbytes)
            parts.extend((f"w{index:04d}.{part}", half[start:start + rows])
                         for part, start in enumerate(range(0, len(half), rows)))
    files: list[str] = []
    current: dict[str, Any] = {}
    size = 0
    for key, part in parts + [("", np.empty(0))]:
        if current and (not key or size + part.nbytes > DELTA_FILE_BYTES):
            files.append(os.path.join(output, f"delta-{len(files)}.npz"))
            np.savez(files[-1], **current)
            current, size = {}, 0
        if key:
            current[key], size = part, size + part.nbytes
    return files


def history(config: JaxTrainConfig, curve: list[dict], untrained: float, device: str, validation: int) -> dict:
    """`model.train`'s history.json keys that the learning curve, the model card and eval read."""
    return {"learning_curve": curve, "untrained_val_triplet_accuracy": untrained,
            "mean_vectors_val_triplet_accuracy": None,
            # the weights written are the run's last (no best-epoch checkpoint): their accuracy
            "best_val_triplet_accuracy": curve[-1]["val_triplet_accuracy"] if curve else untrained,
            "evaluation_triplets": validation, "global_batch_size": config.batch_size, "distance": "cosine",
            "device": device, "triplets_seen": curve[-1]["triplets_seen"] if curve else 0,
            "config": {**asdict(config), "encoder": "minilm", "lstm_units": 0,
                       "dataset": bundle_description(config.bundle)["dataset"],
                       "frozen_layers": 0, "transformer_layers": config.distill_layers,
                       # the teacher: the run the bundle was packed from (`model.jax_bundle --start-from`)
                       "teacher": (bundle_description(config.bundle).get("start_from") or config.bundle
                                   if config.distill_layers else None), "trainer": "model.jax_train"}}


def main(argv: list[str] | None = None) -> dict:
    # Keras picks its backend when it is first imported: JAX, unless the caller chose one.
    # Set here, not at import, so importing this module leaves a TensorFlow process as it was.
    os.environ.setdefault("KERAS_BACKEND", "jax")
    return train(parse_config(JaxTrainConfig, argv, "python -m model.jax_train", __doc__.split("\n\n")[0]))


if __name__ == "__main__":
    sys.exit(run_cli(main))
