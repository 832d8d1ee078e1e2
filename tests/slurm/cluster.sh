#!/usr/bin/env bash
# Single-node Slurm cluster bound to loopback, for tests and CI (two partitions: debug,
# the default, is preempted by urgent).
#
#   tests/slurm/cluster.sh start    # install (if needed), configure, start, wait until idle
#   tests/slurm/cluster.sh stop     # stop the daemons this script started (idempotent)
#   tests/slurm/cluster.sh status   # sinfo + squeue; exit 0 if node idle/mixed/alloc
#
# Needs root. No systemd: daemons are started by hand.
# Env knobs:
#   SLURM_WAIT_S=60        how long `start` waits for the node to become idle
#   SLURM_CLEAN=1          start slurmctld with -c (discard saved job state)
#   SLURM_MEM_RESERVE_MB   memory kept back from RealMemory (default: 5%, min 256)
set -euo pipefail

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
LOG_DIR=/var/log/slurm
CTLD_STATE=/var/spool/slurmctld
SLURMD_SPOOL=/var/spool/slurmd
RUN_DIR=/run/slurm
CTLD_PID=$RUN_DIR/slurmctld.pid
SLURMD_PID=$RUN_DIR/slurmd.pid
MUNGE_PID=/run/munge/cifarflow-munged.pid  # ours: a munged we did not start is used, never stopped
WAIT_S=${SLURM_WAIT_S:-60}

log() { echo "[slurm-cluster] $*" >&2; }

need_root() {
    if [[ $(id -u) -ne 0 ]]; then
        log "must run as root"; exit 1
    fi
}

alive() { # pid: running, not a zombie left for an absent parent to reap
    [[ -n $1 ]] && kill -0 "$1" 2>/dev/null \
        && [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) != Z ]]
}

pid_alive() { # pidfile
    local p
    [[ -s $1 ]] || return 1
    p=$(cat "$1" 2>/dev/null) || return 1
    alive "$p"
}

# pid of a running daemon: from its pidfile, else exact process-name match.
daemon_pid() { # name pidfile
    local p
    if pid_alive "$2"; then cat "$2"; return 0; fi
    for p in $(pgrep -x "$1" 2>/dev/null); do
        alive "$p" && { echo "$p"; return 0; }
    done
    return 0
}

running() { [[ -n $(daemon_pid "$1" "$2") ]]; }

dump_logs() {
    local f
    for f in "$LOG_DIR"/slurmctld.log "$LOG_DIR"/slurmd.log /var/log/munge/munged.log; do
        [[ -f $f ]] || continue
        echo "===== tail -n 40 $f =====" >&2
        tail -n 40 "$f" >&2 || true
    done
}

fail() { log "ERROR: $*"; dump_logs; exit 1; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sinfo >/dev/null && command -v munged >/dev/null; then
        return 0
    fi
    log "installing slurm + munge packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
    # Debian postinst may try to start services; without systemd they just fail. Fine.
}

start_munge() {
    install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
    install -d -o munge -g munge -m 0711 /var/lib/munge
    install -d -o munge -g munge -m 0755 /run/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating munge key"
        if command -v mungekey >/dev/null; then
            mungekey --create --force --keyfile=/etc/munge/munge.key
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0  # a working munged (ours from an earlier start, or the system's)
    fi
    if ! pid_alive "$MUNGE_PID"; then
        log "starting munged"
        rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
        runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGE_PID" \
            || fail "munged failed to start"
    fi
    local i
    for i in $(seq 1 20); do
        if munge -n </dev/null | unmunge >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    fail "munge round-trip (munge -n | unmunge) does not work"
}

write_conf() { # -> prints "changed" if slurm.conf content changed
    local host short cpus sockets cores threads mem reserve realmem defmem tmp
    host=$(hostname)
    short=$(hostname -s)
    # `slurmd -C` reports what slurmd itself will detect; use it so the node is not
    # drained for "low socket*core*thread count" / "low RealMemory".
    local hw; hw=$(slurmd -C 2>/dev/null | head -n1 || true)
    getf() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$hw"; }
    cpus=$(getf CPUs);             cpus=${cpus:-$(nproc --all)}
    sockets=$(getf SocketsPerBoard); sockets=${sockets:-1}
    cores=$(getf CoresPerSocket);  cores=${cores:-$cpus}
    threads=$(getf ThreadsPerCore); threads=${threads:-1}
    mem=$(getf RealMemory)
    [[ -n $mem ]] || mem=$(awk '/^MemTotal:/ {print int($2/1024)}' /proc/meminfo)
    reserve=${SLURM_MEM_RESERVE_MB:-$(( mem / 20 ))}
    (( reserve < 256 )) && reserve=256
    realmem=$(( mem - reserve ))
    (( realmem < 256 )) && realmem=$(( mem > 256 ? 256 : mem ))
    # Without DefMemPerCPU a job that does not ask for --mem gets the WHOLE node's
    # memory under CR_*_Memory, so nothing else could run next to it.
    defmem=$(( realmem / cpus ))
    (( defmem > 1024 )) && defmem=1024

    tmp=$(mktemp)
    cat >"$tmp" <<EOF
# Generated by tests/slurm/cluster.sh -- single-node loopback test cluster.
ClusterName=local
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
StateSaveLocation=${CTLD_STATE}
SlurmdSpoolDir=${SLURMD_SPOOL}
SlurmctldPidFile=${CTLD_PID}
SlurmdPidFile=${SLURMD_PID}
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# timers
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=86400
Waittime=0
MessageTimeout=10
# scheduling
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=${defmem}
# no accounting
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
# node + partition
NodeName=${short} NodeAddr=127.0.0.1 CPUs=${cpus} Boards=1 SocketsPerBoard=${sockets} CoresPerSocket=${cores} ThreadsPerCore=${threads} RealMemory=${realmem} State=UNKNOWN
# preemption: a job of 'urgent' requeues the jobs of 'debug' it needs room from, after
# SIGTERM and a grace time (what a shared cluster does to a low-priority job)
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=${short} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=1 GraceTime=20
PartitionName=urgent Nodes=${short} Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=2 PreemptMode=OFF
EOF
    install -d -m 0755 "$CONF_DIR"
    if [[ -f $CONF ]] && cmp -s "$tmp" "$CONF"; then
        rm -f "$tmp"
    else
        install -m 0644 "$tmp" "$CONF"; rm -f "$tmp"
        echo changed
    fi
}

