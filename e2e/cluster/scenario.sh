#!/usr/bin/env bash
# The cluster scenario: asyncd installed with its Helm chart into a real cluster whose
# images are loaded, run end to end. The same script runs on this machine's one-node
# cluster (e2e/cluster.sh test) and on kind (e2e/kind.sh).
#
# Needs: KUBECONFIG; kubectl; helm (ASYNCD_HELM, else $ASYNCD_CACHE/helm-*/helm, else PATH);
# the images asyncd:<appVersion>, asyncd:<appVersion>-roll, asyncd-operator:<appVersion>
# and asyncd-e2e:dev on the node (e2e/cluster/images.sh).
# ASYNCD_CLUSTER_EXEC: a prefix every kubectl/helm command runs under (the local node's
# `nsenter --net=…`). ASYNCD_CLUSTER_DEPS: "netns" (Kafka and MariaDB of e2e/services run
# in the node's network namespace at ASYNCD_CLUSTER_NODE_IP, reached through selector-less
# Services) or "pods" (Kafka and MariaDB as pods from public images: kind).
#
# Checks, each printed as ok/FAIL; last line `cluster: N passed, N failed`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=e2e/lib.sh
source "$root/e2e/lib.sh"
cd "$root"
export ASYNCD_CACHE=${ASYNCD_CACHE:-/var/cache/asyncd}
NS=${ASYNCD_CLUSTER_NAMESPACE:-asyncd}
DEPS=${ASYNCD_CLUSTER_DEPS:-netns}
NODE_IP=${ASYNCD_CLUSTER_NODE_IP:-}
RELEASE=asyncd
FN=asyncd  # the chart's "<release>-asyncd" prefix: just the release name when it contains "asyncd"
read -ra X <<<"${ASYNCD_CLUSTER_EXEC:-}"
WORK=$(mktemp -d /tmp/asyncd-cluster.XXXXXX)
APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/asyncd/Chart.yaml)

passed=0 failed=0
t_start=$SECONDS
say() { printf '[scenario %4ds] %s\n' $((SECONDS - t_start)) "$*"; }
# the summary lines of a passing check to show
CHECK_SHOWS='^(note|count|time):'
require() {  # require NAME CMD...: a check the rest depends on
  check "$@"
  if (( failed )); then exit 1; fi  # the EXIT trap prints the diagnostics
}
k() { "${X[@]}" kubectl --request-timeout=30s "$@"; }
kn() { k -n "$NS" "$@"; }
helm_bin() {
  if [[ -n ${ASYNCD_HELM:-} ]]; then echo "$ASYNCD_HELM"; return; fi
  local h
  for h in "$ASYNCD_CACHE"/helm-*/helm; do [[ -x $h ]] && { echo "$h"; return; }; done
  command -v helm >/dev/null && { command -v helm; return; }
  bash e2e/chart.sh --tools >&2 && for h in "$ASYNCD_CACHE"/helm-*/helm; do [[ -x $h ]] && { echo "$h"; return; }; done
  return 1
}
HELM=$(helm_bin) || { echo "no helm"; exit 1; }
export HELM_CACHE_HOME=$WORK/helm/cache HELM_CONFIG_HOME=$WORK/helm/config HELM_DATA_HOME=$WORK/helm/data
helm() { "${X[@]}" env KUBECONFIG="$KUBECONFIG" HELM_CACHE_HOME="$HELM_CACHE_HOME" \
  HELM_CONFIG_HOME="$HELM_CONFIG_HOME" HELM_DATA_HOME="$HELM_DATA_HOME" "$HELM" "$@"; }

diagnose() {
  echo "---- diagnostics ----"
  k get pods -A -o wide 2>&1 | head -60 || true
  kn get events --sort-by=.lastTimestamp 2>&1 | tail -30 || true
  local p
  for p in $(kn get pods -o name 2>/dev/null | head -20); do
    if ! kn get "$p" -o jsonpath='{.status.containerStatuses[*].ready}' 2>/dev/null | grep -q true; then
      echo "---- $p"; kn describe "$p" 2>&1 | tail -25; kn logs "$p" --all-containers --tail=30 2>&1 || true
    fi
  done
}

