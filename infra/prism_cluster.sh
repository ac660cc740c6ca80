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
set -uo pipefail   # not -e: `wait -n` returns the status of the part that ended, handled below
cd "$(dirname "$0")/.."
JOB_PORT=${1:-8073}
POOL_PORT=${2:-50000}
PY=${PY:-.venv/bin/python}
error() { echo "error: $*" >&2; exit 2; }
PRISM=.cache/prism/v$("$PY" -c "import apache_beam; print(apache_beam.__version__)")/prism
[ -x "$PRISM" ] || error "no Prism binary at $PRISM (make prism builds it)"
listening() { "$PY" -c "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1)" "$1" 2>/dev/null; }
# A port already taken: Prism printed this script's ready line, then panicked.
for port in "$JOB_PORT" "$POOL_PORT"; do
  listening "$port" && error "port $port: something already listens on 127.0.0.1:$port"
done
export PATH="$(cd "$(dirname "$PY")" && pwd):$PATH"

pids=()
stop() { trap - INT TERM EXIT; kill "${pids[@]}" 2>/dev/null; wait; }
trap stop INT TERM EXIT
"$PRISM" --job_port "$JOB_PORT" --serve_http=false --log_level warn &
pids+=($!)
python -m apache_beam.runners.worker.worker_pool_main --service_port="$POOL_PORT" &
pids+=($!)
# Ready once both listen (a part that dies first ends it).
deadline=$((SECONDS + 60))
until listening "$JOB_PORT" && listening "$POOL_PORT"; do
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "error: a part of the set-up exited while starting" >&2; exit 1; }
  done
  (( SECONDS < deadline )) || { echo "error: the set-up did not listen on $JOB_PORT and $POOL_PORT within 60 s" >&2; exit 1; }
  sleep 0.2
done
echo "prism job server: localhost:$JOB_PORT (pid ${pids[0]}), SDK worker pool: localhost:$POOL_PORT (pid ${pids[1]})" >&2
wait -n
echo "error: a part of the set-up exited; stopping the other" >&2
exit 1
