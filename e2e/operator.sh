#!/usr/bin/env bash
# End-to-end test of asyncd-operator against real servers: a kube-apiserver + etcd
# control plane (e2e/controlplane), a Kafka broker and MariaDB (e2e/services). The operator
# runs as a local process pointed at the API server with its own ServiceAccount's token
# (config/rbac/operator.yaml), so its RBAC is exercised too. There is no kubelet: the
# Deployments and HPAs are checked as objects.
#
#   e2e/operator.sh            # prints `operator-e2e: N passed, N failed`
#
# Env: ASYNCD_CACHE (/var/cache/asyncd), CARGO_TARGET_DIR (default $ASYNCD_CACHE/target),
# ASYNCD_E2E_KEEP=1 keeps the servers it started running (and the operator log).
# Servers that were already running are left running; those it started are stopped.
# Kafka topics get a per-run suffix, so runs never collide on the shared broker; so does
# the topic owner registry. A second operator, confined to a second namespace, shares the
# broker and the registry (section 3b: one namespace cannot take another's topic).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=e2e/lib.sh
source "$root/e2e/lib.sh"
export ASYNCD_CACHE=${ASYNCD_CACHE:-/var/cache/asyncd}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target}
CP=e2e/controlplane/controlplane.sh
KAFKA=e2e/services/kafka.sh
MARIADB=e2e/services/mariadb.sh
RUN="e2e$$"
NS="asyncd-$RUN"
NS2="$NS-b"
OWNERS_TOPIC="asyncd-topic-owners-$RUN"
WORK=$(mktemp -d "/tmp/asyncd-operator-e2e.XXXXXX")
passed=0 failed=0 skipped=0
started=()
operator_pid=""
operator2_pid=""
role_pids=()  # asyncd api/dispatcher and the stub executor of section 4b

section() { printf '\n==> %s\n' "$*"; }

skip() { skipped=$((skipped + 1)); echo "skip - $1 ($2)"; }

finish() {
  local rc=$?
  for pid in "${role_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [[ -n "$operator2_pid" ]] && kill -0 "$operator2_pid" 2>/dev/null; then
    kubectl -n "$NS2" delete asyncjobconfigs --all --wait=true --timeout=30s >/dev/null 2>&1 || true
    kill "$operator2_pid" 2>/dev/null || true
    wait "$operator2_pid" 2>/dev/null || true
  fi
  if [[ -n "$operator_pid" ]] && kill -0 "$operator_pid" 2>/dev/null; then
    # let the operator clear finalizers of what is left, then stop it
    kubectl -n "$NS" delete asyncjobconfigs --all --wait=true --timeout=30s >/dev/null 2>&1 || true
    kill "$operator_pid" 2>/dev/null || true
    wait "$operator_pid" 2>/dev/null || true
  fi
  for t in "${topics_created[@]}"; do "$KAFKA" delete-topic "$t" >/dev/null 2>&1 || true; done
  if (( failed > 0 )) && [[ -f "$WORK/operator.log" ]]; then
    echo "--- operator log (tail) ---"; tail -40 "$WORK/operator.log"
    [[ -f "$WORK/operator2.log" ]] && { echo "--- second operator log (tail) ---"; tail -20 "$WORK/operator2.log"; }
  fi
  if [[ "${ASYNCD_E2E_KEEP:-}" != 1 ]]; then
    for service in "${started[@]}"; do
      case "$service" in
        controlplane) "$CP" stop >/dev/null 2>&1 || true ;;
        *) "e2e/services/$service.sh" stop >/dev/null 2>&1 || true ;;
      esac
    done
    rm -rf "$WORK"
  else
    echo "kept: ${started[*]:-nothing started}; work dir $WORK"
  fi
  if (( rc != 0 )); then failed=$((failed + 1)); echo "FAIL - aborted (exit $rc)"; fi
  echo "operator-e2e: $passed passed, $failed failed, $skipped skipped"
  if (( failed > 0 )); then exit 1; fi
  exit "$rc"
}
topics_created=("$OWNERS_TOPIC")
trap finish EXIT

# ---- helpers ----------------------------------------------------------------------------
k() { kubectl --request-timeout=30s "$@"; }
kn() { k -n "$NS" "$@"; }

# a committed sample with this run's topic names
sample() { sed -E "s/(topic: asyncd-[a-z0-9-]+)/\1-$RUN/" "config/samples/$1"; }
apply_sample() { sample "$1" | kubectl -n "$NS" apply -f -; }
# reasons of the Events about an object (core/v1 view of events.k8s.io Events)
event_reasons() {  # event_reasons NAME [TYPE]
  local sel="involvedObject.name=$1"; [[ -n "${2:-}" ]] && sel="$sel,type=$2"
  kubectl -n "$NS" get events --field-selector "$sel" -o jsonpath='{.items[*].reason}'
}
has_event() { event_reasons "$1" "${3:-}" | grep -qw "$2"; }
topic() { echo "$1-$RUN"; }

# partitions of a topic as the broker reports them (empty if it does not exist)
KAFKA_LIBS="$ASYNCD_CACHE/kafka-${ASYNCD_KAFKA_VERSION:-4.1.1}/libs"
partitions() {
  local out
  out=$(java -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp "$KAFKA_LIBS/*" \
    org.apache.kafka.tools.TopicCommand --bootstrap-server "$BROKERS" --describe --topic "$1" 2>/dev/null) || true
  sed -nE 's/.*PartitionCount: *([0-9]+).*/\1/p' <<<"$out" | head -1
}

topic_has() {  # topic_has TOPIC N
  local got; got=$(partitions "$1")
  [[ "$got" == "$2" ]] || { echo "topic $1 has '${got}' partitions, want $2"; return 1; }
}

topic_absent() {
  local got; got=$(partitions "$1")
  [[ -z "$got" ]] || { echo "topic $1 exists with $got partitions"; return 1; }
}

jp() { kn get "$1" -o "jsonpath=$2"; }

cond() {  # cond CONFIG TYPE FIELD
  jp "asyncjobconfig/$1" "{.status.conditions[?(@.type==\"$2\")].$3}"
}

expect_eq() {  # expect_eq WHAT GOT WANT
  [[ "$2" == "$3" ]] || { echo "$1: got '$2', want '$3'"; return 1; }
}

expect_has() {  # expect_has WHAT TEXT NEEDLE
  grep -qF -- "$3" <<<"$2" || { echo "$1: '$3' not in:"; echo "$2"; return 1; }
}

# ---- setup ------------------------------------------------------------------------------
section "building asyncd-operator"
cargo build --locked -p asyncd-operator --bins
OPERATOR_BIN="$CARGO_TARGET_DIR/debug/asyncd-operator"