cleanup() {
  local rc=$?
  if (( failed )) || (( rc )); then diagnose; fi
  if [[ $DEPS == netns ]]; then
    for s in kafka mariadb; do
      ASYNCD_SERVICES_RUN=$ASYNCD_CLUSTER_RUN/services ASYNCD_SERVICE_HOST=$NODE_IP \
        "${X[@]}" "e2e/services/$s.sh" stop >/dev/null 2>&1 || true
    done
  fi
  rm -rf "$WORK"
  if (( rc )) && (( failed == 0 )); then failed=1; echo "FAIL - aborted (exit $rc)"; fi
  echo "cluster: $passed passed, $failed failed"
  (( failed == 0 )) || exit 1
}
trap cleanup EXIT

# ---------------------------------------------------------------- dependencies

kafka_port=9092 mariadb_port=3306
deps_netns() {
  # Kafka and MariaDB of e2e/services: own instances (run dir, ports) listening on the
  # node's address inside its namespace
  local s
  # An empty broker each run: one kept from an earlier run holds that run's topics
  # without the owner records the operator now requires (TopicNotOwned).
  ASYNCD_SERVICES_RUN=$ASYNCD_CLUSTER_RUN/services ASYNCD_SERVICE_HOST=$NODE_IP \
    ASYNCD_KAFKA_PORT=$kafka_port ASYNCD_KAFKA_CONTROLLER_PORT=9093 \
    "${X[@]}" e2e/services/kafka.sh reset >/dev/null || return 1
  for s in mariadb kafka; do
    ASYNCD_SERVICES_RUN=$ASYNCD_CLUSTER_RUN/services ASYNCD_SERVICE_HOST=$NODE_IP \
      ASYNCD_MARIADB_PORT=$mariadb_port ASYNCD_KAFKA_PORT=$kafka_port ASYNCD_KAFKA_CONTROLLER_PORT=9093 \
      "${X[@]}" "e2e/services/$s.sh" start || return 1
  done
  ASYNCD_SERVICES_RUN=$ASYNCD_CLUSTER_RUN/services ASYNCD_SERVICE_HOST=$NODE_IP ASYNCD_MARIADB_PORT=$mariadb_port \
    "${X[@]}" e2e/services/mariadb.sh createdb asyncd >/dev/null || return 1
  # selector-less Services with the node's address as their endpoint
  kn apply -f - <<EOF
apiVersion: v1
kind: Service
metadata: {name: kafka}
spec: {ports: [{name: kafka, port: 9092, targetPort: $kafka_port}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kafka-node, labels: {kubernetes.io/service-name: kafka}}
addressType: IPv4
ports: [{name: kafka, port: $kafka_port, protocol: TCP}]
endpoints: [{addresses: ["$NODE_IP"]}]
---
apiVersion: v1
kind: Service
metadata: {name: mariadb}
spec: {ports: [{name: mysql, port: 3306, targetPort: $mariadb_port}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: mariadb-node, labels: {kubernetes.io/service-name: mariadb}}
addressType: IPv4
ports: [{name: mysql, port: $mariadb_port, protocol: TCP}]
endpoints: [{addresses: ["$NODE_IP"]}]
EOF
}

deps_pods() {
  kn apply -f "$here/deps-pods.yaml" && kn rollout status deploy/kafka deploy/mariadb --timeout=300s
}

# --------------------------------------------------------------------- install

say "namespace $NS, Kafka and MariaDB ($DEPS)"
k create namespace "$NS" --dry-run=client -o yaml | k apply -f - >/dev/null
require "Kafka and MariaDB reachable as Services kafka:9092 and mariadb:3306 ($DEPS)" "deps_$DEPS"

# the chart ships no credentials: the store URL and the job's signing key are Secrets of ours;
# the signing key's label names the one config that may mount it (docs/security.md)
kn create secret generic asyncd-store --from-literal=url="mysql://asyncd:asyncd@mariadb:3306/asyncd" \
  --dry-run=client -o yaml | kn apply -f - >/dev/null
kn create secret generic order-cancel-signing --from-literal=key="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')" \
  --dry-run=client -o yaml | kn label --local -f - asyncd.example.io/job=order-cancel-job -o yaml | kn apply -f - >/dev/null

say "helm install (default values + store Secret)"
read -ra helm_extra <<<"${ASYNCD_CLUSTER_HELM_ARGS:-}"  # e.g. kind: image tags
install() {
  helm upgrade --install "$RELEASE" charts/asyncd -n "$NS" --set store.existingSecret=asyncd-store \
    "${helm_extra[@]}" --wait --timeout 300s
}
require "helm install charts/asyncd with its defaults (+ store.existingSecret)" install
pods_ready() {  # every pod of the release is Running and ready
  kn wait --for=condition=Ready pod -l "app.kubernetes.io/instance=$RELEASE" --timeout=120s
}
check "api, scheduler and operator pods Running and Ready" pods_ready
images_are_defaults() {
  local imgs
  imgs=$(kn get deploy -l "app.kubernetes.io/instance=$RELEASE" -o jsonpath='{range .items[*]}{.spec.template.spec.containers[0].image}{"\n"}{end}' | sort -u)
  echo "note: images $(tr '\n' ' ' <<<"$imgs")"
  grep -qx "asyncd:$APP_VERSION" <<<"$imgs" && grep -qx "asyncd-operator:$APP_VERSION" <<<"$imgs"
}
check "the pods run the chart's default images (asyncd:$APP_VERSION, asyncd-operator:$APP_VERSION)" images_are_defaults

# ---------------------------------------------------------------- executor + jobs

say "executor, the sample AsyncJobConfig and a Kafka job"
kn apply -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: executor}
spec:
  selector: {matchLabels: {app: executor}}
  template:
    metadata: {labels: {app: executor}}
    spec:
      securityContext: {runAsNonRoot: true, runAsUser: 65532}
      containers:
        - name: executor
          image: asyncd-e2e:dev
          imagePullPolicy: IfNotPresent
          args: [/app/executor.py, "8080"]
          ports: [{name: http, containerPort: 8080}]
          readinessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 2}
          resources: {requests: {cpu: 50m, memory: 32Mi}}
