#!/usr/bin/env bash
# Private Redis server on 127.0.0.1 for asyncd benchmarks (e2e/bench.sh peers: BullMQ).
#   redis.sh start|stop|restart|status|url|pidfile|reset
# See README.md in this folder.
set -euo pipefail

SERVICE=redis
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=_lib.sh
. "$HERE/_lib.sh"

PORT="${ASYNCD_REDIS_PORT:-16379}"
TIMEOUT="${ASYNCD_SERVICE_TIMEOUT:-90}"
RUN_DIR="$ASYNCD_RUN/redis"
DATA_DIR="$RUN_DIR/data"
CONF="$RUN_DIR/redis.conf"
PID_FILE="$RUN_DIR/redis.pid"
LOG_FILE="$RUN_DIR/redis.log"

url() { echo "redis://$HOST:$PORT"; }

ensure_installed() {
  apt_install_if_missing /usr/bin/redis-server redis-server
  command -v redis-cli >/dev/null || die "redis-cli missing"
}

server_pid() { pid_of "$PID_FILE" redis-server; }

is_ready() { [[ "$(redis-cli -h "$HOST" -p "$PORT" ping 2>/dev/null)" == PONG ]]; }

is_running() { server_pid >/dev/null && is_ready; }

write_conf() {
  # rewritten at every start so port changes apply; throwaway benchmark data: no RDB
  # snapshots and no AOF, so nothing is written to disk behind the benchmark's back
  cat >"$CONF" <<CONF
bind $HOST
port $PORT
protected-mode yes
daemonize yes
pidfile $PID_FILE
logfile $LOG_FILE
dir $DATA_DIR
save ""
appendonly no
maxmemory-policy noeviction
CONF
}

start() {
  local t0=$EPOCHREALTIME
  if is_running; then log "already running on $HOST:$PORT (pid $(server_pid))"; return 0; fi
  ensure_installed
  local old; if old="$(server_pid)"; then log "stale redis pid $old not answering; stopping it"; kill_pid "$old" 30; fi
  if port_open "$PORT" "$HOST"; then die "port $HOST:$PORT is in use by another process (set ASYNCD_REDIS_PORT)"; fi
  mkdir -p "$DATA_DIR"
  write_conf
  log "starting redis on $HOST:$PORT (data $DATA_DIR)"
  : >>"$LOG_FILE"
  local log_start; log_start=$(wc -l <"$LOG_FILE")
  # 9>&- drops our lock fd, so the daemon does not keep it
  redis-server "$CONF" </dev/null >/dev/null 2>&1 9>&- || true
  local deadline=$(( $(now_s) + TIMEOUT ))
  until is_running; do
    if (( $(now_s) >= deadline )); then
      tail -n +"$((log_start + 1))" "$LOG_FILE" | tail -n 40 >&2 || true
      die "redis failed to start (log: $LOG_FILE)"
    fi
    sleep 0.2
  done
  log "ready in $(elapsed "$t0"): $(url)"
}

stop() {
  local pid
  if ! pid="$(server_pid)"; then log "not running"; return 0; fi
  log "stopping redis (pid $pid)"
  redis-cli -h "$HOST" -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
  if ! wait_pid_exit "$pid" 20; then kill_pid "$pid" 10; fi
  log "stopped"
}

status() {
  if is_running; then echo "running pid=$(server_pid) $(url)"; else echo "stopped"; return 1; fi
}

cmd="${1:-}"; shift || true
case "$cmd" in
  url) url ;;
  pidfile) echo "$PID_FILE" ;;
  start) with_lock redis; start ;;
  stop) with_lock redis; stop ;;
  restart) with_lock redis; stop; start ;;
  status) status ;;
  reset) with_lock redis; stop; rm -rf "$RUN_DIR"; log "removed $RUN_DIR" ;;
  *) echo "usage: $0 start|stop|restart|status|url|pidfile|reset" >&2; exit 2 ;;
esac
