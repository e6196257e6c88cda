#!/usr/bin/env bash
# Tests the Helm chart charts/asyncd and its observability assets:
#   - helm (pinned, built once from the Go module proxy, cached in
#     $ASYNCD_CACHE/helm-<version>/), and promql-check (Prometheus' own PromQL parser,
#     e2e/chart/promql-check, cached likewise)
#   - the chart's crds/asyncjobconfigs.yaml is a copy of the repository's
#     crds/asyncjobconfigs.yaml (when that exists; `--sync-crd` copies it over)
#   - helm lint; helm template with default values, with monitoring enabled and with
#     other value sets; values that must be refused are refused; values.yaml documented
#   - the Grafana dashboard: valid JSON, datasource and task_type variables, layout,
#     every query parses as PromQL and every metric it names is registered in
#     dispatcher/src/metrics.rs; the same for the PrometheusRule's alerts
#   - against the real kube-apiserver of e2e/controlplane (started here if it is not
#     running, and then stopped again): the AsyncJobConfig CRD from the chart's crds/,
#     minimal ServiceMonitor/PrometheusRule CRDs (e2e/chart/monitoring-crds.yaml), the
#     sample job configs validated against the CRD, `kubectl apply --dry-run=server` of
#     every rendering, and the RBAC applied for real and probed by impersonation
#     (least privilege of the operator, dispatcher and api ServiceAccounts).
# Prints `chart: N passed, N failed` last; exits non-zero if anything failed.
#
#   e2e/chart.sh                 everything
#   e2e/chart.sh --no-cluster    skip the control-plane part
#   e2e/chart.sh --sync-crd      copy crds/asyncjobconfigs.yaml into the chart and exit
#   e2e/chart.sh --tools         only build (or find in the cache) helm and promql-check
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=e2e/lib.sh
source "$root/e2e/lib.sh"
chart=$root/charts/asyncd
td=$root/e2e/chart
repo_crd=$root/crds/asyncjobconfigs.yaml
chart_crd=$chart/crds/asyncjobconfigs.yaml
# the metrics the dashboard and alerts may use: the asyncd binary's and the operator's
metrics_rs=$root/dispatcher/src/metrics.rs:$root/operator/src/metrics.rs
CP=$root/e2e/controlplane/controlplane.sh
export ASYNCD_CACHE=${ASYNCD_CACHE:-/var/cache/asyncd}
HELM_VERSION=${ASYNCD_HELM_VERSION:-v3.22.0}
BUILD_TIMEOUT=${ASYNCD_CHART_BUILD_TIMEOUT:-2400}
release="chart-test"
ns=asyncd-chart-test

cluster=1
case "${1:-}" in
  --sync-crd)
    [[ -f $repo_crd ]] || { echo "no $repo_crd to copy" >&2; exit 1; }
    cp "$repo_crd" "$chart_crd"
    echo "copied $repo_crd -> $chart_crd"
    exit 0 ;;
  --no-cluster) cluster=0 ;;
  --tools) cluster=-1 ;;
  "") ;;
  *) echo "usage: $0 [--no-cluster | --sync-crd | --tools]" >&2; exit 2 ;;
esac

work=$(mktemp -d)
started=0
cleanup() {
  if (( started )); then "$CP" stop >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

passed=0 failed=0
# the summary lines of a passing check to show
CHECK_SHOWS='^(note|kinds|dashboard|rules|parsed|env|helm|built|promql-check):'
fail_now() {  # a step everything after it depends on failed
  failed=$((failed + 1)); echo "FAIL - $1"
  echo "chart: $passed passed, $failed failed"
  exit 1
}

# ---------------------------------------------------------------- tools

# build_cached DIR BIN LOG CMD...: run CMD (which must leave DIR/.build/BIN) under a lock
# and a timeout, unless DIR/BIN is there already; move the binary into place atomically.
build_cached() {
  local dir=$1 bin=$2 log=$3; shift 3
  mkdir -p "$dir"
  (
    flock 9
    [[ -x $dir/$bin ]] && exit 0
    rm -rf "$dir/.build"; mkdir -p "$dir/.build"
    local start=$SECONDS
    echo "building $bin into $dir (log: $log)" >&2
    if ! timeout "$BUILD_TIMEOUT" bash -c '"$@"' _ "$@" >"$log" 2>&1; then
      echo "build of $bin failed; last lines of $log:" >&2
      tail -n 30 "$log" >&2
      exit 1
    fi
    "$dir/.build/$bin" --help </dev/null >/dev/null 2>&1 ||
      { echo "built $bin does not run" >&2; exit 1; }
    printf 'go: %s\nseconds: %s\nbuilt: %s\n' "$(go version)" "$((SECONDS - start))" "$(date -u +%FT%TZ)" >"$dir/BUILDINFO"
    mv "$dir/.build/$bin" "$dir/$bin"
    rm -rf "$dir/.build"
  ) 9>"$dir/.lock"
}

build_helm() {  # run inside build_cached: helm $HELM_VERSION with the ldflags of helm's Makefile
  local dir=$1 info mod minor ldflags
  cd "$dir/.build"
  info=$(go_env go mod download -json "helm.sh/helm/v3@$HELM_VERSION")
  mod=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])' <<<"$info")
  # Helm's Makefile sets the Kubernetes version helm reports (.Capabilities.KubeVersion
  # of `helm template`) from its client-go version: v0.X.Y -> 1.X.
  minor=$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$mod")
  [[ -n $minor ]] || { echo "no k8s.io/client-go in $mod"; return 1; }
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
  done
  go_env GOBIN="$dir/.build" go install -p 2 -trimpath -ldflags "$ldflags" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

