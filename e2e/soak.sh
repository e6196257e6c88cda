#!/usr/bin/env bash
# The chaos soak: proves that nothing an executor answers and no outage of the store or the
# broker stalls a pipeline, loses a task or runs it early.
#
# Builds asyncd and asyncd-bench in release mode, starts a database server (PostgreSQL or
# MariaDB, by --store) and a Kafka server of its own (own ports and data under
# $ASYNCD_CACHE/soak, because the soak restarts them and must not disturb the shared ones
# other tests use), and runs `asyncd-bench soak`: asyncd as separate processes (migrate,
# 2 APIs, 3 dispatchers, 2 schedulers), N tasks over the Kafka and the store route with
# misbehaving executors, every role SIGKILLed and restarted over and over, the database
# and the broker restarted once, network faults on every role's links to the database and
# the broker (through a Toxiproxy server of its own), and DNS outages of the executor's name
# in the dispatchers (which run in mount namespaces of their own: the soak needs root). Prints accepted, lost, early, duplicates, wrong end
# states, peak and last RSS and open descriptors per role, and throughput; exits
# non-zero on any loss, early run or wrong end state. See docs/reliability.md.
#   e2e/soak.sh                        10⁵ tasks on PostgreSQL
#   e2e/soak.sh --store mariadb        the same on MariaDB (--store postgres is the default)
#   e2e/soak.sh --tasks 1000000        the full run
#   e2e/soak.sh --seed 123 …           repeat a run (the seed is printed)
#   e2e/soak.sh --max-duplicates-pct 0.1 …
#   e2e/soak.sh --max-unexplained-duplicates-pct 0.1 …   duplicates no dispatcher kill explains
# Every option but --store goes to `asyncd-bench soak` (`asyncd-bench soak --help`).
set -euo pipefail
cd "$(dirname "$0")/.."

# --store is the script's own (it picks the server to start); the rest is the driver's.
backend=postgres
bench_args=()
while (($#)); do
  case $1 in
    --store) [[ $# -ge 2 ]] || { echo "soak.sh: --store needs a value: mariadb or postgres" >&2; exit 2; }
      backend=$2; shift 2 ;;
    --store=*) backend=${1#--store=}; shift ;;
    *) bench_args+=("$1"); shift ;;
  esac
done
case $backend in
  postgres | mariadb) ;;
  *) echo "soak.sh: --store must be mariadb or postgres, not '$backend'" >&2; exit 2 ;;
esac
# shellcheck source=e2e/lib.sh
source e2e/lib.sh
export ASYNCD_CACHE=${ASYNCD_CACHE:-/var/cache/asyncd}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target}
# the same package set as e2e/cluster.sh builds, so both share one release build (another
# set can unify dependency features differently and compile everything a second time)
cargo build --release --locked -p asyncd -p asyncd-bench -p asyncd-operator

shared_cache=$ASYNCD_CACHE
kafka_version=${ASYNCD_KAFKA_VERSION:-4.1.1}
export ASYNCD_CACHE=$shared_cache/soak
# A run dir set from outside would point the soak at, and make it restart, a shared server.
unset ASYNCD_SERVICES_RUN
export ASYNCD_POSTGRES_PORT=${ASYNCD_SOAK_POSTGRES_PORT:-25432}
export ASYNCD_MARIADB_PORT=${ASYNCD_SOAK_MARIADB_PORT:-23306}
export ASYNCD_KAFKA_PORT=${ASYNCD_SOAK_KAFKA_PORT:-29092}
export ASYNCD_KAFKA_CONTROLLER_PORT=${ASYNCD_SOAK_KAFKA_CONTROLLER_PORT:-29093}
export ASYNCD_TOXIPROXY_PORT=${ASYNCD_SOAK_TOXIPROXY_PORT:-28474}
# The roles reach the broker through a Toxiproxy proxy on this port, which forwards to the
# broker's listener for proxied clients; that listener advertises the proxy's address, so
# the roles' Kafka clients stay behind the proxy (and its network faults) after bootstrap.
kafka_proxy_port=${ASYNCD_SOAK_KAFKA_PROXY_PORT:-29095}
export ASYNCD_KAFKA_PROXIED_PORT=${ASYNCD_SOAK_KAFKA_PROXIED_PORT:-29094}
export ASYNCD_KAFKA_PROXY_ADDRESS=127.0.0.1:$kafka_proxy_port
toxiproxy_version=${ASYNCD_TOXIPROXY_VERSION:-v2.5.0}
mkdir -p "$ASYNCD_CACHE"
# The Kafka jars and the Toxiproxy build are the same for every instance: share the cached
# copies instead of fetching and building them again.
for tool in "kafka-$kafka_version" "toxiproxy-$toxiproxy_version"; do
  if [ -d "$shared_cache/$tool" ] && [ ! -e "$ASYNCD_CACHE/$tool" ]; then
    ln -s "$shared_cache/$tool" "$ASYNCD_CACHE/$tool"
  fi
done

stop_services() {
  e2e/services/kafka.sh stop >/dev/null 2>&1 || true
  e2e/services/"$backend".sh stop >/dev/null 2>&1 || true
  e2e/services/toxiproxy.sh stop >/dev/null 2>&1 || true
}
trap stop_services EXIT
e2e/services/"$backend".sh start >&2
e2e/services/kafka.sh start >&2
e2e/services/toxiproxy.sh start >&2
store=$(e2e/services/"$backend".sh createdb soak)

machine
ASYNCD_STORE=$store "$CARGO_TARGET_DIR/release/asyncd-bench" soak \
  --kafka-brokers "$ASYNCD_KAFKA_PROXY_ADDRESS" \
  --kafka-upstream "127.0.0.1:$ASYNCD_KAFKA_PROXIED_PORT" \
  --db-restart "e2e/services/$backend.sh restart" \
  --broker-restart "e2e/services/kafka.sh restart" \
  --toxiproxy "$(e2e/services/toxiproxy.sh url)" \
  "${bench_args[@]}"
