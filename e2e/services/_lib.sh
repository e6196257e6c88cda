# shellcheck shell=bash
# What e2e/services/*.sh share beyond e2e/lib.sh: where their servers live and listen.
# Sourced, not executed.

# shellcheck source=e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

ASYNCD_CACHE="${ASYNCD_CACHE:-/var/cache/asyncd}"
# ASYNCD_SERVICES_RUN: another run dir, for a second instance (e2e/cluster.sh runs one in
# its network namespace); ASYNCD_SERVICE_HOST: the address to listen on and advertise.
ASYNCD_RUN="${ASYNCD_SERVICES_RUN:-${ASYNCD_CACHE}/run}"
# shellcheck disable=SC2034  # read by the scripts that source this file
HOST="${ASYNCD_SERVICE_HOST:-127.0.0.1}"

# user_can_reach USER DIR: USER can traverse into DIR
user_can_reach() {
  local user="$1" dir="$2"
  runuser -u "$user" -- test -x "$dir" 2>/dev/null
}

valid_name() {
  [[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]{0,62}$ ]] || die "invalid name '$1' (use [A-Za-z_][A-Za-z0-9_]*, max 63 chars)"
}