build_promql_check() {
  go_env go build -C "$td/promql-check" -mod=readonly -p 2 -trimpath -ldflags "-s -w" \
    -o "$1/.build/promql-check" .
}

get_tools() {
  export -f go_env build_helm build_promql_check   # run by `timeout bash -c` in build_cached
  export HELM_VERSION td
  if [[ -n ${ASYNCD_HELM:-} ]]; then
    HELM=$ASYNCD_HELM
  else
    local dir=$ASYNCD_CACHE/helm-$HELM_VERSION
    HELM=$dir/helm
    build_cached "$dir" helm "$dir/build.log" build_helm "$dir" || return 1
  fi
  local got
  got=$("$HELM" version --template '{{.Version}}') || return 1
  echo "helm: $HELM ($got)"
  [[ -n ${ASYNCD_HELM:-} || $got == "$HELM_VERSION" ]] || { echo "expected $HELM_VERSION"; return 1; }

  # promql-check: cached by the hash of its sources (its go.mod pins Prometheus).
  local sum pdir
  sum=$(cat "$td/promql-check/go.mod" "$td/promql-check/go.sum" "$td/promql-check/main.go" | sha256sum | cut -c1-12)
  pdir=$ASYNCD_CACHE/promql-check-$sum
  PROMQL_CHECK=$pdir/promql-check
  build_cached "$pdir" promql-check "$pdir/build.log" build_promql_check "$pdir" || return 1
  echo "promql-check: $PROMQL_CHECK ($(sed -n 's/^require github.com\/prometheus\/prometheus //p' "$td/promql-check/go.mod"))"
}

python3 -c 'import yaml' 2>/dev/null || python3 -m pip install -q pyyaml ||
  fail_now "python3 with PyYAML is needed and pip could not install it"
command -v go >/dev/null || fail_now "go is needed to build helm"

echo "==> tools"
get_tools >"$work/tools.log" 2>&1 || { cat "$work/tools.log"; fail_now "build helm $HELM_VERSION and promql-check"; }
passed=$((passed + 1)); echo "ok   - helm $HELM_VERSION and promql-check"; sed 's/^/       /' "$work/tools.log"
if (( cluster < 0 )); then exit 0; fi  # --tools: only build (or find) helm and promql-check
helm() { "$HELM" "$@"; }
# keep helm's caches, config and plugins out of $HOME
export HELM_CACHE_HOME=$work/helm/cache HELM_CONFIG_HOME=$work/helm/config HELM_DATA_HOME=$work/helm/data

# ---------------------------------------------------------------- chart

echo "==> chart"
crd_in_sync() {
  if [[ ! -f $repo_crd ]]; then
    echo "note: $repo_crd does not exist yet: the chart's placeholder CRD is in use"
    return 0
  fi
  if ! diff -u "$repo_crd" "$chart_crd"; then
    echo "charts/asyncd/crds/asyncjobconfigs.yaml drifted from crds/asyncjobconfigs.yaml: run e2e/chart.sh --sync-crd"
    return 1
  fi
  echo "note: the chart's CRD is identical to crds/asyncjobconfigs.yaml"
}
check "CRD copy in sync with crds/asyncjobconfigs.yaml" crd_in_sync

# the chart ships no credentials: every rendering names the store Secret
base=(--set store.existingSecret=asyncd-store)
monitoring=(--set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true)
other=(--set store.existingSecret=asyncd-db --set store.existingSecretKey=dsn
       --set 'kafka.brokers=kafka-0.kafka:9092\,kafka-1.kafka:9092' --set operator.enabled=false
       --set api.replicas=1 --set routing.mountAsFolder=false --set metrics.dashboard.enabled=false
       --set image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef)

