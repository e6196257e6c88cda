#!/usr/bin/env bash
# Smoke test of the control plane: kubectl get ns, a CRD with a CEL rule and a status
# subresource (a violating object must be rejected with the rule's message), server-side
# dry-run of a Deployment and an autoscaling/v2 HorizontalPodAutoscaler.
# Starts the control plane if needed and stops it again only if it started it.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CP="$HERE/controlplane.sh"
TD="$HERE/testdata"
# shellcheck source=e2e/lib.sh
source "$HERE/../lib.sh"
passed=0 failed=0

started=0
if ! "$CP" status >/dev/null 2>&1; then
  "$CP" start || { echo "smoke: 0 passed, 1 failed"; exit 1; }
  started=1
fi
eval "$("$CP" env)"

ns="smoke-$$"
k() { kubectl --request-timeout=20s "$@"; }

rejected_by_cel() {
  local out
  if out="$(k -n "$ns" apply -f "$TD/widget-bad.yaml" 2>&1)"; then
    echo "violating Widget was accepted: $out"; return 1
  fi
  grep -q 'minReplicas must not exceed maxReplicas' <<<"$out" || { echo "unexpected error: $out"; return 1; }
  echo "$out"
}

status_subresource() {
  k -n "$ns" patch widget ok --subresource=status --type=merge -p '{"status":{"observed":7}}' >/dev/null || return 1
  [[ "$(k -n "$ns" get widget ok -o jsonpath='{.status.observed}')" == 7 ]] || return 1
  # a status write through the main resource is ignored when the subresource is enabled
  k -n "$ns" patch widget ok --type=merge -p '{"status":{"observed":9}}' >/dev/null || return 1
  [[ "$(k -n "$ns" get widget ok -o jsonpath='{.status.observed}')" == 7 ]]
}

check "kubectl get ns"                  k get ns default kube-system
check "create namespace"                k create namespace "$ns"
check "apply CRD"                       k apply -f "$TD/crd.yaml"
check "CRD established"                 k wait --for=condition=Established --timeout=30s crd/widgets.smoke.asyncd.io
check "valid Widget accepted"           k -n "$ns" apply -f "$TD/widget-ok.yaml"
check "CEL rule rejects bad Widget"     rejected_by_cel
check "status subresource"              status_subresource
check "dry-run Deployment + HPA v2"     k -n "$ns" apply --dry-run=server -f "$TD/workloads.yaml"
check "dry-run created nothing"         bash -c "[[ -z \"\$(kubectl -n $ns get deploy,hpa -o name 2>&1)\" ]]"
check "RBAC: impersonated SA denied"    bash -c "! kubectl -n $ns get widgets --as=system:serviceaccount:$ns:nobody"
# no controller-manager: a namespace would stay Terminating; delete the CRD (cascades
# to its objects) and leave the namespace to the next fresh start
check "delete CRD"                      k delete -f "$TD/crd.yaml" --wait=true --timeout=30s

if (( started )); then "$CP" stop; fi
echo "smoke: $passed passed, $failed failed"
(( failed == 0 ))
