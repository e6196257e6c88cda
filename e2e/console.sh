#!/usr/bin/env bash
# The web console (docs/console.md) in a real browser: headless Chromium (Debian's
# `chromium` and `chromium-driver`, installed when missing) driven by Selenium (from PyPI,
# installed once into $ASYNCD_CACHE/selenium-<version>) against a real `asyncd dev` with
# `--auth tokens`. e2e/console_test.py enters the token, finds a submitted task by search
# and opens it, pauses and resumes a job, redrives a dead letter, and checks each change
# through the API; screenshots of every page go to the output directory.
#
#   e2e/console.sh [OUTPUT_DIR]   (default $ASYNCD_CONSOLE_OUT, else a new temporary dir)
#   ASYNCD_BIN                    the asyncd binary (default: built into CARGO_TARGET_DIR)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=e2e/lib.sh
source "$root/e2e/lib.sh"
export ASYNCD_CACHE=${ASYNCD_CACHE:-/var/cache/asyncd}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target}
SELENIUM_VERSION=4.51.0
out=${1:-${ASYNCD_CONSOLE_OUT:-$(mktemp -d /tmp/asyncd-console.XXXXXX)}}
mkdir -p "$out"

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "installing chromium and chromium-driver (Debian packages)" >&2
  apt-get update -q && apt-get install -y -q --no-install-recommends chromium chromium-driver
fi

venv=$ASYNCD_CACHE/selenium-$SELENIUM_VERSION
python_venv "$venv" Selenium "$SELENIUM_VERSION" selenium
asyncd=$(asyncd_bin)

work=$(mktemp -d)
pids=()
cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if ((status != 0)) && [[ -f $work/asyncd.log ]]; then
    echo "--- tail of the asyncd log" >&2
    tail -n 40 "$work/asyncd.log" >&2
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT

answering() {  # answering URL PID WHAT: waits until URL gives any HTTP answer
  wait_for --pid "$2" --what "$3" 60 curl -sS -o /dev/null "$1"
}

executor_port=$(free_port)
python3 "$root/examples/executor.py" "$executor_port" >"$work/executor.log" 2>&1 &
pids+=($!)

# Three jobs: one whose tasks wait an hour (found by search), one whose executor is a
# closed port and which has no retries (its tasks go to dead letters at once), and one
# with a working executor and a weekly cron entry (tasks succeed: the overview's rate).
mkdir "$work/jobs"
cat >"$work/jobs/console.yaml" <<YAML
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: billing-job}
spec:
  taskType: charge_invoice
  executor: {url: "http://127.0.0.1:9/", timeout: 2s}
---
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: webhook-job}
spec:
  taskType: deliver_webhook
  executor: {url: "http://127.0.0.1:9/", timeout: 2s}
  retry: {maxRetries: 0}
---
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: report-job}
spec:
  taskType: send_report
  executor: {url: "http://127.0.0.1:$executor_port/", timeout: 5s}
  cron:
    - name: weekly-summary
      schedule: "CRON_TZ=Europe/Berlin 0 7 * * 1"
      overlap: Skip
      catchUp: 30m
YAML

token=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
cat >"$work/tokens.yaml" <<YAML
tokens:
  - {name: console-test, sha256: "$("$asyncd" hash-token <<<"$token")", jobs: ["*"], verbs: ["*"]}
YAML

answering "http://127.0.0.1:$executor_port/" "${pids[-1]}" "the example executor"
port=$(free_port)
"$asyncd" dev --db "$work/dev.db" --config "$work/jobs" --listen "127.0.0.1:$port" \
  --auth tokens --auth-tokens-file "$work/tokens.yaml" >"$work/asyncd.log" 2>&1 &
pids+=($!)
answering "http://127.0.0.1:$port/healthz" "${pids[-1]}" "asyncd dev"

# `--token=`: a random token may begin with "-", which argparse takes for an option.
SE_OFFLINE=true "$venv/bin/python" "$root/e2e/console_test.py" \
  --url "http://127.0.0.1:$port" --token="$token" --out "$out"
echo "console: passed; screenshots in $out"
