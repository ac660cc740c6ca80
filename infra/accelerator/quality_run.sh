#!/usr/bin/env bash
# The quality run for a lent accelerator (issue 72; docs/transformer.md "One command on a lent GPU"):
# MPNet fine-tuned on the triplets in bfloat16 (the teacher), a MiniLM-L6 student distilled from
# it, the student's int8 ONNX export (<= 30 MB), both scored on the whole test split and an SCB
# sample, and OUT/summary.json (accuracies with intervals, ms a step, triplets/s, an MFU estimate,
# seconds per stage). Everything runs without TensorFlow (Keras under JAX, ONNX Runtime), as on
# the accelerator's image; what a device reply carries back is the summary, the reports and the
# student's export.
#
#   infra/accelerator/quality_run.sh OUT                   # DATA=RUN: a pipeline.run folder (carried shards)
#   DRY=1 infra/accelerator/quality_run.sh OUT             # the rehearsal on this CPU: the excerpt, tiny sizes
#
# Budgets and choices, as environment variables (defaults for one H200; DRY=1 shrinks them):
#   DATA             a pipeline.run output folder; none: pipeline.run on INPUT (the embedded excerpt by default)
#   TEACHER_MINUTES  the teacher's training budget (3)      STUDENT_MINUTES  the student's (2)
#   PRECISION        bfloat16 (or float32)                  SCB_ARTICLES     the SCB sample's articles (100)
#   EVAL_TRIPLETS    the test triplets scored; none = the whole split (none)
#   TEACHER_LAYERS   keep only the teacher's lowest N layers (DRY: a 2-layer MPNet stand-in)
#   INPUT_WORKERS    processes that tokenise and batch the teacher's input (every core but one; DRY: 1)
#   MPNET_CHECKPOINT the teacher's all-mpnet-base-v2 folder (a kit's float16 copy); none: the installed one
#   PYTHON           the interpreter (python3)
# Each stage writes OUT/STAGE.log; OUT/stages.tsv has each stage's seconds.
set -euo pipefail
{   # read whole before it runs: an edit of this file during a run does not change the run
OUT=${1:?OUT: a new folder for the run}
PY=${PYTHON:-python3}
DRY=${DRY:-0}
PRECISION=${PRECISION:-bfloat16}
export PYTHONUNBUFFERED=1 KERAS_BACKEND=jax
if [ "$DRY" = 1 ]; then   # this CPU, as the accelerator's image: no TensorFlow, tiny sizes
  export WIKISIM_WITHOUT_TENSORFLOW=1 JAX_PLATFORMS=cpu
  TEACHER_MINUTES=${TEACHER_MINUTES:-2} STUDENT_MINUTES=${STUDENT_MINUTES:-2}
  SCB_ARTICLES=${SCB_ARTICLES:-4} EVAL_TRIPLETS=${EVAL_TRIPLETS:-300} TEACHER_LAYERS=${TEACHER_LAYERS:-2}
  PEAK_TFLOPS=0   # no MFU on a CPU
  INPUT_WORKERS=${INPUT_WORKERS:-1}
  tiny=(--steps 4 --epochs 1 --batch-size 8 --max-tokens 32 --evaluation-triplets 64 --warmup-triplets 0)
else
  TEACHER_MINUTES=${TEACHER_MINUTES:-3} STUDENT_MINUTES=${STUDENT_MINUTES:-2}
  SCB_ARTICLES=${SCB_ARTICLES:-100} EVAL_TRIPLETS=${EVAL_TRIPLETS:-none} TEACHER_LAYERS=${TEACHER_LAYERS:-}
  PEAK_TFLOPS=${PEAK_TFLOPS:-$([ "$PRECISION" = bfloat16 ] && echo 989 || echo 495)}   # H200 dense: bf16, TF32
  INPUT_WORKERS=${INPUT_WORKERS:-$(($(nproc) - 1))}
  tiny=()
fi
[ -e "$OUT" ] && [ -n "$(ls -A "$OUT")" ] && { echo "error: $OUT is not empty: give a new folder" >&2; exit 2; }
mkdir -p "$OUT"
printf 'stage\tseconds\n' > "$OUT/stages.tsv"

stage() {   # stage NAME COMMAND...: runs it, its output in OUT/NAME.log, its seconds in OUT/stages.tsv
  local name=$1 started=$SECONDS
  shift
  echo "[$(date +%H:%M:%S)] $name: $*"
  if ! "$@" > "$OUT/$name.log" 2>&1; then
    echo "error: stage $name failed: see $OUT/$name.log" >&2
    tail -n 5 "$OUT/$name.log" >&2
    exit 1
  fi
  printf '%s\t%s\n' "$name" $((SECONDS - started)) >> "$OUT/stages.tsv"
}

DATA=${DATA:-}
if [ -z "$DATA" ]; then
  DATA=$OUT/data
  stage data "$PY" -m pipeline.run --output "$DATA" ${INPUT:+--input "$INPUT"}
fi
models=$OUT/models
# infra.recipe prints the flags shell-quoted; a failed one ends the script here (an assignment, under set -e)
flags=$("$PY" -m infra.recipe mpnet-sen --machine gpu --budget-minutes "$TEACHER_MINUTES" --models "$models")
eval "teacher_recipe=($flags)"
flags=$("$PY" -m infra.recipe mpnet-distilled --machine gpu --budget-minutes "$STUDENT_MINUTES" --models "$models")
eval "student_recipe=($flags)"
common=(--data "$DATA" --backend jax --precision "$PRECISION" --progress false)
stage teacher "$PY" -m model.train "${common[@]}" --model-dir "$models/mpnet-sen" "${teacher_recipe[@]}" \
  ${TEACHER_LAYERS:+--transformer-layers "$TEACHER_LAYERS" --frozen-layers 0} \
  ${MPNET_CHECKPOINT:+--checkpoint "$MPNET_CHECKPOINT"} --input-workers "$INPUT_WORKERS" ${tiny[@]+"${tiny[@]}"}
stage student "$PY" -m model.train "${common[@]}" --model-dir "$models/mpnet-distilled" "${student_recipe[@]}" ${tiny[@]+"${tiny[@]}"}
stage export "$PY" -m model.export --model-dir "$models/mpnet-distilled" --format onnx --quantize int8 \
  --output "$OUT/student-int8"
methods=(--encoder "saved:teacher=$models/mpnet-sen" --encoder "onnx:student-int8=$OUT/student-int8")
stage triplets "$PY" -m eval.triplets --data "$DATA" --output "$OUT/triplets" "${methods[@]}" --max-triplets "$EVAL_TRIPLETS"
stage scb "$PY" -m eval.scb --data "$DATA" --output "$OUT/scb" "${methods[@]}" --max-articles "$SCB_ARTICLES"
"$PY" -m infra.accelerator.summary --out "$OUT" --peak-tflops "$PEAK_TFLOPS"
exit
}
