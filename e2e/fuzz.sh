#!/usr/bin/env bash
# Property-based HTTP fuzzing of the API, driven by its OpenAPI description
# (docs/openapi.json, generated from the Rust contract types): Schemathesis (from PyPI,
# installed once into $ASYNCD_CACHE/schemathesis-<version>) sends generated valid and
# invalid requests to
#   1. `asyncd dev` on its embedded SQLite store, and
#   2. `asyncd api` on PostgreSQL (e2e/services/postgres.sh, started if needed) with
#      `--auth tokens`, Schemathesis sending the token (its generated requests without it,
#      or with a broken header, must answer the documented 401),
# then every path and query parameter holding a NUL or bytes that are not UTF-8
# (e2e/fuzz_params.py), and fails on any 5xx, any answer that does not match the schema (status code, content
# type, body, headers), on a panic in asyncd's log, and on an asyncd process that is no
# longer running afterwards. One worker: Schemathesis 4.32.5 with two workers sometimes
# reports an internal error (a KeyError while shrinking) instead of a result.
#
#   e2e/fuzz.sh [--examples N]     N generated cases per operation and phase (default 100)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=e2e/lib.sh
source "$root/e2e/lib.sh"
export ASYNCD_CACHE=${ASYNCD_CACHE:-/var/cache/asyncd}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target}
ST_VERSION=4.32.5
examples=100
case "${1:-}" in
  --examples) examples=$2 ;;
  "") ;;
  *) echo "usage: $0 [--examples N]" >&2; exit 2 ;;
esac

venv=$ASYNCD_CACHE/schemathesis-$ST_VERSION
python_venv "$venv" Schemathesis "$ST_VERSION" schemathesis
asyncd=$(asyncd_bin)

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Two jobs: one plain, one with a unique-key template, so both submit paths are reached.
# Their executor is a closed port: dispatched tasks fail and retry, which is fine here.
mkdir -p "$work/jobs"
cat >"$work/jobs/fuzz.yaml" <<'YAML'
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: fuzz-job}
spec:
  taskType: fuzz_task
  executor: {url: "http://127.0.0.1:9/", timeout: 2s}
  retry: {maxRetries: 1}
---
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: fuzz-unique-job}
spec:
  taskType: fuzz_unique
  executor: {url: "http://127.0.0.1:9/", timeout: 2s}
  uniqueKey: "order:{order_id}"
YAML

wait_healthy() {  # wait_healthy PORT PID
  wait_for --pid "$2" --what "asyncd to be healthy" 60 curl -fsS "http://127.0.0.1:$1/healthz"
}

failed=0
fuzz() {  # fuzz NAME PORT PID LOG [SCHEMATHESIS ARGS...]
  local name=$1 port=$2 pid=$3 log=$4 status=0
  shift 4
  echo "==> fuzzing $name on 127.0.0.1:$port ($examples examples per operation)"
  "$venv/bin/schemathesis" run "$root/docs/openapi.json" "$@" \
    --url "http://127.0.0.1:$port" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance \
    --phases examples,coverage,fuzzing,stateful \
    --max-examples "$examples" --seed 20261130 --workers 1 \
    --request-timeout 10 --no-color --warnings off \
    --generation-database none || status=$?
  # Parameters holding a NUL or bytes that are not UTF-8, which Schemathesis does not send.
  python3 "$root/e2e/fuzz_params.py" "http://127.0.0.1:$port" "$@" || status=$?
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "FAIL: asyncd ($name) is not running after the fuzzer; its log:" >&2
    tail -40 "$log" >&2
    status=1
  elif grep -q 'panicked' "$log"; then
    echo "FAIL: asyncd ($name) logged a panic:" >&2
    grep -m5 -A5 'panicked' "$log" >&2
    status=1
  fi
  if ((status != 0)); then failed=$((failed + 1)); fi
  echo "<== $name: $([[ $status == 0 ]] && echo passed || echo FAILED)"
}

port=$(free_port)
"$asyncd" dev --db "$work/dev.db" --config "$work/jobs" --listen "127.0.0.1:$port" \
  >"$work/dev.log" 2>&1 &
pids+=($!)
wait_healthy "$port" "${pids[-1]}"
fuzz "asyncd dev (SQLite)" "$port" "${pids[-1]}" "$work/dev.log"

"$root/e2e/services/postgres.sh" start >&2
pg_url=$("$root/e2e/services/postgres.sh" createdb asyncd_fuzz)
ASYNCD_STORE=$pg_url "$asyncd" migrate >/dev/null
port=$(free_port)
token=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
cat >"$work/tokens.yaml" <<YAML
tokens:
  - {name: fuzzer, sha256: "$("$asyncd" hash-token <<<"$token")", jobs: ["*"], verbs: ["*"]}
YAML
ASYNCD_STORE=$pg_url "$asyncd" api --config "$work/jobs" --listen "127.0.0.1:$port" \
  --auth tokens --auth-tokens-file "$work/tokens.yaml" >"$work/api.log" 2>&1 &
pids+=($!)
wait_healthy "$port" "${pids[-1]}"
fuzz "asyncd api (PostgreSQL, --auth tokens)" "$port" "${pids[-1]}" "$work/api.log" \
  --header "Authorization: Bearer $token"

passed=$((2 - failed))
echo "fuzz: $passed passed, $failed failed"
((failed == 0))
