#!/usr/bin/env bash
# A standalone portable Beam set-up on loopback, each part its own process: Beam's Prism job server
# (`make prism` builds it) and a pool of Python SDK workers (Beam's worker_pool_main), which starts an
# SDK worker process per job environment. Runs until Ctrl-C (or SIGTERM), which stops both.
#
#   infra/prism_cluster.sh [JOB_PORT] [WORKER_POOL_PORT]       # defaults 8073 and 50000
#
# then, from the repository root (docs/pipeline.md, "Portable runners"):
#
#   python -m pipeline.run --output OUT --runner PrismRunner --job_endpoint localhost:8073 \
#     --environment_type EXTERNAL --environment_config localhost:50000
#
# The SDK workers import this checkout's packages (they start in the repository root) with the
# venv's Python (PY, default .venv/bin/python; worker_pool_main starts `python` from PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
JOB_PORT=${1:-8073}
POOL_PORT=${2:-50000}
PY=${PY:-.venv/bin/python}
PRISM=.cache/prism/v$("$PY" -c "import apache_beam; print(apache_beam.__version__)")/prism
if [ ! -x "$PRISM" ]; then
  echo "error: no Prism binary at $PRISM (make prism builds it)" >&2
  exit 2
fi
export PATH="$(cd "$(dirname "$PY")" && pwd):$PATH"

pids=()
stop() { trap - INT TERM EXIT; kill "${pids[@]}" 2>/dev/null || true; wait; }
trap stop INT TERM EXIT
"$PRISM" --job_port "$JOB_PORT" --serve_http=false --log_level warn &
pids+=($!)
python -m apache_beam.runners.worker.worker_pool_main --service_port="$POOL_PORT" &
pids+=($!)
echo "prism job server: localhost:$JOB_PORT (pid ${pids[0]}), SDK worker pool: localhost:$POOL_PORT (pid ${pids[1]})" >&2
wait -n
echo "error: a part of the set-up exited; stopping the other" >&2
exit 1
