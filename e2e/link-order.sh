#!/usr/bin/env bash
# The order in which the linker lays out the `asyncd` binary's functions
# (dispatcher/link-order.txt, read by dispatcher/build.rs).
#
#   link-order.sh generate   rebuild the list: run a release build's roles under
#                            callgrind (start-up, a few submits, the idle loops,
#                            shutdown) and keep the functions they ran, in that order
#   link-order.sh check BIN  fail when the list names too few of BIN's functions
#
# Why: a process's resident code is every page it ever touched, and the kernel maps
# the 64 KiB around each page fault. The functions an idle `asyncd` runs lie scattered
# over 24 MiB of code; laid out together they cost a third less resident memory
# (docs/benchmarks.md, "The code an idle asyncd runs, laid out together").
#
# The list names functions by their mangled names, whose hashes change with the
# toolchain, a dependency or its features; a name the binary no longer defines is
# skipped by the linker. `check` (in the README's test command) says when so many are
# gone that the list needs `generate` again.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIST="$ROOT/dispatcher/link-order.txt"
# Below this share of the list defined in the binary, `check` fails. A change to the
# store's trait left 91.8 % defined and cost the dispatcher 3 MiB of its 14 MiB idle
# (docs/benchmarks.md, "The link order decays with the code").
MIN_SHARE_PERCENT=97
# How long each role runs its idle loops under callgrind (about 50x slower than native).
IDLE_SECONDS=20

defined_functions() {
  nm --defined-only "$1" | awk '$2 ~ /^[tTwW]$/ { print $3 }' | sort -u
}

check() {
  local bin=$1 listed present
  [[ -x "$bin" ]] || { echo "link-order: no binary at $bin" >&2; exit 1; }
  listed=$(grep -c . "$LIST")
  present=$(sort -u "$LIST" | comm -12 - <(defined_functions "$bin") | wc -l)
  echo "link-order: $present of the $listed functions in $(basename "$LIST") are defined in $bin"
  if (( present * 100 < listed * MIN_SHARE_PERCENT )); then
    echo "link-order: fewer than $MIN_SHARE_PERCENT % (the toolchain or a dependency changed" \
      "their mangled names, or the code changed): run e2e/link-order.sh generate and commit the list" >&2
    exit 1
  fi
}

# wait_up BASE: until BASE/healthz answers.
wait_up() {
  local i
  for i in $(seq 1 600); do
    curl -fs "$1/healthz" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "link-order: $1 did not come up" >&2
  return 1
}

# exercise BASE: what a benchmark's asyncd does — tasks run through the executor, more
# submitted one by one and in a batch for later to a paused job — then idle.
exercise() {
  local base=$1 i
  : >"$WORK/calls"
  python3 -c 'import json; print(json.dumps({"tasks": [{"type": "run", "payload": {"n": i}} for i in range(500)]}))' |
    curl -fsS -XPOST "$base/v1/tasks:batch" -H 'content-type: application/json' --data-binary @- >/dev/null
  for i in $(seq 1 600); do
    (( $(wc -l <"$WORK/calls") >= 500 )) && break
    sleep 0.5
  done
  (( $(wc -l <"$WORK/calls") >= 500 )) ||
    { echo "link-order: the executor saw $(wc -l <"$WORK/calls") of 500 calls" >&2; return 1; }
  curl -fsS -XPOST "$base/v1/jobs/later/pause" >/dev/null
  for i in 1 2 3; do
    curl -fsS -XPOST "$base/v1/tasks" -H 'content-type: application/json' \
      -d '{"type":"later","payload":{"n":1},"delay":"1h"}' >/dev/null
    curl -fsS -XPOST "$base/v1/tasks" -H 'content-type: application/json' \
      -d "{\"type\":\"later\",\"payload\":{\"n\":1},\"delay\":\"1h\",\"idempotency_key\":\"k$i\"}" >/dev/null
  done
  python3 -c 'import json; print(json.dumps({"tasks": [{"type": "later", "payload": {"n": i}, "delay": "1h"} for i in range(300)]}))' |
    curl -fsS -XPOST "$base/v1/tasks:batch" -H 'content-type: application/json' --data-binary @- >/dev/null
  curl -fsS "$base/v1/jobs" >/dev/null
  curl -fsS "$base/metrics" >/dev/null
  sleep "$IDLE_SECONDS"
}

