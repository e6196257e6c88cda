# shellcheck shell=bash
# Helpers shared by the e2e scripts (e2e/*.sh, e2e/services, e2e/controlplane,
# e2e/cluster) and sdk/test.sh. Sourced, not executed, from the script's own folder:
#   # shellcheck source=e2e/lib.sh
#   source "$root/e2e/lib.sh"
# Sourcing it only defines functions (no variables, no shell options): each script keeps
# its own settings.

# ------------------------------------------------------------------------ checks

# check NAME CMD...: runs CMD and prints `ok   - NAME`, or `FAIL - NAME` and the last 40
# lines of CMD's output, counting it in the caller's $passed or $failed. Lines of a
# passing CMD's output that match $CHECK_SHOWS (an extended regex), when the caller sets
# it, are shown too: the summaries a check gives of itself.
check() {
  local name=$1; shift
  local out
  if out=$("$@" 2>&1); then
    passed=$((passed + 1)); echo "ok   - $name"
    if [[ -n ${CHECK_SHOWS:-} ]]; then
      grep -E "$CHECK_SHOWS" <<<"$out" | sed 's/^/       /' || true
    fi
  else
    failed=$((failed + 1)); echo "FAIL - $name"
    printf '%s\n' "$out" | tail -n 40 | sed 's/^/       /'
  fi
}

# wait_for [--pid PID] [--what WHAT] SECONDS CMD...: runs CMD every 0.2 s until it
# succeeds. Fails after SECONDS, or as soon as process PID (the one that should come up)
# has exited, saying so on stderr with CMD's last output. WHAT names what is awaited in
# that message (default: CMD).
wait_for() {
  local pid="" what=""
  while [[ $1 == --* ]]; do
    case $1 in
      --pid) pid=$2 ;;
      --what) what=$2 ;;
      *) echo "wait_for: unknown option $1" >&2; return 2 ;;
    esac
    shift 2
  done
  local seconds=$1; shift
  what=${what:-$*}
  local deadline=$((SECONDS + seconds)) out
  until out=$("$@" 2>&1); do
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
      echo "process $pid exited while waiting for $what" >&2
      [[ -z $out ]] || printf '%s\n' "$out" >&2
      return 1
    fi
    if ((SECONDS >= deadline)); then
      echo "timed out after ${seconds}s waiting for $what" >&2
      [[ -z $out ]] || printf '%s\n' "$out" >&2
      return 1
    fi
    sleep 0.2
  done
}

# free_port: a TCP port on 127.0.0.1 that nothing listens on (now)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ------------------------------------------------------------------------- tools

# asyncd_bin: the asyncd binary to test: $ASYNCD_BIN, else the debug build in
# $CARGO_TARGET_DIR, built first when it is not there.
asyncd_bin() {
  local bin=${ASYNCD_BIN:-$CARGO_TARGET_DIR/debug/asyncd}
  if [[ ! -x $bin ]]; then
    (cd "$(dirname "${BASH_SOURCE[0]}")/.." && cargo build -q -p asyncd --locked >&2)
  fi
  echo "$bin"
}

# python_venv DIR NAME VERSION MODULE: a virtualenv in DIR with NAME==VERSION from PyPI,
# made once: kept while its python imports MODULE.
python_venv() {
  local dir=$1 name=$2 version=$3 module=$4
  if [[ -x $dir/bin/python ]] && "$dir/bin/python" -c "import $module" 2>/dev/null; then
    return 0
  fi
  echo "installing $name $version into $dir" >&2
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/pip" install -q "$name==$version"
}

# go_env CMD...: CMD in the environment of our Go builds
go_env() { env GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOWORK=off CGO_ENABLED=0 "$@"; }

# machine: the line a benchmark's report starts with
machine() {
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
}

# ----------------------------------------------------- servers the scripts run

# log MESSAGE / die MESSAGE: to stderr, prefixed with $SERVICE (the caller's name for
# itself) and the time; die exits 1
log() { printf '[%s %s] %s\n' "${SERVICE:-svc}" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# now_s: wall-clock seconds (integer)
now_s() { date +%s; }

# elapsed START: seconds since START (an $EPOCHREALTIME value), e.g. "1.42s"
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2fs", b - a }'; }

# port_open PORT [HOST]: true if something accepts TCP connections on HOST (127.0.0.1):PORT
port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/${2:-127.0.0.1}/$1" 2>/dev/null; }

# proc_matches PID PATTERN: PID is alive (not a zombie) and its command line contains PATTERN
proc_matches() {
  local pid="$1" pat="$2" cmd
  [[ -n "$pid" && "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]] || return 1
  cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  [[ "$cmd" == *"$pat"* ]]
}

# pid_of PIDFILE PATTERN: prints the pid in PIDFILE if that process is ours and alive
pid_of() {
  local pid; pid="$(cat "$1" 2>/dev/null || true)"
  if proc_matches "$pid" "$2"; then echo "$pid"; return 0; fi
  return 1
}

# wait_pid_exit PID SECONDS: wait for PID to exit; returns 1 on timeout
wait_pid_exit() {
  local pid="$1" deadline=$(( $(now_s) + $2 ))
  while kill -0 "$pid" 2>/dev/null; do
    # a zombie child of ours counts as exited
    if [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" == Z ]]; then return 0; fi
    (( $(now_s) < deadline )) || return 1
    sleep 0.1
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

# with_lock NAME [SECONDS]: take an exclusive lock in $ASYNCD_RUN for the rest of the
# script (fd 9), waiting for it at most SECONDS (600). Children started in the background
# must close fd 9 (9>&-), or they keep it.
with_lock() {
  mkdir -p "$ASYNCD_RUN"
  exec 9>"$ASYNCD_RUN/.$1.lock"
  flock -w "${2:-600}" 9 || die "could not take lock $ASYNCD_RUN/.$1.lock"
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

# apt_install_if_missing CHECK PKG...: install Debian packages unless CHECK (a path, or a
# command on PATH) already exists. Runs apt-get update only when the plain install
# fails (no/stale package lists). Keeps postinst scripts from starting the
# system services (we never use them) via a temporary policy-rc.d.
apt_install_if_missing() {
  local check="$1"; shift
  installed "$check" && return 0
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
  installed "$check" || die "installed $* but $check is still missing"
}

# installed CHECK: CHECK (a path, or a command on PATH) exists
installed() {
  if [[ $1 == */* ]]; then [[ -e $1 ]]; else command -v "$1" >/dev/null 2>&1; fi
}
