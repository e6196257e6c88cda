# shellcheck shell=bash
# shellcheck disable=SC2154  # sourced by scenario.sh, which sets here, WORK, NS, X, ...
# Autoscaling, sourced by scenario.sh: the metrics pipeline a user runs — Prometheus
# scraping the dispatcher pods (their prometheus.io annotations) and a custom metrics API
# server serving asyncd_due_backlog as a Pods metric (e2e/cluster/metrics-adapter: the
# prometheus-adapter role) — and the HPA the operator wrote for burst-job taking its
# dispatchers from 1 to more under a due backlog and back to 1, never above the topic's
# 3 partitions.

say "autoscaling: Prometheus + custom metrics API, HPA on asyncd_due_backlog"
k create namespace monitoring --dry-run=client -o yaml | k apply -f - >/dev/null
metrics_pipeline() {
  k apply -f "$here/metrics.yaml" >/dev/null &&
    k -n monitoring rollout status deploy/prometheus deploy/metrics-adapter --timeout=180s &&
    k wait --for=condition=Available apiservice/v1beta1.custom.metrics.k8s.io apiservice/v1beta2.custom.metrics.k8s.io --timeout=120s
}
require "Prometheus and the custom metrics API running, APIService Available" metrics_pipeline

# the job scales on 20 due tasks per replica and scales in 15 s after the backlog is gone
kn patch asyncjobconfig/burst-job --type=merge \
  -p '{"spec":{"scaling":{"minReplicas":1,"targetDueBacklog":20,"scaleDownStabilizationSeconds":15}}}' >/dev/null
hpa_written() {
  local max down
  for _ in $(seq 60); do
    max=$(kn get hpa/asyncd-dispatcher-burst-job -o jsonpath='{.spec.maxReplicas}')
    down=$(kn get hpa/asyncd-dispatcher-burst-job -o jsonpath='{.spec.behavior.scaleDown.stabilizationWindowSeconds}')
    [[ $max == 3 && $down == 15 ]] && { echo "note: HPA 1..$max replicas, scale-in after ${down}s"; return 0; }
    sleep 1
  done
  echo "HPA maxReplicas $max, stabilization $down"; return 1
}
check "the operator's HPA: max = the topic's 3 partitions, the job's scale-in window" hpa_written
metric_served() {  # the HPA reads the metric (ScalingActive true)
  local i
  for i in $(seq 90); do
    if [[ $(kn get hpa/asyncd-dispatcher-burst-job -o jsonpath='{.status.conditions[?(@.type=="ScalingActive")].status}') == True ]]; then
      echo "note: metric served after ${i}s: $(k get --raw "/apis/custom.metrics.k8s.io/v1beta2/namespaces/$NS/pods/*/asyncd_due_backlog?metricLabelSelector=task_type%3Dburst" | head -c 300)"
      return 0
    fi
    sleep 1
  done
  kn describe hpa/asyncd-dispatcher-burst-job | tail -15; return 1
}
check "custom.metrics.k8s.io serves asyncd_due_backlog to the HPA (ScalingActive)" metric_served

# A due backlog: 1500 tasks at 40/s, each holding the executor 400 ms; one dispatcher
# runs 8 at a time (concurrency 8), so the backlog grows until more dispatchers run.
replicas() { kn get deploy/asyncd-dispatcher-burst-job -o jsonpath='{.spec.replicas}'; }
watch_replicas() {  # watch_replicas SECONDS: the replica count every 2 s, to $WORK/replicas
  local end=$((SECONDS + $1)) r
  while (( SECONDS < end )); do
    if r=$(replicas 2>>"$WORK/replicas.err"); then echo "$r" >>"$WORK/replicas"; fi
    sleep 2
  done
}
: >"$WORK/replicas"
watch_replicas 900 &
watcher=$!
submit hpa-load --type burst --count 1500 --rate 40 --sleep-ms 400
scaled_up() {
  local i r
  for i in $(seq 150); do
    r=$(replicas)
    if (( r > 1 )); then echo "note: $r dispatchers ${i}×2 s into the load"; return 0; fi
    sleep 2
  done
  kn describe hpa/asyncd-dispatcher-burst-job | tail -15; return 1
}
check "under the due backlog the HPA scales the dispatchers above 1" scaled_up
load_ran() { submit_wait hpa-load 300 && all_run 300 "$WORK/hpa-load.json"; }
check "every task of the load ran (none lost while scaling)" load_ran
scaled_down() {
  local i
  for i in $(seq 120); do
    if [[ $(replicas) == 1 ]]; then echo "note: back to 1 dispatcher"; return 0; fi
    sleep 2
  done
  kn describe hpa/asyncd-dispatcher-burst-job | tail -15; return 1
}
check "with the backlog gone the HPA scales back to 1" scaled_down
sleep 4  # one more sample of the watcher
kill "$watcher" 2>/dev/null || true
never_above() {
  local max
  max=$(sort -n "$WORK/replicas" | tail -n 1)
  # replicas seen every 2 s, run-length encoded: "1x4 2x2 3x40 2x30 1x5"
  echo "note: replicas seen (every 2 s): $(grep . "$WORK/replicas" | uniq -c | awk '{printf "%sx%s ", $2, $1}')"
  if [[ -s $WORK/replicas.err ]]; then echo "note: watcher errors: $(tail -n 2 "$WORK/replicas.err")"; fi
  echo "count: at most $max dispatchers"
  (( max <= 3 ))
}
check "never more dispatchers than the topic's 3 partitions" never_above