section "starting the control plane, Kafka and MariaDB"
"$CP" status >/dev/null 2>&1 || { "$CP" start; started+=(controlplane); }
eval "$("$CP" env)"
"$KAFKA" status >/dev/null 2>&1 || { "$KAFKA" start; started+=(kafka); }
BROKERS=$("$KAFKA" url)
"$MARIADB" status >/dev/null 2>&1 || { "$MARIADB" start; started+=(mariadb); }
STORE_URL=$("$MARIADB" createdb asyncd_operator_e2e)

section "CRD, RBAC, namespace $NS"
check "CRD applies"                  k apply -f crds/asyncjobconfigs.yaml
check "CRD established"              k wait --for=condition=Established --timeout=30s crd/asyncjobconfigs.asyncd.example.io
check "AsyncLimiter CRD established" k wait --for=condition=Established --timeout=30s crd/asynclimiters.asyncd.example.io
check "operator RBAC applies"        k apply -f config/rbac/operator.yaml
k create namespace "$NS" >/dev/null
check "dispatcher RBAC applies"      kn apply -f config/rbac/dispatcher.yaml
kn create secret generic asyncd-store --from-literal=url="$STORE_URL" >/dev/null
# the sample's signing key, labelled for the one config that may mount it
signing_secret() {  # signing_secret NAME [JOB]: a signing Secret, labelled for JOB if given
  kn create secret generic "$1" --from-literal=key=e2e-signing-key >/dev/null
  [[ -z ${2:-} ]] || kn label secret "$1" "asyncd.example.io/job=$2" >/dev/null
}
signing_secret order-cancel-signing order-cancel-job

# the operator authenticates as its ServiceAccount: what RBAC does not grant fails here
token=$(k -n asyncd-system create token asyncd-operator --duration=2h)
cp "$KUBECONFIG" "$WORK/operator.kubeconfig"
kubectl --kubeconfig "$WORK/operator.kubeconfig" config set-credentials asyncd-operator --token="$token" >/dev/null
kubectl --kubeconfig "$WORK/operator.kubeconfig" config set-context --current --user=asyncd-operator >/dev/null

port=$(free_port)
# The asyncd api of section 4b listens here; the operator reads the limiters' usage from
# it (section 4d) as its ServiceAccount, with a token for the api's audience.
API_PORT=$(free_port)
k -n asyncd-system create token asyncd-operator --audience asyncd --duration=2h >"$WORK/operator-api-token"
section "starting asyncd-operator (namespace $NS, brokers $BROKERS, http 127.0.0.1:$port)"
operator_in() {  # operator_in NAMESPACE PORT LOG: the operator, confined to NAMESPACE (exec'd, so `&` gives its pid)
  exec env KUBECONFIG="$WORK/operator.kubeconfig" ASYNCD_LOG=info,asyncd_operator=debug \
    "$OPERATOR_BIN" --kafka-brokers "$BROKERS" --dispatcher-image registry.example/asyncd:e2e \
    --namespace "$1" --listen "127.0.0.1:$2" --kafka-replication-factor 1 \
    --topic-owners-topic "$OWNERS_TOPIC" >>"$3" 2>&1
}
start_operator() {  # the first operator also reads the limiters' usage from the api
  (
    export ASYNCD_API_URL="http://127.0.0.1:$API_PORT" ASYNCD_API_TOKEN_FILE="$WORK/operator-api-token"
    export ASYNCD_USAGE_INTERVAL=2s
    operator_in "$NS" "$port" "$WORK/operator.log"
  ) &
  operator_pid=$!
}
start_operator
check "operator /readyz"             wait_for 30 curl -fsS "http://127.0.0.1:$port/readyz"
check "operator /healthz"            curl -fsS "http://127.0.0.1:$port/healthz"

# ---- 1. a config becomes a topic, a route, a Deployment and an HPA -------------------------
section "apply config/samples/order-cancel-job.yaml"
OC=order-cancel-job
OC_TOPIC=$(topic asyncd-order-cancel)
topics_created+=("$OC_TOPIC" "$OC_TOPIC-high")
check "apply order-cancel-job"       apply_sample order-cancel-job.yaml
check "order-cancel-job Ready"       kn wait --for=condition=Ready --timeout=60s "asyncjobconfig/$OC"
check "topic has 6 partitions"       topic_has "$OC_TOPIC" 6
check "high-priority topic too"      topic_has "$OC_TOPIC-high" 6
check "status.partitions is 6"       expect_eq partitions "$(jp asyncjobconfig/$OC '{.status.partitions}')" 6
check "observedGeneration"           expect_eq observedGeneration "$(jp asyncjobconfig/$OC '{.status.observedGeneration}')" "$(jp asyncjobconfig/$OC '{.metadata.generation}')"
check "status.limits in effect"      expect_eq limits "$(jp asyncjobconfig/$OC '{.status.limits.concurrency}')/$(jp asyncjobconfig/$OC '{.status.paused}')" 64/false
check "finalizer set"                expect_eq finalizers "$(jp asyncjobconfig/$OC '{.metadata.finalizers}')" '["asyncd.example.io/cleanup"]'

routing_entry() {  # the document under KEY, checked against what the loader needs
  local doc; doc=$(kn get configmap asyncd-routing -o "go-template={{index .data \"$1\"}}")
  expect_has "entry $1" "$doc" "apiVersion: asyncd.example.io/v1" &&
  expect_has "entry $1" "$doc" "kind: AsyncJobConfig" &&
  expect_has "entry $1" "$doc" "name: ${1%.yaml}" &&
  expect_has "entry $1" "$doc" "taskType: $2" &&
  expect_has "entry $1" "$doc" "topic: $3" &&
  expect_has "entry $1" "$doc" "namespace: $NS" &&
  ! grep -q "status:\|uid:" <<<"$doc"
}
# shellcheck disable=SC2016 # a go-template, expanded by kubectl
routing_keys() { kn get configmap asyncd-routing -o go-template='{{range $k, $v := .data}}{{$k}} {{end}}'; }
check "routing ConfigMap entry"      routing_entry order-cancel-job.yaml cancel_expired_order "$OC_TOPIC"
check "routing ConfigMap keys"       expect_eq keys "$(routing_keys)" "order-cancel-job.yaml "

