#!/usr/bin/env bash
# The local Prefect stack: a Prefect server on 127.0.0.1 (SQLite), the `process` work pool, the
# deployments of prefect.yaml and a worker, all in the background with pid files and logs.
#
#   infra/prefect_stack.sh start     # server + pool + "gpu" concurrency limit + deploy --all + worker
#   infra/prefect_stack.sh status    # what runs, where the logs are
#   infra/prefect_stack.sh env       # export lines for this stack: eval "$(infra/prefect_stack.sh env)"
#   infra/prefect_stack.sh stop      # stop the worker and the server (their process groups)
#
# Settings (environment):
#   MEMAGENT_PREFECT_DIR   state dir: PREFECT_HOME, SQLite db, logs, pids (default runs/prefect)
#   MEMAGENT_PREFECT_PORT  server port on 127.0.0.1 (default 4200)
#   MEMAGENT_GPU_SLOTS     GPU-stage slots of the "gpu" tag concurrency limit (default 1)
#   PYTHON                 interpreter with prefect installed (default .venv/bin/python)
# Analytics are off and nothing listens beyond 127.0.0.1 (there is no network here).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"  # prefect.yaml's pull step records this directory ({{ $PWD }})
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
STATE="$(mkdir -p "${MEMAGENT_PREFECT_DIR:-$REPO/runs/prefect}" && cd "${MEMAGENT_PREFECT_DIR:-$REPO/runs/prefect}" && pwd)"
PORT="${MEMAGENT_PREFECT_PORT:-4200}"
POOL="memagent-process"  # the work pool named in prefect.yaml
GPU_SLOTS="${MEMAGENT_GPU_SLOTS:-1}"

export PREFECT_HOME="$STATE/home"
export PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_API_DATABASE_CONNECTION_URL="sqlite+aiosqlite:///$STATE/prefect.db"
export PREFECT_SERVER_API_HOST=127.0.0.1
export PREFECT_SERVER_API_PORT="$PORT"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_UI_ENABLED="${PREFECT_UI_ENABLED:-true}"
export PREFECT_WORKER_QUERY_SECONDS="${PREFECT_WORKER_QUERY_SECONDS:-5}"
# Flow runs (worker subprocesses) may start a local Ray: loopback only, no usage stats, no hub.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PREFECT=("$PYTHON" -m prefect)

log() { echo "prefect-stack: $*" >&2; }

alive() { [[ -f "$STATE/$1.pid" ]] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

# A new session (setsid) per service, so `stop` ends the service and every process it started
# (uvicorn, flow-run subprocesses, a Ray they started) by process group, and nothing else.
spawn() {
  local name="$1"; shift
  setsid "$@" >"$STATE/$name.log" 2>&1 < /dev/null &
  echo $! >"$STATE/$name.pid"
}

wait_healthy() {
  local deadline=$((SECONDS + ${1:-120}))
  until "$PYTHON" - "$PREFECT_API_URL" <<'EOF' 2>/dev/null; do
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/health", timeout=2).read()
EOF
    alive server || { log "server exited; see $STATE/server.log"; tail -n 20 "$STATE/server.log" >&2; return 1; }
    (( SECONDS < deadline )) || { log "server not healthy after ${1:-120}s; see $STATE/server.log"; return 1; }
    sleep 1
  done
}

start() {
  mkdir -p "$PREFECT_HOME"
  if alive server; then
    log "server already running (pid $(cat "$STATE/server.pid"))"
  else
    log "starting the server on 127.0.0.1:$PORT (db $STATE/prefect.db)"
    spawn server "${PREFECT[@]}" server start --host 127.0.0.1 --port "$PORT"
  fi
  wait_healthy 180
  "${PREFECT[@]}" work-pool inspect "$POOL" >/dev/null 2>&1 \
    || "${PREFECT[@]}" work-pool create "$POOL" --type process >/dev/null
  # Tag concurrency limit: at most GPU_SLOTS task runs tagged "gpu" hold the accelerators at once.
  "${PREFECT[@]}" concurrency-limit inspect gpu >/dev/null 2>&1 \
    || "${PREFECT[@]}" concurrency-limit create gpu "$GPU_SLOTS" >/dev/null
  log "deploying prefect.yaml"
  "${PREFECT[@]}" --no-prompt deploy --all >"$STATE/deploy.log" 2>&1 \
    || { log "deploy failed; see $STATE/deploy.log"; tail -n 30 "$STATE/deploy.log" >&2; return 1; }
  if alive worker; then
    log "worker already running (pid $(cat "$STATE/worker.pid"))"
  else
    spawn worker "${PREFECT[@]}" worker start --pool "$POOL" --type process
  fi
  sleep 2
  alive worker || { log "worker exited; see $STATE/worker.log"; tail -n 20 "$STATE/worker.log" >&2; return 1; }
  log "up: UI/API http://127.0.0.1:$PORT, pool $POOL, logs in $STATE"
  log "next: eval \"\$(infra/prefect_stack.sh env)\"; prefect deployment run 'batch-qa/nightly' --watch"
}

stop_one() {
  local name="$1" pid
  [[ -f "$STATE/$name.pid" ]] || return 0
  pid="$(cat "$STATE/$name.pid")"
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $name (process group $pid)"
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$STATE/$name.pid"
}

stop() { stop_one worker; stop_one server; }

status() {
  for name in server worker; do
    if alive "$name"; then echo "$name: running (pid $(cat "$STATE/$name.pid")), log $STATE/$name.log"
    else echo "$name: stopped"; fi
  done
  echo "api: $PREFECT_API_URL"
}

env_lines() {
  echo "export PREFECT_HOME='$PREFECT_HOME'"
  echo "export PREFECT_API_URL='$PREFECT_API_URL'"
  echo "export PREFECT_SERVER_ANALYTICS_ENABLED=false"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) env_lines ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
