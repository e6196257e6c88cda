#!/usr/bin/env bash
# Runs every test of the project on this machine, installing and starting what the tests
# need: the Rust toolchain's lints, MariaDB and PostgreSQL for the store suite and the
# multi-process tests, a Kafka broker (KRaft) for the Kafka path, a kube-apiserver + etcd
# control plane (built once from k8s.io/kubernetes) for the operator and the Helm chart,
# a one-node Kubernetes cluster with a container runtime running asyncd as pods
# (e2e/cluster.sh), and the SDK suites against a real `asyncd dev`. Heavy builds are
# cached outside the clone in $ASYNCD_CACHE (default /var/cache/asyncd), so a second run
# is quick.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export ASYNCD_CACHE=${ASYNCD_CACHE:-/var/cache/asyncd}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target}
# Each run builds the workspace crates from a fresh clone anyway; incremental state would
# only pile up gigabytes per clone in the shared target dir.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
mkdir -p "$ASYNCD_CACHE"

# Each phase prints how long the previous one took, so a slow phase is visible in CI logs.
phase_started=$SECONDS
run_started=$SECONDS
phase=""
step() {
  if [ -n "$phase" ]; then
    printf '<== %s: %ds\n' "$phase" $((SECONDS - phase_started))
  fi
  phase=$*
  phase_started=$SECONDS
  printf '\n==> %s\n' "$*"
}

