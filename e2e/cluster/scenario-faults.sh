# shellcheck shell=bash
# shellcheck disable=SC2154  # sourced by scenario.sh, which sets here, WORK, NS, X, ...
# Faults, sourced by scenario.sh after the install: tasks keep being submitted while
#   - a dispatcher pod is deleted with --grace-period=0 --force,
#   - the dispatchers' image is rolled (helm upgrade image.tag=<appVersion>-roll: the
#     operator is given the new --dispatcher-image and rolls every dispatcher Deployment),
#   - the operator is restarted (kubectl rollout restart),
# and every submitted task must have run (none lost; duplicates are counted and shown).
# Then leader election: the operator runs two replicas; the leader is force-deleted and the
# other must hold the Lease within LEADER_BOUND seconds and reconcile a change.

LEADER_BOUND=${ASYNCD_CLUSTER_LEADER_BOUND:-25}
OPERATOR=deploy/$FN-operator
LEASE=lease/$FN-operator
BURST_PODS="app.kubernetes.io/name=asyncd-dispatcher,app.kubernetes.io/instance=burst-job"

say "faults: force-deleted dispatcher, rolled image, restarted operator"

# run_during NAME ACTION...: submit 300 tasks (each holds the executor 300 ms) at 30/s
# while ACTION runs a few seconds in; then every one of them must have run
run_during() {
  local name=$1; shift
  submit "$name" --type burst --count 300 --rate 30 --sleep-ms 300 || return 1
  kn wait --for=jsonpath='{.status.active}'=1 "job/$name" --timeout=60s >/dev/null || return 1
  sleep 3
  "$@" || { echo "the fault itself failed"; return 1; }
  submit_wait "$name" 240 && all_run 240 "$WORK/$name.json"
}

force_delete_dispatcher() {
  local pod
  pod=$(kn get pods -l "$BURST_PODS" -o jsonpath='{.items[0].metadata.name}')
  [[ -n $pod ]] || { echo "no dispatcher pod"; return 1; }
  echo "note: force-deleting $pod"
  kn delete pod "$pod" --grace-period=0 --force --wait=false 2>&1 | grep -v 'Warning: Immediate deletion' || true
}
check "dispatcher pod force-deleted mid-run: nothing lost" run_during fault-kill force_delete_dispatcher

roll_image() {
  helm upgrade "$RELEASE" charts/asyncd -n "$NS" --reuse-values --set image.tag="$APP_VERSION-roll" \
    --wait --timeout 300s >/dev/null
}
check "dispatcher image rolled mid-run (helm upgrade image.tag=$APP_VERSION-roll): nothing lost" run_during fault-roll roll_image
rolled() {
  # The operator, itself rolled by the upgrade, writes the new image into each dispatcher
  # Deployment once it leads: until then a Deployment's rollout is "complete" on the old
  # image, so wait (with a deadline) for the spec first, then for the rollouts.
  local deadline=$((SECONDS + 120)) specs
  while :; do
    specs=$(kn get deploy -l app.kubernetes.io/name=asyncd-dispatcher \
      -o jsonpath='{range .items[*]}{.spec.template.spec.containers[0].image}{"\n"}{end}' | sort -u)
    [[ $specs == "asyncd:$APP_VERSION-roll" ]] && break
    if (( SECONDS >= deadline )); then echo "note: dispatcher Deployments still at: $(tr '\n' ' ' <<<"$specs")"; return 1; fi
    sleep 1
  done
  kn rollout status deploy/asyncd-dispatcher-burst-job --timeout=180s >/dev/null &&
    kn rollout status deploy/asyncd-dispatcher-order-cancel-job --timeout=180s >/dev/null || return 1
  # A rollout is complete once the old pods are told to stop, while they may still be
  # draining (Terminating) and listed: wait, with a deadline, until they are gone.
  local imgs
  deadline=$((SECONDS + 120))
  while :; do
    imgs=$(kn get pods -l app.kubernetes.io/name=asyncd-dispatcher -o jsonpath='{range .items[*]}{.spec.containers[0].image}{"\n"}{end}' | sort -u)
    [[ $imgs == "asyncd:$APP_VERSION-roll" ]] && break
    if (( SECONDS >= deadline )); then break; fi
    sleep 1
  done
  echo "note: dispatcher images now: $(tr '\n' ' ' <<<"$imgs")"
  [[ $imgs == "asyncd:$APP_VERSION-roll" ]]
}
check "every dispatcher pod now runs asyncd:$APP_VERSION-roll" rolled