deployment_spec() {
  local d=asyncd-dispatcher-$OC
  expect_eq image "$(jp deploy/$d '{.spec.template.spec.containers[0].image}')" registry.example/asyncd:e2e &&
  expect_eq args "$(jp deploy/$d '{.spec.template.spec.containers[0].args}')" \
    "[\"dispatcher\",\"--routing-configmap\",\"$NS/asyncd-routing\",\"--job\",\"$OC\",\"--kafka-brokers\",\"$BROKERS\",\"--listen\",\"0.0.0.0:7700\",\"--signing-dir\",\"/var/run/asyncd/signing\"]" &&
  expect_eq store-env "$(jp deploy/$d '{.spec.template.spec.containers[0].env[?(@.name=="ASYNCD_STORE")].valueFrom.secretKeyRef}')" '{"key":"url","name":"asyncd-store","optional":false}' &&
  expect_eq port "$(jp deploy/$d '{.spec.template.spec.containers[0].ports[0].containerPort}')" 7700 &&
  expect_eq serviceAccount "$(jp deploy/$d '{.spec.template.spec.serviceAccountName}')" asyncd-dispatcher &&
  expect_eq owner "$(jp deploy/$d '{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}/{.metadata.ownerReferences[0].controller}')" "AsyncJobConfig/$OC/true"
}
check "dispatcher Deployment spec"   deployment_spec

hpa_spec() {  # hpa_spec MIN MAX
  local h=asyncd-dispatcher-$OC
  expect_eq apiVersion "$(kn get hpa.v2.autoscaling "$h" -o jsonpath='{.apiVersion}')" autoscaling/v2 &&
  expect_eq target "$(jp hpa/$h '{.spec.scaleTargetRef.kind}/{.spec.scaleTargetRef.name}')" "Deployment/$h" &&
  expect_eq min/max "$(jp hpa/$h '{.spec.minReplicas}/{.spec.maxReplicas}')" "$1/$2" &&
  expect_eq metric "$(jp hpa/$h '{.spec.metrics[0].type}/{.spec.metrics[0].pods.metric.name}/{.spec.metrics[0].pods.target.type}/{.spec.metrics[0].pods.target.averageValue}')" \
    "Pods/asyncd_due_backlog/AverageValue/100"
}
check "HPA spec (1..6 on due backlog)" hpa_spec 1 6

get_asyncjobs() {
  local out; out=$(kn get asyncjobs)
  echo "$out"
  expect_has header "$(head -1 <<<"$out")" "TASK TYPE" &&
  for col in TOPIC PARTITIONS REPLICAS PAUSED READY AGE; do expect_has header "$(head -1 <<<"$out")" "$col" || return 1; done &&
  # PAUSED is `.spec.paused`, which the sample leaves unset (the CRD gives it no default):
  # kubectl leaves the cell blank.
  grep -E "^$OC +cancel_expired_order +$OC_TOPIC +6 +[0-9]+ +True " <<<"$out"
}
check "kubectl get asyncjobs shows Ready and the columns" get_asyncjobs
check "event TopicCreated"           wait_for 10 has_event "$OC" TopicCreated

# level-based and idempotent: a restarted operator finds everything in place and writes nothing
versions() {
  for o in "asyncjobconfig/$OC" "deploy/asyncd-dispatcher-$OC" "hpa/asyncd-dispatcher-$OC" configmap/asyncd-routing; do
    jp "$o" '{.metadata.resourceVersion} '
  done
}
changed_nothing() {  # changed_nothing VERSIONS-BEFORE
  wait_for 15 bash -c "curl -fsS http://127.0.0.1:$port/metrics | grep -q 'asyncd_operator_reconciliations_total{result=\"ok\"}'" || return 1
  sleep 2
  expect_eq resourceVersions "$(versions)" "$1" &&
  ! curl -fsS "http://127.0.0.1:$port/metrics" | grep -q asyncd_operator_topic_operations_total
}
before=$(versions)
kill "$operator_pid"; wait "$operator_pid" 2>/dev/null || true
start_operator
check "operator restarted"           wait_for 30 curl -fsS "http://127.0.0.1:$port/readyz"
check "a restart changes nothing"    changed_nothing "$before"

# ---- 2. partitions grow 6 -> 12; a shrink is refused -------------------------------------
section "grow to 12 partitions (config/samples/order-cancel-job-12-partitions.yaml)"
check "apply 12 partitions"          apply_sample order-cancel-job-12-partitions.yaml
check "status.partitions becomes 12" kn wait --for=jsonpath='{.status.partitions}'=12 --timeout=60s "asyncjobconfig/$OC"
check "topic grew to 12"             topic_has "$OC_TOPIC" 12
check "high-priority topic too"      topic_has "$OC_TOPIC-high" 12
check "Ready after growing"          kn wait --for=condition=Ready --timeout=30s "asyncjobconfig/$OC"
check "HPA follows (2..12)"          wait_for 20 hpa_spec 2 12
check "event PartitionsGrown"        wait_for 10 has_event "$OC" PartitionsGrown

section "shrink back to 6: refused"
check "apply 6 partitions again"     apply_sample order-cancel-job.yaml
check "TopicReady=False"             kn wait --for=condition=TopicReady=false --timeout=60s "asyncjobconfig/$OC"
check "reason ShrinkRefused"         expect_eq reason "$(cond $OC TopicReady reason)" ShrinkRefused
check "message says why"             expect_has message "$(cond $OC TopicReady message)" "Kafka cannot remove partitions"
check "Ready=False, ShrinkRefused"   expect_eq ready "$(cond $OC Ready status)/$(cond $OC Ready reason)" False/ShrinkRefused
check "topic still has 12"           topic_has "$OC_TOPIC" 12
check "warning event ShrinkRefused"  wait_for 10 has_event "$OC" ShrinkRefused Warning
back_to_12() { apply_sample order-cancel-job-12-partitions.yaml && kn wait --for=condition=Ready --timeout=60s "asyncjobconfig/$OC"; }
check "back to 12: Ready again"      back_to_12

# ---- 3. a second config claiming the task type: Conflict, nothing changed -------------------
section "a second config claims cancel_expired_order (config/samples/order-cancel-job-conflict.yaml)"
V2=order-cancel-job-v2
V2_TOPIC=$(topic asyncd-order-cancel-v2)
routing_before=$(kn get configmap asyncd-routing -o jsonpath='{.data}')
check "apply the conflicting config" apply_sample order-cancel-job-conflict.yaml
check "Conflict=True"                kn wait --for=condition=Conflict=true --timeout=60s "asyncjobconfig/$V2"
names_owner() { expect_eq reason "$(cond "$1" Conflict reason)" "$2" && expect_has message "$(cond "$1" Conflict message)" "\"$OC\""; }
check "reason names the owner"       names_owner "$V2" TaskTypeOwnedByOther
check "conflicting config not Ready" expect_eq ready "$(cond $V2 Ready status)/$(cond $V2 Ready reason)" False/Conflict
check "no topic for it"              topic_absent "$V2_TOPIC"
no_workloads() { ! kn get "deploy/asyncd-dispatcher-$1" 2>/dev/null && ! kn get "hpa/asyncd-dispatcher-$1" 2>/dev/null; }
check "no Deployment, no HPA for it" no_workloads "$V2"
check "routing ConfigMap unchanged"  expect_eq routing "$(kn get configmap asyncd-routing -o jsonpath='{.data}')" "$routing_before"
check "owner still Ready"            expect_eq ready "$(cond $OC Ready status)" True
check "warning event on the conflict" wait_for 10 has_event "$V2" TaskTypeOwnedByOther Warning
check "delete the conflicting config" kn delete asyncjobconfig "$V2" --wait=true --timeout=30s
check "owner's topic untouched"      topic_has "$OC_TOPIC" 12
check "owner's route untouched"      routing_entry order-cancel-job.yaml cancel_expired_order "$OC_TOPIC"

