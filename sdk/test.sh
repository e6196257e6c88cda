#!/usr/bin/env bash
# Tests the Go, Python and Rust SDKs against a real `asyncd dev`, then checks them
# against each other: a Go client's task run by a Python executor and a Python client's
# by a Go one; Go and Python clients' tasks run by a Rust executor; and a Rust executor's
# permanent failure landing the Go and Python clients' tasks in dead letters. Last, it
# runs every code block of the three SDK READMEs, in order, against a real `asyncd dev`
# (readme_test.py; needs `unshare --net`, i.e. root, to give each README its own
# loopback).
#
#   ASYNCD_BIN        the asyncd binary (default $ASYNCD_CACHE/target/debug/asyncd)
#   ASYNCD_CACHE      where the venv lives (default /var/cache/asyncd)
#   CARGO_TARGET_DIR  where cargo builds the Rust SDK (default: cargo's own)
set -euo pipefail

sdk=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=e2e/lib.sh
source "$sdk/../e2e/lib.sh"
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

echo "== Rust SDK: cargo test -p asyncd-client"
(cd "$sdk/.." && cargo test -q -p asyncd-client)

echo "== cross-language: Go <-> Python <-> Rust through asyncd dev"
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

(cd "$sdk/go" && go build -o "$tmp/crosstest" ./internal/crosstest)
# The Rust examples: the executor (sdk/rust/examples/executor.rs) and the README's;
# cargo names the binaries it built, linked here as $tmp/examples/<example name>.
mkdir "$tmp/examples"
(cd "$sdk/.." && cargo build -q -p asyncd-client --examples \
	--message-format=json-render-diagnostics) | "$venv/bin/python" -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and "example" in m["target"]["kind"] and m.get("executable"):
        os.symlink(m["executable"], os.path.join(sys.argv[1], m["target"]["name"]))
' "$tmp/examples"
rust_executor=$tmp/examples/executor
if [[ ! -x $rust_executor ]]; then
	echo "sdk/test.sh: cargo built no executor example binary" >&2
	exit 1
fi
secret="cross-$RANDOM$RANDOM"
port=$(free_port)
endpoint=http://127.0.0.1:$port

"$tmp/crosstest" serve -portfile "$tmp/go.port" -secret "$secret" -endpoint "$endpoint" >"$tmp/go-executor.log" 2>&1 &
pids+=($!)
"$venv/bin/python" "$sdk/python/tests/crosstest.py" serve --portfile "$tmp/py.port" --secret "$secret" \
	--endpoint "$endpoint" >"$tmp/py-executor.log" 2>&1 &
pids+=($!)
"$rust_executor" --portfile "$tmp/rust.port" --secret "$secret" --type cross_rust \
	>"$tmp/rust-executor.log" 2>&1 &
pids+=($!)
"$rust_executor" --portfile "$tmp/rust-dead.port" --secret "$secret" --type cross_rust_dead \
	--fail-permanently >"$tmp/rust-dead-executor.log" 2>&1 &
pids+=($!)
wait_for --what "the Go executor" 30 test -s "$tmp/go.port"
wait_for --what "the Python executor" 30 test -s "$tmp/py.port"
wait_for --what "the Rust executor" 30 test -s "$tmp/rust.port"
wait_for --what "the failing Rust executor" 30 test -s "$tmp/rust-dead.port"

