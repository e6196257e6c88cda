#!/usr/bin/env bash
# Writes the images the test cluster runs as OCI archives (e2e/cluster/oci-image.py: no
# Docker engine, no registry) and imports the ones containerd does not have yet.
#
#   images.sh --asyncd BIN --operator BIN --pause BIN --coredns BIN --kube-version V
#             --coredns-version V [--import "CTR ARGS"] [--out DIR]
#
# What each image holds, next to the Dockerfile it stands for:
#   asyncd:<appVersion>           dispatcher/Dockerfile: /usr/local/bin/asyncd, the shared
#                                 libraries it links (libssl3 among them), CA certificates,
#                                 tzdata, user 65532, port 7700, ENTRYPOINT asyncd
#   asyncd:<appVersion>-roll      the same binary with one more variable: a second image to
#                                 roll the dispatchers to
#   asyncd-operator:<appVersion>  operator/Dockerfile: /usr/local/bin/asyncd-operator, its
#                                 libraries, CA certificates, the CRD, user 65532, port 8080
#   asyncd-e2e:dev                the scenario's executor and submitter (Python, from the
#                                 host's python3 and its standard library)
#   pause:<kube version>          the pod sandbox (kubernetes' build/pause, static)
#   coredns:<version>             cluster DNS (static Go binary)
#   prometheus:dev                Debian's prometheus binary and its libraries
#   asyncd-metrics-adapter:dev    e2e/cluster/metrics-adapter (static Go binary)
# Every name is imported under docker.io/library/..., the name CRI normalises
# "asyncd:0.1.0" to, so the chart's default image references find them.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${ASYNCD_IMAGES_DIR:-${ASYNCD_CACHE:-/var/cache/asyncd}/images}
asyncd="" operator="" pause="" coredns="" kube_version="" coredns_version="" import="" prometheus="" adapter=""
extra=()
while (( $# )); do
  case $1 in
    --asyncd) asyncd=$2; shift 2 ;;
    --operator) operator=$2; shift 2 ;;
    --pause) pause=$2; shift 2 ;;
    --coredns) coredns=$2; shift 2 ;;
    --prometheus) prometheus=$2; shift 2 ;;
    --adapter) adapter=$2; shift 2 ;;
    --kube-version) kube_version=$2; shift 2 ;;
    --coredns-version) coredns_version=$2; shift 2 ;;
    --import) import=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --extra) extra+=("$2"); shift 2 ;;   # NAME=ARCHIVE written by someone else
    *) echo "images.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$root/charts/asyncd/Chart.yaml")
[[ -n $app_version ]] || { echo "images.sh: no appVersion in charts/asyncd/Chart.yaml" >&2; exit 1; }
oci() { python3 "$here/oci-image.py" "$@"; }

archives=()
build() {  # build NAME FILE oci-image.py-args...: unless the archive's inputs are unchanged
  local name=$1 file=$out/$2 key a; shift 2
  # the key: the arguments, and the size and mtime of every file they name
  key=$( { echo "$name $*"; for a in "$@"; do a=${a%%:*}; [[ -e $a ]] && stat -c '%n %s %Y' "$a"; done
           stat -c '%n %s %Y' "$here/oci-image.py"; } | sha256sum | cut -c1-16)
  if [[ ! -f $file || $(cat "$file.key" 2>/dev/null) != "$key" ]]; then
    oci --name "docker.io/library/$name" --out "$file" "$@" >&2
    echo "$key" >"$file.key"
  fi
  archives+=("docker.io/library/$name=$file")
}

t0=$SECONDS
if [[ -n $asyncd ]]; then
  common=(--file "$asyncd:/usr/local/bin/asyncd" --ca-certs --zoneinfo --user 65532:65532 --port 7700
          --entrypoint /usr/local/bin/asyncd)
  build "asyncd:$app_version" asyncd.tar "${common[@]}"
  build "asyncd:$app_version-roll" asyncd-roll.tar "${common[@]}" --env ASYNCD_IMAGE_VARIANT=roll
fi
if [[ -n $operator ]]; then
  build "asyncd-operator:$app_version" asyncd-operator.tar \
    --file "$operator:/usr/local/bin/asyncd-operator" --ca-certs --user 65532:65532 --port 8080 \
    --file "$root/crds/asyncjobconfigs.yaml:/usr/share/asyncd/crds/asyncjobconfigs.yaml" \
    --entrypoint /usr/local/bin/asyncd-operator
fi
if [[ -n $asyncd || -n $operator ]]; then
  # Debian's interpreter (a python3 earlier on PATH may be a pyenv shim script)
  py=$(readlink -f /usr/bin/python3)
  pyver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  build asyncd-e2e:dev asyncd-e2e.tar --file "$py:/usr/bin/python$pyver" --link "/usr/bin/python3:python$pyver" \
    --tree "/usr/lib/python$pyver:/usr/lib/python$pyver" \
    --exclude "*/__pycache__" --exclude "*/test" --exclude "*/idlelib" --exclude "*/tkinter" \
    --exclude "*/ensurepip" --exclude "*/lib2to3" --exclude "*/site-packages" --exclude "*/dist-packages" \
    --exclude "*/config-*" --exclude "*/_tkinter*" \
    --file "$here/executor.py:/app/executor.py" --file "$here/submit.py:/app/submit.py" \
    --user 65532:65532 --entrypoint /usr/bin/python3
fi
[[ -n $pause ]] && build "pause:$kube_version" pause.tar --file "$pause:/pause" --entrypoint /pause --user 65535:65535
[[ -n $coredns ]] && build "coredns:$coredns_version" coredns.tar --file "$coredns:/coredns" --entrypoint /coredns --port 53
[[ -n $prometheus ]] && build prometheus:dev prometheus.tar --file "$prometheus:/bin/prometheus" \
  --ca-certs --user 65534:65534 --port 9090 --entrypoint /bin/prometheus
[[ -n $adapter ]] && build asyncd-metrics-adapter:dev metrics-adapter.tar \
  --file "$adapter:/metrics-adapter" --user 65532:65532 --entrypoint /metrics-adapter
for e in "${extra[@]}"; do archives+=("$e"); done
echo "images: written in $((SECONDS - t0))s" >&2

[[ -n $import ]] || exit 0
read -ra ctr <<<"$import"
have=$("${ctr[@]}" -n k8s.io images ls 2>/dev/null | awk 'NR > 1 { print $1 "@" $3 }')
for a in "${archives[@]}"; do
  name=${a%%=*} file=${a#*=}
  digest=$(tar -xOf "$file" index.json | python3 -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["digest"])')
  if grep -qxF "$name@$digest" <<<"$have"; then
    echo "images: $name is loaded ($digest)" >&2
    continue
  fi
  "${ctr[@]}" -n k8s.io images import --no-unpack=false --platform linux/amd64 "$file" >/dev/null
  echo "images: imported $name ($digest)" >&2
done