section "a config claiming the owner's topic, with deletePolicy: Delete, deleted: the owner's topic stays"
cat >"$WORK/topic-thief.yaml" <<EOF
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: topic-thief}
spec:
  taskType: steal_topic
  executor: {url: http://thief.example.svc:8080/run}
  kafka: {topic: $OC_TOPIC, partitions: 12, deletePolicy: Delete}
EOF
check "apply the topic thief"        kn apply -f "$WORK/topic-thief.yaml"
check "Conflict=True on the topic"   kn wait --for=condition=Conflict=true --timeout=60s asyncjobconfig/topic-thief
check "reason names the topic's owner" names_owner topic-thief TopicOwnedByOther
check "delete the topic thief"       kn delete asyncjobconfig topic-thief --wait=true --timeout=30s
check "owner's topic still there"    topic_has "$OC_TOPIC" 12

# ---- 3b. tenancy: signing Secrets, topics of another namespace, topics nobody owns ----------
section "a signing Secret is mounted only for the config its label names"
signer() {  # signer CONFIG SECRET: a config without a topic that signs with SECRET
  kn apply -f - <<EOF
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: $1}
spec:
  taskType: $1
  executor:
    url: http://$1.example.svc:8080/run
    signing: {secretRef: {name: $2}}
EOF
}
refused_for() {  # refused_for NS CONFIG REASON: Conflict=True with REASON, no workloads, no route
  k -n "$1" wait --for=condition=Conflict=true --timeout=60s "asyncjobconfig/$2" &&
  expect_eq reason "$(k -n "$1" get "asyncjobconfig/$2" -o jsonpath='{.status.conditions[?(@.type=="Conflict")].reason}')" "$3" &&
  ! k -n "$1" get "deploy/asyncd-dispatcher-$2" 2>/dev/null &&
  ! k -n "$1" get "hpa/asyncd-dispatcher-$2" 2>/dev/null &&
  ! k -n "$1" get configmap asyncd-routing -o jsonpath='{.data}' 2>/dev/null | grep -q "\"$2.yaml\""
}
check "a config naming $OC's signing Secret"  signer key-thief order-cancel-signing
check "refused: SigningSecretOwnedByOther, no Deployment" refused_for "$NS" key-thief SigningSecretOwnedByOther
check "the message names the Secret's job"   expect_has message "$(cond key-thief Conflict message)" "\"order-cancel-job\""
signing_secret bare-signing
check "a config naming an unlabelled Secret" signer bare-signer bare-signing
check "refused: SigningSecretNotLabelled, no Deployment" refused_for "$NS" bare-signer SigningSecretNotLabelled
check "label the Secret for the config"      kn label secret bare-signing asyncd.example.io/job=bare-signer
# a Secret's change does not wake the operator (it never watches Secrets): touch the config
check "touch the config"                     kn annotate asyncjobconfig bare-signer e2e/touched=1
check "then it is Ready"                     kn wait --for=condition=Ready --timeout=60s asyncjobconfig/bare-signer
mounted() { expect_eq volume "$(jp deploy/asyncd-dispatcher-bare-signer '{.spec.template.spec.volumes[?(@.name=="signing")].secret.secretName}')" bare-signing; }
check "and its Deployment mounts the Secret" mounted
check "delete both signers"                  kn delete asyncjobconfig key-thief bare-signer --wait=true --timeout=30s

section "a second namespace ($NS2, its own operator) names $NS's topic"
k create namespace "$NS2" >/dev/null
port2=$(free_port)
operator_in "$NS2" "$port2" "$WORK/operator2.log" &
operator2_pid=$!
check "second operator /readyz"              wait_for 30 curl -fsS "http://127.0.0.1:$port2/readyz"
cat >"$WORK/cross-namespace.yaml" <<EOF
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: taker}
spec:
  taskType: take_topic
  executor: {url: http://taker.example.svc:8080/run}
  kafka: {topic: $OC_TOPIC, partitions: 16, deletePolicy: Delete}
EOF
check "apply it in $NS2"                     k -n "$NS2" apply -f "$WORK/cross-namespace.yaml"
check "refused: TopicOwnedByOther, no Deployment, no route" refused_for "$NS2" taker TopicOwnedByOther
check "the message names $NS/$OC"            expect_has message "$(k -n "$NS2" get asyncjobconfig/taker -o jsonpath='{.status.conditions[?(@.type=="Conflict")].message}')" "\"$NS/$OC\""
check "the topic was not grown"              topic_has "$OC_TOPIC" 12
check "delete it (deletePolicy: Delete)"     k -n "$NS2" delete asyncjobconfig taker --wait=true --timeout=30s
check "$NS's topic is still there"           topic_has "$OC_TOPIC" 12
check "and its high-priority topic"          topic_has "$OC_TOPIC-high" 12
check "$OC still Ready"                      expect_eq ready "$(cond $OC Ready status)" True
kill "$operator2_pid"; wait "$operator2_pid" 2>/dev/null || true
operator2_pid=""

section "a topic that exists without an owner record: refused until an admin assigns it"
PRE_TOPIC=$(topic asyncd-preexisting)
topics_created+=("$PRE_TOPIC" "$PRE_TOPIC-high")
"$KAFKA" create-topic "$PRE_TOPIC" 3 >/dev/null 2>&1
cat >"$WORK/squatter.yaml" <<EOF
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: squatter}
spec:
  taskType: squat
  executor: {url: http://squatter.example.svc:8080/run}
  kafka: {topic: $PRE_TOPIC, partitions: 3}
EOF
check "apply a config naming it"             kn apply -f "$WORK/squatter.yaml"
check "refused: TopicNotOwned, no Deployment" refused_for "$NS" squatter TopicNotOwned
assign() {  # assign TOPIC OWNER: an admin writes the owner record (docs/security.md)
  printf '%s|%s\n' "$1" "$2" | java -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp "$KAFKA_LIBS/*" \
    org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$BROKERS" --topic "$OWNERS_TOPIC" \
    --property parse.key=true --property 'key.separator=|' 2>/dev/null
}
check "an admin assigns it to $NS/squatter"  assign "$PRE_TOPIC" "$NS/squatter"
check "touch the config"                     kn annotate asyncjobconfig squatter e2e/touched=1
check "then it is Ready"                     kn wait --for=condition=Ready --timeout=60s asyncjobconfig/squatter
check "its high-priority topic was created"  topic_has "$PRE_TOPIC-high" 3
check "delete it (Retain)"                   kn delete asyncjobconfig squatter --wait=true --timeout=30s
check "the topic is kept"                    topic_has "$PRE_TOPIC" 3

# ---- 4. dispatchers execute tasks through the route in the ConfigMap ----------------------
# ---- 4b. a dispatcher follows the route from the ConfigMap, without a restart ------------------
# asyncd api + dispatcher run as local processes on the routing ConfigMap (`--job` for the
# dispatcher, as the operator's Deployment runs it), started while the route still points at
# the sample's in-cluster URL. Re-pointing the config at a local executor must reach the
# running dispatcher through the operator and the ConfigMap watch, and tasks must run there.
section "asyncd dispatcher --routing-configmap $NS/asyncd-routing --job $OC"
cargo build --locked -p asyncd
ASYNCD_BIN="$CARGO_TARGET_DIR/debug/asyncd"
EXEC_PORT=$(free_port); DISP_PORT=$(free_port)
stop_roles() { for pid in "${role_pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; }
python3 examples/executor.py "$EXEC_PORT" >"$WORK/executor.log" 2>&1 & role_pids+=($!)
ASYNCD_STORE=$STORE_URL "$ASYNCD_BIN" migrate >/dev/null
roles_env=(env ASYNCD_STORE="$STORE_URL" ASYNCD_ROUTING_CONFIGMAP="$NS/asyncd-routing" ASYNCD_KAFKA_BROKERS="$BROKERS")
# The job signs its calls with its own Secret's key; this dispatcher finds it where the
# operator would mount it (a job whose key is missing is not dispatched).
mkdir -p "$WORK/signing/order-cancel-signing"
printf 'e2e-signing-key' >"$WORK/signing/order-cancel-signing/key"
"${roles_env[@]}" "$ASYNCD_BIN" dispatcher --job "$OC" --listen "127.0.0.1:$DISP_PORT" \
  --signing-dir "$WORK/signing" >"$WORK/dispatcher.log" 2>&1 & role_pids+=($!)
# The api authenticates callers with TokenReview and authorizes them with
# SubjectAccessReview (section 4c tests that); team-a's ServiceAccount may submit to and
# read the job's tasks through an ordinary Role.
job_role() {  # job_role NAME VERBS: a Role on $OC's tasks, bound to team-a (docs/security.md)
  kn apply -f - <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: $1}
rules:
  - apiGroups: [asyncd.example.io]
    resources: [asyncjobconfigs/tasks]
    resourceNames: [$OC]
    verbs: [$2]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: $1}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: $1}
