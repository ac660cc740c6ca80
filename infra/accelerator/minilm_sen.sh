#!/usr/bin/env bash
# The accelerator run of docs/transformer.md ("Training on GPUs"), with the product's own commands:
# make scale's `minilm-sen` recipe (infra/recipe.py, its `gpu` machine) under Keras' JAX backend,
# one run per seed side by side on the machine's GPU(s), averaged by model.soup, and the soup and
# every run exported as int8 ONNX (what eval.all --int8 and `onnx:DIR` score). Training reads the
# run without TensorFlow (model.training.arrays), so it runs on an image that has JAX but no
# TensorFlow; the soup and the exports then run where TensorFlow is (the script says how).
#
#   infra/accelerator/minilm_sen.sh DATA OUT            # DATA: a pipeline.run folder; OUT: new
#   SEEDS="1 2 3" BUDGET_MIN=8 EPOCHS=1 PYTHON=python3 infra/accelerator/minilm_sen.sh DATA OUT
#
# Each run gets an equal share of the GPU's memory (XLA_PYTHON_CLIENT_MEM_FRACTION); MiniLM at a
# batch of 128 triplets leaves an H100 mostly idle, so runs side by side cost little more than one.
set -euo pipefail
DATA=${1:?DATA: a pipeline.run output folder} OUT=${2:?OUT: the folder for the model dirs}
SEEDS=${SEEDS:-1 2 3}
BUDGET_MIN=${BUDGET_MIN:-8}
EPOCHS=${EPOCHS:-1}
PY=${PYTHON:-python3}
export KERAS_BACKEND=jax PYTHONUNBUFFERED=1
runs=$(wc -w <<< "$SEEDS")
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-$($PY -c "print(round(0.9 / $runs, 2))")}
mkdir -p "$OUT"
read -ra recipe <<< "$($PY -m infra.recipe minilm-sen --machine gpu --budget-minutes "$BUDGET_MIN" --models "$OUT")"
pids=()
for seed in $SEEDS; do
  $PY -m model.train --data "$DATA" --dataset triplets-sen --model-dir "$OUT/minilm-sen-$seed" "${recipe[@]}" \
    --epochs "$EPOCHS" --backend jax --seed "$seed" --progress false > "$OUT/minilm-sen-$seed.log" 2>&1 &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || { echo "a training run failed: see $OUT/minilm-sen-*.log" >&2; exit 1; }
models=()
for seed in $SEEDS; do models+=(--model-dir "$OUT/minilm-sen-$seed"); done
# model.soup and model.export rebuild the Net under TensorFlow's Keras: on an image without it,
# the model dirs go to a machine that has it (every file but encoder/ is written here).
if ! $PY -c "import tensorflow" 2> /dev/null; then
  echo "no TensorFlow here: on a machine with it, soup and export the model dirs with:"
  echo "  python -m model.soup ${models[*]} --output $OUT/minilm-sen-soup"
  echo "  python -m model.export --model-dir MODEL_DIR --format onnx --quantize int8 --output ONNX_DIR"
  exit 0
fi
if [ "$runs" -gt 1 ]; then
  $PY -m model.soup "${models[@]}" --output "$OUT/minilm-sen-soup"
  names="soup $SEEDS"
else
  names="$SEEDS"
fi
for name in $names; do
  $PY -m model.export --model-dir "$OUT/minilm-sen-$name" --format onnx --quantize int8 --output "$OUT/onnx/minilm-sen-$name"
done
echo "model dirs: $OUT/minilm-sen-*; int8 ONNX exports: $OUT/onnx/ (score them with eval.all --model-dir NAME=onnx:DIR)"
