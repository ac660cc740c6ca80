#!/usr/bin/env bash
# The accelerator run of docs/transformer.md ("Training on GPUs"), with the product's own commands:
# one of make scale's recipes (infra/recipe.py, its `gpu` machine; RECIPE, default minilm-sen)
# under Keras' JAX backend, one run per seed side by side on the machine's GPU(s), averaged by
# model.soup, and the soup and every run exported: int8 ONNX for MiniLM (what eval.all --int8
# and `onnx:DIR` score), a sentence-transformers folder for MPNet (whose int8 encoder is its
# distilled MiniLM: RECIPE=mpnet-distilled TEACHER=OUT/mpnet-sen-soup). Training reads the run
# without TensorFlow (model.training.arrays), and so do the soup and the exports (the Net rebuilt
# under JAX: model.encoding.trained_net), so it all runs on an image that has JAX but no TensorFlow.
#
#   infra/accelerator/recipe_seeds.sh DATA OUT            # DATA: a pipeline.run folder; OUT: new
#   RECIPE=mpnet-sen SEEDS="1 2 3" BUDGET_MIN=8 EPOCHS=1 PYTHON=python3 infra/accelerator/recipe_seeds.sh DATA OUT
#
# Each run gets an equal share of the GPU's memory (XLA_PYTHON_CLIENT_MEM_FRACTION); MiniLM at a
# batch of 128 triplets leaves an H100 mostly idle, so runs side by side cost little more than one.
set -euo pipefail
DATA=${1:?DATA: a pipeline.run output folder} OUT=${2:?OUT: the folder for the model dirs}
RECIPE=${RECIPE:-minilm-sen}
SEEDS=${SEEDS:-1 2 3}
BUDGET_MIN=${BUDGET_MIN:-8}
EPOCHS=${EPOCHS:-1}
PY=${PYTHON:-python3}
export KERAS_BACKEND=jax PYTHONUNBUFFERED=1
runs=$(wc -w <<< "$SEEDS")
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-$($PY -c "print(round(0.9 / $runs, 2))")}
mkdir -p "$OUT"
flags=$($PY -m infra.recipe "$RECIPE" --machine gpu --budget-minutes "$BUDGET_MIN" --models "$OUT")   # set -e: a bad RECIPE ends here
eval "recipe=($flags)"
if [ -n "${TEACHER:-}" ]; then   # a distillation's teacher: this soup or run rather than the recipe's OUT/NAME
  for i in "${!recipe[@]}"; do [ "${recipe[$i]}" = --teacher ] && recipe[$((i + 1))]=$TEACHER; done
fi
encoder=minilm
for i in "${!recipe[@]}"; do [ "${recipe[$i]}" = --encoder ] && encoder=${recipe[$((i + 1))]}; done
if [ "$encoder" = minilm ]; then
  export_as=(--format onnx --quantize int8) exports=onnx
else
  export_as=(--format sentence-transformers) exports=sentence-transformers
fi
pids=()
for seed in $SEEDS; do
  $PY -m model.train --data "$DATA" --dataset triplets-sen --model-dir "$OUT/$RECIPE-$seed" "${recipe[@]}" \
    --epochs "$EPOCHS" --backend jax --seed "$seed" --progress false > "$OUT/$RECIPE-$seed.log" 2>&1 &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || { echo "a training run failed: see $OUT/$RECIPE-*.log" >&2; exit 1; }
models=()
for seed in $SEEDS; do models+=(--model-dir "$OUT/$RECIPE-$seed"); done
if [ "$runs" -gt 1 ]; then
  $PY -m model.soup "${models[@]}" --output "$OUT/$RECIPE-soup"
  names="soup $SEEDS"
else
  names="$SEEDS"
fi
for name in $names; do
  $PY -m model.export --model-dir "$OUT/$RECIPE-$name" "${export_as[@]}" --output "$OUT/$exports/$RECIPE-$name"
done
echo "model dirs: $OUT/$RECIPE-*; exports: $OUT/$exports/ (score a model dir with eval.all --model-dir NAME=DIR," \
  "an int8 ONNX export with --model-dir NAME=onnx:DIR)"
