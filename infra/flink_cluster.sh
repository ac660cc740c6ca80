#!/usr/bin/env bash
# A standalone Flink 1.16 session cluster on loopback, each part its own JVM: the JobManager (Flink's
# StandaloneSessionClusterEntrypoint) and TASKMANAGERS TaskManagers (TaskManagerRunner, one task slot
# each), from the jars `make flink` resolved (.cache/flink/lib: the Flink that Beam 2.50's runner was
# built against). Runs until Ctrl-C (or SIGTERM), which stops every part; a part that exits stops the
# rest (exit 1).
#
#   infra/flink_cluster.sh [REST_PORT] [TASKMANAGERS]      # defaults 8081 and 2
#
# then, from the repository root (docs/pipeline.md, "Flink"):
#
#   python -m pipeline.run --output OUT --runner FlinkRunner --flink_master=localhost:8081 --parallelism=2
#
# The launcher starts Beam's Flink job server for the run, which submits the job to this cluster;
# the SDK workers run in the launcher (LOOPBACK), which the TaskManagers reach on loopback.
# Flink's own start scripts (not served by Maven) would compute the memory and JVM flags: here the
# TaskManager's memory is spelt out in the generated flink-conf.yaml, every address is 127.0.0.1, and
# Java 17 gets the --add-opens Flink's scripts pass. Logs and configuration: the folder it prints.
set -uo pipefail   # not -e: `wait -n` returns the status of the part that ended, handled below
cd "$(dirname "$0")/.."
REST_PORT=${1:-8081}
TASKMANAGERS=${2:-2}
LIB=.cache/flink/lib
error() { echo "error: $*" >&2; exit 2; }
[[ $REST_PORT =~ ^[0-9]+$ ]] && (( REST_PORT > 0 && REST_PORT < 65536 )) || error "REST_PORT $REST_PORT: not a port"
[[ $TASKMANAGERS =~ ^[0-9]+$ ]] && (( TASKMANAGERS >= 1 )) || error "TASKMANAGERS $TASKMANAGERS: not a count >= 1"
# A port already taken would let the JobManager start, print nothing useful and die later.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
if python3 -c "import socket, sys; socket.create_connection(('127.0.0.1', $REST_PORT), 1)" 2>/dev/null; then
  error "REST_PORT $REST_PORT: something already listens on 127.0.0.1:$REST_PORT"
fi
[ -d "$LIB" ] || error "no Flink jars in $LIB (make flink resolves them)"
RPC_PORT=$(free_port)

STATE=$(mktemp -d -t wikisim-flink-cluster-XXXXXX)
mkdir -p "$STATE/conf" "$STATE/log" "$STATE/tmp"
cat > "$STATE/conf/flink-conf.yaml" <<EOF
jobmanager.rpc.address: 127.0.0.1
jobmanager.rpc.port: $RPC_PORT
jobmanager.bind-host: 127.0.0.1
rest.address: 127.0.0.1
rest.bind-address: 127.0.0.1
rest.port: $REST_PORT
blob.server.port: 0
taskmanager.host: 127.0.0.1
taskmanager.bind-host: 127.0.0.1
taskmanager.numberOfTaskSlots: 1
parallelism.default: 1
io.tmp.dirs: $STATE/tmp
# The TaskManagers load Beam from these same jars; the job server also ships them with each job, and
# child-first loading of that copy beside the parent's fails ("loader constraint violation").
classloader.resolve-order: parent-first
# A TaskManager's memory, every part given (no start script computes it): 512m heap, 512m network
# buffers (Flink's batch shuffle takes 512 buffers of 32 KB per result partition: 64m failed with
# "Insufficient number of network buffers", 256m with every negative strategy's outputs), 512m of direct
# memory for the task (Beam's gRPC data plane to the SDK workers: with none, the 2019 file failed
# with "OutOfMemoryError: Direct buffer memory"), 512m of managed memory (the batch sorts' buffers:
# with 128m a record of the triplet writers "exceeds the maximum size of a sort buffer").
taskmanager.cpu.cores: 1
taskmanager.memory.framework.heap.size: 128m
taskmanager.memory.task.heap.size: 384m
taskmanager.memory.managed.size: 512m
taskmanager.memory.network.min: 512m
taskmanager.memory.network.max: 512m
taskmanager.memory.framework.off-heap.size: 128m
taskmanager.memory.task.off-heap.size: 512m
taskmanager.memory.jvm-metaspace.size: 256m
taskmanager.memory.jvm-overhead.min: 192m
taskmanager.memory.jvm-overhead.max: 192m
EOF

# What Flink 1.16's scripts pass to a JVM on Java 17 (its reflection into the JDK).
JAVA_17=(--add-exports=java.base/sun.net.util=ALL-UNNAMED)
for package in java.lang java.net java.io java.nio sun.nio.ch java.lang.reflect java.text java.time java.util \
               java.util.concurrent java.util.concurrent.atomic java.util.concurrent.locks; do
  JAVA_17+=("--add-opens=java.base/$package=ALL-UNNAMED")
done
java_part() {   # java_part NAME HEAP DIRECT CLASS: one part of the cluster, in the background
  local name=$1 heap=$2 direct=$3 class=$4
  java "${JAVA_17[@]}" -Xms"$heap" -Xmx"$heap" -XX:MaxDirectMemorySize="$direct" -XX:MaxMetaspaceSize=256m \
    -Djava.io.tmpdir="$STATE/tmp" -Dlog.file="$STATE/log/$name.log" \
    -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$LIB/*" "$class" --configDir "$STATE/conf" \
    > "$STATE/log/$name.log" 2>&1 &
  pids+=($!)
}

pids=()
STOP_GRACE_S=20   # a part's shutdown after SIGTERM; then SIGKILL (three JVMs stopping on 2 busy cores took > 60 s)
alive() { local pid; for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }
stop() {
  trap - INT TERM EXIT
  kill "${pids[@]}" 2>/dev/null
  local deadline=$((SECONDS + STOP_GRACE_S))
  while alive && (( SECONDS < deadline )); do sleep 0.2; done
  kill -KILL "${pids[@]}" 2>/dev/null
  wait
}
trap 'stop; exit 0' INT TERM   # asked to stop: not an error
trap stop EXIT
java_part jobmanager 512m 128m org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint
for ((n = 1; n <= TASKMANAGERS; n++)); do
  # direct memory: framework off-heap 128m + task off-heap 512m + network 512m
  java_part "taskmanager-$n" 512m 1152m org.apache.flink.runtime.taskexecutor.TaskManagerRunner
done

# Ready once the JobManager's REST API lists every TaskManager (a part that dies first ends it).
deadline=$((SECONDS + 120))
until [ "$(curl -sf "http://127.0.0.1:$REST_PORT/taskmanagers" | python3 -c \
         'import json, sys; print(len(json.load(sys.stdin)["taskmanagers"]))' 2>/dev/null)" = "$TASKMANAGERS" ]; do
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "error: a part of the Flink cluster exited while starting; its logs: $STATE/log" >&2; exit 1; }
  done
  (( SECONDS < deadline )) || { echo "error: the Flink cluster did not list $TASKMANAGERS TaskManagers within 120 s; its logs: $STATE/log" >&2; exit 1; }
  sleep 0.5
done
echo "flink session cluster: http://127.0.0.1:$REST_PORT, $TASKMANAGERS TaskManagers (pids ${pids[*]}); logs and configuration in $STATE" >&2
wait -n
echo "error: a part of the Flink cluster exited; stopping the others (logs: $STATE/log)" >&2
exit 1