subjects: [{kind: ServiceAccount, name: team-a, namespace: $NS}]
EOF
}
kn create serviceaccount team-a >/dev/null
job_role order-cancel-tasks "create, get" >/dev/null
TOKEN_A=$(kn create token team-a --audience asyncd)
"${roles_env[@]}" "$ASYNCD_BIN" api --listen "127.0.0.1:$API_PORT" --auth kubernetes >"$WORK/api.log" 2>&1 & role_pids+=($!)
check "dispatcher up"                wait_for 30 curl -fsS "http://127.0.0.1:$DISP_PORT/healthz"
check "api up"                       wait_for 30 curl -fsS "http://127.0.0.1:$API_PORT/healthz"
repoint() { sample order-cancel-job-12-partitions.yaml | sed -E "s#url: .*#url: http://127.0.0.1:$EXEC_PORT/tasks/cancel#" | kubectl -n "$NS" apply -f -; }
check "re-point the executor URL"    repoint
routed_to_stub() { kn get configmap asyncd-routing -o jsonpath='{.data}' | grep -q "127.0.0.1:$EXEC_PORT"; }
check "route carries the new URL"    wait_for 30 routed_to_stub
submit_task() {  # submit_task ORDER: 201 from the api, answer kept for `ran`
  curl -fsS -XPOST "http://127.0.0.1:$API_PORT/v1/tasks" -H "Authorization: Bearer $TOKEN_A" \
    -H 'Content-Type: application/json' -d "{\"type\": \"cancel_expired_order\", \"payload\": {\"order_id\": $1}}" >"$WORK/submit-$1.json"
}
ran() {  # ran ORDER: the local executor ran that task
  local id
  id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' <"$WORK/submit-$1.json")
  grep -q "executing cancel_expired_order $id" "$WORK/executor.log"
}
# The api learns the job from its own watch of the ConfigMap: retry the first submit until then.
check "api accepts the job's tasks"  wait_for 30 submit_task 101
check "the dispatcher that read the ConfigMap runs it" wait_for 40 ran 101
check "a second task, no restart"    submit_task 102
check "runs too"                     wait_for 30 ran 102
check "dispatcher never restarted"   kill -0 "${role_pids[1]}"