---
apiVersion: v1
kind: Service
metadata: {name: executor}
spec: {selector: {app: executor}, ports: [{name: http, port: 8080, targetPort: http}]}
EOF
check "executor pod Ready" kn rollout status deploy/executor --timeout=120s

# the repository's sample, pointed at our executor
sed -e "s#url: .*#url: http://executor.$NS.svc:8080/tasks/cancel#" config/samples/order-cancel-job.yaml >"$WORK/order-cancel-job.yaml"
check "kubectl apply config/samples/order-cancel-job.yaml" kn apply -f "$WORK/order-cancel-job.yaml"
kn apply -f - >/dev/null <<EOF
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: burst-job}
spec:
  taskType: burst
  executor: {url: "http://executor.$NS.svc:8080/burst", timeout: 30s}
  retry: {maxRetries: 5, backoff: fixed, initialBackoff: 1s}
  concurrency: 8
  kafka: {topic: asyncd-burst, partitions: 3, consumerGroup: asyncd-burst-cg}
  scaling: {minReplicas: 1, targetDueBacklog: 20}
EOF
jobs_ready() {
  kn wait --for=condition=Ready asyncjobconfig/order-cancel-job asyncjobconfig/burst-job --timeout=180s &&
    kn rollout status deploy/asyncd-dispatcher-order-cancel-job --timeout=180s &&
    kn rollout status deploy/asyncd-dispatcher-burst-job --timeout=180s
}
require "AsyncJobConfigs Ready, their dispatcher Deployments rolled out" jobs_ready
show_asyncjobs() {
  local out
  out=$(kn get asyncjobs)
  printf '%s\n' "$out" | sed 's/^/note: /'
  [[ $(awk 'NR > 1 && $(NF-1) == "True"' <<<"$out" | wc -l) -eq 2 ]]
}
check "kubectl get asyncjobs: both Ready" show_asyncjobs

