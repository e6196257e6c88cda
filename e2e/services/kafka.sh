#!/usr/bin/env bash
# Single-node Apache Kafka (KRaft, combined broker+controller) on 127.0.0.1 for asyncd
# e2e tests, assembled from Maven Central jars and run on Java 17+.
#   kafka.sh start|stop|restart|status|url|create-topic NAME PARTITIONS|delete-topic NAME|topics|reset
# See README.md in this folder.
set -euo pipefail

SERVICE=kafka
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=_lib.sh
. "$HERE/_lib.sh"

KAFKA_VERSION="${ASYNCD_KAFKA_VERSION:-4.1.1}"
SCALA_VERSION=2.13
LOG4J_VERSION=2.24.3          # must match what kafka-server $KAFKA_VERSION depends on
DEP_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.6.1
PORT="${ASYNCD_KAFKA_PORT:-19092}"
CONTROLLER_PORT="${ASYNCD_KAFKA_CONTROLLER_PORT:-19093}"
TIMEOUT="${ASYNCD_KAFKA_TIMEOUT:-${ASYNCD_SERVICE_TIMEOUT:-180}}"
HEAP_OPTS="${ASYNCD_KAFKA_HEAP_OPTS:--Xms128m -Xmx512m}"

HOME_DIR="$ASYNCD_CACHE/kafka-$KAFKA_VERSION"
LIBS="$HOME_DIR/libs"
RUN_DIR="$ASYNCD_RUN/kafka"
DATA_DIR="$RUN_DIR/data"
PROPS="$RUN_DIR/server.properties"
PID_FILE="$RUN_DIR/kafka.pid"
LOG_FILE="$RUN_DIR/server.log"
VERSION_MARK="$RUN_DIR/.version"
BOOTSTRAP="$HOST:$PORT"

url() { echo "$BOOTSTRAP"; }

