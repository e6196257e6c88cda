#!/usr/bin/env bash
# A real Kubernetes API server (kube-apiserver + etcd, no kubelet, no controller-manager)
# on 127.0.0.1 for asyncd tests, the way controller-runtime's envtest runs one.
#   controlplane.sh start|stop|restart|status|env|build|kubectl ARGS...
# See README.md in this folder.
set -euo pipefail

KUBE_VERSION="${ASYNCD_KUBE_VERSION:-v1.36.3}"
ASYNCD_CACHE="${ASYNCD_CACHE:-/var/cache/asyncd}"
ASYNCD_RUN="${ASYNCD_CACHE}/run"
RUN_DIR="${ASYNCD_CONTROLPLANE_DIR:-$ASYNCD_RUN/controlplane}"
BIN_DIR="$ASYNCD_CACHE/kube-$KUBE_VERSION"
APISERVER_BIN="$BIN_DIR/kube-apiserver"

API_PORT="${ASYNCD_KUBE_PORT:-16443}"
ETCD_PORT="${ASYNCD_ETCD_PORT:-12379}"
ETCD_PEER_PORT="${ASYNCD_ETCD_PEER_PORT:-12380}"
TIMEOUT="${ASYNCD_CONTROLPLANE_TIMEOUT:-120}"     # start deadline, seconds (build excluded)
STOP_TIMEOUT="${ASYNCD_CONTROLPLANE_STOP_TIMEOUT:-30}"
BUILD_P="${ASYNCD_KUBE_BUILD_P:-2}"                # go build -p (peak ~1.9 GB RSS with 2)
BUILD_TIMEOUT="${ASYNCD_KUBE_BUILD_TIMEOUT:-2400}" # deadline for the one-time build, seconds

KUBECONFIG_PATH="$RUN_DIR/kubeconfig"
PKI="$RUN_DIR/pki"
ETCD_DATA="$RUN_DIR/etcd-data"
ETCD_LOG="$RUN_DIR/etcd.log"
ETCD_PIDFILE="$RUN_DIR/etcd.pid"
API_LOG="$RUN_DIR/kube-apiserver.log"
API_PIDFILE="$RUN_DIR/kube-apiserver.pid"
API_URL="https://127.0.0.1:$API_PORT"
ETCD_URL="http://127.0.0.1:$ETCD_PORT"
TOKEN_FILE="$RUN_DIR/token"