started=()
release_build=""
cleanup() {
  if [ -n "$release_build" ]; then
    pkill -P "$release_build" 2>/dev/null || true
    kill "$release_build" 2>/dev/null || true
  fi
  for service in "${started[@]}"; do
    "e2e/services/$service.sh" stop >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT

step "formatting and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
command -v shellcheck >/dev/null ||
  apt-get install -y shellcheck || { apt-get update && apt-get install -y shellcheck; }
git ls-files -z '*.sh' .ci/run | xargs -0 shellcheck -x
# The image builds copy every workspace member (cargo resolves the whole workspace before
# it builds one package) and .cargo/config.toml (the allocator's build flags).
for dockerfile in dispatcher/Dockerfile operator/Dockerfile; do
  for copied in $(sed -n 's/^members = \[\(.*\)\]/\1/p' Cargo.toml | tr -d '",') .cargo; do
    grep -q "^COPY $copied $copied\$" "$dockerfile" ||
      { echo "$dockerfile does not COPY $copied (a workspace member or the cargo config)" >&2; exit 1; }
  done
done
# The side-by-side benchmark's peer programs compile and parse (e2e/bench.sh peers runs them;
# the benchmark itself is not part of the tests).
(cd bench/peers/driver && go vet .)
for f in bench/peers/common.mjs bench/peers/graphile/peer.mjs bench/peers/bullmq/peer.mjs; do node --check "$f"; done

step "starting MariaDB, PostgreSQL, Kafka and Toxiproxy on loopback, and a PostgreSQL and a MariaDB on small disks"
for service in mariadb postgres kafka toxiproxy small-disk; do
  e2e/services/$service.sh start
  started+=("$service")
done
# The test databases of earlier runs (each test makes its own and keeps it), which would
# otherwise grow the servers' data in the cache by gigabytes a week.
for service in mariadb postgres; do e2e/services/$service.sh dropdbs asyncd_mp_ asyncd_t_; done
ASYNCD_TEST_MYSQL_URL=$(e2e/services/mariadb.sh url)
ASYNCD_TEST_POSTGRES_URL=$(e2e/services/postgres.sh url)
ASYNCD_TEST_KAFKA_BROKERS=$(e2e/services/kafka.sh url)
ASYNCD_TEST_TOXIPROXY_URL=$(e2e/services/toxiproxy.sh url)
export ASYNCD_TEST_MYSQL_URL ASYNCD_TEST_POSTGRES_URL ASYNCD_TEST_KAFKA_BROKERS ASYNCD_TEST_TOXIPROXY_URL
# The servers whose disks dispatcher/tests/integration/disk_full.rs fills: URL and mount of each.
while IFS='=' read -r name value; do
  export "$name=$value"
done < <(e2e/services/small-disk.sh env)

step "Rust tests (unit, the store suite on three backends, integration, Kafka, operator)"
# Here every backend is running: a test that found one missing must fail, not skip.
# Four tests at a time on two cores: most of the integration suite waits on the servers,
# its processes and the manual clock, not the CPU (side by side on 2026-12-06: the
# integration suite 480 s with 2 threads, 347 s with 4; the store suite 60 s with 4, 77 s
# with 2 in the last clean-clone run).
RUST_TEST_THREADS=4 ASYNCD_TEST_REQUIRE_BACKENDS=1 cargo test --workspace --locked

step "HTTP fuzzing from docs/openapi.json (Schemathesis) against asyncd dev and asyncd api on PostgreSQL"
cargo build -p asyncd --locked
# The release build that the soaks, the hot-path guard and the cluster share (one package
# set) runs beside the phases from here to the soaks, which use debug builds: cargo locks
# each profile's directory apart. It took 3 min 53 s alone at the soak's start.
# First the binary as the image builds it (dispatcher/Dockerfile: the asyncd package
# alone, whose dependencies then unify fewer features and so get other mangled names),
# to check that the link order list still names its functions (e2e/link-order.sh).
release_log=$ASYNCD_CACHE/release-build.log
{
  cargo build --release --locked -p asyncd --bin asyncd &&
    bash e2e/link-order.sh check "$CARGO_TARGET_DIR/release/asyncd" &&
    cargo build --release --locked -p asyncd -p asyncd-bench -p asyncd-operator
} >"$release_log" 2>&1 &
release_build=$!
ASYNCD_BIN="$CARGO_TARGET_DIR/debug/asyncd" bash e2e/fuzz.sh

step "web console in headless Chromium (Selenium) against asyncd dev (e2e/console.sh)"
ASYNCD_BIN="$CARGO_TARGET_DIR/debug/asyncd" bash e2e/console.sh "$ASYNCD_CACHE/console-screenshots"

step "tracing: one trace from submit to executor, spans decoded by opentelemetry-proto (e2e/tracing.sh)"
ASYNCD_BIN="$CARGO_TARGET_DIR/debug/asyncd" bash e2e/tracing.sh

step "operator e2e: kube-apiserver + etcd, Kafka, MariaDB, the operator and a dispatcher as local processes"
bash e2e/operator.sh

step "Helm chart: lint, render, PromQL, server-side dry-run on the API server"
bash e2e/chart.sh

# Each dispatcher keeps an outcome journal (the soak's default), so a kill re-runs only the
# calls it caught in flight: answers the executor sent that the killed dispatcher had not
# yet read. Runs at 900 submits/s (the recorded 10^6 runs' rate) with 1.5*10^5 tasks and
# 24-27 dispatcher kills each: most kills catch nothing, but one that lands while a
# dispatcher works off a backlog on the starved two cores catches a whole begun batch
# (up to 256 calls; 86, 78 and 103 in single kills of 2026-12-06). At this size one or two
# such kills decide the figure (0-190 re-runs over eight runs), so the bound on all
# duplicates is 0.25 %, three such kills; the 0.1 % goal is the 10^6 runs'
# (docs/reliability.md). What no kill explains stays bounded at 0.1 %, and a run fails on
# one kill set against more re-runs than the job's concurrency.
step "the release build begun before the fuzzing"
wait_started=$SECONDS
if ! wait "$release_build"; then
  cat "$release_log"
  exit 1
fi
release_build=""
grep '^link-order:' "$release_log"
tail -n 1 "$release_log"
printf 'waited %ds for it\n' $((SECONDS - wait_started))
step "chaos soak: 1.5*10^5 tasks at 900/s, every role SIGKILLed, PostgreSQL and Kafka restarted, network faults and DNS outages, at most 0.25 % run twice (e2e/soak.sh)"
bash e2e/soak.sh --tasks 150000 --rate 900 --max-duplicates-pct 0.25 --max-unexplained-duplicates-pct 0.1
step "chaos soak on MariaDB: 1.5*10^5 tasks at 900/s, every role SIGKILLed, MariaDB and Kafka restarted, network faults and DNS outages, at most 0.25 % run twice (e2e/soak.sh --store mariadb)"
bash e2e/soak.sh --store mariadb --tasks 150000 --rate 900 --max-duplicates-pct 0.25 --max-unexplained-duplicates-pct 0.1

step "hot-path guard: asyncd dev's drain against a plain HTTP loop to the same executor (asyncd-bench guard)"
# A ratio measured in turn in one run, so it holds on any machine. The floor sits a third
# below the medians of the clean-clone runs since 513d900 (0.296–0.359; docs/benchmarks.md,
# "Hot-path guard"); raise it as the hot path gets faster, never lower it. Rows of
# `tasks` changed per task: the insert, the claim that begins the attempt
# (Store::start_due) and the outcome.
# The soak's package set: another set would unify features differently and rebuild asyncd.
cargo build --release --locked -p asyncd -p asyncd-bench -p asyncd-operator
"$CARGO_TARGET_DIR/release/asyncd-bench" guard --min-ratio 0.20 --max-task-rows 3.05

step "Kubernetes cluster: the chart installed, asyncd as pods, faults, leader election, HPA (e2e/cluster.sh test)"
bash e2e/cluster.sh test

if [ -x sdk/test.sh ]; then
  step "SDK tests, cross-language checks and every SDK README block against a real asyncd dev"
  cargo build -p asyncd --locked
  ASYNCD_BIN="$CARGO_TARGET_DIR/debug/asyncd" sdk/test.sh
fi

step "all tests passed"
printf 'total: %ds\n' $((SECONDS - run_started))
