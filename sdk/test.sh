#!/usr/bin/env bash
# Tests both SDKs against a real `asyncd dev`, then checks them against each other:
# a Go client's task run by a Python executor and a Python client's by a Go one.
#
#   ASYNCD_BIN    the asyncd binary (default $ASYNCD_CACHE/target/debug/asyncd)
#   ASYNCD_CACHE  where the venv lives (default /var/cache/asyncd)
set -euo pipefail

sdk=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${ASYNCD_CACHE:-/var/cache/asyncd}
export ASYNCD_BIN=${ASYNCD_BIN:-$cache/target/debug/asyncd}
if [[ ! -x $ASYNCD_BIN ]]; then
	echo "sdk/test.sh: no asyncd binary at $ASYNCD_BIN: build it (cargo build) or set ASYNCD_BIN" >&2
	exit 1
fi

echo "== Go SDK: go vet, go test"
(cd "$sdk/go" && go vet ./... && go test -count=1 ./...)

echo "== Python SDK: venv $cache/venv, pytest"
venv=$cache/venv
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q -e "$sdk/python" pytest
(cd "$sdk/python" && "$venv/bin/python" -m pytest -q)

echo "== cross-language: Go <-> Python through asyncd dev"
tmp=$(mktemp -d)
pids=()
status=0
cleanup() {
	status=$?
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	if ((status != 0)); then
		for log in "$tmp"/*.log; do
			[[ -f $log ]] || continue
			echo "--- tail of $(basename "$log")" >&2
			tail -n 40 "$log" >&2
		done
	fi
	rm -rf "$tmp"
	exit "$status"
}
trap cleanup EXIT

# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND until it succeeds.
wait_for() {
	local what=$1 secs=$2
	shift 2
	local deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= deadline)); then
			echo "sdk/test.sh: timed out after ${secs}s waiting for $what" >&2
			return 1
		fi
		sleep 0.1
	done
}

(cd "$sdk/go" && go build -o "$tmp/crosstest" ./internal/crosstest)
secret="cross-$RANDOM$RANDOM"
port=$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
endpoint=http://127.0.0.1:$port

"$tmp/crosstest" serve -portfile "$tmp/go.port" -secret "$secret" -endpoint "$endpoint" >"$tmp/go-executor.log" 2>&1 &
pids+=($!)
"$venv/bin/python" "$sdk/python/tests/crosstest.py" serve --portfile "$tmp/py.port" --secret "$secret" \
	--endpoint "$endpoint" >"$tmp/py-executor.log" 2>&1 &
pids+=($!)
wait_for "the Go executor" 30 test -s "$tmp/go.port"
wait_for "the Python executor" 30 test -s "$tmp/py.port"

mkdir "$tmp/config"
for side in go py; do
	cat >"$tmp/config/cross-$side.yaml" <<EOF
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata:
  name: cross-$side-job
spec:
  taskType: cross_$side
  executor:
    url: http://127.0.0.1:$(cat "$tmp/$side.port")/tasks/cross_$side
    timeout: 10s
    signingSecretEnv: ASYNCD_CROSS_SIGNING_SECRET
  retry:
    maxRetries: 1
    backoff: fixed
    initialBackoff: 200ms
EOF
done

ASYNCD_CROSS_SIGNING_SECRET=$secret "$ASYNCD_BIN" dev --config "$tmp/config" --db "$tmp/asyncd.db" \
	--listen "127.0.0.1:$port" >"$tmp/asyncd.log" 2>&1 &
pids+=($!)
wait_for "asyncd dev /healthz" 60 curl -fsS "$endpoint/healthz"
wait_for "asyncd dev /readyz" 60 curl -fsS "$endpoint/readyz"

passed=0
"$tmp/crosstest" submit -endpoint "$endpoint" -type cross_py -nonce "$RANDOM$RANDOM"
passed=$((passed + 1))
"$venv/bin/python" "$sdk/python/tests/crosstest.py" submit --endpoint "$endpoint" --type cross_go --nonce "$RANDOM$RANDOM"
passed=$((passed + 1))
cat "$tmp/go-executor.log" "$tmp/py-executor.log"
echo "cross-language: $passed passed, 0 failed"