node_state() { sinfo -h -o %T 2>/dev/null | head -n1; }

wait_ready() {
    local deadline=$(( SECONDS + WAIT_S )) st resumed=0
    while (( SECONDS < deadline )); do
        st=$(node_state || true)
        case $st in
            idle|mixed|allocated|completing) return 0 ;;
            down|down\*|drained|drained\*|draining)
                # e.g. state from a previous config; try to resume once slurmd registered
                if (( resumed == 0 )) && running slurmd "$SLURMD_PID"; then
                    scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 && resumed=1
                fi ;;
        esac
        sleep 1
    done
    log "node state after ${WAIT_S}s: '${st:-<no answer>}'"
    scontrol show node 2>&1 | sed 's/^/    /' >&2 || true
    return 1
}

start_daemons() {
    install -d -m 0755 "$LOG_DIR" "$RUN_DIR" "$CTLD_STATE" "$SLURMD_SPOOL"
    if ! running slurmd "$SLURMD_PID"; then
        log "starting slurmd"
        /usr/sbin/slurmd || fail "slurmd failed to start"
    fi
    if ! running slurmctld "$CTLD_PID"; then
        local args=()
        [[ ${SLURM_CLEAN:-0} == 1 ]] && args+=(-c)
        log "starting slurmctld ${args[*]}"
        if ! /usr/sbin/slurmctld "${args[@]}"; then
            log "slurmctld failed; retrying with clean state (-c)"
            /usr/sbin/slurmctld -c || fail "slurmctld failed to start"
        fi
    fi
    sleep 1
    running slurmctld "$CTLD_PID" || {
        log "slurmctld exited; retrying with clean state (-c)"
        /usr/sbin/slurmctld -c || true
        sleep 2
        running slurmctld "$CTLD_PID" || fail "slurmctld is not running"
    }
    running slurmd "$SLURMD_PID" || fail "slurmd is not running"
}

cmd_start() {
    need_root
    install_packages
    start_munge
    local changed
    changed=$(write_conf)
    if [[ $changed == changed ]] && { running slurmctld "$CTLD_PID" || running slurmd "$SLURMD_PID"; }; then
        log "slurm.conf changed; restarting slurm daemons"
        stop_slurm
    fi
    start_daemons
    wait_ready || fail "node did not become idle within ${WAIT_S}s"
    sinfo
}

kill_and_wait() { # name pidfile: only the process of our own pidfile
    local pid i
    for i in $(seq 1 30); do
        pid=$(pid_alive "$2" && cat "$2" || true)
        [[ -z $pid ]] && { rm -f "$2"; return 0; }
        if (( i == 1 )); then kill -TERM "$pid" 2>/dev/null || true; fi
        if (( i == 20 )); then kill -KILL "$pid" 2>/dev/null || true; fi
        sleep 0.5
    done
    log "WARNING: $1 still running"
}

stop_slurm() {
    if running slurmctld "$CTLD_PID"; then
        # shuts down slurmctld and every registered slurmd
        timeout 10 scontrol shutdown >/dev/null 2>&1 || true
    fi
    kill_and_wait slurmctld "$CTLD_PID"
    kill_and_wait slurmd "$SLURMD_PID"
}

cmd_stop() {
    need_root
    stop_slurm
    kill_and_wait munged "$MUNGE_PID"
    log "stopped"
}

cmd_status() {
    local st rc=0
    sinfo || rc=1
    squeue || rc=1
    st=$(node_state || true)
    case $st in
        idle|mixed|allocated|completing) ;;
        *) rc=1 ;;
    esac
    return $rc
}

case ${1:-} in
    start)  cmd_start ;;
    stop)   cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 {start|stop|status}" >&2; exit 2 ;;
esac