check "helm lint (default values)"              helm lint "$chart" "${base[@]}"
check "helm lint --strict (monitoring enabled)" helm lint --strict "$chart" "${base[@]}" "${monitoring[@]}"
check "helm lint --strict (existing secret, Kafka, no operator)" helm lint --strict "$chart" "${other[@]}"

packaged() {  # helm package works and the package carries the CRD and the dashboard
  helm package "$chart" -d "$work" >/dev/null && tar -tzf "$work"/asyncd-*.tgz >"$work/package.txt" &&
    grep -qx 'asyncd/crds/asyncjobconfigs.yaml' "$work/package.txt" &&
    grep -qx 'asyncd/dashboards/asyncd.json' "$work/package.txt"
}
check "helm package (CRD and dashboard inside)" packaged

render() {  # render OUT ARGS...
  local out=$1; shift
  helm template "$release" "$chart" --namespace "$ns" "${base[@]}" "$@" >"$out"
}
check "helm template (default values)"    render "$work/default.yaml"
check "helm template (monitoring enabled)" render "$work/monitoring.yaml" "${monitoring[@]}"
check "helm template (existing secret, Kafka, no operator)" render "$work/other.yaml" "${other[@]}"
check "helm template (operator.scope=cluster, existing store Secret)" render "$work/cluster.yaml" \
  --set operator.scope=cluster --set store.existingSecret=asyncd-store

assets() { python3 "$td/check_assets.py" "$@"; }
fn=$release-asyncd
check "default rendering: the expected objects" assets manifests "$work/default.yaml" \
  Deployment=3 Service=4 Job=1 Secret=0 ServiceAccount=3 Role=3 RoleBinding=3 ConfigMap=1 \
  PodDisruptionBudget=1 Pod=1 ServiceMonitor=0 PrometheusRule=0 ClusterRole=1 ClusterRoleBinding=1 \
  NetworkPolicy=1 "NetworkPolicy/$fn-dispatcher" \
  "ClusterRole/$ns-$fn-api-auth" "ClusterRoleBinding/$ns-$fn-api-auth" \
  "Deployment/$fn-api" "Deployment/$fn-scheduler" "Deployment/$fn-operator" "Service/$fn-api" \
  "Job/$fn-migrate" "ServiceAccount/asyncd-dispatcher" \
  "Role/$fn-operator" "Role/$fn-routing-reader" "Role/$fn-operator-lease" "RoleBinding/$fn-operator-lease" \
  "ConfigMap/$fn-dashboard" "Service/$fn-scheduler-metrics" "Service/$fn-dispatcher-metrics" \
  "Service/$fn-operator-metrics"
check "monitoring rendering adds ServiceMonitor and PrometheusRule" assets manifests "$work/monitoring.yaml" \
  ServiceMonitor=1 PrometheusRule=1 Deployment=3 "ServiceMonitor/$fn" "PrometheusRule/$fn"
check "existing secret / no operator: no Secret, no operator objects" assets manifests "$work/other.yaml" \
  Secret=0 Deployment=2 Service=3 Role=1 RoleBinding=1 ServiceAccount=2 ConfigMap=0 \
  PodDisruptionBudget=0 "!Deployment/$fn-operator"
check "operator.scope=cluster: ClusterRole for the reconciled kinds" assets manifests "$work/cluster.yaml" \
  ClusterRole=2 ClusterRoleBinding=2 Role=2 RoleBinding=2 Secret=0 "Role/$fn-operator-lease" \
  "ClusterRole/$ns-$fn-operator" "ClusterRole/$ns-$fn-api-auth" "Role/$fn-routing-reader"
check "operator.scope=cluster: no --namespace" bash -c "! grep -q -- '--namespace=' '$work/cluster.yaml'"

rendered_has() {  # rendered_has FILE PATTERN...: every fixed-string PATTERN occurs in FILE
  local file=$1; shift
  for p in "$@"; do grep -qF -- "$p" "$file" || { echo "missing in $(basename "$file"): $p"; return 1; }; done
}
check "api/scheduler env: store Secret, listen, routing ConfigMap, Kafka threshold" rendered_has "$work/default.yaml" \
  "name: ASYNCD_STORE" "name: asyncd-store" "value: \"0.0.0.0:7700\"" \
  "value: \"$ns/asyncd-routing\"" "name: ASYNCD_KAFKA_THRESHOLD" "- api" "- scheduler" "args: [migrate]"
