#!/usr/bin/env bash
# End to end on a real cluster with kubelets, for machines that have a container runtime
# (Docker) and `kind`, `kubectl` and `helm` on PATH. This project's own CI machine has no
# container runtime; there e2e/operator.sh and e2e/chart.sh cover the same ground against a
# bare kube-apiserver. This script adds what only real pods show: the images start, the
# operator's dispatcher Deployments run, and a task submitted to the API reaches an
# executor pod.
#
#   e2e/kind.sh            # create cluster `asyncd`, build and load images, install, test
#   e2e/kind.sh delete     # remove the cluster
#
# In-cluster dependencies are deliberately small: a single-node Kafka (apache/kafka image,
# KRaft) and PostgreSQL (postgres image), both throwaway.
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER=${ASYNCD_KIND_CLUSTER:-asyncd}
NS=asyncd

if [[ "${1:-}" == delete ]]; then kind delete cluster --name "$CLUSTER"; exit 0; fi
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind.sh needs $tool on PATH" >&2; exit 1; }
done

kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
docker build -t asyncd:dev -f dispatcher/Dockerfile .
docker build -t asyncd-operator:dev -f operator/Dockerfile .
kind load docker-image --name "$CLUSTER" asyncd:dev asyncd-operator:dev

kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -
kubectl -n "$NS" apply -f - <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: kafka}
spec:
  selector: {matchLabels: {app: kafka}}
  template:
    metadata: {labels: {app: kafka}}
    spec:
      containers:
        - name: kafka
          image: apache/kafka:4.1.1
          env:
            - {name: KAFKA_NODE_ID, value: "1"}
            - {name: KAFKA_PROCESS_ROLES, value: "broker,controller"}
            - {name: KAFKA_LISTENERS, value: "PLAINTEXT://:9092,CONTROLLER://:9093"}
            - {name: KAFKA_ADVERTISED_LISTENERS, value: "PLAINTEXT://kafka:9092"}
            - {name: KAFKA_CONTROLLER_LISTENER_NAMES, value: CONTROLLER}
            - {name: KAFKA_CONTROLLER_QUORUM_VOTERS, value: "1@localhost:9093"}
            - {name: KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR, value: "1"}
---
apiVersion: v1
kind: Service
metadata: {name: kafka}
spec: {selector: {app: kafka}, ports: [{port: 9092}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: postgres}
spec:
  selector: {matchLabels: {app: postgres}}
  template:
    metadata: {labels: {app: postgres}}
    spec:
      containers:
        - name: postgres
          image: postgres:16
          env: [{name: POSTGRES_PASSWORD, value: asyncd}, {name: POSTGRES_USER, value: asyncd}]
---
apiVersion: v1
kind: Service
metadata: {name: postgres}
spec: {selector: {app: postgres}, ports: [{port: 5432}]}
---
# The executor: prints each task it runs (the quickstart's example executor).
apiVersion: apps/v1
kind: Deployment
metadata: {name: executor}
spec:
  selector: {matchLabels: {app: executor}}
  template:
    metadata: {labels: {app: executor}}
    spec:
      containers:
        - name: executor
          image: python:3.11-slim
          command: [python3, /app/executor.py, "8080"]
          volumeMounts: [{name: app, mountPath: /app}]
      volumes: [{name: app, configMap: {name: executor}}]
---
apiVersion: v1
kind: Service
metadata: {name: executor}
spec: {selector: {app: executor}, ports: [{port: 8080}]}
YAML
kubectl -n "$NS" create configmap executor --from-file=examples/executor.py --dry-run=client -o yaml | kubectl apply -f -
kubectl -n "$NS" rollout status deploy/kafka deploy/postgres deploy/executor --timeout=300s

# the chart ships no credentials: the store URL goes into a Secret of our own
kubectl -n "$NS" create secret generic asyncd-store \
  --from-literal=url=postgres://asyncd:asyncd@postgres:5432/asyncd --dry-run=client -o yaml | kubectl apply -f -
helm upgrade --install asyncd charts/asyncd -n "$NS" \
  --set store.existingSecret=asyncd-store \
  --set kafka.brokers=kafka:9092 \
  --set image.repository=asyncd --set image.tag=dev \
  --set operator.image.repository=asyncd-operator --set operator.image.tag=dev \
  --wait --timeout 300s

sed -e 's#url: .*#url: http://executor:8080/tasks/cancel#' config/samples/order-cancel-job.yaml \
  | kubectl -n "$NS" apply -f -
kubectl -n "$NS" wait --for=condition=Ready asyncjobconfig/order-cancel-job --timeout=180s
kubectl -n "$NS" rollout status deploy/asyncd-dispatcher-order-cancel-job --timeout=300s
kubectl -n "$NS" get asyncjobs

# The api authenticates callers with Kubernetes tokens (api.auth.mode=kubernetes): a
# ServiceAccount allowed to submit to the job (docs/security.md) sends its token.
kubectl -n "$NS" create serviceaccount submitter --dry-run=client -o yaml | kubectl apply -f -
kubectl -n "$NS" apply -f - <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: order-cancel-job-submitter}
rules: [{apiGroups: [asyncd.example.io], resources: [asyncjobconfigs/tasks], resourceNames: [order-cancel-job], verbs: [create, get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: submitter-order-cancel-job}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: order-cancel-job-submitter}
subjects: [{kind: ServiceAccount, name: submitter, namespace: $NS}]
YAML
token=$(kubectl -n "$NS" create token submitter --audience asyncd)
kubectl -n "$NS" port-forward svc/asyncd-api 17700:7700 >/dev/null 2>&1 &
forward=$!
trap 'kill $forward 2>/dev/null || true' EXIT
for _ in $(seq 60); do curl -fsS localhost:17700/healthz >/dev/null 2>&1 && break; sleep 1; done
id=$(curl -fsS -XPOST localhost:17700/v1/tasks -H "Authorization: Bearer $token" \
  -d '{"type": "cancel_expired_order", "payload": {"order_id": 7}}' \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
for _ in $(seq 60); do
  if kubectl -n "$NS" logs deploy/executor | grep -q "$id"; then echo "kind: task $id executed in the cluster"; exit 0; fi
  sleep 2
done
echo "kind: task $id was not executed" >&2
exit 1
