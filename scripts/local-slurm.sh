#!/usr/bin/env bash
# local-slurm.sh [start|stop|status]: a one-node Slurm cluster on this machine, to try the sbatch
# and srun lines of docs/cluster.md (and run Cluster.ProcessesStartedBySrunJoin) without a real
# cluster. Needs root. `start` installs Debian's slurm-wlm and munge when missing, writes
# /etc/slurm/slurm.conf for this host (all its cores, one partition `debug`), and starts munged,
# slurmctld and slurmd; it is idempotent. `stop` ends the daemons. No cgroups are needed: process
# tracking is plain (proctrack/linuxproc) and tasks are not bound to cores.
set -euo pipefail
action=${1:-start}
[ "$(id -u)" = 0 ] || { echo "local-slurm.sh: run as root" >&2; exit 1; }
host=$(hostname -s)

case "$action" in
start)
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge
    fi
    mkdir -p /run/munge /var/spool/slurmctld-dist-local /var/spool/slurmd-dist-local /var/log/slurm
    chown munge:munge /run/munge
    [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=128 count=1 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
    pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
    mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    cat > /etc/slurm/slurm.conf <<EOF
# Written by dist's scripts/local-slurm.sh: one node, for trying launches locally.
ClusterName=dist-local
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld-dist-local
SlurmdSpoolDir=/var/spool/slurmd-dist-local
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$(nproc) RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
    pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
    pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
    for _ in $(seq 1 20); do
        sinfo -h -o %a 2>/dev/null | grep -q up && { sinfo; exit 0; }
        sleep 0.5
    done
    echo "local-slurm.sh: the partition did not come up; see /var/log/slurm/" >&2
    exit 1 ;;
stop)
    for daemon in slurmd slurmctld munged; do
        pkill -x "$daemon" || continue
        for _ in $(seq 1 40); do pgrep -x "$daemon" >/dev/null || break; sleep 0.25; done
    done ;;
status)
    sinfo ;;
*)
    echo "usage: local-slurm.sh [start|stop|status]" >&2
    exit 2 ;;
esac