check "operator args: brokers, dispatcher image and ServiceAccount, store Secret, namespace" rendered_has "$work/default.yaml" \
  "- --kafka-brokers=kafka:9092" "- --dispatcher-image=asyncd:0.1.0" "- --namespace=$ns" \
  "- --dispatcher-service-account=asyncd-dispatcher" "- --store-secret=asyncd-store" \
  "- --listen=0.0.0.0:8080" "image: \"asyncd-operator:0.1.0\"" "replicas: 2" "- --leader-elect" \
  "- --leader-election-namespace=$ns" "- --leader-election-id=$fn-operator" "fieldPath: metadata.name"
check "Kafka brokers and existing Secret reach the pods" rendered_has "$work/other.yaml" \
  "name: ASYNCD_KAFKA_BROKERS" "value: \"kafka-0.kafka:9092,kafka-1.kafka:9092\"" "name: asyncd-db" "key: dsn" \
  "image: \"asyncd@sha256:0123456789abcdef"
check "api: kubernetes auth by default, its ServiceAccount may create token and access reviews" rendered_has "$work/default.yaml" \
  "name: ASYNCD_AUTH" 'value: "kubernetes"' "name: ASYNCD_AUTH_AUDIENCE" "resources: [tokenreviews]" "resources: [subjectaccessreviews]"
check "helm template (api.auth.mode=tokens)" render "$work/tokens.yaml" --set api.auth.mode=tokens --set api.auth.tokensSecret=asyncd-api-tokens
check "api.auth.mode=tokens: the Secret's file, no review grants" bash -c \
  "grep -qF 'value: /etc/asyncd/auth/tokens.yaml' '$work/tokens.yaml' && grep -qF 'secretName: \"asyncd-api-tokens\"' '$work/tokens.yaml' && ! grep -qF tokenreviews '$work/tokens.yaml'"
json_logs() {  # json_logs FILE: every container given ASYNCD_LOG also gets ASYNCD_LOG_FORMAT=json
  local file=$1 levels formats
  levels=$(grep -c -- '- name: ASYNCD_LOG$' "$file")
  formats=$(grep -A1 -- '- name: ASYNCD_LOG_FORMAT$' "$file" | grep -c 'value: "json"')
  echo "ASYNCD_LOG on $levels containers, ASYNCD_LOG_FORMAT=json on $formats"
  ((levels > 0 && levels == formats))
}
check "JSON log lines on every asyncd and operator container" json_logs "$work/default.yaml"
check "every ASYNCD_* variable of the asyncd pods is read by the binary" \
  assets env "$work/default.yaml" "$root/dispatcher/src" ASYNCD_ROUTING_CONFIGMAP ASYNCD_KAFKA_BROKERS

# The asyncd binary the pods would run: its CLI must accept every rendered container.
asyncd_bin=${ASYNCD_BIN:-${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target}/debug/asyncd}
if [[ ! -x $asyncd_bin ]]; then
  (cd "$root" && CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target} cargo build -q -p asyncd --locked) ||
    fail_now "could not build the asyncd binary"
fi
check "default rendering: every asyncd container starts (the CLI accepts its args and env)" \
  assets cli "$work/default.yaml" "$asyncd_bin"
operator_bin=${ASYNCD_OPERATOR_BIN:-${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target}/debug/asyncd-operator}
if [[ ! -x $operator_bin ]]; then
  (cd "$root" && CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target} cargo build -q -p asyncd-operator --bin asyncd-operator --locked) ||
    fail_now "could not build the asyncd-operator binary"
fi
check "default rendering: the operator container starts (its CLI accepts the args and env)" \
  assets operator-cli "$work/default.yaml" "$operator_bin"
check "cluster scope: the operator container starts" assets operator-cli "$work/cluster.yaml" "$operator_bin"
check "helm template (executor address ranges)" render "$work/executor.yaml" \
  --set 'operator.executorAddresses.denyCidrs={10.0.0.0/16,fd00::/8}' \
  --set 'operator.executorAddresses.allowCidrs={10.0.5.0/24}'
check "executor ranges set on the command line reach the operator args" rendered_has "$work/executor.yaml" \
  '- "--executor-deny-cidrs=10.0.0.0/16"' '- "--executor-deny-cidrs=fd00::/8"' \
  '- "--executor-allow-cidrs=10.0.5.0/24"'
check "executor ranges: the operator container starts (its CLI accepts them)" \
  assets operator-cli "$work/executor.yaml" "$operator_bin"
