#!/usr/bin/env bash
# Private MariaDB server on 127.0.0.1 for asyncd e2e tests.
#   mariadb.sh start|stop|restart|status|url|createdb NAME|dropdbs PREFIX...|reset
# See README.md in this folder.
set -euo pipefail

SERVICE=mariadb
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=_lib.sh
. "$HERE/_lib.sh"

PORT="${ASYNCD_MARIADB_PORT:-13306}"
USER_NAME=asyncd
USER_PASS=asyncd
TIMEOUT="${ASYNCD_SERVICE_TIMEOUT:-90}"
# InnoDB reads through its own buffer pool, not the page cache (O_DIRECT): with the
# default 128M, a soak of 10^6 tasks (a tasks table near 2 GB) read its indexes from disk
# and dispatch collapsed to 190-250 tasks/s. Memory is taken as pages are used.
BUFFER_POOL="${ASYNCD_MARIADB_BUFFER_POOL:-2G}"

RUN_DIR="$ASYNCD_RUN/mariadb"
DATA_DIR="$RUN_DIR/data"
CNF="$RUN_DIR/my.cnf"
PID_FILE="$RUN_DIR/mariadbd.pid"
LOG_FILE="$RUN_DIR/mariadbd.log"
INIT_MARK="$RUN_DIR/.initialized"
SOCK="$RUN_DIR/mariadbd.sock"
# unix socket paths are limited to ~107 bytes
if (( ${#SOCK} > 100 )); then SOCK="/tmp/asyncd-mariadb-$PORT.sock"; fi

MARIADBD=/usr/sbin/mariadbd

url() { echo "mysql://$USER_NAME:$USER_PASS@$HOST:$PORT"; }

# root over the private unix socket (unix_socket auth, we are OS root)
sql_root() { mariadb --no-defaults --protocol=socket --socket="$SOCK" -uroot --batch --skip-column-names "$@"; }

ensure_installed() {
  apt_install_if_missing "$MARIADBD" mariadb-server mariadb-client
  command -v mariadb >/dev/null || die "mariadb client missing"
}

write_cnf() {
  mkdir -p "$RUN_DIR"
  cat >"$CNF" <<EOF
[mariadbd]
user = root
datadir = $DATA_DIR
socket = $SOCK
port = $PORT
bind-address = $HOST
pid-file = $PID_FILE
log-error = $LOG_FILE
skip-name-resolve
skip-log-bin
character-set-server = utf8mb4
collation-server = utf8mb4_unicode_ci
max_connections = 500
innodb_buffer_pool_size = $BUFFER_POOL
innodb_log_file_size = 64M
innodb_flush_log_at_trx_commit = 2
innodb_use_native_aio = 0
performance_schema = OFF
EOF
}

server_pid() {
  pid_of "$PID_FILE" "$CNF" && return 0
  # pid file missing/stale: look for our server by its config path
  local pid
  pid="$(pgrep -f -- "--defaults-file=$CNF" 2>/dev/null | head -n1 || true)"
  if proc_matches "$pid" "$CNF"; then echo "$pid"; return 0; fi
  return 1
}

is_ready() { mariadb-admin --no-defaults --protocol=socket --socket="$SOCK" -uroot --connect-timeout=2 ping >/dev/null 2>&1; }

is_running() { server_pid >/dev/null && is_ready; }

init_datadir() {
  log "initializing data dir $DATA_DIR"
  rm -rf "$DATA_DIR" "$INIT_MARK"
  mkdir -p "$DATA_DIR"
  if ! mariadb-install-db --defaults-file="$CNF" --user=root --skip-test-db \
        --auth-root-authentication-method=socket >"$RUN_DIR/install-db.log" 2>&1; then
    show_log_tail "$RUN_DIR/install-db.log"
    die "mariadb-install-db failed"
  fi
}

launch_and_wait() {
  : >>"$LOG_FILE"
  local log_start; log_start=$(wc -l <"$LOG_FILE")
  # setsid + redirects: detach from the caller's session and pipes; 9>&- drops our lock fd
  setsid "$MARIADBD" --defaults-file="$CNF" </dev/null >>"$LOG_FILE" 2>&1 9>&- &
  local pid=$! deadline=$(( $(now_s) + TIMEOUT ))
  while :; do
    if is_ready; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      log "mariadbd exited during startup"
      tail -n +"$((log_start + 1))" "$LOG_FILE" | tail -n 40 >&2 || true
      return 1
    fi
    if (( $(now_s) >= deadline )); then
      log "mariadbd not ready after ${TIMEOUT}s"
      show_log_tail "$LOG_FILE"
      kill_pid "$pid" 20
      return 1
    fi
    sleep 0.2
  done
}

setup_user() {
  sql_root <<EOF
CREATE USER IF NOT EXISTS '$USER_NAME'@'%' IDENTIFIED BY '$USER_PASS';
CREATE USER IF NOT EXISTS '$USER_NAME'@'localhost' IDENTIFIED BY '$USER_PASS';
ALTER USER '$USER_NAME'@'%' IDENTIFIED BY '$USER_PASS';
ALTER USER '$USER_NAME'@'localhost' IDENTIFIED BY '$USER_PASS';
GRANT ALL PRIVILEGES ON *.* TO '$USER_NAME'@'%' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '$USER_NAME'@'localhost' WITH GRANT OPTION;
FLUSH PRIVILEGES;
EOF
}

start() {
  local t0=$EPOCHREALTIME
  if is_running; then log "already running on $HOST:$PORT (pid $(server_pid))"; return 0; fi
  ensure_installed
  # a server of ours that is alive but not answering: stop it first
  local old; if old="$(server_pid)"; then log "stale mariadbd pid $old not answering; stopping it"; kill_pid "$old" 30; fi
  if port_open "$PORT" "$HOST"; then die "port $HOST:$PORT is in use by another process (set ASYNCD_MARIADB_PORT)"; fi
  rm -f "$PID_FILE" "$SOCK"
  write_cnf
  local fresh=0
  if [[ ! -f "$INIT_MARK" || ! -d "$DATA_DIR/mysql" ]]; then init_datadir; fresh=1; fi
  log "starting mariadbd on $HOST:$PORT (data $DATA_DIR)"
  if ! launch_and_wait; then
    (( fresh )) && die "mariadbd failed to start (log: $LOG_FILE)"
    # data dir left by an earlier run may be damaged (e.g. machine reset): it only holds
    # throwaway test databases, so re-create it once.
    log "WARNING: start on the existing data dir failed; re-initializing it"
    init_datadir
    launch_and_wait || die "mariadbd failed to start (log: $LOG_FILE)"
  fi
  setup_user
  touch "$INIT_MARK"
  log "ready in $(elapsed "$t0"): $(url)"
}

stop() {
  local pid
  if ! pid="$(server_pid)"; then log "not running"; rm -f "$PID_FILE"; return 0; fi
  log "stopping mariadbd (pid $pid)"
  mariadb-admin --no-defaults --protocol=socket --socket="$SOCK" -uroot shutdown >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
  if ! wait_pid_exit "$pid" 60; then kill_pid "$pid" 5; fi
  rm -f "$PID_FILE"
  log "stopped"
}

createdb() {
  local name="${1:-}"; [[ -n "$name" ]] || die "usage: $0 createdb NAME"
  valid_name "$name"
  is_running || start
  sql_root -e "DROP DATABASE IF EXISTS \`$name\`; CREATE DATABASE \`$name\` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;"
  echo "$(url)/$name"
}

# Drops every database whose name starts with one of the PREFIXes: the test suites
# create a database per test and do not drop it (a failing test's data is worth
# reading), so the test command clears the earlier runs' before it starts.
dropdbs() {
  [[ $# -gt 0 ]] || die "usage: $0 dropdbs PREFIX..."
  local prefix name dropped=0
  is_running || start
  for prefix in "$@"; do
    valid_name "$prefix"
    while read -r name; do
      [[ -n "$name" ]] || continue
      sql_root -e "DROP DATABASE IF EXISTS \`$name\`"
      dropped=$((dropped + 1))
    done < <(sql_root -e "SELECT schema_name FROM information_schema.schemata WHERE LEFT(schema_name, ${#prefix}) = '$prefix'")
  done
  log "dropped $dropped databases named $*"
}

status() {
  if is_running; then echo "running pid=$(server_pid) $(url)"; else echo "stopped"; return 1; fi
}

cmd="${1:-}"; shift || true
case "$cmd" in
  url) url ;;
  start) with_lock mariadb; start ;;
  stop) with_lock mariadb; stop ;;
  restart) with_lock mariadb; stop; start ;;
  status) status ;;
  createdb) with_lock mariadb; createdb "$@" ;;
  dropdbs) with_lock mariadb; dropdbs "$@" ;;
  reset) with_lock mariadb; stop; rm -rf "$RUN_DIR"; log "removed $RUN_DIR" ;;
  *) echo "usage: $0 start|stop|restart|status|url|createdb NAME|reset" >&2; exit 2 ;;
esac
