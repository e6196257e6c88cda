#!/usr/bin/env bash
# Private Toxiproxy server (github.com/Shopify/toxiproxy) on 127.0.0.1 for asyncd tests:
# a TCP proxy whose links a test breaks on purpose (black holes, latency, bandwidth
# limits, resets) through its HTTP API. Tests create their own proxies; this script only
# runs the server.
#   toxiproxy.sh start|stop|restart|status|url|reset
# See README.md in this folder.
set -euo pipefail

SERVICE=toxiproxy
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=_lib.sh
. "$HERE/_lib.sh"

PORT="${ASYNCD_TOXIPROXY_PORT:-18474}"
VERSION="${ASYNCD_TOXIPROXY_VERSION:-v2.5.0}"
TIMEOUT="${ASYNCD_SERVICE_TIMEOUT:-90}"
MODULE=github.com/Shopify/toxiproxy/v2
BIN_DIR="$ASYNCD_CACHE/toxiproxy-$VERSION"
SERVER_BIN="$BIN_DIR/toxiproxy-server"
RUN_DIR="$ASYNCD_RUN/toxiproxy"
PID_FILE="$RUN_DIR/toxiproxy.pid"
LOG_FILE="$RUN_DIR/toxiproxy.log"

url() { echo "http://$HOST:$PORT"; }

# Built once per version with the local Go toolchain from the module proxy, as the other
# Go tools of the tests are (e2e/chart.sh, e2e/cluster.sh); `.complete` marks a finished
# build, so an interrupted one is redone.
ensure_built() {
  [[ -x "$SERVER_BIN" && -f "$BIN_DIR/.complete" ]] && return 0
  command -v go >/dev/null || die "go is needed to build toxiproxy $VERSION (apt-get install golang-go)"
  local t0=$EPOCHREALTIME
  log "building toxiproxy $VERSION into $BIN_DIR (once)"
  rm -rf "$BIN_DIR"; mkdir -p "$BIN_DIR/.build"
  if ! go_env GOBIN="$BIN_DIR/.build" go install -p 2 -trimpath \
      -ldflags "-s -w -X $MODULE.Version=$VERSION" \
      "$MODULE/cmd/server@$VERSION" "$MODULE/cmd/cli@$VERSION" >"$BIN_DIR/build.log" 2>&1; then
    show_log_tail "$BIN_DIR/build.log"
    die "building toxiproxy $VERSION failed"
  fi
  mv "$BIN_DIR/.build/server" "$SERVER_BIN"
  mv "$BIN_DIR/.build/cli" "$BIN_DIR/toxiproxy-cli"
  rmdir "$BIN_DIR/.build"
  printf 'go: %s\nbuilt: %s\n' "$(go version)" "$(date -u +%FT%TZ)" >"$BIN_DIR/BUILDINFO"
  touch "$BIN_DIR/.complete"
  log "built in $(elapsed "$t0")"
}

server_pid() { pid_of "$PID_FILE" toxiproxy-server; }

is_ready() { curl -fsS --max-time 2 "$(url)/version" >/dev/null 2>&1; }

is_running() { server_pid >/dev/null && is_ready; }

start() {
  local t0=$EPOCHREALTIME
  if is_running; then log "already running on $HOST:$PORT (pid $(server_pid))"; return 0; fi
  ensure_built
  local old; if old="$(server_pid)"; then log "stale toxiproxy pid $old not answering; stopping it"; kill_pid "$old" 10; fi
  if port_open "$PORT" "$HOST"; then die "port $HOST:$PORT is in use by another process (set ASYNCD_TOXIPROXY_PORT)"; fi
  mkdir -p "$RUN_DIR"
  [[ -f "$LOG_FILE" ]] && mv -f "$LOG_FILE" "$LOG_FILE.prev"
  log "starting toxiproxy $VERSION, API on $(url)"
  # setsid + redirects: detach from the caller's session and pipes; 9>&- drops our lock fd
  setsid "$SERVER_BIN" -host "$HOST" -port "$PORT" </dev/null >"$LOG_FILE" 2>&1 9>&- &
  local pid=$! deadline=$(( $(now_s) + TIMEOUT ))
  echo "$pid" >"$PID_FILE"
  until is_ready; do
    if ! kill -0 "$pid" 2>/dev/null; then
      show_log_tail "$LOG_FILE"; die "toxiproxy exited during startup"
    fi
    if (( $(now_s) >= deadline )); then
      show_log_tail "$LOG_FILE"; kill_pid "$pid" 10; die "toxiproxy not ready after ${TIMEOUT}s"
    fi
    sleep 0.2
  done
  log "ready in $(elapsed "$t0"): $(url)"
}

stop() {
  local pid
  if ! pid="$(server_pid)"; then log "not running"; rm -f "$PID_FILE"; return 0; fi
  log "stopping toxiproxy (pid $pid)"
  kill_pid "$pid" 10
  rm -f "$PID_FILE"
  log "stopped"
}

status() {
  if is_running; then echo "running pid=$(server_pid) $(url)"; else echo "stopped"; return 1; fi
}

cmd="${1:-}"; shift || true
case "$cmd" in
  url) url ;;
  start) with_lock toxiproxy; start ;;
  stop) with_lock toxiproxy; stop ;;
  restart) with_lock toxiproxy; stop; start ;;
  status) status ;;
  reset) with_lock toxiproxy; stop; rm -rf "$RUN_DIR"; log "removed $RUN_DIR" ;;
  *) echo "usage: $0 start|stop|restart|status|url|reset" >&2; exit 2 ;;
esac