restart_operator() { kn rollout restart "$OPERATOR" >/dev/null; }
check "operator restarted mid-run (rollout restart): nothing lost" run_during fault-operator restart_operator
operator_back() {
  kn rollout status "$OPERATOR" --timeout=180s >/dev/null &&
    kn wait --for=condition=Ready asyncjobconfig/order-cancel-job asyncjobconfig/burst-job --timeout=60s >/dev/null
}
check "operator rolled out again, jobs still Ready" operator_back

# ---- leader election
say "leader election: two operator replicas, the leader force-deleted"
holder() { kn get "$LEASE" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
pod_of() { echo "${1%_*}"; }  # the holder identity is <pod>_<process nonce>
two_replicas() {
  local ready
  ready=$(kn get "$OPERATOR" -o jsonpath='{.status.readyReplicas}')
  echo "note: operator replicas ready: $ready, Lease held by $(holder)"
  [[ $ready == 2 ]] && [[ -n $(holder) ]]
}
check "operator: 2 replicas Ready, one holds the Lease" two_replicas
# wait_new_holder OLD BOUND: another identity holds the Lease within BOUND s; prints when
wait_new_holder() {
  local old=$1 bound=$2 t0=$SECONDS new=""
  while (( SECONDS - t0 <= bound + 20 )); do
    new=$(holder)
    if [[ -n $new && $new != "$old" ]]; then break; fi
    sleep 0.5
  done
  echo "time: $new holds the Lease $((SECONDS - t0))s after $old went (bound ${bound}s)"
  [[ -n $new && $new != "$old" ]] && (( SECONDS - t0 <= bound ))
}
# 1. the leader's pod is deleted: SIGTERM, it releases the Lease, the standby takes it
handover_release() {
  local leader
  leader=$(holder)
  kn delete pod "$(pod_of "$leader")" --wait=false >/dev/null || return 1
  wait_new_holder "$leader" 10
}
check "leader pod deleted: it releases the Lease, the standby holds it within 10s" handover_release
check "operator back to 2 Ready replicas" kn rollout status "$OPERATOR" --timeout=180s
# 2. the leader is SIGKILLed (no release): the Lease must expire first, then another
#    process (the standby, or the restarted container: a new identity) holds it. Needs
#    the node's containerd (ASYNCD_CLUSTER_CTR); the pod is force-deleted otherwise.
handover_kill() {
  local leader pod cid
  leader=$(holder); pod=$(pod_of "$leader")
  cid=$(kn get pod "$pod" -o jsonpath='{.status.containerStatuses[0].containerID}')
  if [[ -n ${ASYNCD_CLUSTER_CTR:-} ]]; then
    read -ra ctr <<<"$ASYNCD_CLUSTER_CTR"
    "${ctr[@]}" -n k8s.io tasks kill -s SIGKILL "${cid#containerd://}" >/dev/null || return 1
    echo "note: SIGKILLed the operator in $pod"
  else
    kn delete pod "$pod" --grace-period=0 --force --wait=false >/dev/null 2>&1
    echo "note: force-deleted $pod (no ASYNCD_CLUSTER_CTR to SIGKILL it with)"
  fi
  wait_new_holder "$leader" "$LEADER_BOUND"
}
check "leader killed: another process holds the Lease within ${LEADER_BOUND}s" handover_kill
new_leader_reconciles() {
  # a change only a reconciling leader turns into the HPA
  kn patch asyncjobconfig/burst-job --type=merge -p '{"spec":{"scaling":{"targetDueBacklog":21}}}' >/dev/null
  local i
  for i in $(seq 60); do
    if [[ $(kn get hpa/asyncd-dispatcher-burst-job -o jsonpath='{.spec.metrics[0].pods.target.averageValue}') == 21 ]]; then
      echo "note: HPA target updated after ${i}s"; return 0
    fi
    sleep 1
  done
  return 1
}
check "the new leader reconciles (a spec change reaches the HPA)" new_leader_reconciles
check "operator back to 2 Ready replicas" kn rollout status "$OPERATOR" --timeout=180s