SERVICE=controlplane
log() { printf '[%s %s] %s\n' "$SERVICE" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now_s() { date +%s; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2fs", b - a }'; }

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# proc_matches PID PATTERN: PID is alive (not a zombie) and its command line contains PATTERN
proc_matches() {
  local pid="$1" pat="$2" cmd
  [[ -n "$pid" && "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]] || return 1
  cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  [[ "$cmd" == *"$pat"* ]]
}

# pid_of PIDFILE PATTERN: prints the pid if that process is ours and alive
pid_of() {
  local pid; pid="$(cat "$1" 2>/dev/null || true)"
  if proc_matches "$pid" "$2"; then echo "$pid"; return 0; fi
  return 1
}
etcd_pid() { pid_of "$ETCD_PIDFILE" "$ETCD_DATA"; }
api_pid() { pid_of "$API_PIDFILE" "--secure-port=$API_PORT"; }

wait_pid_exit() {
  local pid="$1" deadline=$(( $(now_s) + $2 ))
  while kill -0 "$pid" 2>/dev/null; do
    if [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" == Z ]]; then return 0; fi
    (( $(now_s) < deadline )) || return 1
    sleep 0.1
  done
}

# kill_pid PID GRACE_SECONDS: SIGTERM, wait, then SIGKILL
kill_pid() {
  local pid="$1" grace="$2"
  kill -TERM "$pid" 2>/dev/null || return 0
  if ! wait_pid_exit "$pid" "$grace"; then
    log "pid $pid did not exit after ${grace}s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_pid_exit "$pid" 10 || true
  fi
}

# with_lock NAME: exclusive lock for the rest of the script (fd 9). Background
# children must close fd 9 (9>&-) or they keep holding it.
with_lock() {
  mkdir -p "$ASYNCD_RUN"
  exec 9>"$ASYNCD_RUN/.$1.lock"
  flock -w 900 9 || die "could not take lock $ASYNCD_RUN/.$1.lock"
}

show_log_tail() {
  local f="$1" n="${2:-40}"
  if [[ -f "$f" ]]; then
    log "---- last $n lines of $f ----"
    tail -n "$n" "$f" >&2 || true
    log "---- end of $f ----"
  else
    log "(no log file at $f)"
  fi
}

# ---------------------------------------------------------------- etcd (Debian)

ensure_etcd() {
  command -v etcd >/dev/null 2>&1 && return 0
  [[ $EUID -eq 0 ]] || die "etcd is missing and installing it needs root (apt-get install etcd-server)"
  log "installing etcd-server (apt)"
  # keep the package's postinst from starting the system etcd service (we never use it)
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; made_policy=1
  fi
  local rc=0
  export DEBIAN_FRONTEND=noninteractive
  local aopts=(-y -q -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
  if ! apt-get install "${aopts[@]}" --no-install-recommends etcd-server >&2; then
    log "apt-get install failed; running apt-get update and retrying"
    apt-get update -q -o DPkg::Lock::Timeout=300 >&2 || true
    apt-get install "${aopts[@]}" --no-install-recommends etcd-server >&2 || rc=$?
  fi
  if (( made_policy )); then rm -f /usr/sbin/policy-rc.d; fi
  (( rc == 0 )) || die "apt-get install etcd-server failed (rc=$rc)"
  command -v etcd >/dev/null 2>&1 || die "installed etcd-server but 'etcd' is still not on PATH"
}

# ------------------------------------------------------- kube-apiserver (built)

# Build k8s.io/kubernetes/cmd/kube-apiserver at $KUBE_VERSION from the Go module proxy, in a
# throwaway module under $BIN_DIR/src. k8s.io/kubernetes requires its staging modules
# (k8s.io/api, apimachinery, apiserver, client-go, ...) at v0.0.0 and replaces them with
# ./staging paths, which do not exist in the module zip; we replace every such v0.0.0
# requirement with the published v0.X.Y that matches v1.X.Y.
build_apiserver() { build_kube kube-apiserver; }

# build_kube NAME: build k8s.io/kubernetes/cmd/NAME (kube-apiserver, kubelet,
# kube-controller-manager, kube-scheduler, kube-proxy) into $BIN_DIR/NAME, once.
build_kube() {
  local name="$1" bin="$BIN_DIR/$1"
  [[ -x "$bin" ]] && return 0
  command -v go >/dev/null 2>&1 || die "go is needed to build $name (none on PATH)"
  mkdir -p "$BIN_DIR"
  exec 8>"$BIN_DIR/.build.lock"
  flock -w 1800 8 || die "could not take build lock $BIN_DIR/.build.lock"
  if [[ -x "$bin" ]]; then exec 8>&-; return 0; fi   # built while we waited

  [[ "$KUBE_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "ASYNCD_KUBE_VERSION must look like v1.X.Y (got $KUBE_VERSION)"
  local minor="${BASH_REMATCH[1]}" staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
  local t0=$EPOCHREALTIME src="$BIN_DIR/src" blog="$BIN_DIR/build-$name.log"
  log "building $name $KUBE_VERSION (first time only: ~3-9 min each, ~2 GB RAM; log $blog)"

  # Go environment: module cache and GOPATH as configured; never fetch another toolchain;
  # ignore any go.work; resolve modules from go.mod (-mod=mod).
  export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOWORK=off CGO_ENABLED=0
  local gf; gf="$(sed -E 's/(^| )-mod=[^ ]*//g; s/^ +//' <<<"$(go env GOFLAGS)")"
  export GOFLAGS="${gf:+$gf }-mod=mod"
  # A toolchain with encoding/json v2 turned on breaks the server's OpenAPI document
  # (kubectl apply then fails validation). Turn it off wherever the toolchain knows it.
  if GOEXPERIMENT=nojsonv2 go env GOEXPERIMENT >/dev/null 2>&1; then
    export GOEXPERIMENT=nojsonv2
  else
    unset GOEXPERIMENT
  fi

  rm -rf "$src" "$BIN_DIR/$name".tmp.*; mkdir -p "$src"
  : >"$blog"
  {
    echo "# $(date -u +%FT%TZ) build $name $KUBE_VERSION"
    go version
    echo "GOFLAGS=$GOFLAGS GOEXPERIMENT=${GOEXPERIMENT:-} GOTOOLCHAIN=$GOTOOLCHAIN GOMODCACHE=$(go env GOMODCACHE)"
  } >>"$blog" 2>&1
  local kmod
  if ! kmod="$(cd "$src" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" 2>>"$blog" \
               | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')" || [[ ! -f "$kmod" ]]; then
    show_log_tail "$blog"; die "could not download k8s.io/kubernetes@$KUBE_VERSION"
  fi
  # every k8s.io/* module that k8s.io/kubernetes requires at v0.0.0 is a staging module
  local staging
  staging="$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 } $1 == "require" && $2 ~ /^k8s\.io\// && $3 == "v0.0.0" { print $2 }' "$kmod" | sort -u)"
  [[ -n "$staging" ]] || die "found no staging modules in $kmod"
  {
    echo "// Generated by e2e/controlplane/controlplane.sh: throwaway module that builds Kubernetes commands."
    echo "module asyncd.local/kube-build"
    echo
    echo "go $(awk '$1 == "go" { print $2; exit }' "$kmod")"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    local m; for m in $staging; do echo "	$m => $m $staging_version"; done
    echo ")"
  } >"$src/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/%s"\n' "$name" >"$src/tools.go"

  local vpkg ldflags build_date
  build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  ldflags="-s -w"
  for vpkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $vpkg.gitVersion=$KUBE_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor"
    ldflags+=" -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=$build_date"
  done
  local tmp="$BIN_DIR/$name.tmp.$$"
  if ! ( cd "$src" && timeout "$BUILD_TIMEOUT" go mod tidy -e >>"$blog" 2>&1 \
         && timeout "$BUILD_TIMEOUT" go build -p "$BUILD_P" -trimpath -ldflags "$ldflags" \
              -o "$tmp" "k8s.io/kubernetes/cmd/$name" >>"$blog" 2>&1 ) 8>&- 9>&-; then
    rm -f "$tmp"; show_log_tail "$blog" 60; die "$name build failed or timed out after ${BUILD_TIMEOUT}s (log: $blog)"
  fi
  "$tmp" --version >>"$blog" 2>&1 || { rm -f "$tmp"; show_log_tail "$blog"; die "built $name does not run"; }
  mv -f "$tmp" "$bin"
  {
    echo "kube_version=$KUBE_VERSION"
    echo "built=$build_date"
    echo "build_seconds=$(elapsed "$t0")"
    echo "go=$(go env GOVERSION)"
    echo "goexperiment=${GOEXPERIMENT:-}"
    echo "staging_version=$staging_version"
  } >"$BIN_DIR/BUILDINFO-$name"
  log "built $bin in $(elapsed "$t0")"
  exec 8>&-
}

# ------------------------------------------------------------------- certificates

# A private CA, a serving cert for 127.0.0.1/localhost/kubernetes.default.svc signed by it,
# a service-account signing key pair and an admin bearer token (group system:masters).
# ECDSA P-256 keys: generated in milliseconds; accepted by Go, rustls and OpenSSL clients.
make_pki() {
  rm -rf "$PKI"; mkdir -p "$PKI"; chmod 700 "$PKI"
  (
    cd "$PKI"
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key
    openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=asyncd-controlplane-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -addext "subjectKeyIdentifier=hash" -out ca.crt
    openssl ecparam -name prime256v1 -genkey -noout -out apiserver.key
    openssl req -new -key apiserver.key -subj "/CN=kube-apiserver" -out apiserver.csr
    cat >apiserver.ext <<'EOF'
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 3650 \
      -extfile apiserver.ext -out apiserver.crt
    openssl ecparam -name prime256v1 -genkey -noout -out sa.key
    openssl ec -in sa.key -pubout -out sa.pub
  ) >"$RUN_DIR/pki.log" 2>&1 || { show_log_tail "$RUN_DIR/pki.log"; die "openssl failed"; }
  chmod 600 "$PKI"/*.key
  local token
  token="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
  printf '%s\n' "$token" >"$TOKEN_FILE"; chmod 600 "$TOKEN_FILE"
  # token,user,uid,"group1,group2"
  printf '%s,asyncd-admin,asyncd-admin,"system:masters"\n' "$token" >"$PKI/tokens.csv"
  chmod 600 "$PKI/tokens.csv"
}

write_kubeconfig() {
  local tmp="$KUBECONFIG_PATH.tmp"
  cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: asyncd-controlplane
  cluster:
    server: $API_URL
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
users:
- name: asyncd-admin
  user:
    token: $(cat "$TOKEN_FILE")
contexts:
- name: asyncd-controlplane
  context:
    cluster: asyncd-controlplane
    user: asyncd-admin
    namespace: default
current-context: asyncd-controlplane
preferences: {}
EOF
  chmod 600 "$tmp"; mv -f "$tmp" "$KUBECONFIG_PATH"
}

# ------------------------------------------------------------------------ probes

# api_get PATH: GET over TLS with the admin token; prints the body, fails on non-2xx
api_get() {
  curl -sS --fail --max-time 3 --cacert "$PKI/ca.crt" \
    -H "Authorization: Bearer $(cat "$TOKEN_FILE" 2>/dev/null)" "$API_URL$1" 2>/dev/null
}
etcd_healthy() { curl -sS --fail --max-time 2 "$ETCD_URL/health" 2>/dev/null | grep -q '"health":"true"'; }
api_ready() { [[ "$(api_get /readyz 2>/dev/null)" == ok ]]; }
# The "default" namespace is created by a post-start hook and may lag /readyz by a moment.
api_usable() { api_ready && api_get /api/v1/namespaces/default >/dev/null; }

is_running() { etcd_pid >/dev/null && api_pid >/dev/null && api_usable; }

# wait_until DEADLINE_EPOCH WHAT PID CMD...: poll CMD every 0.2 s until it succeeds; fail
# when the deadline passes or PID exits
wait_until() {
  local deadline="$1" what="$2" pid="$3"; shift 3
  until "$@"; do
    if ! kill -0 "$pid" 2>/dev/null || [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" == Z ]]; then
      log "$what exited during startup"; return 1
    fi
    if (( $(now_s) >= deadline )); then log "$what not ready after ${TIMEOUT}s"; return 1; fi
    sleep 0.2
  done
}

# ------------------------------------------------------------------------ start

start_etcd() {
  rm -rf "$ETCD_DATA"; mkdir -p "$ETCD_DATA"; chmod 700 "$ETCD_DATA"
  [[ -f "$ETCD_LOG" ]] && mv -f "$ETCD_LOG" "$ETCD_LOG.prev"
  # --unsafe-no-fsync: throwaway test data, as envtest does
  local args=(
    --name=asyncd-controlplane
    --data-dir="$ETCD_DATA"
    --listen-client-urls="$ETCD_URL"
    --advertise-client-urls="$ETCD_URL"
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT"
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT"
    --initial-cluster="asyncd-controlplane=http://127.0.0.1:$ETCD_PEER_PORT"
    --initial-cluster-state=new
    --logger=zap --log-outputs=stderr
    --unsafe-no-fsync
    --quota-backend-bytes=$((2 * 1024 * 1024 * 1024))
  )
  setsid etcd "${args[@]}" </dev/null >"$ETCD_LOG" 2>&1 9>&- &
  echo $! >"$ETCD_PIDFILE"
}

start_apiserver() {
  [[ -f "$API_LOG" ]] && mv -f "$API_LOG" "$API_LOG.prev"
  local args=(
    --etcd-servers="$ETCD_URL"
    --bind-address=127.0.0.1
    --advertise-address=127.0.0.1
    --secure-port="$API_PORT"
    --cert-dir="$PKI"
    --tls-cert-file="$PKI/apiserver.crt"
    --tls-private-key-file="$PKI/apiserver.key"
    --token-auth-file="$PKI/tokens.csv"
    --authorization-mode=RBAC
    --service-account-issuer=https://kubernetes.default.svc.cluster.local
    --service-account-key-file="$PKI/sa.pub"
    --service-account-signing-key-file="$PKI/sa.key"
    --service-cluster-ip-range=10.0.0.0/24
    --allow-privileged=true
    # no controller-manager creates the "default" ServiceAccount, so (like envtest) do not
    # make Pods wait for one
    --disable-admission-plugins=ServiceAccount
    # the built-in "kubernetes" Service would get a loopback Endpoint, which is invalid
    --endpoint-reconciler-type=none
    --profiling=false
  )
  setsid "$APISERVER_BIN" "${args[@]}" </dev/null >"$API_LOG" 2>&1 9>&- &
  echo $! >"$API_PIDFILE"
}

stop_all() {
  local pid
  if pid="$(api_pid)"; then log "stopping kube-apiserver (pid $pid)"; kill_pid "$pid" "$STOP_TIMEOUT"; fi
  if pid="$(etcd_pid)"; then log "stopping etcd (pid $pid)"; kill_pid "$pid" "$STOP_TIMEOUT"; fi
  rm -f "$API_PIDFILE" "$ETCD_PIDFILE"
}

fail_start() {
  log "start failed: $*"
  show_log_tail "$ETCD_LOG" 15
  show_log_tail "$API_LOG" 60
  stop_all
  exit 1
}

start() {
  local t0=$EPOCHREALTIME
  if is_running; then
    log "already running: $API_URL (kube-apiserver pid $(api_pid), etcd pid $(etcd_pid)); KUBECONFIG=$KUBECONFIG_PATH"
    return 0
  fi
  if etcd_pid >/dev/null || api_pid >/dev/null; then
    log "found a partly running or unhealthy control plane; stopping it first"
    stop_all
  fi
  ensure_etcd
  build_apiserver
  local p
  for p in "$API_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT"; do
    port_open "$p" && die "port 127.0.0.1:$p is in use by another process (see ASYNCD_KUBE_PORT / ASYNCD_ETCD_PORT / ASYNCD_ETCD_PEER_PORT)"
  done
  mkdir -p "$RUN_DIR"; chmod 700 "$RUN_DIR"
  local t1=$EPOCHREALTIME
  make_pki
  local deadline=$(( $(now_s) + TIMEOUT ))

  log "starting etcd $(etcd --version 2>/dev/null | awk '/etcd Version/ {print $3}') on $ETCD_URL (data $ETCD_DATA)"
  start_etcd
  wait_until "$deadline" etcd "$(cat "$ETCD_PIDFILE")" etcd_healthy || fail_start "etcd did not become healthy"

  log "starting kube-apiserver $KUBE_VERSION on $API_URL"
  start_apiserver
  wait_until "$deadline" kube-apiserver "$(cat "$API_PIDFILE")" api_usable || fail_start "kube-apiserver did not become ready"
  write_kubeconfig
  log "ready in $(elapsed "$t0") (servers up in $(elapsed "$t1")): $API_URL; KUBECONFIG=$KUBECONFIG_PATH"
}

stop() {
  if ! etcd_pid >/dev/null && ! api_pid >/dev/null; then log "not running"; return 0; fi
  stop_all
  rm -rf "$ETCD_DATA"
  log "stopped"
}

status() {
  local ep ap
  ep="$(etcd_pid || true)"; ap="$(api_pid || true)"
  if [[ -n "$ep" && -n "$ap" ]] && api_usable; then
    echo "running $API_URL kube-apiserver=$KUBE_VERSION pid=$ap etcd pid=$ep kubeconfig=$KUBECONFIG_PATH"
  elif [[ -n "$ep" || -n "$ap" ]]; then
    echo "unhealthy kube-apiserver pid=${ap:-none} etcd pid=${ep:-none}"; return 1
  else
    echo "stopped"; return 1
  fi
}

print_env() {
  [[ -f "$KUBECONFIG_PATH" ]] || log "warning: $KUBECONFIG_PATH does not exist yet (run '$0 start')"
  printf 'export KUBECONFIG=%q\n' "$KUBECONFIG_PATH"
  printf 'export ASYNCD_KUBE_SERVER=%q\n' "$API_URL"
  printf 'export ASYNCD_KUBE_VERSION=%q\n' "$KUBE_VERSION"
}

cmd="${1:-}"; shift || true
case "$cmd" in
  start) with_lock controlplane; start ;;
  stop) with_lock controlplane; stop ;;
  restart) with_lock controlplane; stop; start ;;
  status) status ;;
  env) print_env ;;
  build)  # build [NAME...]: kube-apiserver by default
    (( $# )) || set -- kube-apiserver
    for c in "$@"; do build_kube "$c"; echo "$BIN_DIR/$c"; done ;;
  kubectl) exec kubectl --kubeconfig "$KUBECONFIG_PATH" "$@" ;;
  *) echo "usage: $0 start|stop|restart|status|env|build|kubectl ARGS..." >&2; exit 2 ;;
esac
