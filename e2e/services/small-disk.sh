#!/usr/bin/env bash
# A PostgreSQL and a MariaDB server of their own, each with its data on a small file system
# of its own (an ext4 image on a loop device), for the tests of a database that runs out
# of disk (dispatcher/tests/integration/disk_full.rs): a test fills the file system with
# a file of its own in the data's mount, and deletes it to free the space again.
#   small-disk.sh start|stop|env
# `env` prints the variables the tests read (URL and mount of each server). Needs root
# (mount, losetup). See README.md in this folder.
set -euo pipefail

SERVICE=small-disk
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=_lib.sh
. "$HERE/_lib.sh"

# Room for a fresh server (MariaDB's is the larger: a 64 MiB redo log and its system
# tablespace) and a few thousand tasks, small enough to fill in a second.
SIZE_MIB="${ASYNCD_SMALL_DISK_MIB:-256}"
POSTGRES_PORT="${ASYNCD_SMALL_DISK_POSTGRES_PORT:-15433}"
MARIADB_PORT="${ASYNCD_SMALL_DISK_MARIADB_PORT:-13307}"
BASE="$ASYNCD_RUN/small-disk"

# mount_of SERVER: where SERVER's file system is mounted; its run dir is inside.
mount_of() { echo "$BASE/$1"; }

# with SERVER CMD...: runs e2e/services/SERVER.sh CMD with its run dir and port moved.
with() {
  local server=$1; shift
  ASYNCD_SERVICES_RUN="$(mount_of "$server")/run" \
    ASYNCD_POSTGRES_PORT="$POSTGRES_PORT" ASYNCD_MARIADB_PORT="$MARIADB_PORT" \
    "$HERE/$server.sh" "$@"
}

mount_small() {
  local server=$1 dir image
  dir="$(mount_of "$server")"; image="$BASE/$server.img"
  mkdir -p "$dir"
  if mountpoint -q "$dir"; then return 0; fi
  [[ $EUID -eq 0 ]] || die "mounting a small file system needs root"
  rm -f "$image"
  truncate -s "${SIZE_MIB}M" "$image"
  mkfs.ext4 -q -F -m 0 "$image"
  mount -o loop "$image" "$dir"
  # The servers' OS users must reach their data dirs inside.
  chmod 1777 "$dir"
}

unmount_small() {
  local server=$1 dir
  dir="$(mount_of "$server")"
  if mountpoint -q "$dir"; then umount "$dir"; fi
  rm -f "$BASE/$server.img"
}

start() {
  for server in postgres mariadb; do
    mount_small "$server"
    with "$server" start
  done
}

stop() {
  for server in postgres mariadb; do
    if mountpoint -q "$(mount_of "$server")"; then
      with "$server" stop || true
      unmount_small "$server"
    fi
  done
}

env_vars() {
  echo "ASYNCD_TEST_SMALL_DISK_POSTGRES_URL=$(with postgres url)"
  echo "ASYNCD_TEST_SMALL_DISK_POSTGRES_MOUNT=$(mount_of postgres)"
  echo "ASYNCD_TEST_SMALL_DISK_MYSQL_URL=$(with mariadb url)"
  echo "ASYNCD_TEST_SMALL_DISK_MYSQL_MOUNT=$(mount_of mariadb)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) env_vars ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