# ---- 4c. callers authenticated by TokenReview, authorized by RBAC on the job -----------------
section "api --auth kubernetes: a ServiceAccount bound to $OC submits there and nowhere else"
cat >"$WORK/other-job.yaml" <<EOF
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: other-job}
spec:
  taskType: other_task
  executor: {url: http://127.0.0.1:$EXEC_PORT/tasks/other}
EOF
call() {  # call METHOD PATH [TOKEN [BODY]]: prints "STATUS CODE" of the api's answer
  local auth=() body=()
  [[ -n ${3:-} ]] && auth=(-H "Authorization: Bearer $3")
  [[ -n ${4:-} ]] && body=(-H 'Content-Type: application/json' -d "$4")
  curl -sS -o "$WORK/answer.json" -w '%{http_code} ' -X "$1" "${auth[@]}" "${body[@]}" "http://127.0.0.1:$API_PORT$2"
  python3 -c 'import json,sys
try: print(json.load(open(sys.argv[1]))["error"]["code"])
except Exception: print("-")' "$WORK/answer.json"
}
expect_call() {  # expect_call WANT METHOD PATH [TOKEN [BODY]]
  local want=$1; shift
  expect_eq "$1 $2" "$(call "$@")" "$want"
}
check "apply a second job, other-job" kn apply -f "$WORK/other-job.yaml"
api_knows_other() { expect_call "403 forbidden" POST /v1/tasks "$TOKEN_A" '{"type": "other_task"}'; }
check "the api learns other-job (team-a is refused there: 403)" wait_for 30 api_knows_other
A_ID=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' <"$WORK/submit-101.json")
check "team-a reads its task"         expect_call "200 -" GET "/v1/tasks/$A_ID" "$TOKEN_A"
check "team-a submits to $OC: 201"    expect_call "201 -" POST /v1/tasks "$TOKEN_A" '{"type": "cancel_expired_order", "payload": {"order_id": 103}}'
check "team-a submits to other-job: 403" expect_call "403 forbidden" POST /v1/tasks "$TOKEN_A" '{"type": "other_task"}'
can_i() {  # can_i WANT SA VERB JOB [SUBRESOURCE]: what kubectl auth can-i answers
  expect_eq "can-i $3 $4/${5:-tasks} as $2" \
    "$(k auth can-i "$3" "asyncjobconfigs.asyncd.example.io/$4" --subresource="${5:-tasks}" -n "$NS" --as="system:serviceaccount:$NS:$2" 2>/dev/null)" "$1"
}
check "kubectl auth can-i: team-a may create $OC/tasks" can_i yes team-a create "$OC"
check "kubectl auth can-i: team-a may not create other-job/tasks" can_i no team-a create other-job
check "kubectl auth can-i: team-a may not delete $OC/tasks" can_i no team-a delete "$OC"
check "kubectl auth can-i: team-a may not redrive $OC" can_i no team-a update "$OC" deadletters

# Every public endpoint refuses no token, a garbage one, one bound to another audience, the
# token of a ServiceAccount that no longer exists (invalid), an expired one, and one out of
# scope.
kn create serviceaccount gone >/dev/null && kn create serviceaccount team-none >/dev/null
TOKEN_GONE=$(kn create token gone --audience asyncd)
kn delete serviceaccount gone --wait=true >/dev/null
TOKEN_OTHER_AUD=$(kn create token team-a --audience someone-else)
TOKEN_NONE=$(kn create token team-none --audience asyncd)
# An expired token: the API server issues none shorter than ten minutes, so these are
# minted as it mints its own — its claims, ES256-signed with the test bed's
# service-account key. The unexpired twin must be accepted, so it is the expiry alone
# that refuses the first.
PKI=${ASYNCD_CONTROLPLANE_DIR:-${ASYNCD_CACHE:-/var/cache/asyncd}/run/controlplane}/pki
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
# JWS wants ES256 as the raw 32-byte r and s; openssl writes a DER SEQUENCE of two INTEGERs.
der_to_jws() {
  python3 -c 'import sys
d = sys.stdin.buffer.read()
def integer(i):
    assert d[i] == 2, "DER INTEGER expected"
    n = d[i + 1]
    return int.from_bytes(d[i + 2:i + 2 + n], "big"), i + 2 + n
r, i = integer(2 if d[1] < 0x80 else 3)
s, _ = integer(i)
sys.stdout.buffer.write(r.to_bytes(32, "big") + s.to_bytes(32, "big"))'
}
mint_token() {  # mint_token SA EXPIRES_IN_SECONDS: a token of SA for audience asyncd
  local uid now header payload sig
  uid=$(kn get serviceaccount "$1" -o jsonpath='{.metadata.uid}')
  now=$(date +%s)
  header=$(printf '{"alg":"ES256","typ":"JWT"}' | b64url)
  payload=$(printf '{"aud":["asyncd"],"iss":"https://kubernetes.default.svc.cluster.local","sub":"system:serviceaccount:%s:%s","iat":%d,"nbf":%d,"exp":%d,"kubernetes.io":{"namespace":"%s","serviceaccount":{"name":"%s","uid":"%s"}}}' \
    "$NS" "$1" $((now - 900)) $((now - 900)) $((now + $2)) "$NS" "$1" "$uid" | b64url)
  sig=$(printf '%s.%s' "$header" "$payload" | openssl dgst -sha256 -sign "$PKI/sa.key" | der_to_jws | b64url)
  printf '%s.%s.%s' "$header" "$payload" "$sig"
}
TOKEN_EXPIRED=$(mint_token team-a -60)
TOKEN_MINTED=$(mint_token team-a 600)
check "a token minted like the API server's own is accepted (201)" \
  expect_call "201 -" POST /v1/tasks "$TOKEN_MINTED" '{"type": "cancel_expired_order", "payload": {"order_id": 105}}'
endpoints=("POST /v1/tasks" "POST /v1/tasks:batch" "GET /v1/tasks/$A_ID" "DELETE /v1/tasks/$A_ID"
           "GET /v1/dead-letters" "GET /v1/dead-letters?type=cancel_expired_order" "POST /v1/dead-letters/$A_ID/redrive")
body_for() {
  case $1 in
    "POST /v1/tasks") echo '{"type": "cancel_expired_order"}' ;;
    "POST /v1/tasks:batch") echo '{"tasks": [{"type": "cancel_expired_order"}]}' ;;
    *) echo "" ;;
  esac
}
refuses_bad_tokens() {
  local e method path t
  for e in "${endpoints[@]}"; do
    read -r method path <<<"$e"
    for t in "" not-a-token "$TOKEN_OTHER_AUD" "$TOKEN_GONE" "$TOKEN_EXPIRED"; do
      expect_call "401 unauthenticated" "$method" "$path" "$t" "$(body_for "$e")" || return 1
    done
  done
}
check "every endpoint: no, garbage, wrong-audience, invalid and expired tokens answer 401" refuses_bad_tokens
out_of_scope() {
  expect_call "403 forbidden" POST /v1/tasks "$TOKEN_NONE" "$(body_for "POST /v1/tasks")" &&
  expect_call "200 -" POST /v1/tasks:batch "$TOKEN_NONE" "$(body_for "POST /v1/tasks:batch")" &&
  expect_has "batch item" "$(cat "$WORK/answer.json")" '"status":403' &&
  # A task of a job the caller may not read answers as an unknown id.
  expect_call "404 not_found" GET "/v1/tasks/$A_ID" "$TOKEN_NONE" &&
  expect_call "404 not_found" DELETE "/v1/tasks/$A_ID" "$TOKEN_NONE" &&
  expect_call "404 not_found" POST "/v1/dead-letters/$A_ID/redrive" "$TOKEN_NONE" &&
  expect_call "403 forbidden" GET /v1/dead-letters "$TOKEN_NONE" &&
  expect_call "403 forbidden" GET "/v1/dead-letters?type=cancel_expired_order" "$TOKEN_NONE" &&
  # team-a may read the task but not cancel it (no delete in its Role): 403, not 404.
  expect_call "403 forbidden" DELETE "/v1/tasks/$A_ID" "$TOKEN_A" &&
  expect_call "403 forbidden" GET /v1/dead-letters "$TOKEN_A"
}
check "every endpoint: an out-of-scope ServiceAccount is refused, hidden tasks look unknown" out_of_scope
submit_delayed() {
  curl -fsS -XPOST "http://127.0.0.1:$API_PORT/v1/tasks" -H "Authorization: Bearer $TOKEN_A" \
    -H 'Content-Type: application/json' -d '{"type": "cancel_expired_order", "payload": {"order_id": 104}, "delay": "1h"}' >"$WORK/delayed.json"
}
check "submit a delayed task as team-a" submit_delayed
DELAYED=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' <"$WORK/delayed.json")
check "team-a may not cancel it yet"  expect_call "403 forbidden" DELETE "/v1/tasks/$DELAYED" "$TOKEN_A"
check "grant team-a delete on $OC/tasks" job_role order-cancel-cancel delete
check "kubectl auth can-i: now team-a may delete $OC/tasks" can_i yes team-a delete "$OC"
# The api remembers a refusal for 2 s (docs/security.md), so the grant applies within that.
cancel_delayed() { expect_call "200 -" DELETE "/v1/tasks/$DELAYED" "$TOKEN_A"; }
check "the api lets team-a cancel once RBAC allows it" wait_for 15 cancel_delayed
check "the api log holds no token"   bash -c "! grep -qF -- '$TOKEN_A' '$WORK/api.log'"
check "delete other-job"             kn delete asyncjobconfig other-job --wait=true --timeout=30s