check "default rendering: no executor ranges (the dispatchers' default policy alone)" \
  bash -c "! grep -qF -- '--executor-' '$work/default.yaml'"
check "helm template (store.timeout)" render "$work/store-timeout.yaml" --set store.timeout=4s
check "store.timeout reaches the api and scheduler env and the operator args" rendered_has "$work/store-timeout.yaml" \
  '- name: ASYNCD_STORE_TIMEOUT' 'value: "4s"' '- --dispatcher-store-timeout=4s'
check "store.timeout: every asyncd container starts (the CLI accepts it)" \
  assets cli "$work/store-timeout.yaml" "$asyncd_bin"
check "store.timeout: the operator container starts (its CLI accepts it)" \
  assets operator-cli "$work/store-timeout.yaml" "$operator_bin"
check "default rendering: no store timeout (asyncd's default)" \
  bash -c "! grep -qF -- 'STORE_TIMEOUT' '$work/default.yaml'"
check "helm template (api TLS, Kafka security Secret)" render "$work/tls.yaml" \
  --set api.tls.secretName=asyncd-api-tls --set kafka.securitySecret=asyncd-kafka "${monitoring[@]}"
check "api TLS: every asyncd container starts" assets cli "$work/tls.yaml" "$asyncd_bin"
check "api TLS and the Kafka Secret reach the pods, probes and scrapes use HTTPS" rendered_has "$work/tls.yaml" \
  "name: ASYNCD_TLS_CERT" "value: /etc/asyncd/tls/tls.crt" "name: ASYNCD_TLS_RELOAD_INTERVAL" "scheme: HTTPS" \
  "secretName: asyncd-api-tls" "- name: https" "scheme: https" "- --dispatcher-kafka-secret=asyncd-kafka" \
  "name: asyncd-kafka"
check "helm template (routing.mountAsFolder=true)" render "$work/folder.yaml" --set routing.mountAsFolder=true
check "routing.mountAsFolder=true: every asyncd container starts" assets cli "$work/folder.yaml" "$asyncd_bin"
check "routing.mountAsFolder=true: job configs from the folder, not the ConfigMap" \
  bash -c "grep -qF 'name: ASYNCD_CONFIG' '$work/folder.yaml' && ! grep -qF 'ASYNCD_ROUTING_CONFIGMAP' '$work/folder.yaml'"

refused() {  # refused MESSAGE ARGS...: helm template fails, naming MESSAGE
  local msg=$1 out; shift
  if out=$(helm template "$release" "$chart" -n "$ns" "${base[@]}" "$@" 2>&1); then
    echo "was accepted: $*"; return 1
  fi
  grep -qF -- "$msg" <<<"$out" || { echo "error does not say '$msg': $out"; return 1; }
}
check "refused: no store Secret named (no default credentials)" refused "store.existingSecret is required" --set store.existingSecret=
check "refused: two operator replicas without leader election" refused "needs operator.leaderElection.enabled" \
  --set operator.leaderElection.enabled=false
check "refused: a store URL in values" refused "store.url is no longer supported" --set store.url=postgres://u:p@db/q
check "store password not echoed in errors" bash -c "! $HELM template x '$chart' --set store.existingSecret=s --set store.url=postgres://u:s3cret@h/db 2>&1 | grep -q s3cret"
no_credentials() {  # nothing in values.yaml looks like a URL with a password or a password value
  if grep -nE '://[^/@ ]+:[^/@ ]+@|password: *[^ "]' "$chart/values.yaml"; then return 1; fi
}
check "values.yaml holds no credentials" no_credentials
argv_has_no_store() {  # no rendered container passes the store URL as an argument
  if grep -nE -- '--store(=| |$)|\$\(ASYNCD_STORE\)' "$@"; then return 1; fi
}
check "no rendering passes the store URL in argv" argv_has_no_store "$work/default.yaml" "$work/other.yaml" "$work/cluster.yaml"
check "refused: NetworkPolicy egress without the API server" refused "egress.apiServer is required" \
  --set networkPolicy.dispatcher.egress.enabled=true
check "helm template (networkPolicy egress restricted)" render "$work/egress.yaml" \
  --set networkPolicy.dispatcher.egress.enabled=true --set 'networkPolicy.dispatcher.egress.apiServer[0].ipBlock.cidr=10.0.0.1/32' \
  --set 'networkPolicy.dispatcher.egress.to[0].ports[0].port=5432'
check "networkPolicy.enabled=false: no NetworkPolicy" bash -c \
  "! '$HELM' template x '$chart' --set store.existingSecret=s --set networkPolicy.enabled=false | grep -q 'kind: NetworkPolicy'"
