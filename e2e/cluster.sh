#!/usr/bin/env bash
# A one-node Kubernetes cluster on this machine, with a container runtime, and asyncd's
# images, Helm chart and operator running in it as pods.
#
#   e2e/cluster.sh up        build or reuse every part (cached in $ASYNCD_CACHE), start the
#                            node, load the images; prints how to use it
#   e2e/cluster.sh test      up + the scenario (e2e/cluster/scenario.sh) + down; exits
#                            non-zero on any failed check; `cluster: N passed, N failed`
#   e2e/cluster.sh down      stop everything, remove the pods' mounts, cgroups and the
#                            network namespace
#   e2e/cluster.sh exec CMD  run CMD inside the node's network namespace with KUBECONFIG
#                            set (e.g. `e2e/cluster.sh exec kubectl get pods -A`)
#   e2e/cluster.sh images    (re)build the images and load them into a running node
#
# The node: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
# kube-proxy v1.36.3 (built from k8s.io/kubernetes like e2e/controlplane's apiserver),
# containerd v2.4.2 (Go module) with Debian's runc, Debian's CNI plugins (bridge +
# host-local + portmap) and CoreDNS (Go module) as a Deployment. Everything runs inside a
# network namespace the script creates ($ASYNCD_CLUSTER_NETNS, default asyncd-cluster):
# the kubelet refuses a loopback node IP, and this machine lets traffic go only to loopback
# and to namespaces of our own. The node's address is 10.250.0.2 (a veth inside the
# namespace), pods get 10.244.0.0/24 on the bridge cni0, Services 10.96.0.0/24 (kube-proxy,
# iptables mode, inside the namespace). Kafka and MariaDB (e2e/services, their own
# instances) listen on the node address and are reachable from pods as the Services
# `kafka:9092` and `mariadb:3306` of the asyncd namespace.
#
# No Docker engine and no registry: e2e/cluster/images.sh writes the images as OCI archives
# (the Dockerfiles' contents: the release binaries, the shared libraries they link, CA
# certificates, tzdata, user 65532) and imports them with `ctr -n k8s.io images import`.
#
# See e2e/cluster/README.md for the layout, the versions and the timings.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export ASYNCD_CACHE=${ASYNCD_CACHE:-/var/cache/asyncd}
KUBE_VERSION=${ASYNCD_KUBE_VERSION:-v1.36.3}
CONTAINERD_VERSION=${ASYNCD_CONTAINERD_VERSION:-v2.4.2}
COREDNS_VERSION=${ASYNCD_COREDNS_VERSION:-v1.14.7}
NETNS=${ASYNCD_CLUSTER_NETNS:-asyncd-cluster}
NODE=asyncd-node
NODE_IP=10.250.0.2
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/24
KUBE_SVC_IP=10.96.0.1
DNS_IP=10.96.0.10
API_URL=https://$NODE_IP:6443

KUBE_BIN=$ASYNCD_CACHE/kube-$KUBE_VERSION
CTRD_BIN=$ASYNCD_CACHE/containerd-$CONTAINERD_VERSION
PAUSE_DIR=$ASYNCD_CACHE/pause-$KUBE_VERSION
COREDNS_DIR=$ASYNCD_CACHE/coredns-$COREDNS_VERSION
CMA_VERSION=${ASYNCD_CUSTOM_METRICS_APISERVER_VERSION:-v1.36.0}
ADAPTER_DIR=$ASYNCD_CACHE/metrics-adapter-$CMA_VERSION-$(sha256sum <"$root/e2e/cluster/metrics-adapter/main.go" | cut -c1-12)
RUN=${ASYNCD_CLUSTER_DIR:-$ASYNCD_CACHE/run/cluster}
# sockets: short paths (a unix socket path has at most 107 bytes)
SOCK_DIR=/run/$NETNS
CTRD_SOCK=$SOCK_DIR/containerd.sock
# containerd's content store outlives the cluster: the images stay imported
CTRD_ROOT=$ASYNCD_CACHE/cluster-containerd
PKI=$RUN/pki
KUBECONFIG_ADMIN=$RUN/admin.kubeconfig
CNI_BIN=/usr/lib/cni
TIMEOUT=${ASYNCD_CLUSTER_TIMEOUT:-180}

