#!/usr/bin/env bash
# Builds asyncd and the benchmark in release mode, starts the servers a benchmark needs,
# and prints its tables:
#   e2e/bench.sh embedded [--sizes 10000,100000 …]   asyncd dev on SQLite
#   e2e/bench.sh guard    [--min-ratio 0.10 …]       the hot path's regression guard:
#                                                    asyncd dev's drain ÷ a plain HTTP loop
#   e2e/bench.sh store    [--e2e-sizes 10000,100000 …] MariaDB and PostgreSQL: end to end
#                                                    (asyncd api + dispatcher), claim paths
#   e2e/bench.sh kafka    [--sizes …]                the Kafka path
#   e2e/bench.sh peers    [--scale 0.02 …]           asyncd side by side with River,
#                                                    graphile-worker and BullMQ (bench/peers)
#   e2e/bench.sh retention [--tasks 1000000 --rate 2000 --retention 10s]
#                                                    table size and lateness under a steady
#                                                    load, purging and not
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=e2e/lib.sh
source e2e/lib.sh
export ASYNCD_CACHE=${ASYNCD_CACHE:-/var/cache/asyncd}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target}
bench=${1:-embedded}

if [[ $bench == peers ]]; then
  # The peers are installed from their registries into a cache folder named by their
  # versions (read from the pinned manifests), never into the repository.
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "installing Node.js (apt)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm >&2
  fi
  command -v go >/dev/null || { echo "bench.sh peers needs Go (bench/peers/driver/go.mod names the version)" >&2; exit 1; }
  river=$(awk '$1 == "github.com/riverqueue/river" {print $2}' bench/peers/driver/go.mod)
  graphile=$(node -p 'require("./bench/peers/graphile/package.json").dependencies["graphile-worker"]')
  bullmq=$(node -p 'require("./bench/peers/bullmq/package.json").dependencies.bullmq')
  peers=$ASYNCD_CACHE/peers-river$river-graphile$graphile-bullmq$bullmq
  mkdir -p "$peers"
  cargo build --release --locked -p asyncd
  e2e/services/postgres.sh start >&2
  e2e/services/redis.sh start >&2
  GOMODCACHE=$peers/gomod GOCACHE=$peers/gocache GOFLAGS=-modcacherw \
    go build -C bench/peers/driver -o "$peers/peers" .
  cp bench/peers/common.mjs "$peers/"
  for p in graphile bullmq; do
    mkdir -p "$peers/$p"
    if ! cmp -s "bench/peers/$p/package-lock.json" "$peers/$p/package-lock.json" || [[ ! -d $peers/$p/node_modules ]]; then
      cp "bench/peers/$p/package.json" "bench/peers/$p/package-lock.json" "$peers/$p/"
      (cd "$peers/$p" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
    fi
    cp "bench/peers/$p/peer.mjs" "$peers/$p/"
  done
  machine
  echo "versions: River $river (riverpgxv5, pgx), graphile-worker $graphile, BullMQ $bullmq (ioredis), Node.js $(node --version), $(go version | cut -d' ' -f3), PostgreSQL $(psql --version | awk '{print $3}'), Redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')"
  exec "$peers/peers" run --asyncd "$CARGO_TARGET_DIR/release/asyncd" --peers-dir "$peers" \
    --createdb e2e/services/postgres.sh --redis "$(e2e/services/redis.sh url)" \
    --redis-pid-file "$(e2e/services/redis.sh pidfile)" "${@:2}"
fi

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
machine
"$CARGO_TARGET_DIR/release/asyncd-bench" "$@"
