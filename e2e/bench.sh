#!/usr/bin/env bash
# Builds asyncd and the benchmark in release mode, starts the servers a benchmark needs,
# and prints its tables:
#   e2e/bench.sh embedded [--sizes 10000,100000 …]   asyncd dev on SQLite
#   e2e/bench.sh store    [--rows 20000 …]           MariaDB and PostgreSQL claim paths
#   e2e/bench.sh kafka    [--sizes …]                the Kafka path
#   e2e/bench.sh retention [--tasks 1000000 --rate 2000 --retention 10s]
#                                                    table size and lateness under a steady
#                                                    load, purging and not
set -euo pipefail
cd "$(dirname "$0")/.."
export ASYNCD_CACHE=${ASYNCD_CACHE:-/var/cache/asyncd}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target}
bench=${1:-embedded}
cargo build --release --locked -p asyncd -p asyncd-bench
case $bench in
  store)
    e2e/services/mariadb.sh start >&2
    e2e/services/postgres.sh start >&2
    ASYNCD_TEST_MYSQL_URL=$(e2e/services/mariadb.sh url)
    ASYNCD_TEST_POSTGRES_URL=$(e2e/services/postgres.sh url)
    export ASYNCD_TEST_MYSQL_URL ASYNCD_TEST_POSTGRES_URL
    ;;
  kafka)
    e2e/services/kafka.sh start >&2
    ASYNCD_TEST_KAFKA_BROKERS=$(e2e/services/kafka.sh url)
    export ASYNCD_TEST_KAFKA_BROKERS
    ;;
esac
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$CARGO_TARGET_DIR/release/asyncd-bench" "$@"
