#!/usr/bin/env bash
# Private PostgreSQL server on 127.0.0.1 for asyncd e2e tests.
#   postgres.sh start|stop|restart|status|url|createdb NAME|dropdbs PREFIX...|reset
# See README.md in this folder.
set -euo pipefail

SERVICE=postgres
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=_lib.sh
. "$HERE/_lib.sh"

PORT="${ASYNCD_POSTGRES_PORT:-15432}"
PG_MAJOR="${ASYNCD_PG_MAJOR:-15}"
USER_NAME=asyncd
USER_PASS=asyncd
TIMEOUT="${ASYNCD_SERVICE_TIMEOUT:-90}"
OS_USER=postgres

url() { echo "postgres://$USER_NAME:$USER_PASS@127.0.0.1:$PORT"; }

# The server runs as the postgres OS user, which must be able to reach its data dir.
# If it cannot get into $ASYNCD_RUN (e.g. ASYNCD_CACHE under /root), use /tmp.
pick_run_dir() {
  RUN_DIR="$ASYNCD_RUN/postgres"
  mkdir -p "$ASYNCD_RUN" 2>/dev/null || true
  if [[ -d "$ASYNCD_RUN" ]] && id "$OS_USER" >/dev/null 2>&1 && ! user_can_reach "$OS_USER" "$ASYNCD_RUN"; then
    RUN_DIR="/tmp/asyncd-postgres-$PORT"
  fi
  DATA_DIR="$RUN_DIR/data"
  LOG_FILE="$RUN_DIR/postgres.log"
  INIT_MARK="$RUN_DIR/.initialized"
  SOCK_DIR="$RUN_DIR"
  if (( ${#SOCK_DIR} > 90 )); then SOCK_DIR="/tmp"; fi
}

find_bin() {
  PG_BIN="${ASYNCD_PG_BIN:-/usr/lib/postgresql/$PG_MAJOR/bin}"
  if [[ ! -x "$PG_BIN/pg_ctl" ]]; then
    # fall back to the newest installed major version
    local d; d="$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n1)"
    [[ -n "$d" && -x "$d/pg_ctl" ]] && PG_BIN="$d"
  fi
}

ensure_installed() {
  find_bin
  if [[ ! -x "$PG_BIN/pg_ctl" ]]; then
    apt_install_if_missing "/usr/lib/postgresql/$PG_MAJOR/bin/pg_ctl" postgresql postgresql-client
    find_bin
  fi
  [[ -x "$PG_BIN/pg_ctl" ]] || die "pg_ctl not found under /usr/lib/postgresql/*/bin"
  command -v psql >/dev/null || die "psql missing"
  id "$OS_USER" >/dev/null 2>&1 || die "OS user $OS_USER missing"
}

as_pg() { runuser -u "$OS_USER" -- "$@"; }

# superuser over the private unix socket (trust auth for local connections)
sql_super() { PGOPTIONS="-c client_min_messages=warning" psql -X -q -v ON_ERROR_STOP=1 -h "$SOCK_DIR" -p "$PORT" -U postgres -d postgres -At "$@"; }

server_pid() {
  local pid
  pid="$(head -n1 "$DATA_DIR/postmaster.pid" 2>/dev/null || true)"
  if proc_matches "$pid" "$DATA_DIR"; then echo "$pid"; return 0; fi
  return 1
}

is_ready() { pg_isready -q -h "$SOCK_DIR" -p "$PORT" -t 2 >/dev/null 2>&1; }

is_running() { server_pid >/dev/null && is_ready; }

init_datadir() {
  log "initializing data dir $DATA_DIR ($PG_BIN)"
  rm -rf "$DATA_DIR" "$INIT_MARK"
  install -d -o "$OS_USER" -g "$OS_USER" -m 0700 "$RUN_DIR"
  if ! as_pg "$PG_BIN/initdb" -D "$DATA_DIR" -U postgres -E UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 --no-sync >"$RUN_DIR/initdb.log" 2>&1; then
    show_log_tail "$RUN_DIR/initdb.log"
    die "initdb failed"
  fi
  echo "include_if_exists = 'asyncd.conf'" >>"$DATA_DIR/postgresql.conf"
}

write_conf() {
  # rewritten at every start so port/socket changes apply
  cat >"$DATA_DIR/asyncd.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$SOCK_DIR'
max_connections = 300
shared_buffers = 128MB
# throwaway test data: durability across an OS crash is not needed, but a killed
# server must keep committed rows (commit still write()s WAL), so synchronous_commit stays on
fsync = off
full_page_writes = off
logging_collector = off
log_min_messages = warning
EOF
  chown "$OS_USER:$OS_USER" "$DATA_DIR/asyncd.conf"
}

launch_and_wait() {
  # a postmaster.pid left by a dead server (or one whose pid is now reused) blocks the start
  if [[ -f "$DATA_DIR/postmaster.pid" ]] && ! server_pid >/dev/null; then
    rm -f "$DATA_DIR/postmaster.pid"
  fi
  # same for the socket lock file (a killed server leaves it behind)
  local lock="$SOCK_DIR/.s.PGSQL.$PORT.lock" lpid
  if [[ -f "$lock" ]]; then
    lpid="$(head -n1 "$lock" 2>/dev/null || true)"
    if ! proc_matches "$lpid" postgres; then rm -f "$lock" "$SOCK_DIR/.s.PGSQL.$PORT"; fi
  fi
  : >>"$LOG_FILE"; chown "$OS_USER:$OS_USER" "$LOG_FILE"
  local log_start; log_start=$(wc -l <"$LOG_FILE")
  # pg_ctl -w polls for readiness itself, with our deadline; 9>&- drops our lock fd
  if as_pg "$PG_BIN/pg_ctl" -D "$DATA_DIR" -l "$LOG_FILE" -w -t "$TIMEOUT" start </dev/null >/dev/null 2>&1 9>&-; then
    local deadline=$(( $(now_s) + 10 ))
    until is_ready; do (( $(now_s) < deadline )) || break; sleep 0.2; done
    is_ready && return 0
  fi
  log "postgres failed to start"
  tail -n +"$((log_start + 1))" "$LOG_FILE" | tail -n 40 >&2 || true
  local pid; if pid="$(server_pid)"; then kill_pid "$pid" 20; fi
  return 1
}

setup_user() {
  sql_super <<EOF
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$USER_NAME') THEN
    CREATE ROLE $USER_NAME LOGIN CREATEDB PASSWORD '$USER_PASS';
  ELSE
    ALTER ROLE $USER_NAME LOGIN CREATEDB PASSWORD '$USER_PASS';
  END IF;
END
\$\$;
EOF
}

start() {
  local t0=$EPOCHREALTIME
  if is_running; then log "already running on 127.0.0.1:$PORT (pid $(server_pid))"; return 0; fi
  ensure_installed
  local old; if old="$(server_pid)"; then log "stale postgres pid $old not answering; stopping it"; kill_pid "$old" 30; fi
  if port_open "$PORT" "$HOST"; then die "port 127.0.0.1:$PORT is in use by another process (set ASYNCD_POSTGRES_PORT)"; fi
  local fresh=0
  if [[ ! -f "$INIT_MARK" || ! -f "$DATA_DIR/PG_VERSION" ]] || \
     [[ "$(cat "$DATA_DIR/PG_VERSION")" != "$(basename "$(dirname "$PG_BIN")")" ]]; then
    init_datadir; fresh=1
  fi
  write_conf
  log "starting postgres on 127.0.0.1:$PORT (data $DATA_DIR)"
  if ! launch_and_wait; then
    (( fresh )) && die "postgres failed to start (log: $LOG_FILE)"
    # data dir left by an earlier run may be damaged (fsync=off + machine reset): it only
    # holds throwaway test databases, so re-create it once.
    log "WARNING: start on the existing data dir failed; re-initializing it"
    init_datadir; write_conf
    launch_and_wait || die "postgres failed to start (log: $LOG_FILE)"
  fi
  setup_user
  touch "$INIT_MARK"
  log "ready in $(elapsed "$t0"): $(url)"
}

stop() {
  local pid
  if ! pid="$(server_pid)"; then log "not running"; return 0; fi
  find_bin
  log "stopping postgres (pid $pid)"
  as_pg "$PG_BIN/pg_ctl" -D "$DATA_DIR" -m fast -w -t 60 stop </dev/null >/dev/null 2>&1 || true
  if kill -0 "$pid" 2>/dev/null; then kill_pid "$pid" 10; fi
  log "stopped"
}

createdb() {
  local name="${1:-}"; [[ -n "$name" ]] || die "usage: $0 createdb NAME"
  valid_name "$name"
  is_running || start
  sql_super -c "DROP DATABASE IF EXISTS \"$name\" WITH (FORCE)" \
            -c "CREATE DATABASE \"$name\" OWNER $USER_NAME"
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
      sql_super -c "DROP DATABASE IF EXISTS \"$name\" WITH (FORCE)"
      dropped=$((dropped + 1))
    done < <(sql_super -c "SELECT datname FROM pg_database WHERE starts_with(datname, '$prefix')")
  done
  log "dropped $dropped databases named $*"
}

status() {
  if is_running; then echo "running pid=$(server_pid) $(url)"; else echo "stopped"; return 1; fi
}

pick_run_dir
cmd="${1:-}"; shift || true
case "$cmd" in
  url) url ;;
  start) with_lock postgres; start ;;
  stop) with_lock postgres; stop ;;
  restart) with_lock postgres; stop; start ;;
  status) status ;;
  createdb) with_lock postgres; createdb "$@" ;;
  dropdbs) with_lock postgres; dropdbs "$@" ;;
  reset) with_lock postgres; stop; rm -rf "$RUN_DIR"; log "removed $RUN_DIR" ;;
  *) echo "usage: $0 start|stop|restart|status|url|createdb NAME|dropdbs PREFIX...|reset" >&2; exit 2 ;;
esac