check "refused: serviceAccount.create=false without a name" refused "serviceAccount.name is required" --set serviceAccount.create=false
check "refused: operator without Kafka brokers" refused "kafka.brokers is required by the operator" --set kafka.brokers=
check "refused: operator with a store Secret key other than url" refused 'reads the store URL from the key "url"' \
  --set store.existingSecret=db --set store.existingSecretKey=dsn
check "refused: unknown operator.scope" refused 'operator.scope must be "namespace" or "cluster"' --set operator.scope=everywhere
check "store password not echoed in errors" bash -c "! $HELM template x '$chart' --set store.url=sqlite://u:s3cret@h/db 2>&1 | grep -q s3cret"
check "refused: an executor range that is a bare address" \
  refused 'operator.executorAddresses.denyCidrs: "10.0.0.1" is not a CIDR' \
  --set 'operator.executorAddresses.denyCidrs={10.0.0.0/16,10.0.0.1}'
check "refused: executor ranges not given as a list" refused "operator.executorAddresses.allowCidrs must be a list" \
  --set operator.executorAddresses.allowCidrs=10.0.0.0/8

values_documented() {
  python3 - "$chart/values.yaml" <<'EOF'
import re, sys
lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
stack = []          # (indent, documented) of the enclosing keys
problems, leaves = [], 0
for i, line in enumerate(lines):
    m = re.match(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*):(.*)$", line)
    if not m:
        continue
    indent, key, rest = len(m.group(1)), m.group(2), m.group(3).split(" #")[0].strip()
    while stack and stack[-1][0] >= indent:
        stack.pop()
    j = i - 1
    documented = j >= 0 and lines[j].strip().startswith("#")
    inherited = any(d for _, d in stack)
    nxt = next((l for l in lines[i + 1:] if l.strip() and not l.strip().startswith("#")), "")
    leaf = rest != "" or not (len(nxt) - len(nxt.lstrip()) > indent)
    if leaf:
        leaves += 1
        if not (documented or inherited):
            problems.append(f"values.yaml:{i + 1}: {key} has no comment")
    stack.append((indent, documented and lines[j].strip().startswith("# --") or inherited))
for p in problems:
    print(p)
print(f"note: {leaves} value fields, all documented" if not problems else "")
sys.exit(1 if problems else 0)
EOF
}
check "values.yaml: every field documented" values_documented

# ---------------------------------------------------------------- observability assets

echo "==> dashboard and alerts"
check "dashboard is valid JSON (python3 -m json.tool)" python3 -m json.tool "$chart/dashboards/asyncd.json" /dev/null
check "dashboard: variables, panels, metric names in metrics.rs" \
  assets dashboard "$chart/dashboards/asyncd.json" "$metrics_rs" "$work/dashboard.exprs"
check "dashboard ConfigMap carries the JSON and grafana_dashboard: \"1\"" python3 - "$work/default.yaml" "$chart/dashboards/asyncd.json" <<'EOF'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"]
cm = [d for d in docs if d["metadata"]["name"].endswith("-dashboard")][0]
assert cm["metadata"]["labels"].get("grafana_dashboard") == "1", cm["metadata"]["labels"]
assert json.loads(cm["data"]["asyncd.json"]) == json.load(open(sys.argv[2])), "ConfigMap JSON differs from the file"
EOF
check "PrometheusRule: five alerts with severity, summary, description, for" \
  assets rules "$work/monitoring.yaml" "$metrics_rs" "$work/rules.exprs"
promql() {  # every expression parses with Prometheus' parser; the metrics it selects exist
  local out
  out=$(cat "$work/dashboard.exprs" "$work/rules.exprs" | "$PROMQL_CHECK") || { printf '%s\n' "$out"; return 1; }
  assets parsed "$metrics_rs" <<<"$out"
}
check "PromQL of dashboard and alerts parses; selected metrics are registered" promql
check "PromQL checker rejects a broken expression" bash -c \
  "! echo '{\"name\":\"bad\",\"expr\":\"sum(rate(asyncd_task_retry_total[5m])\"}' | '$PROMQL_CHECK' >/dev/null"

# ---------------------------------------------------------------- control plane