java_major() { "$1" -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {split($2, v, "."); print v[1]}'; }

# pick a Java 17+ (JAVA_HOME, PATH, /usr/bin) into $JAVA
java_bin() {
  [[ -n "${JAVA:-}" ]] && return 0
  local j m
  for j in ${JAVA_HOME:+"$JAVA_HOME/bin/java"} "$(command -v java || true)" /usr/bin/java; do
    [[ -n "$j" && -x "$j" ]] || continue
    m="$(java_major "$j")"
    if [[ "$m" =~ ^[0-9]+$ ]] && (( m >= 17 )); then JAVA="$j"; return 0; fi
  done
  die "Kafka $KAFKA_VERSION needs Java 17+ (none found)"
}

# ---- jars from Maven Central, cached per version -------------------------------------
fetch_libs() {
  [[ -f "$HOME_DIR/.complete" ]] && return 0
  command -v mvn >/dev/null || die "mvn not found (needed once to fetch Kafka jars)"
  local t0=$EPOCHREALTIME tmp="$HOME_DIR.tmp.$$"
  log "fetching Kafka $KAFKA_VERSION jars from Maven Central into $LIBS"
  rm -rf "$tmp"; mkdir -p "$tmp"
  cat >"$tmp/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.asyncd.e2e</groupId>
  <artifactId>kafka-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_$SCALA_VERSION</artifactId><version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <!-- TopicCommand etc.; Connect is not needed -->
      <groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version>
      <exclusions>
        <exclusion><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId></exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <!-- slf4j 1.x -> log4j2 binding, so the broker actually logs -->
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
  if ! mvn -B -q -f "$tmp/pom.xml" "$DEP_PLUGIN:copy-dependencies" \
        -DincludeScope=runtime -DoutputDirectory="$tmp/libs" >"$tmp/mvn.log" 2>&1; then
    show_log_tail "$tmp/mvn.log" 60
    die "mvn could not fetch Kafka $KAFKA_VERSION (pom and log kept in $tmp)"
  fi
  [[ -f "$tmp/libs/kafka_${SCALA_VERSION}-${KAFKA_VERSION}.jar" ]] || die "kafka jar missing after mvn (see $tmp)"
  rm -rf "$HOME_DIR"; mkdir -p "$HOME_DIR"
  mv "$tmp/libs" "$LIBS"; mv "$tmp/pom.xml" "$HOME_DIR/pom.xml"; rm -rf "$tmp"
  write_log_configs
  touch "$HOME_DIR/.complete"
  log "fetched $(find "$LIBS" -mindepth 1 -maxdepth 1 | wc -l) jars ($(du -sh "$LIBS" | cut -f1)) in $(elapsed "$t0")"
}

write_log_configs() {
  cat >"$HOME_DIR/log4j2-server.properties" <<'EOF'
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
EOF
  cat >"$HOME_DIR/log4j2-tools.properties" <<'EOF'
status = error
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = ERR
EOF
}

# run a Kafka CLI class (short-lived JVM: C1 only, small heap), e.g.
#   kafka_tool [timeout 30] CLASS ARGS...   -- a leading "timeout N" bounds its run time
kafka_tool() {
  local pre=()
  if [[ "$1" == timeout ]]; then pre=(timeout "$2"); shift 2; fi
  local cls="$1"; shift
  "${pre[@]}" "$JAVA" -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HOME_DIR/log4j2-tools.properties" \
    -cp "$LIBS/*" "$cls" "$@"
}

topic_cmd() { kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" "$@"; }

# ---- server ------------------------------------------------------------------------------
write_props() {
  mkdir -p "$RUN_DIR"
  # A third listener for clients that must go through a proxy (the chaos soak's network
  # faults): it listens on ASYNCD_KAFKA_PROXIED_PORT and advertises the proxy's address,
  # so a client bootstrapped through the proxy keeps talking through it.
  local proxied_listener="" proxied_advertised="" proxied_protocol=""
  if [[ -n "${ASYNCD_KAFKA_PROXIED_PORT:-}" ]]; then
    [[ -n "${ASYNCD_KAFKA_PROXY_ADDRESS:-}" ]] || die "ASYNCD_KAFKA_PROXIED_PORT needs ASYNCD_KAFKA_PROXY_ADDRESS (the proxy's host:port)"
    proxied_listener=",PROXIED://$HOST:$ASYNCD_KAFKA_PROXIED_PORT"
    proxied_advertised=",PROXIED://$ASYNCD_KAFKA_PROXY_ADDRESS"
    proxied_protocol=",PROXIED:PLAINTEXT"
  fi
  cat >"$PROPS" <<EOF
# generated by e2e/services/kafka.sh -- rewritten on every start
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT$proxied_listener
advertised.listeners=PLAINTEXT://$HOST:$PORT$proxied_advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT$proxied_protocol
log.dirs=$DATA_DIR
auto.create.topics.enable=false
delete.topic.enable=true
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=5
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=5
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
EOF
}

server_pid() {
  pid_of "$PID_FILE" "$PROPS" && return 0
  local pid
  pid="$(pgrep -f -- "kafka.Kafka $PROPS" 2>/dev/null | head -n1 || true)"
  if proc_matches "$pid" "$PROPS"; then echo "$pid"; return 0; fi
  return 1
}

is_running() { server_pid >/dev/null && port_open "$PORT" "$HOST"; }

random_cluster_id() {
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$id" != -* ]] && { echo "$id"; return; }
  done
}

format_storage() {
  log "formatting storage in $DATA_DIR"
  rm -rf "$DATA_DIR"; mkdir -p "$DATA_DIR"
  local cid; cid="$(random_cluster_id)"
  if ! kafka_tool kafka.tools.StorageTool format --cluster-id "$cid" --config "$PROPS" \
        --ignore-formatted >"$RUN_DIR/format.log" 2>&1; then
    show_log_tail "$RUN_DIR/format.log"
    die "kafka storage format failed"
  fi
  echo "$KAFKA_VERSION" >"$VERSION_MARK"
}

launch_and_wait() {
  [[ -f "$LOG_FILE" ]] && mv -f "$LOG_FILE" "$LOG_FILE.prev"
  # setsid + redirects: detach from the caller's session and pipes; 9>&- drops our lock fd
  # shellcheck disable=SC2086
  setsid "$JAVA" $HEAP_OPTS -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HOME_DIR/log4j2-server.properties" \
    -cp "$LIBS/*" kafka.Kafka "$PROPS" </dev/null >"$LOG_FILE" 2>&1 9>&- &
  local pid=$! deadline=$(( $(now_s) + TIMEOUT ))
  echo "$pid" >"$PID_FILE"
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "broker exited during startup"; show_log_tail "$LOG_FILE"; return 1
    fi
    # The port is bound early; the broker logs "Kafka Server started" once it is unfenced
    # and serving. (A metadata call through Kafka's CLI tools also answers then, but it
    # starts a JVM of its own: on a loaded 2-core machine that took over its 30 s, and
    # the script killed a broker that had been serving for minutes.)
    if port_open "$PORT" "$HOST" && grep -q "Kafka Server started" "$LOG_FILE"; then
      return 0
    fi
    if (( $(now_s) >= deadline )); then
      log "broker not ready after ${TIMEOUT}s"; show_log_tail "$LOG_FILE"
      kill_pid "$pid" 20
      return 1
    fi
    sleep 0.5
  done
}

start() {
  local t0=$EPOCHREALTIME
  if is_running; then log "already running on $BOOTSTRAP (pid $(server_pid))"; return 0; fi
  java_bin
  fetch_libs
  local old; if old="$(server_pid)"; then log "stale broker pid $old not answering; stopping it"; kill_pid "$old" 30; fi
  local p; for p in "$PORT" "$CONTROLLER_PORT"; do
    if port_open "$p" "$HOST"; then die "port $HOST:$p is in use by another process (set ASYNCD_KAFKA_PORT / ASYNCD_KAFKA_CONTROLLER_PORT)"; fi
  done
  write_props
  if [[ ! -f "$DATA_DIR/meta.properties" || "$(cat "$VERSION_MARK" 2>/dev/null)" != "$KAFKA_VERSION" ]]; then
    format_storage
  fi
  log "starting Kafka $KAFKA_VERSION on $BOOTSTRAP (controller :$CONTROLLER_PORT, data $DATA_DIR)"
  # no automatic wipe on failure: 'restart' must keep data. '$0 reset' wipes it by hand.
  launch_and_wait || die "Kafka failed to start (log: $LOG_FILE; '$0 reset' wipes its data)"
  log "ready in $(elapsed "$t0"): $BOOTSTRAP"
}

stop() {
  local pid
  if ! pid="$(server_pid)"; then log "not running"; rm -f "$PID_FILE"; return 0; fi
  log "stopping broker (pid $pid)"
  kill_pid "$pid" 60   # SIGTERM = controlled shutdown; data is kept
  rm -f "$PID_FILE"
  log "stopped"
}

create_topic() {
  local name="${1:-}" parts="${2:-}"
  [[ -n "$name" && "$parts" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 create-topic NAME PARTITIONS"
  [[ "$name" =~ ^[A-Za-z0-9._-]{1,249}$ ]] || die "invalid topic name '$name'"
  is_running || start
  java_bin
  topic_cmd --create --if-not-exists --topic "$name" --partitions "$parts" --replication-factor 1 >&2
  echo "$name"
}

delete_topic() {
  local name="${1:-}"; [[ -n "$name" ]] || die "usage: $0 delete-topic NAME"
  java_bin
  topic_cmd --delete --if-exists --topic "$name" >&2
}

topics() { java_bin; topic_cmd --list; }

status() {
  if is_running; then echo "running pid=$(server_pid) $BOOTSTRAP (Kafka $(cat "$VERSION_MARK" 2>/dev/null))"; else echo "stopped"; return 1; fi
}

cmd="${1:-}"; shift || true
case "$cmd" in
  url) url ;;
  start) with_lock kafka; start ;;
  stop) with_lock kafka; stop ;;
  restart) with_lock kafka; stop; start ;;
  status) status ;;
  create-topic) with_lock kafka; create_topic "$@" ;;
  delete-topic) delete_topic "$@" ;;
  topics) topics ;;
  fetch) with_lock kafka; java_bin; fetch_libs ;;
  reset) with_lock kafka; stop; rm -rf "$RUN_DIR"; log "removed $RUN_DIR" ;;
  *) echo "usage: $0 start|stop|restart|status|url|create-topic NAME PARTITIONS|delete-topic NAME|topics|fetch|reset" >&2; exit 2 ;;
esac