SERVICE=cluster  # the name log and die print
# shellcheck source=e2e/lib.sh
source "$root/e2e/lib.sh"
# Enter only the network namespace: `ip netns exec` also makes a mount namespace with a
# fresh /sys, which hides /sys/fs/cgroup from the kubelet and runc.
nsx() { nsenter --net="/run/netns/$NETNS" "$@"; }
kc() { nsx env KUBECONFIG="$KUBECONFIG_ADMIN" kubectl --request-timeout=30s "$@"; }

# ------------------------------------------------------------------------- tools

apt_tools() {  # Debian packages the node needs
  local missing=()
  command -v runc >/dev/null || missing+=(runc)
  [[ -x $CNI_BIN/bridge ]] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v etcd >/dev/null || missing+=(etcd-server)
  [[ -x /usr/bin/prometheus ]] || missing+=(prometheus)
  [[ -x /usr/bin/python3 ]] || missing+=(python3)
  (( ${#missing[@]} )) || return 0
  log "installing ${missing[*]} (apt)"
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then  # keep postinst scripts from starting services
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; made_policy=1
  fi
  local opts=(-y -q -o DPkg::Lock::Timeout=300 --no-install-recommends) rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install "${opts[@]}" "${missing[@]}" >&2 ||
    { apt-get update -q >&2 || true; DEBIAN_FRONTEND=noninteractive apt-get install "${opts[@]}" "${missing[@]}" >&2 || rc=$?; }
  (( made_policy )) && rm -f /usr/sbin/policy-rc.d
  (( rc == 0 )) || die "apt-get install ${missing[*]} failed"
}

# cached DIR NAME CMD...: unless DIR/NAME exists, run CMD (which writes DIR/.build/NAME...)
# under a lock; then move everything from DIR/.build into DIR
cached() {
  local dir=$1 name=$2; shift 2
  [[ -x $dir/$name ]] && return 0
  mkdir -p "$dir"
  (
    flock 8
    [[ -x $dir/$name ]] && exit 0
    rm -rf "$dir/.build"; mkdir -p "$dir/.build"
    local t0=$SECONDS
    log "building $name into $dir (first time only; log $dir/build.log)"
    if ! "$@" >"$dir/build.log" 2>&1; then
      tail -n 30 "$dir/build.log" >&2; exit 1
    fi
    mv "$dir"/.build/* "$dir"/ && rmdir "$dir/.build"
    printf 'go: %s\nseconds: %s\nbuilt: %s\n' "$(go version)" "$((SECONDS - t0))" "$(date -u +%FT%TZ)" >"$dir/BUILDINFO"
    log "built $name in $((SECONDS - t0))s"
  ) 8>"$dir/.lock"
}

build_containerd() {
  go_env GOBIN="$CTRD_BIN/.build" go install -p 2 -trimpath \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
}

# CoreDNS with the plugins a cluster's DNS needs (the way CoreDNS documents building with
# a chosen plugin set): a small main package that imports coremain and those plugins.
build_coredns() {
  local src=$COREDNS_DIR/src
  rm -rf "$src"; mkdir -p "$src"
  cp "$root/e2e/cluster/coredns/main.go" "$src/main.go"
  printf 'module asyncd.local/coredns\n\ngo 1.25\n\nrequire github.com/coredns/coredns %s\n' "$COREDNS_VERSION" >"$src/go.mod"
  ( cd "$src" && go_env GOFLAGS=-mod=mod go mod tidy && go_env go build -p 2 -trimpath -ldflags "-s -w" -o "$COREDNS_DIR/.build/coredns" . )
}

# The custom metrics API server of e2e/cluster/metrics-adapter, on the k8s.io modules of
# the Kubernetes version the node runs (so the Go build cache of the node's own builds
# serves most of it).
build_adapter() {
  local src=$ADAPTER_DIR/src staging=v0.${KUBE_VERSION#v1.} m
  rm -rf "$src"; mkdir -p "$src"
  cp "$root/e2e/cluster/metrics-adapter/main.go" "$src/main.go"
  {
    printf 'module asyncd.local/metrics-adapter\n\ngo 1.25\n\nrequire sigs.k8s.io/custom-metrics-apiserver %s\n\nreplace (\n' "$CMA_VERSION"
    for m in api apimachinery apiserver client-go component-base kms metrics streaming; do
      printf '\tk8s.io/%s => k8s.io/%s %s\n' "$m" "$m" "$staging"
    done
    printf ')\n'
  } >"$src/go.mod"
  local exp=""
  GOEXPERIMENT=nojsonv2 go env GOEXPERIMENT >/dev/null 2>&1 && exp=nojsonv2
  ( cd "$src" && go_env GOEXPERIMENT=$exp GOFLAGS=-mod=mod go mod tidy &&
    go_env GOEXPERIMENT=$exp go build -p 2 -trimpath -ldflags "-s -w" -o "$ADAPTER_DIR/.build/metrics-adapter" . )
}

build_pause() {  # the sandbox's pause process, from the kubernetes module's build/pause
  local mod
  mod=$(go_env go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  gcc -Os -static -Wall -Werror -DVERSION="$KUBE_VERSION" -o "$PAUSE_DIR/.build/pause" "$mod/build/pause/linux/pause.c"
}

tools() {
  apt_tools
  command -v go >/dev/null || die "go is needed to build the Kubernetes parts"
  local c
  # no kubectl on PATH: build one of the cluster's own version (Debian's is far older)
  if ! command -v kubectl >/dev/null; then
    "$root/e2e/controlplane/controlplane.sh" build kubectl >/dev/null
    export PATH="$KUBE_BIN:$PATH"
  fi
  for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    "$root/e2e/controlplane/controlplane.sh" build "$c" >/dev/null
  done
  cached "$PAUSE_DIR" pause build_pause
  cached "$CTRD_BIN" containerd build_containerd
  cached "$COREDNS_DIR" coredns build_coredns
  cached "$ADAPTER_DIR" metrics-adapter build_adapter
}

# --------------------------------------------------------------------- processes

pidfile() { echo "$RUN/$1.pid"; }
running() {  # running NAME: the process of pidfile NAME is alive
  local pid
  pid=$(cat "$(pidfile "$1")" 2>/dev/null) || return 1
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null &&
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}
# spawn NAME CMD...: start CMD detached inside the namespace, log to $RUN/NAME.log
spawn() {
  local name=$1; shift
  [[ -f $RUN/$name.log ]] && mv -f "$RUN/$name.log" "$RUN/$name.log.prev"
  PATH="$CTRD_BIN:$KUBE_BIN:$PATH" setsid nsenter --net="/run/netns/$NETNS" "$@" </dev/null >"$RUN/$name.log" 2>&1 8>&- 9>&- &
  echo $! >"$(pidfile "$name")"
}
stop_proc() {  # stop_proc NAME [GRACE]: SIGTERM, then SIGKILL after GRACE seconds
  local name=$1 grace=${2:-20} pid i
  pid=$(cat "$(pidfile "$name")" 2>/dev/null) || return 0
  if running "$name"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 5; i++)); do running "$name" || break; sleep 0.2; done
    if running "$name"; then kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$(pidfile "$name")"
}
wait_up() {  # wait_up WHAT PROCESS CMD...: until CMD succeeds; fail if PROCESS died
  local what=$1 proc=$2 deadline=$((SECONDS + TIMEOUT)); shift 2
  until "$@" >/dev/null 2>&1; do
    if [[ -n $proc ]] && ! running "$proc"; then tail -n 40 "$RUN/$proc.log" >&2; die "$proc exited while waiting for $what"; fi
    (( SECONDS < deadline )) || { [[ -n $proc ]] && tail -n 40 "$RUN/$proc.log" >&2; die "timed out waiting for $what"; }
    sleep 0.5
  done
}

# ---------------------------------------------------------------------- network

netns_up() {
  [[ -e /run/netns/$NETNS ]] || ip netns add "$NETNS"
  nsx ip link set lo up
  if ! nsx ip link show node0 >/dev/null 2>&1; then
    # a veth pair inside the namespace: node0 carries the node's address
    nsx ip link add node0 type veth peer name node1
    nsx ip addr add "$NODE_IP/24" dev node0
  fi
  nsx ip link set node0 up
  nsx ip link set node1 up
  # the node's own connections to ClusterIPs need a route before kube-proxy's DNAT; there
  # is no default route: nothing leaves the namespace
  nsx ip route replace "$SERVICE_CIDR" dev node0 src "$NODE_IP"
  nsx sysctl -qw net.ipv4.ip_forward=1
  # bridged pod-to-pod replies of Service traffic must pass kube-proxy's NAT rules
  nsx sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || log "note: no br_netfilter here"
}

# ------------------------------------------------------------------------- PKI

sign() {  # sign NAME SUBJ EXT: ECDSA key + certificate signed by our CA
  local name=$1 subj=$2 ext=$3
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key"
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr"
  printf '%s\n' "$ext" >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/${CA:-ca}.crt" -CAkey "$PKI/${CA:-ca}.key" -CAcreateserial \
    -sha256 -days 3650 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt"
}

make_pki() {
  rm -rf "$PKI"; mkdir -p "$PKI"; chmod 700 "$PKI"
  (
    for ca in ca front-proxy-ca; do
      openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$ca.key"
      openssl req -x509 -new -key "$PKI/$ca.key" -sha256 -days 3650 -subj "/CN=asyncd-cluster-$ca" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$PKI/$ca.crt"
    done
    sign apiserver /CN=kube-apiserver "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$NODE_IP,IP:$KUBE_SVC_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    client="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
    CA=front-proxy-ca sign front-proxy-client /CN=front-proxy-client "$client"
    openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key"
    openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
  ) >"$RUN/pki.log" 2>&1 || { cat "$RUN/pki.log" >&2; die "openssl failed"; }
  chmod 600 "$PKI"/*.key
  # static tokens: token,user,uid,"groups"
  local who user groups token
  : >"$PKI/tokens.csv"
  for who in admin:asyncd-admin:system:masters controller-manager:system:kube-controller-manager:system:masters \
             scheduler:system:kube-scheduler:system:masters proxy:system:kube-proxy:system:node-proxier \
             kubelet:system:node:$NODE:system:nodes; do
    IFS=: read -r name rest <<<"$who"
    user=${rest%:system:*}; groups=system:${rest##*:system:}
    token=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
    printf '%s,%s,%s,"%s"\n' "$token" "$user" "$user" "$groups" >>"$PKI/tokens.csv"
    kubeconfig "$RUN/$name.kubeconfig" "$token"
  done
  chmod 600 "$PKI/tokens.csv"
}

kubeconfig() {  # kubeconfig FILE TOKEN
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: asyncd-cluster
  cluster:
    server: $API_URL
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
users:
- name: user
  user:
    token: $2
contexts:
- name: asyncd-cluster
  context: {cluster: asyncd-cluster, user: user, namespace: default}
current-context: asyncd-cluster
EOF
  chmod 600 "$1"
}

# ------------------------------------------------------------------ components

start_etcd() {
  rm -rf "$RUN/etcd-data"; mkdir -p "$RUN/etcd-data"; chmod 700 "$RUN/etcd-data"
  spawn etcd etcd --name=asyncd-node --data-dir="$RUN/etcd-data" \
    --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
    --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
    --initial-cluster=asyncd-node=http://127.0.0.1:2380 --initial-cluster-state=new \
    --logger=zap --log-outputs=stderr --unsafe-no-fsync --quota-backend-bytes=$((2 * 1024 * 1024 * 1024))
  wait_up "etcd" etcd nsx curl -fsS http://127.0.0.1:2379/health
}

start_apiserver() {
  spawn kube-apiserver "$KUBE_BIN/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port=6443 \
    --cert-dir="$PKI" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --enable-aggregator-routing=true \
    --profiling=false
  wait_up "kube-apiserver" kube-apiserver kc get --raw /readyz
  wait_up "the default namespace" kube-apiserver kc get namespace default
}

start_controllers() {
  spawn kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig="$RUN/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$RUN/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$RUN/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --service-cluster-ip-range="$SERVICE_CIDR" --cluster-cidr="$POD_CIDR" \
    --controllers='*,-nodeipam,-bootstrapsigner,-tokencleaner' \
    --horizontal-pod-autoscaler-sync-period=5s \
    --profiling=false
  spawn kube-scheduler "$KUBE_BIN/kube-scheduler" \
    --kubeconfig="$RUN/scheduler.kubeconfig" \
    --authentication-kubeconfig="$RUN/scheduler.kubeconfig" \
    --authorization-kubeconfig="$RUN/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --profiling=false
}

start_containerd() {
  mkdir -p "$SOCK_DIR" "$CTRD_ROOT" "$RUN/cni/net.d" "$RUN/containerd-state"
  cat >"$RUN/cni/net.d/10-asyncd.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "asyncd",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
              "dataDir": "$RUN/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  cat >"$RUN/containerd.toml" <<EOF
version = 3
root = "$CTRD_ROOT"
state = "$SOCK_DIR/state"

[grpc]
  address = "$CTRD_SOCK"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "docker.io/library/pause:$KUBE_VERSION"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # the pods' network namespaces under our state dir (not /run/netns), so down finds them
  netns_mounts_under_state_dir = true
  # runc cannot give the sandbox a negative OOM score here (no CAP_SYS_RESOURCE)
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$RUN/cni/net.d"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
EOF
  spawn containerd "$CTRD_BIN/containerd" --config "$RUN/containerd.toml"
  wait_up "containerd" containerd "$CTRD_BIN/ctr" --address "$CTRD_SOCK" version
}

start_kubelet() {
  mkdir -p "$RUN/kubelet" "$RUN/pod-logs"
  : >"$RUN/resolv.conf"
  cat >"$RUN/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CTRD_SOCK
address: $NODE_IP
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [$DNS_IP]
resolvConf: $RUN/resolv.conf
failSwapOn: false
podLogsDir: $RUN/pod-logs
# images are imported, never pulled: keep them however full the disk gets
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
maxPods: 60
serializeImagePulls: false
EOF
  spawn kubelet "$KUBE_BIN/kubelet" --config="$RUN/kubelet.yaml" --kubeconfig="$RUN/kubelet.kubeconfig" \
    --root-dir="$RUN/kubelet" --hostname-override="$NODE" --node-ip="$NODE_IP"
  cat >"$RUN/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $RUN/proxy.kubeconfig}
mode: iptables
hostnameOverride: $NODE
clusterCIDR: $POD_CIDR
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  spawn kube-proxy "$KUBE_BIN/kube-proxy" --config="$RUN/kube-proxy.yaml"
  wait_up "node $NODE Ready" kubelet kc wait --for=condition=Ready "node/$NODE" --timeout=5s
}

start_coredns() {
  kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
  - {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
  - {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 5
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      containers:
        - name: coredns
          image: docker.io/library/coredns:$COREDNS_VERSION
          imagePullPolicy: Never
          args: [-conf, /etc/coredns/Corefile]
          ports:
            - {name: dns, containerPort: 53, protocol: UDP}
            - {name: dns-tcp, containerPort: 53, protocol: TCP}
          readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
          livenessProbe: {httpGet: {path: /health, port: 8080}, periodSeconds: 10}
          resources: {requests: {cpu: 50m, memory: 32Mi}, limits: {memory: 128Mi}}
          volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_IP
  selector: {k8s-app: kube-dns}
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}
EOF
}

# ----------------------------------------------------------------------- images

# asyncd and asyncd-operator from a release build of this tree (CARGO_TARGET_DIR)
# (ASYNCD_CLUSTER_BIN_DIR: take the two binaries from there instead)
build_rust() {
  if [[ -n ${ASYNCD_CLUSTER_BIN_DIR:-} ]]; then RUST_OUT=$ASYNCD_CLUSTER_BIN_DIR; return; fi
  local target=${CARGO_TARGET_DIR:-$ASYNCD_CACHE/target}
  # the package set of e2e/soak.sh's release build too: one set, one build
  ( cd "$root" && CARGO_TARGET_DIR=$target cargo build --release --locked -p asyncd -p asyncd-bench -p asyncd-operator >&2 ) ||
    die "cargo build --release failed"
  RUST_OUT=$target/release
}

load_images() {
  build_rust
  ASYNCD_IMAGES_DIR=$ASYNCD_CACHE/images "$root/e2e/cluster/images.sh" \
    --asyncd "$RUST_OUT/asyncd" --operator "$RUST_OUT/asyncd-operator" \
    --pause "$PAUSE_DIR/pause" --coredns "$COREDNS_DIR/coredns" --kube-version "$KUBE_VERSION" \
    --coredns-version "$COREDNS_VERSION" --prometheus /usr/bin/prometheus \
    --adapter "$ADAPTER_DIR/metrics-adapter" --import "$CTRD_BIN/ctr --address $CTRD_SOCK"
}

# ---------------------------------------------------------------------- up/down

up() {
  local t0=$SECONDS
  [[ $EUID -eq 0 ]] || die "the node needs root (namespaces, mounts, cgroups)"
  tools
  if running kubelet && running kube-apiserver && kc get --raw /readyz >/dev/null 2>&1; then
    log "already up (KUBECONFIG=$KUBECONFIG_ADMIN inside netns $NETNS)"
    load_images
  else
    down quiet
    mkdir -p "$RUN"; chmod 700 "$RUN"
    netns_up
    make_pki
    log "starting etcd, kube-apiserver $KUBE_VERSION on $API_URL (netns $NETNS)"
    start_etcd
    start_apiserver
    start_controllers
    log "starting containerd $CONTAINERD_VERSION, kubelet, kube-proxy"
    start_containerd
    load_images
    start_kubelet
    start_coredns
    kc -n kube-system rollout status deploy/coredns --timeout=120s >/dev/null ||
      { kc -n kube-system describe pods >&2; die "CoreDNS did not start"; }
  fi
  log "up in $((SECONDS - t0))s: node $NODE ($NODE_IP), pods $POD_CIDR, Services $SERVICE_CIDR"
  log "use: e2e/cluster.sh exec kubectl get pods -A"
}

# Everything the node started: pods' processes (by their cgroups), the shims, the
# components, the pods' mounts and network namespaces, then our namespace.
down() {
  local quiet=${1:-}
  [[ -d $RUN || -e /run/netns/$NETNS ]] || { [[ -n $quiet ]] || log "not running"; return 0; }
  [[ -n $quiet ]] || log "stopping the node"
  stop_proc kube-proxy 5
  stop_proc kubelet 10
  if running containerd; then
    local id
    for id in $("$CTRD_BIN/ctr" --address "$CTRD_SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      "$CTRD_BIN/ctr" --address "$CTRD_SOCK" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
  fi
  # whatever still runs in a pod cgroup
  local pid
  while read -r pid; do
    [[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null
  done < <(find /sys/fs/cgroup/pids/kubepods* -name cgroup.procs -exec cat {} + 2>/dev/null || true)
  stop_proc containerd 10
  # shims of our containerd (their command line names our socket's directory)
  pkill_ours() {
    local p
    for p in $(pgrep -f "$1" 2>/dev/null); do
      if [[ $p != "$$" ]]; then kill -KILL "$p" 2>/dev/null || true; fi
    done
  }
  pkill_ours "containerd-shim-runc-v2 .*-address $CTRD_SOCK"
  stop_proc kube-scheduler 5
  stop_proc kube-controller-manager 5
  stop_proc kube-apiserver 10
  stop_proc etcd 10
  # helper processes the scenario left in the namespace (Kafka, MariaDB, port-forwards)
  local p
  for p in $(ip netns pids "$NETNS" 2>/dev/null); do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in $(ip netns pids "$NETNS" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  # mounts under our directories, deepest first
  local m
  while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done < <(awk -v a="$RUN/" -v b="$SOCK_DIR/" -v c="$CTRD_ROOT/" \
             'index($2, a) == 1 || index($2, b) == 1 || index($2, c) == 1 { print $2 }' /proc/self/mounts | sort -r)
  # pod cgroups (empty now), deepest first
  find /sys/fs/cgroup/*/kubepods* -depth -type d -exec rmdir {} + 2>/dev/null || true
  ip netns del "$NETNS" 2>/dev/null || true
  rm -rf "$SOCK_DIR" "$RUN/etcd-data" "$RUN/kubelet" "$RUN/cni/ipam" "$RUN/containerd-state"
  [[ -n $quiet ]] || log "stopped"
}

# sourced (e.g. to call one function while debugging): define, run nothing
[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0

cmd=${1:-}; shift || true
case $cmd in
  up) up ;;
  down) down ;;
  test)
    trap 'rc=$?; [[ ${ASYNCD_CLUSTER_KEEP:-} == 1 ]] || down; exit $rc' EXIT
    up
    ASYNCD_CLUSTER_EXEC="nsenter --net=/run/netns/$NETNS" KUBECONFIG=$KUBECONFIG_ADMIN \
      ASYNCD_CLUSTER_LOCAL=1 ASYNCD_CLUSTER_NODE_IP=$NODE_IP ASYNCD_CLUSTER_RUN=$RUN \
      ASYNCD_CLUSTER_CTR="$CTRD_BIN/ctr --address $CTRD_SOCK" \
      bash "$root/e2e/cluster/scenario.sh" "$@"
    ;;
  exec) nsx env KUBECONFIG="$KUBECONFIG_ADMIN" PATH="$KUBE_BIN:$CTRD_BIN:$PATH" "$@" ;;
  images) load_images ;;
  tools) tools ;;
  build)  # build PART: one part only (containerd, coredns, metrics-adapter, pause)
    case ${1:-} in
      containerd) cached "$CTRD_BIN" containerd build_containerd ;;
      coredns) cached "$COREDNS_DIR" coredns build_coredns ;;
      metrics-adapter) cached "$ADAPTER_DIR" metrics-adapter build_adapter ;;
      pause) cached "$PAUSE_DIR" pause build_pause ;;
      *) die "build containerd|coredns|metrics-adapter|pause" ;;
    esac ;;
  *) echo "usage: $0 up|down|test|exec CMD...|images|tools|build PART" >&2; exit 2 ;;
esac