if (( cluster )); then
  echo "==> control plane"
  if ! "$CP" status >/dev/null 2>&1; then
    "$CP" start >"$work/controlplane.log" 2>&1 || { cat "$work/controlplane.log"; fail_now "start the control plane"; }
    started=1
  fi
  eval "$("$CP" env)"
  k() { kubectl --request-timeout=30s "$@"; }

  ensure_ns() { k get namespace "$ns" >/dev/null 2>&1 || k create namespace "$ns"; }
  check "namespace $ns"                     ensure_ns
  check "apply minimal ServiceMonitor/PrometheusRule CRDs" k apply -f "$td/monitoring-crds.yaml"
  check "apply the AsyncJobConfig CRD from the chart's crds/" k apply --server-side --force-conflicts -f "$chart_crd"
  check "CRDs established" k wait --for=condition=Established --timeout=60s \
    crd/asyncjobconfigs.asyncd.example.io crd/servicemonitors.monitoring.coreos.com crd/prometheusrules.monitoring.coreos.com
  # leftovers of an interrupted earlier run on a control plane that stayed up
  kinds=deploy,svc,job,pod,sa,role,rolebinding,cm,secret,pdb,networkpolicy,servicemonitor,prometheusrule
  k -n "$ns" delete "$kinds" -l "app.kubernetes.io/instance=$release" --ignore-not-found --wait=false >/dev/null 2>&1 || true

  # The repository's job configs against the chart's CRD: files named *invalid* must be
  # refused, all others accepted.
  samples=() invalid=()
  for f in "$root"/config/samples/*.yaml "$root"/examples/dev-config/*.yaml; do
    if [[ ! -f $f ]] || ! grep -q '^kind: AsyncJobConfig' "$f"; then continue; fi
    if [[ $(basename "$f") == *invalid* ]]; then invalid+=("$f"); else samples+=(-f "$f"); fi
  done
  if (( ${#samples[@]} )); then
    check "$(( ${#samples[@]} / 2 )) sample AsyncJobConfigs accepted by the CRD (dry-run)" \
      k -n "$ns" apply --dry-run=server "${samples[@]}"
  fi
  invalid_by_api() {  # invalid_by_api FILE: the API server refuses FILE as invalid
    local out
    if out=$(k -n "$ns" apply --dry-run=server -f "$1" 2>&1); then echo "accepted: $out"; return 1; fi
    grep -q 'is invalid' <<<"$out" || { echo "refused, but not as invalid: $out"; return 1; }
    echo "$out"
  }
  for f in "${invalid[@]}"; do
    check "CRD refuses ${f#"$root"/} (dry-run)" invalid_by_api "$f"
  done
  cat >"$work/no-executor.yaml" <<'EOF'
apiVersion: asyncd.example.io/v1
kind: AsyncJobConfig
metadata: {name: no-executor}
spec: {taskType: t}
EOF
  check "CRD refuses a job without executor (dry-run)" invalid_by_api "$work/no-executor.yaml"

  check "dry-run=server: default values"    k -n "$ns" apply --dry-run=server -f "$work/default.yaml"
  check "dry-run=server: monitoring enabled" k -n "$ns" apply --dry-run=server -f "$work/monitoring.yaml"
  check "dry-run=server: existing secret, Kafka, no operator" k -n "$ns" apply --dry-run=server -f "$work/other.yaml"
  check "dry-run=server: operator.scope=cluster" k -n "$ns" apply --dry-run=server -f "$work/cluster.yaml"
  check "dry-run=server: api TLS, Kafka security Secret" k -n "$ns" apply --dry-run=server -f "$work/tls.yaml"
  check "dry-run=server: NetworkPolicy with egress rules" k -n "$ns" apply --dry-run=server -f "$work/egress.yaml"
  check "dry-run=server: executor address ranges" k -n "$ns" apply --dry-run=server -f "$work/executor.yaml"
  # the stand-in CRDs do validate: a malformed scrape interval is refused
  helm template "$release" "$chart" -n "$ns" "${base[@]}" -s templates/servicemonitor.yaml \
    --set metrics.serviceMonitor.enabled=true --set metrics.serviceMonitor.interval=thirty >"$work/bad-sm.yaml"
  check "dry-run=server refuses a ServiceMonitor with interval 'thirty'" invalid_by_api "$work/bad-sm.yaml"
  helm_dry_run() {  # helm's own install path against the server; NOTES render
    local out
    out=$(helm install --dry-run=server "$release" "$chart" -n "$ns" "${base[@]}" "${monitoring[@]}" 2>&1) || { echo "$out"; return 1; }
    if ! grep -q '^NOTES:' <<<"$out" || ! grep -q "http://$fn-api.$ns.svc:7700" <<<"$out"; then
      echo "NOTES missing or wrong: $out"; return 1
    fi
  }
  check "helm install --dry-run=server (NOTES rendered)" helm_dry_run
  nothing_created() {
    local left
    left=$(k -n "$ns" get "$kinds" -l "app.kubernetes.io/instance=$release" -o name 2>&1) || { echo "$left"; return 1; }
    [[ -z $left ]] || { echo "dry-run left objects behind: $left"; return 1; }
  }
  check "the dry-runs created nothing" nothing_created

  # RBAC for real, then probe it by impersonation.
  helm template "$release" "$chart" -n "$ns" "${base[@]}" -s templates/serviceaccounts.yaml \
    -s templates/routing-rbac.yaml -s templates/operator-rbac.yaml -s templates/api-auth-rbac.yaml \
    >"$work/rbac.yaml"
  check "apply ServiceAccounts, Roles, RoleBindings" k -n "$ns" apply -f "$work/rbac.yaml"
  can() {  # can yes|no SA VERB RESOURCE [more kubectl auth can-i args]
    local want=$1 sa=$2; shift 2
    local got
    got=$(k auth can-i "$@" -n "$ns" --as="system:serviceaccount:$ns:$sa" 2>/dev/null) || true
    [[ $got == "$want" ]] || { echo "$sa: can-i $*: got '$got', want $want"; return 1; }
  }
  rbac_dispatcher() {
    local sa=asyncd-dispatcher
    can yes $sa get configmaps/asyncd-routing && can yes $sa watch configmaps/asyncd-routing &&
    can yes $sa list configmaps/asyncd-routing && can no $sa get configmaps/other &&
    can no $sa list configmaps && can no $sa update configmaps/asyncd-routing &&
    can no $sa get secrets && can no $sa list asyncjobconfigs.asyncd.example.io &&
    can no $sa create deployments.apps
  }
  rbac_api() {
    local sa=$fn
    can yes $sa get configmaps/asyncd-routing && can no $sa get configmaps/other &&
    can no $sa get secrets && can no $sa create pods &&
    can yes $sa create tokenreviews.authentication.k8s.io &&
    can yes $sa create subjectaccessreviews.authorization.k8s.io &&
    can no $sa create serviceaccounts --subresource=token && can no $sa list asyncjobconfigs.asyncd.example.io
  }
  rbac_operator() {
    local sa=$fn-operator
    can yes $sa watch asyncjobconfigs.asyncd.example.io && can yes $sa patch asyncjobconfigs.asyncd.example.io &&
    can yes $sa patch asyncjobconfigs.asyncd.example.io --subresource=status &&
    can yes $sa update asyncjobconfigs.asyncd.example.io --subresource=finalizers &&
    can no $sa create asyncjobconfigs.asyncd.example.io && can no $sa delete asyncjobconfigs.asyncd.example.io &&
    can yes $sa create configmaps && can yes $sa patch configmaps/asyncd-routing &&
    can yes $sa create deployments.apps && can yes $sa delete deployments.apps &&
    can yes $sa create horizontalpodautoscalers.autoscaling && can no $sa create events &&
    can yes $sa create events.events.k8s.io && can yes $sa update leases.coordination.k8s.io/$fn-operator &&
    can yes $sa create leases.coordination.k8s.io && can no $sa update leases.coordination.k8s.io/other &&
    can no $sa delete leases.coordination.k8s.io/$fn-operator &&
    can yes $sa patch configmaps/asyncd-routing && can yes $sa patch horizontalpodautoscalers.autoscaling &&
    can no $sa get configmaps/other && can no $sa patch configmaps/other && can no $sa delete configmaps/asyncd-routing &&
    can no $sa list configmaps &&
    can yes $sa get secrets && can no $sa list secrets && can no $sa watch secrets &&
    can no $sa create pods && can no $sa create roles.rbac.authorization.k8s.io &&
    can no $sa create serviceaccounts &&
    ! k auth can-i create deployments.apps -n default --as="system:serviceaccount:$ns:$sa" >/dev/null 2>&1 &&
    ! k auth can-i list asyncjobconfigs.asyncd.example.io --all-namespaces --as="system:serviceaccount:$ns:$sa" >/dev/null 2>&1
  }
  check "RBAC: dispatcher reads only the routing ConfigMap"  rbac_dispatcher
  check "RBAC: api/scheduler read only the routing ConfigMap, and may review tokens and access" rbac_api
  check "RBAC: operator has what it reconciles, in its namespace only" rbac_operator
  check "delete the RBAC objects again" k -n "$ns" delete -f "$work/rbac.yaml" --wait=true --timeout=30s

  if (( started )); then
    check "stop the control plane (started by this script)" "$CP" stop
    started=0
  fi
fi

echo "chart: $passed passed, $failed failed"
(( failed == 0 ))
