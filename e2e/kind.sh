#!/usr/bin/env bash
# The cluster scenario (e2e/cluster/scenario.sh) on kind, for machines with Docker — a
# fork's GitHub Actions (.github/workflows/cluster.yml) or a laptop. This project's own
# test machine has no Docker engine; there e2e/cluster.sh runs the same scenario on a
# one-node cluster it builds itself.
#
#   e2e/kind.sh            create cluster `asyncd` (ASYNCD_KIND_CLUSTER), build the images
#                          from the Dockerfiles, load them, run the scenario
#   e2e/kind.sh delete     remove the cluster
#
# Needs docker, kind, kubectl and helm on PATH. Kafka and MariaDB run as pods
# (e2e/cluster/deps-pods.yaml, public images); Prometheus from its public image.
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER=${ASYNCD_KIND_CLUSTER:-asyncd}
PROMETHEUS_IMAGE=${ASYNCD_PROMETHEUS_IMAGE:-prom/prometheus:v2.53.4}

if [[ ${1:-} == delete ]]; then kind delete cluster --name "$CLUSTER"; exit 0; fi
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind.sh needs $tool on PATH" >&2; exit 1; }
done
app=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/asyncd/Chart.yaml)

# HPA decisions every 5 s, as on the local node (the default is 15 s)
cat >"${TMPDIR:-/tmp}/asyncd-kind.yaml" <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    kubeadmConfigPatches:
      - |
        kind: ClusterConfiguration
        controllerManager:
          extraArgs:
            horizontal-pod-autoscaler-sync-period: 5s
EOF
kind get clusters | grep -qx "$CLUSTER" ||
  kind create cluster --name "$CLUSTER" --config "${TMPDIR:-/tmp}/asyncd-kind.yaml" --wait 180s

# The images the scenario expects, under the names the chart's defaults use
docker build -t "asyncd:$app" -f dispatcher/Dockerfile .
docker build -t "asyncd:$app-roll" --label asyncd.variant=roll -f dispatcher/Dockerfile .
docker build -t "asyncd-operator:$app" -f operator/Dockerfile .
docker build -t asyncd-e2e:dev -f e2e/cluster/e2e.Dockerfile e2e/cluster
docker build -t asyncd-metrics-adapter:dev -f e2e/cluster/metrics-adapter/Dockerfile e2e/cluster/metrics-adapter
docker pull "$PROMETHEUS_IMAGE" && docker tag "$PROMETHEUS_IMAGE" prometheus:dev
kind load docker-image --name "$CLUSTER" "asyncd:$app" "asyncd:$app-roll" "asyncd-operator:$app" \
  asyncd-e2e:dev asyncd-metrics-adapter:dev prometheus:dev

KUBECONFIG=$(mktemp)
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"
# the scenario SIGKILLs the operator leader's container through the node's containerd
export KUBECONFIG ASYNCD_CLUSTER_DEPS=pods ASYNCD_CLUSTER_CTR="docker exec $CLUSTER-control-plane ctr"
exec bash e2e/cluster/scenario.sh
