#!/usr/bin/env bash
# A single-node Grid Engine (Son of Grid Engine, Debian's gridengine) on this machine, for
# dasktune's SGE test (tests/test_sge.py).
#   bash scripts/sge-local.sh         # install (as root, once), configure, start; idempotent
#   bash scripts/sge-local.sh stop    # stop exactly the daemons this script started
# Installs gridengine-master, -exec and -client (debconf answers preseeded; a temporary
# policy-rc.d keeps the packages from starting services of their own), names this host's
# loopback names one host (Grid Engine refuses a client whose address resolves to
# another name than the one it gives: 127.0.0.1 is "localhost" where the host is "vm"),
# starts sge_qmaster, lets root's jobs run (min_uid/min_gid 0: CI runs as root) and
# schedules every second, adds this host as submit and execution host with one queue
# (all.q, 8 slots, no load threshold: a busy test machine must not close it), starts
# sge_execd and waits until the queue takes jobs. PIDs of the daemons it started are
# kept in $STATE; `stop` signals only those.
set -euo pipefail

STATE=${SGE_LOCAL_STATE:-/run/dasktune-sge-local}
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
COMMON=$SGE_ROOT/$SGE_CELL/common

log() { echo "sge-local: $*" >&2; }

# A PID that runs (a zombie left unreaped by a container's PID 1 does not count).
running() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }
alive() { [ -f "$1" ] && running "$(cat "$1")"; }

stop_one() {  # $1: name; the PID file in $STATE says it is ours
  local mine="$STATE/$1.pid"
  if alive "$mine"; then
    local pid
    pid=$(cat "$mine")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do running "$pid" || break; sleep 0.1; done
    if running "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$mine"
}

if [ "${1:-start}" = "stop" ]; then
  stop_one sge_execd
  stop_one sge_qmaster
  exit 0
fi

if [ "$(id -u)" != "0" ]; then
  if command -v qstat >/dev/null && qstat >/dev/null 2>&1; then exit 0; fi
  log "needs root to install and start Grid Engine"; exit 1
fi

host=$(hostname -s)
if ! command -v qconf >/dev/null || [ ! -x /usr/sbin/sge_qmaster ] \
    || [ ! -x /usr/sbin/sge_execd ]; then
  for pkg in gridengine-common gridengine-client gridengine-master; do
    printf '%s shared/gridenginemaster string %s\n%s shared/gridenginecell string %s\n%s shared/gridengineconfig boolean true\n' \
      "$pkg" "$host" "$pkg" "$SGE_CELL" "$pkg"
  done | debconf-set-selections
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    created_policy=1
  fi
  log "installing gridengine"
  out=$(mktemp)
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends gridengine-master gridengine-exec gridengine-client; } \
      >"$out" 2>&1; then
    cat "$out" >&2; rm -f "$out"; [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
    log "could not install gridengine"; exit 1
  fi
  rm -f "$out"
  [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi
[ -f "$COMMON/bootstrap" ] || { log "no $COMMON/bootstrap: the cell was not created"; exit 1; }
mkdir -p "$STATE"

# One host, whichever of its loopback names an address resolves to.
if [ "$host" != localhost ]; then
  line="$host localhost"
  grep -qxF "$line" "$COMMON/host_aliases" 2>/dev/null || echo "$line" >> "$COMMON/host_aliases"
fi

spool=$(awk '$1 == "qmaster_spool_dir" {print $2}' "$COMMON/bootstrap")
if ! qconf -sh >/dev/null 2>&1; then
  rm -f "$spool/qmaster.pid"
  /usr/sbin/sge_qmaster
  for _ in $(seq 100); do qconf -sh >/dev/null 2>&1 && break; sleep 0.2; done
  qconf -sh >/dev/null 2>&1 || { log "sge_qmaster did not start; see $spool/messages"; exit 1; }
  cp "$spool/qmaster.pid" "$STATE/sge_qmaster.pid"
fi

# qconf -m* opens $EDITOR on the object: a sed that sets the given "key value" lines.
edit() {  # $1: qconf option (-mconf global, -msconf, -aq all.q ...), then key=value...
  local opt=$1; shift
  local script
  script=$(mktemp)
  { echo '#!/bin/sh'; printf 'sed -i'; for kv in "$@"; do
      printf " -e 's|^%s .*|%s %s|'" "${kv%%=*}" "${kv%%=*}" "${kv#*=}"; done
    echo ' "$1"'; } > "$script"
  chmod +x "$script"
  # shellcheck disable=SC2086
  EDITOR=$script qconf $opt >/dev/null
  rm -f "$script"
}
conf=$(qconf -sconf global)
if ! grep -qE '^min_uid +0$' <<<"$conf" || ! grep -qE '^min_gid +0$' <<<"$conf"; then
  edit "-mconf global" min_uid=0 min_gid=0
fi
if ! qconf -ssconf | grep -qE '^schedule_interval +0:0:1$'; then
  edit -msconf schedule_interval=0:0:1 flush_submit_sec=1 flush_finish_sec=1
fi
qconf -ss 2>/dev/null | grep -qxF "$host" || qconf -as "$host" >/dev/null
if ! qconf -sel 2>/dev/null | grep -qxF "$host"; then
  f=$(mktemp)
  printf 'hostname %s\nload_scaling NONE\ncomplex_values NONE\nuser_lists NONE\nxuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\nreport_variables NONE\n' "$host" > "$f"
  qconf -Ae "$f" >/dev/null; rm -f "$f"
fi
if ! qconf -shgrpl 2>/dev/null | grep -qxF @allhosts; then
  f=$(mktemp); printf 'group_name @allhosts\nhostlist %s\n' "$host" > "$f"
  qconf -Ahgrp "$f" >/dev/null; rm -f "$f"
fi
if ! qconf -sql 2>/dev/null | grep -qxF all.q; then
  edit "-aq all.q" qname=all.q hostlist=@allhosts slots=8 pe_list=NONE \
    load_thresholds=NONE shell=/bin/bash
fi

# The execution daemon, after the configuration (it keeps the one it started with).
execd_spool=$(qconf -sconf global | awk '$1 == "execd_spool_dir" {print $2}')
if ! alive "$STATE/sge_execd.pid"; then
  mine=""
  for f in "$execd_spool"/*/execd.pid; do alive "$f" && mine=$f; done
  if [ -z "$mine" ]; then
    /usr/sbin/sge_execd
    for _ in $(seq 100); do
      for f in "$execd_spool"/*/execd.pid; do alive "$f" && mine=$f; done
      [ -n "$mine" ] && break; sleep 0.2
    done
    [ -n "$mine" ] || { log "sge_execd did not start; see $execd_spool"; exit 1; }
    cp "$mine" "$STATE/sge_execd.pid"
  fi
fi

# Ready once the queue instance reports in and is in no error, alarm or unknown state.
for _ in $(seq 120); do
  states=$(qstat -f -q all.q 2>/dev/null | awk -v q="all.q@" 'index($1, q) == 1 {print $6}')
  line=$(qstat -f -q all.q 2>/dev/null | awk -v q="all.q@" 'index($1, q) == 1')
  if [ -n "$line" ]; then
    case "$states" in
      "") exit 0 ;;
      *E*) qmod -cq all.q >/dev/null 2>&1 || true ;;
    esac
  fi
  sleep 0.5
done
log "the queue all.q did not become ready (${line:-no queue instance}); see $spool/messages"
exit 1
