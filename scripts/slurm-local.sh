#!/usr/bin/env bash
# A single-node Slurm on this machine, for dasktune's Slurm tests and benchmarks.
#   bash scripts/slurm-local.sh         # install (as root, once), configure, start; idempotent
#   bash scripts/slurm-local.sh stop    # stop exactly the daemons this script started
# Installs Debian's slurm-wlm and munge (a temporary policy-rc.d keeps the packages from
# starting services of their own), writes /etc/slurm/slurm.conf from `slurmd -C`
# (proctrack/linuxproc, task/none, no cgroups, jobs share CPUs, finished jobs leave squeue
# after MinJobAge), starts munged (as the munge user), slurmctld and slurmd, and waits
# until the node is idle. PIDs of the daemons it started are kept in $STATE; `stop`
# signals only those.
set -euo pipefail

STATE=${SLURM_LOCAL_STATE:-/run/dasktune-slurm-local}
CONF=/etc/slurm/slurm.conf
LOGS=/var/log/slurm-local

log() { echo "slurm-local: $*" >&2; }

# A PID that runs (a zombie left unreaped by a container's PID 1 does not count).
running() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }
alive() { [ -f "$1" ] && running "$(cat "$1")"; }

stop_one() {  # $1: name; the PID file in $STATE says it is ours
  local mine="$STATE/$1.pid"
  if alive "$mine"; then
    local pid
    pid=$(cat "$mine")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do running "$pid" || break; sleep 0.1; done
    if running "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$mine"
}

if [ "${1:-start}" = "stop" ]; then
  stop_one slurmd
  stop_one slurmctld
  stop_one munged
  exit 0
fi

if [ "$(id -u)" != "0" ]; then
  if command -v sinfo >/dev/null && sinfo -h >/dev/null 2>&1; then exit 0; fi
  log "needs root to install and start Slurm"; exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null \
    || ! command -v sbatch >/dev/null; then
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    created_policy=1
  fi
  log "installing slurm-wlm and munge"
  out=$(mktemp)
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends slurm-wlm munge; } >"$out" 2>&1; then
    cat "$out" >&2; rm -f "$out"; [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
    log "could not install slurm-wlm and munge"; exit 1
  fi
  rm -f "$out"
  [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

mkdir -p "$STATE" "$LOGS" /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /etc/slurm

# munge: a key, its run directory, the daemon as the munge user.
if [ ! -s /etc/munge/munge.key ]; then
  if command -v mungekey >/dev/null; then mungekey -c -f -k /etc/munge/munge.key
  else dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
  cp /run/munge/munged.pid "$STATE/munged.pid"
fi

# slurm.conf for this node: its hardware from slurmd -C, shared CPUs (up to 4 jobs each),
# no cgroups, no accounting; finished jobs leave squeue after MinJobAge. The daemons reach
# each other on 127.0.0.1, whatever this host's name resolves to (a one-node cluster needs
# no other network).
host=$(hostname -s)
node=$(slurmd -C | head -1 | sed "s/^NodeName=[^ ]*/NodeName=$host NodeAddr=127.0.0.1/")
want=$(cat <<EOF
ClusterName=dasktune
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=$STATE/slurmctld.daemon.pid
SlurmdPidFile=$STATE/slurmd.daemon.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=5
KillWait=5
InactiveLimit=0
SchedulerParameters=sched_interval=2
$node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
)
changed=0
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$want" ]; then
  printf '%s\n' "$want" > "$CONF"
  changed=1
fi

start_daemon() {  # $1: name; the daemon writes $STATE/$1.daemon.pid
  if alive "$STATE/$1.daemon.pid" && [ "$changed" = 0 ]; then return; fi
  if alive "$STATE/$1.daemon.pid"; then  # a new configuration: restart ours
    cp "$STATE/$1.daemon.pid" "$STATE/$1.pid"
    stop_one "$1"
  fi
  "/usr/sbin/$1" "${@:2}"
  for _ in $(seq 100); do alive "$STATE/$1.daemon.pid" && break; sleep 0.1; done
  alive "$STATE/$1.daemon.pid" || { log "$1 did not start; see $LOGS/$1.log"; exit 1; }
  cp "$STATE/$1.daemon.pid" "$STATE/$1.pid"
}
start_daemon slurmctld -i
start_daemon slurmd

for _ in $(seq 120); do
  state=$(sinfo -h -N -o %t 2>/dev/null | head -1 || true)
  case "$state" in
    idle*|mix*|alloc*) exit 0 ;;
    drain*|down*) scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 0.5
done
log "the node did not become idle (state: ${state:-none}); see $LOGS"
exit 1
