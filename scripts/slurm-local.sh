#!/usr/bin/env bash
# A single-node Slurm cluster on localhost, for tests (Debian 12, run as root,
# no systemd). Everything lives under $OPAL_SLURM_DIR (default
# /tmp/opal-slurm); nothing under /etc/slurm or /etc/munge is used or changed.
#
#   scripts/slurm-local.sh install   # apt-get the daemons (slurmctld slurmd slurm-client munge)
#   scripts/slurm-local.sh start     # start munged, slurmctld, slurmd; wait for the node to be idle
#   scripts/slurm-local.sh status    # daemons alive and node state
#   scripts/slurm-local.sh stop      # stop only the daemons this script started
#
# Clients need `export SLURM_CONF=$OPAL_SLURM_DIR/slurm.conf` (printed by start).
# Cgroup-free plugins (proctrack/linuxproc, task/none) avoid the cgroup
# failures that otherwise drain the node while sbatch still exits 0.
set -euo pipefail

DIR=${OPAL_SLURM_DIR:-/tmp/opal-slurm}
CONF=$DIR/slurm.conf
SOCK=$DIR/munge-run/munge.socket

die() { echo "slurm-local: $*" >&2; exit 1; }

alive() { # alive <pidfile> <command name>
  local pid state
  [ -f "$1" ] || return 1
  pid=$(cat "$1")
  [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$2" ] || return 1
  state=$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo Z)
  [ "$state" != Z ]
}

node_state() { SLURM_CONF=$CONF sinfo -h -N -o %t 2>/dev/null | head -n1; }

install() {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

start() {
  for bin in munged slurmctld slurmd sinfo sbatch; do
    command -v "$bin" >/dev/null || die "$bin not found (run: $0 install)"
  done
  if alive "$DIR/slurmctld.pid" slurmctld && alive "$DIR/slurmd.pid" slurmd; then
    echo "already running"; echo "export SLURM_CONF=$CONF"; return 0
  fi
  mkdir -p "$DIR"/{munge,munge-run,log,state,spool}
  chmod 700 "$DIR/munge"; chmod 755 "$DIR/munge-run"
  if [ ! -f "$DIR/munge/munge.key" ]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$DIR/munge/munge.key"
  fi
  if ! alive "$DIR/munge-run/munged.pid" munged; then
    munged --key-file="$DIR/munge/munge.key" --socket="$SOCK" --pid-file="$DIR/munge-run/munged.pid" \
      --seed-file="$DIR/munge/munged.seed" --log-file="$DIR/log/munged.log"
  fi
  munge -S "$SOCK" -n | unmunge -S "$SOCK" >/dev/null || die "munge does not work (see $DIR/log/munged.log)"

  # Node topology exactly as slurmd sees it (avoids "reconfigured" warnings).
  local topo cpus boards sockets cores threads mem
  topo=$(slurmd -C | head -n1)
  field() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$topo"; }
  cpus=$(field CPUs); boards=$(field Boards); sockets=$(field SocketsPerBoard)
  cores=$(field CoresPerSocket); threads=$(field ThreadsPerCore); mem=$(field RealMemory)
  cat >"$CONF" <<CONF
ClusterName=opal-local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SOCK
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
PlugStackConfig=$DIR/plugstack.conf
MailProg=/bin/true
ReturnToService=2
MinJobAge=5
NodeName=$(hostname -s) NodeAddr=127.0.0.1 CPUs=$cpus Sockets=$((boards * sockets)) CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$((mem * 9 / 10)) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  : >"$DIR/plugstack.conf"
  alive "$DIR/slurmctld.pid" slurmctld || slurmctld -f "$CONF"
  alive "$DIR/slurmd.pid" slurmd || slurmd -f "$CONF"
  local i
  for i in $(seq 1 150); do
    [ "$(node_state)" = idle ] && { echo "node idle"; echo "export SLURM_CONF=$CONF"; return 0; }
    sleep 0.2
  done
  die "node did not become idle (state: $(node_state)); logs in $DIR/log"
}

stop_one() { # stop_one <pidfile> <command name>
  alive "$1" "$2" || return 0
  local pid i; pid=$(cat "$1")
  kill -TERM "$pid"
  for i in $(seq 1 50); do alive "$1" "$2" || return 0; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null || true
}

stop() {
  stop_one "$DIR/slurmd.pid" slurmd
  stop_one "$DIR/slurmctld.pid" slurmctld
  stop_one "$DIR/munge-run/munged.pid" munged
  echo "stopped"
}

status() {
  local ok=0
  for d in "slurmctld.pid slurmctld" "slurmd.pid slurmd" "munge-run/munged.pid munged"; do
    set -- $d
    if alive "$DIR/$1" "$2"; then echo "$2: running"; else echo "$2: not running"; ok=1; fi
  done
  echo "node: $(node_state || true)"
  return $ok
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 install|start|status|stop" ;;
esac
