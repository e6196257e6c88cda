# shellcheck shell=bash
# Shared helpers for e2e/services/*.sh. Sourced, not executed.

ASYNCD_CACHE="${ASYNCD_CACHE:-/var/cache/asyncd}"
# ASYNCD_SERVICES_RUN: another run dir, for a second instance (e2e/cluster.sh runs one in
# its network namespace); ASYNCD_SERVICE_HOST: the address to listen on and advertise.
ASYNCD_RUN="${ASYNCD_SERVICES_RUN:-${ASYNCD_CACHE}/run}"
HOST="${ASYNCD_SERVICE_HOST:-127.0.0.1}"

log() { printf '[%s %s] %s\n' "${SERVICE:-svc}" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# now_s: wall-clock seconds (integer)
now_s() { date +%s; }

# elapsed START: seconds since START (an $EPOCHREALTIME value), e.g. "1.42s"
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2fs", b - a }'; }

# port_open PORT: true if something accepts TCP connections on $HOST:PORT
port_open() {
  timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
}

# proc_matches PID PATTERN: PID is alive and its command line contains PATTERN
proc_matches() {
  local pid="$1" pat="$2" cmd
  [[ -n "$pid" && "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  [[ "$cmd" == *"$pat"* ]]
}

# wait_pid_exit PID SECONDS: wait for PID to exit; returns 1 on timeout
wait_pid_exit() {
  local pid="$1" deadline=$(( $(now_s) + $2 ))
  while kill -0 "$pid" 2>/dev/null; do
    # a zombie child of ours counts as exited
    if [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" == Z ]]; then return 0; fi
    (( $(now_s) < deadline )) || return 1
    sleep 0.2
  done
}

# kill_pid PID GRACE_SECONDS: SIGTERM, wait, then SIGKILL
kill_pid() {
  local pid="$1" grace="$2"
  kill -TERM "$pid" 2>/dev/null || return 0
  if ! wait_pid_exit "$pid" "$grace"; then
    log "pid $pid did not exit after ${grace}s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_pid_exit "$pid" 10 || true
  fi
}

# with_lock NAME: take an exclusive lock for the rest of the script (fd 9).
# Children started in the background must close fd 9 (9>&-), or they keep it.
with_lock() {
  mkdir -p "$ASYNCD_RUN"
  exec 9>"$ASYNCD_RUN/.$1.lock"
  flock -w 600 9 || die "could not take lock $ASYNCD_RUN/.$1.lock"
}

# apt_install_if_missing CHECK_PATH PKG...: install Debian packages unless
# CHECK_PATH already exists. Runs apt-get update only when the plain install
# fails (no/stale package lists). Keeps postinst scripts from starting the
# system services (we never use them) via a temporary policy-rc.d.
apt_install_if_missing() {
  local check="$1"; shift
  [[ -e "$check" ]] && return 0
  [[ $EUID -eq 0 ]] || die "need root to apt-get install $*"
  log "installing $* (apt)"
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  local rc=0
  export DEBIAN_FRONTEND=noninteractive
  local aopts=(-y -q -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
  if ! apt-get install "${aopts[@]}" --no-install-recommends "$@" >&2; then
    log "apt-get install failed; running apt-get update and retrying"
    apt-get update -q -o DPkg::Lock::Timeout=300 >&2 || true
    apt-get install "${aopts[@]}" --no-install-recommends "$@" >&2 || rc=$?
  fi
  if (( made_policy )); then rm -f /usr/sbin/policy-rc.d; fi
  (( rc == 0 )) || die "apt-get install $* failed (rc=$rc)"
  [[ -e "$check" ]] || die "installed $* but $check is still missing"
}

# user_can_reach USER DIR: USER can traverse into DIR
user_can_reach() {
  local user="$1" dir="$2"
  runuser -u "$user" -- test -x "$dir" 2>/dev/null
}

# show_log_tail FILE [N]
show_log_tail() {
  local f="$1" n="${2:-40}"
  if [[ -f "$f" ]]; then
    log "---- last $n lines of $f ----"
    tail -n "$n" "$f" >&2 || true
    log "---- end of $f ----"
  else
    log "(no log file at $f)"
  fi
}

valid_name() {
  [[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]{0,62}$ ]] || die "invalid name '$1' (use [A-Za-z_][A-Za-z0-9_]*, max 63 chars)"
}