# ---- 4d. kubectl get asynclimiters shows the attempts running under a limiter ---------------
# The operator reads them from the api (GET /v1/limiters) as its ServiceAccount; the api
# authorizes that with SubjectAccessReview (config/rbac/operator.yaml grants the read).
# An executor that accepts every call with a 202 lease keeps its attempts running.
section "the RUNNING column of kubectl get asynclimiters, read from the api"
HOLD_PORT=$(free_port)
python3 e2e/hold_executor.py "$HOLD_PORT" >"$WORK/hold.log" 2>&1 & role_pids+=($!)
check "declare the limiter"          apply_sample payment-provider-limiter.yaml
name_limiter() {
  local patch='{"spec":{"limiters":["payment-provider"],"executor":{"url":"http://127.0.0.1:%s/tasks/cancel"}}}'
  # shellcheck disable=SC2059 # the format is the patch, with the port in it
  kn patch asyncjobconfig "$OC" --type merge -p "$(printf "$patch" "$HOLD_PORT")"
}
check "the job names it, its executor holds every call" name_limiter
routed_to_hold() { kn get configmap asyncd-routing -o jsonpath='{.data}' | grep -q "127.0.0.1:$HOLD_PORT"; }
check "routed"                       wait_for 30 routed_to_hold
# the api and the dispatcher learn the limiter from their watch of the ConfigMap
limiter_listed() { curl -fsS "http://127.0.0.1:$API_PORT/v1/limiters" -H "Authorization: Bearer $TOKEN_A" | grep -q payment-provider; }
check "the api lists the limiter"    wait_for 30 limiter_listed
submit_three() { submit_task 201 && submit_task 202 && submit_task 203; }
check "submit three tasks"           submit_three
held() { expect_eq accepted "$(grep -c accepted "$WORK/hold.log")" 3; }
check "three calls accepted and held" wait_for 30 held
limiter_running() { expect_eq running "$(kn get asynclimiters payment-provider --no-headers | awk '{print $5}')" 3; }
check "kubectl get asynclimiters: RUNNING 3" wait_for 30 limiter_running
check "the job names no limiter again" kn patch asyncjobconfig "$OC" --type merge -p '{"spec":{"limiters":null}}'
check "delete the limiter"           kn delete asynclimiter payment-provider --wait=true --timeout=30s
stop_roles

# ---- 5. deleting the config removes the route and keeps the topic ----------------------------
section "delete order-cancel-job (deletePolicy: Retain)"
check "delete order-cancel-job"      kn delete asyncjobconfig "$OC" --wait=true --timeout=30s
route_gone() { expect_eq keys "$(routing_keys)" ""; }
check "route removed"                wait_for 20 route_gone
check "topic kept (Retain)"          topic_has "$OC_TOPIC" 12
check "Deployment and HPA removed"   wait_for 20 no_workloads "$OC"

section "config/samples/invoice-reminder-job.yaml: clamped scaling, deletePolicy: Delete"
IR=invoice-reminder-job
IR_TOPIC=$(topic asyncd-invoice-reminder)
topics_created+=("$IR_TOPIC" "$IR_TOPIC-high")
check "apply invoice-reminder-job"   apply_sample invoice-reminder-job.yaml
check "invoice-reminder-job Ready"   kn wait --for=condition=Ready --timeout=60s "asyncjobconfig/$IR"
check "topic has 3 partitions"       topic_has "$IR_TOPIC" 3
clamped() { expect_eq min/max "$(jp "hpa/asyncd-dispatcher-$IR" '{.spec.minReplicas}/{.spec.maxReplicas}')" 1/3 && expect_eq reason "$(cond $IR ScalingReady reason)" MaxReplicasClamped; }
check "maxReplicas clamped to 3"     clamped

section "an AsyncLimiter named by invoice-reminder-job (config/samples/payment-provider-limiter.yaml)"
check "name a limiter not declared"  kn patch asyncjobconfig "$IR" --type merge -p '{"spec":{"limiters":["payment-provider"]}}'
check "not Ready, InvalidSpec"       kn wait --for=condition=Ready=false --timeout=30s "asyncjobconfig/$IR"
check "the message names the field"  expect_has message "$(cond $IR Ready message)" "spec.limiters[0]"
check "not routed meanwhile"         expect_eq keys "$(routing_keys)" ""
check "declare the limiter"          apply_sample payment-provider-limiter.yaml
check "Ready again"                  kn wait --for=condition=Ready --timeout=60s "asyncjobconfig/$IR"
routed_with_limiter() { expect_eq keys "$(routing_keys)" "invoice-reminder-job.yaml limiter_payment-provider.yaml "; }
check "routed, the limiter beside it" wait_for 20 routed_with_limiter
limiter_doc() {
  local doc; doc=$(kn get configmap asyncd-routing -o 'go-template={{index .data "limiter_payment-provider.yaml"}}')
  expect_has limiter "$doc" "kind: AsyncLimiter" && expect_has limiter "$doc" "namespace: $NS" &&
  expect_has limiter "$doc" "concurrency: 20"
}
check "the limiter's routing entry"  limiter_doc
limiter_jobs() { expect_eq jobs "$(jp asynclimiter/payment-provider '{.status.jobs}')" '["invoice-reminder-job"]'; }
check "status.jobs names the job"    wait_for 20 limiter_jobs
limiter_columns() { expect_eq columns "$(kn get asynclimiters payment-provider --no-headers | awk '{print $1, $2, $3, $4}')" "payment-provider 20 50 1"; }
check "kubectl get asynclimiters: CONCURRENCY, RATE, JOBS" limiter_columns
check "delete invoice-reminder-job"  kn delete asyncjobconfig "$IR" --wait=true --timeout=30s
check "delete the limiter"           kn delete asynclimiter payment-provider --wait=true --timeout=30s
check "its topic is deleted"         wait_for 20 topic_absent "$IR_TOPIC"
check "high-priority topic too"      wait_for 20 topic_absent "$IR_TOPIC-high"

