#!/usr/bin/env bash
# A single-node Slurm on loopback, for the Slurm tests (tests/test_slurm.cpp) and for trying
# `kvbench sweep --slurm` on one machine: munged, slurmctld and slurmd (Debian's slurm-wlm
# 22.05 and munge), the node's real cores and memory, everything under DIR.
#   scripts/slurm/local_cluster.sh start DIR   # prints the line to export: SLURM_CONF=DIR/slurm.conf
#   scripts/slurm/local_cluster.sh stop DIR
# Nothing outside DIR is written; ports are free ones picked at start. Clients (sbatch,
# squeue, kvbench sweep --slurm) find the cluster through SLURM_CONF.
set -euo pipefail
action="${1:?usage: local_cluster.sh start|stop DIR}"
dir="${2:?usage: local_cluster.sh start|stop DIR}"

stop() {
  # The jobs first, so that no step daemon outlives the cluster; then the daemons; then any
  # step daemon left (its working folder is DIR).
  if [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    SLURM_CONF="$dir/slurm.conf" scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(SLURM_CONF="$dir/slurm.conf" squeue -h -t running,completing 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  for daemon in slurmd slurmctld munged; do
    if [ -f "$dir/$daemon.pid" ]; then
      kill "$(cat "$dir/$daemon.pid")" 2>/dev/null || true
    fi
  done
  for daemon in slurmd slurmctld munged; do
    if [ -f "$dir/$daemon.pid" ]; then
      local pid; pid="$(cat "$dir/$daemon.pid")"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/$daemon.pid"
    fi
  done
  for pid in $(pgrep -x slurmstepd 2>/dev/null); do
    [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$dir" ] && kill -9 "$pid" 2>/dev/null
  done
  return 0
}

if [ "$action" = stop ]; then
  [ -d "$dir" ] || exit 0
  dir="$(cd "$dir" && pwd)"
  stop
  exit 0
fi
[ "$action" = start ] || { echo "local_cluster.sh: start or stop, not '$action'" >&2; exit 2; }
for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || { echo "local_cluster.sh: $tool not installed (scripts/setup.sh installs slurm-wlm and munge)" >&2; exit 2; }
done
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
dir="$(cd "$dir" && pwd)"
chmod 700 "$dir/munge"
user="$(id -un)"

# munge: its own key and socket, so that no system munged is needed or touched.
head -c 1024 /dev/urandom > "$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
force=(); [ "$(id -u)" -ne 0 ] || force=(--force)  # munged refuses root without it
munged "${force[@]}" --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/munge/munge.seed"

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
ctld_port="$(free_port)"; slurmd_port="$(free_port)"
cpus="$(nproc)"
memory_mib="$(awk '/MemTotal/ { print int($2 / 1024 * 0.9) }' /proc/meminfo)"
cat > "$dir/slurm.conf" <<EOF
# Written by scripts/slurm/local_cluster.sh: one node on loopback.
ClusterName=kvbench-local
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
MinJobAge=600
NodeName=kvbench-node NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mib State=UNKNOWN
PartitionName=local Nodes=kvbench-node Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -i
slurmd -N kvbench-node
# Ready when the node takes jobs.
for _ in $(seq 100); do
  state="$(sinfo -h -N -o '%t' 2>/dev/null | head -1)"
  case "$state" in idle|mix|alloc) echo "export SLURM_CONF=$SLURM_CONF"; exit 0 ;; esac
  sleep 0.2
done
echo "local_cluster.sh: the node did not come up (state '${state:-none}'); see $dir/slurmctld.log and $dir/slurmd.log" >&2
stop
exit 1