mkdir "$tmp/config"
for side in go py rust rust-dead; do
	task_type=cross_${side//-/_}
	cat >"$tmp/config/cross-$side.yaml" <<EOF
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata:
  name: cross-$side-job
spec:
  taskType: $task_type
  executor:
    url: http://127.0.0.1:$(cat "$tmp/$side.port")/tasks/$task_type
    timeout: 10s
    errorBodies: true
    signing:
      secretRef:
        name: cross-signing
  retry:
    maxRetries: 1
    backoff: fixed
    initialBackoff: 200ms
EOF
done

# The jobs' signing Secret, laid out as the operator mounts it: DIR/<secret name>/<key>.
mkdir -p "$tmp/signing/cross-signing"
printf '%s' "$secret" >"$tmp/signing/cross-signing/key"
"$ASYNCD_BIN" dev --config "$tmp/config" --db "$tmp/asyncd.db" \
	--listen "127.0.0.1:$port" --signing-dir "$tmp/signing" >"$tmp/asyncd.log" 2>&1 &
pids+=($!)
wait_for --what "asyncd dev /healthz" 60 curl -fsS "$endpoint/healthz"
wait_for --what "asyncd dev /readyz" 60 curl -fsS "$endpoint/readyz"

passed=0
"$tmp/crosstest" submit -endpoint "$endpoint" -type cross_py -nonce "$RANDOM$RANDOM"
passed=$((passed + 1))
"$venv/bin/python" "$sdk/python/tests/crosstest.py" submit --endpoint "$endpoint" --type cross_go --nonce "$RANDOM$RANDOM"
passed=$((passed + 1))

# Go and Python clients' tasks run by the Rust executor, which recomputes their
# idempotency keys with the Rust SDK.
"$tmp/crosstest" submit -endpoint "$endpoint" -type cross_rust -nonce "$RANDOM$RANDOM"
passed=$((passed + 1))
"$venv/bin/python" "$sdk/python/tests/crosstest.py" submit --endpoint "$endpoint" --type cross_rust --nonce "$RANDOM$RANDOM"
passed=$((passed + 1))

# The Rust executor signals a permanent failure (after the same key check) for a
# Python client's task: it must be dead after one attempt, with the Rust message, and
# listed in dead letters.
"$venv/bin/python" - "$endpoint" "$RANDOM$RANDOM" <<'EOF'
import sys
import time

import asyncd

endpoint, nonce = sys.argv[1], int(sys.argv[2])
client = asyncd.Client(endpoint, service_name="crosstest-python")
payload = {"nonce": nonce, "lang": "python", "amount": 12.5, "text": 'Grüße 😀 "q"\n'}
key = asyncd.idempotency_key_from("cross_rust_dead", payload, "nonce", "amount", "text")
res = client.submit("cross_rust_dead", payload, idempotency_key=key)
deadline = time.monotonic() + 30
while True:
    st = client.get(res.id)
    if st.state == asyncd.DEAD:
        break
    if st.state in (asyncd.SUCCEEDED, asyncd.CANCELLED) or time.monotonic() > deadline:
        sys.exit(f"crosstest: task {res.id} is {st.state}, want dead: {st.last_error}")
    time.sleep(0.05)
want = "rust executor: permanent failure as asked, task from the python client"
if st.attempt != 1 or want not in (st.last_error or ""):
    sys.exit(f"crosstest: task {res.id}: attempt {st.attempt}, last_error {st.last_error!r}; want one attempt refused with {want!r}")
if res.id not in [t.id for t in client.dead_letters(type="cross_rust_dead")]:
    sys.exit(f"crosstest: task {res.id} is dead but not in dead letters")
print(f"python client: task {res.id} (cross_rust_dead) in dead letters: {st.last_error}")
EOF
passed=$((passed + 1))

# The same for a Go client's task: the Go crosstest fails, naming the dead task.
if out=$("$tmp/crosstest" submit -endpoint "$endpoint" -type cross_rust_dead -nonce "$RANDOM$RANDOM" 2>&1); then
	echo "sdk/test.sh: the Go client's cross_rust_dead task succeeded: $out" >&2
	exit 1
fi
dead_id=$(sed -n 's/^crosstest: task \([^ ]*\) is dead: .*/\1/p' <<<"$out")
if [[ -z $dead_id ]] || ! grep -q "rust executor: permanent failure as asked, task from the go client" <<<"$out"; then
	echo "sdk/test.sh: want the Go client's task dead by the Rust executor's permanent failure, got: $out" >&2
	exit 1
fi
curl -fsS "$endpoint/v1/dead-letters?type=cross_rust_dead" | "$venv/bin/python" -c '
import json, sys
ids = [t["id"] for t in json.load(sys.stdin)["items"]]
sys.exit(0 if sys.argv[1] in ids else "crosstest: task %s is not in dead letters" % sys.argv[1])
' "$dead_id"
echo "go client: task $dead_id (cross_rust_dead) in dead letters"
passed=$((passed + 1))

cat "$tmp/go-executor.log" "$tmp/py-executor.log" "$tmp/rust-executor.log" "$tmp/rust-dead-executor.log"
echo "cross-language: $passed passed, 0 failed"

echo "== README blocks: sdk/{go,python,rust}/README.md against asyncd dev"
ASYNCD_VENV=$venv ASYNCD_REPO=$(cd "$sdk/.." && pwd) ASYNCD_RUST_EXAMPLES=$tmp/examples \
	"$venv/bin/python" "$sdk/readme_test.py" "$sdk/go/README.md" "$sdk/python/README.md" "$sdk/rust/README.md"