# ---- 6. invalid specs are refused by the API server -----------------------------------------
section "invalid specs"
rejected() {  # rejected MESSAGE: the document on stdin must be refused with MESSAGE
  local out
  if out=$(kubectl -n "$NS" apply -f - 2>&1); then echo "accepted: $out"; return 1; fi
  expect_has rejection "$out" "$1"
}
invalid() {  # a valid base document with one edit (a sed expression)
  sed -E "$1" <<EOF
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: bad-$RANDOM}
spec:
  taskType: bad
  executor: {url: http://bad.example.svc:8080/run}
  kafka: {topic: asyncd-bad-$RUN, partitions: 3}
  cron: [{name: nightly, schedule: "CRON_TZ=UTC 0 0 * * *"}]
  scaling: {minReplicas: 1, maxReplicas: 3}
EOF
}
valid_base() { invalid 's/x/x/' | kn apply --dry-run=server -f -; }
refused() { invalid "$1" | rejected "$2"; }  # refused SED-EDIT MESSAGE
check "base of the invalid cases is valid" valid_base
check "cron without CRON_TZ= refused" refused 's/CRON_TZ=UTC //' 'a cron schedule must start with CRON_TZ='
check "maxReplicas < minReplicas refused" refused 's/minReplicas: 1, maxReplicas: 3/minReplicas: 4, maxReplicas: 2/' 'scaling.maxReplicas must not be below scaling.minReplicas'
check "partitions 0 refused"         refused 's/partitions: 3/partitions: 0/' 'kafka.partitions must be at least 1'
check "partitions above the CRD's 1024 refused" refused 's/partitions: 3/partitions: 1025/' 'spec.kafka.partitions in body should be less than or equal to 1024'
check "maxReplicas above the CRD's 1024 refused" refused 's/maxReplicas: 3/maxReplicas: 1025/' 'spec.scaling.maxReplicas in body should be less than or equal to 1024'
# within the CRD's ceiling but above the operator's cap (--max-partitions, default 256):
# stored, then refused by the operator, naming the field; no topic
over_cap() { invalid 's/partitions: 3/partitions: 300/; s/name: bad-[0-9]+/name: over-cap/' | kn apply -f -; }
check "partitions above the operator's cap: stored" over_cap
capped() {
  kn wait --for=condition=Ready=false --timeout=60s asyncjobconfig/over-cap &&
  expect_eq reason "$(cond over-cap Ready reason)" InvalidSpec &&
  expect_has message "$(cond over-cap Ready message)" "spec.kafka.partitions: 300 is above this operator's cap of 256" &&
  topic_absent "asyncd-bad-$RUN"
}
check "refused by the operator (InvalidSpec naming spec.kafka.partitions), no topic" capped
check "delete it"                    kn delete asyncjobconfig over-cap --wait=true --timeout=30s
invalid_sample() {
  local out
  if out=$(kubectl -n "$NS" apply -f config/samples/invalid-job.yaml 2>&1); then echo "accepted: $out"; return 1; fi
  echo "$out"
  for m in "spec.cron[0].schedule" "CRON_TZ=" "spec.scaling" "maxReplicas must not be below" "spec.kafka.partitions" "at least 1"; do
    expect_has rejection "$out" "$m" || return 1
  done
}
check "config/samples/invalid-job.yaml refused, naming each field" invalid_sample
check "nothing invalid was stored"   expect_eq stored "$(kn get asyncjobconfigs -o name)" ""

# ---- 7. RBAC and metrics --------------------------------------------------------------------
section "RBAC and metrics"
sa_can() { k auth can-i "$@" -n "$NS" --as="system:serviceaccount:$NS:asyncd-dispatcher"; }
check "dispatcher may watch the routing ConfigMap" sa_can watch configmaps/asyncd-routing
cannot() { ! k auth can-i "$@" -n "$NS"; }
check "dispatcher may not read other ConfigMaps"   cannot get configmaps/other --as="system:serviceaccount:$NS:asyncd-dispatcher"
check "dispatcher may not read Secrets"           cannot get secrets --as="system:serviceaccount:$NS:asyncd-dispatcher"
op_secrets() {  # it reads a signing Secret's label by name, never lists or watches Secrets
  k auth can-i get secrets -n "$NS" --as=system:serviceaccount:asyncd-system:asyncd-operator >/dev/null &&
  cannot list secrets --as=system:serviceaccount:asyncd-system:asyncd-operator &&
  cannot watch secrets --as=system:serviceaccount:asyncd-system:asyncd-operator
}
check "operator may get, not list or watch, Secrets" op_secrets
op_as=(--as=system:serviceaccount:asyncd-system:asyncd-operator)
check "operator may not read other ConfigMaps"     cannot get configmaps/other "${op_as[@]}"
check "operator may not delete the routing ConfigMap" cannot delete configmaps/asyncd-routing "${op_as[@]}"
op_cannot() {  # op_cannot VERB RESOURCE...: the operator may do VERB on none of them
  local verb=$1 r; shift
  for r in "$@"; do cannot "$verb" "$r" "${op_as[@]}" || { echo "operator may $verb $r"; return 1; }; done
}
no_config_writes() { op_cannot create asyncjobconfigs.asyncd.example.io && op_cannot delete asyncjobconfigs.asyncd.example.io; }
check "operator may not create or delete AsyncJobConfigs" no_config_writes
check "operator may not create Pods, RBAC or ServiceAccounts" \
  op_cannot create pods roles.rbac.authorization.k8s.io rolebindings.rbac.authorization.k8s.io serviceaccounts
check "operator may not create core Events"        cannot create events "${op_as[@]}"
check "operator may not take Leases"              cannot create leases.coordination.k8s.io "${op_as[@]}"
metrics_ok() {
  local m; m=$(curl -fsS "http://127.0.0.1:$port/metrics")
  expect_has metrics "$m" 'asyncd_operator_reconciliations_total{result="ok"}' &&
  expect_has metrics "$m" 'asyncd_operator_topic_operations_total{op="grow"} 2' &&
  # order-cancel-job's two topics were created before the restart; since: squatter's
  # high-priority topic and invoice-reminder-job's two
  expect_has metrics "$m" 'asyncd_operator_topic_operations_total{op="create"} 3'
}
check "operator /metrics"            metrics_ok
no_failures() { ! grep 'reconcile failed' "$WORK/operator.log"; }
check "operator logged no reconcile failure" no_failures
