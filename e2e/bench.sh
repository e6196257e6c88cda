#!/usr/bin/env bash
# Builds asyncd and the benchmark in release mode and prints the benchmark's tables.
# Arguments go to asyncd-bench (e.g. --sizes 10000 for a quick run).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${ASYNCD_CACHE:-/var/cache/asyncd}/target}
cargo build --release --locked -p asyncd -p asyncd-bench
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
"$CARGO_TARGET_DIR/release/asyncd-bench" "$@"
