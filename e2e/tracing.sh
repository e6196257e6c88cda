#!/usr/bin/env bash
# Trace context from submit to executor with a real OTLP receiver: e2e/tracing_test.py
# decodes what `asyncd dev --otlp-endpoint` exports with the official
# `opentelemetry-proto` package (from PyPI, installed once into
# $ASYNCD_CACHE/otlp-proto-<version>) and checks one trace from the caller's span
# through submit, dispatch and attempt to the executor's `traceparent`.
#
#   e2e/tracing.sh
#   ASYNCD_BIN    the asyncd binary (default: built into CARGO_TARGET_DIR)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=e2e/lib.sh
source "$root/e2e/lib.sh"
export ASYNCD_CACHE=${ASYNCD_CACHE:-/var/cache/asyncd}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target}
OTLP_PROTO_VERSION=1.45.2

venv=$ASYNCD_CACHE/otlp-proto-$OTLP_PROTO_VERSION
python_venv "$venv" opentelemetry-proto "$OTLP_PROTO_VERSION" opentelemetry.proto
asyncd=$(asyncd_bin)

"$venv/bin/python" "$root/e2e/tracing_test.py" --asyncd "$asyncd"