# --------------------------------------------------------------- submit + run

# A ServiceAccount allowed to submit to the two jobs (api.auth.mode=kubernetes, the default)
kn apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: submitter}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: e2e-submitter}
rules:
  - apiGroups: [asyncd.example.io]
    resources: [asyncjobconfigs/tasks]
    resourceNames: [order-cancel-job, burst-job]
    verbs: [create, get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: e2e-submitter}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: e2e-submitter}
subjects: [{kind: ServiceAccount, name: submitter, namespace: $NS}]
EOF

# submit NAME ARGS...: a Job whose pod submits through the api Service; its log's last
# line (the summary) goes to $WORK/NAME.json
submit() {
  local name=$1; shift
  local args="" a
  for a in "$@"; do args+="\"$a\", "; done
  kn delete job "$name" --ignore-not-found --wait=true >/dev/null 2>&1 || true
  kn apply -f - >/dev/null <<EOF
apiVersion: batch/v1
kind: Job
metadata: {name: $name}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      serviceAccountName: submitter
      automountServiceAccountToken: false
      securityContext: {runAsNonRoot: true, runAsUser: 65532}
      containers:
        - name: submit
          image: asyncd-e2e:dev
          imagePullPolicy: IfNotPresent
          args: [/app/submit.py, ${args} "--url", "http://$FN-api.$NS.svc:7700"]
          volumeMounts: [{name: token, mountPath: /var/run/secrets/asyncd}]
      volumes:
        - name: token
          projected:
            sources: [{serviceAccountToken: {audience: asyncd, expirationSeconds: 3600, path: token}}]
EOF
}
submit_wait() {  # submit_wait NAME TIMEOUT: the Job completed; its summary saved
  local name=$1 timeout=$2
  if ! kn wait --for=condition=Complete "job/$name" --timeout="${timeout}s" >/dev/null; then
    kn logs "job/$name" --tail=20; return 1
  fi
  kn logs "job/$name" | tail -n 1 >"$WORK/$name.json"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("count: %d submitted, %d failed" % (d["submitted"], d["failed"])); sys.exit(d["failed"] != 0 or d["submitted"] == 0)' "$WORK/$name.json"
}

stats() {  # the executor's counts, as JSON, into $WORK/stats.json
  kn exec deploy/executor -- python3 -c \
    'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8080/stats").read().decode())' >"$WORK/stats.json"
}
# all_run TIMEOUT FILE...: every id submitted in FILEs was executed (within TIMEOUT s);
# prints the last count
all_run() {
  local timeout=$1; shift
  local deadline=$((SECONDS + timeout)) out=""
  while :; do
    if stats && out=$(python3 "$here/count.py" "$WORK/stats.json" "$@"); then
      echo "$out"; return 0
    fi
    if (( SECONDS >= deadline )); then echo "$out"; return 1; fi
    sleep 2
  done
}

say "submitting through the api Service"
submit submit-orders --type cancel_expired_order --count 40 --key-prefix "order-$RANDOM"
submit submit-burst --type burst --count 200
check "40 tasks submitted to order-cancel-job (store route) through the api Service" submit_wait submit-orders 180
check "200 tasks submitted to burst-job (Kafka route) through the api Service" submit_wait submit-burst 180
check "every submitted task ran on the executor pod" all_run 180 "$WORK/submit-orders.json" "$WORK/submit-burst.json"
delayed() {
  submit submit-delayed --type burst --count 10 --delay 5s && submit_wait submit-delayed 120 &&
    all_run 120 "$WORK/submit-delayed.json"
}
check "10 tasks with a 5 s delay ran" delayed

# the further phases (ASYNCD_CLUSTER_PHASES, default "faults hpa"; "" for none)
for phase in ${ASYNCD_CLUSTER_PHASES-faults hpa}; do
  # shellcheck source=/dev/null
  . "$here/scenario-$phase.sh"
done
say "done"