# profile NAME ARGS...: runs `asyncd ARGS...` under callgrind in the background.
profile() {
  local name=$1
  shift
  ASYNCD_LOG=warn valgrind --tool=callgrind --demangle=no \
    --callgrind-out-file="$WORK/$name.callgrind" "$BIN" "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=("$!")
}

# stop: SIGTERM to every profiled role (each writes its profile as it exits), then wait.
stop() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" || true; done
  PIDS=()
}

# The names of the functions a profile ran, in the order callgrind first lists them.
ran() {
  grep -oE '^c?fn=\([0-9]+\) .*' "$1" | sed -E 's/^c?fn=\([0-9]+\) //' | awk '!seen[$0]++'
}

generate() {
  command -v valgrind >/dev/null || { echo "link-order: valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
  WORK=$(mktemp -d)
  PIDS=()
  EXECUTOR=""
  trap 'stop; [[ -z $EXECUTOR ]] || kill "$EXECUTOR"; rm -rf "$WORK"' EXIT
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
  (cd "$ROOT" && cargo build --release --locked -p asyncd --bin asyncd)
  BIN="$CARGO_TARGET_DIR/release/asyncd"
  local dev=47311 api=47312 dispatcher=47313 executor=47314 store job
  python3 "$ROOT/e2e/noop_executor.py" "$executor" "$WORK/calls" &
  EXECUTOR=$!
  mkdir -p "$WORK/jobs"
  for job in run later; do
    printf '%s\n' "apiVersion: asyncd.example.io/v1" "kind: AsyncJobConfig" \
      "metadata: {name: $job}" "spec:" "  taskType: $job" \
      "  executor: {url: 'http://127.0.0.1:$executor/', timeout: 30s}" \
      "  concurrency: 64" >"$WORK/jobs/$job.yaml"
  done
  profile dev dev --config "$WORK/jobs" --listen "127.0.0.1:$dev" --db "$WORK/dev.db"
  wait_up "http://127.0.0.1:$dev"
  exercise "http://127.0.0.1:$dev"
  stop

  "$ROOT/e2e/services/postgres.sh" start >/dev/null
  store=$("$ROOT/e2e/services/postgres.sh" createdb asyncd_link_order | tail -n 1)
  export ASYNCD_STORE="$store"
  ASYNCD_LOG=warn "$BIN" migrate
  profile api api --config "$WORK/jobs" --listen "127.0.0.1:$api"
  profile dispatcher dispatcher --config "$WORK/jobs" --listen "127.0.0.1:$dispatcher"
  wait_up "http://127.0.0.1:$api"
  wait_up "http://127.0.0.1:$dispatcher"
  exercise "http://127.0.0.1:$api"
  stop

  # The dispatcher's functions first (the role most replicas run), then what the API
  # and `asyncd dev` ran besides; only functions the binary itself defines.
  {
    ran "$WORK/dispatcher.callgrind"
    ran "$WORK/api.callgrind"
    ran "$WORK/dev.callgrind"
  } | awk '!seen[$0]++' | grep -Fxf <(defined_functions "$BIN") >"$LIST"
  echo "link-order: $(grep -c . "$LIST") functions written to $LIST"
}

case "${1:-}" in
  generate) generate ;;
  check) check "${2:?usage: link-order.sh check BINARY}" ;;
  *) echo "usage: link-order.sh generate | check BINARY" >&2; exit 2 ;;
esac
