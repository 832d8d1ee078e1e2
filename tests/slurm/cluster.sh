#!/usr/bin/env bash
# A Slurm cluster on this one machine, for tests and CI: the node of this host (partitions
# debug, the default, which urgent preempts) and two more nodes, n1 and n2 (partition multi),
# each a slurmd in its own network, UTS and mount namespace: its own address on a bridge,
# its own hostname and its own node-local /localscratch (a folder of its own), as on a
# real cluster.
# A task prolog sets SLURM_TMPDIR=/localscratch/<user>.<job>.0 as on Alliance clusters.
# n1 and n2 also advertise 2 fake GPUs each (gres on character devices this script makes),
# for tests of what GPU jobs request; nothing here has CUDA.
#
#   tests/slurm/cluster.sh start          # install (if needed), configure, start, wait until idle
#   tests/slurm/cluster.sh stop           # stop what this script started (idempotent)
#   tests/slurm/cluster.sh status         # sinfo + squeue; exit 0 if every node is up
#   tests/slurm/cluster.sh kill-node n1   # power loss of n1: SIGKILL everything on it
#                                         # (`start` brings it back)
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
SCRATCH=/localscratch
NODE_SCRATCH=/var/tmp/cifarflow-localscratch  # the namespaced nodes' /localscratch, one folder each
# the namespaced nodes: name -> address on the bridge (the controller is .1)
BRIDGE=cfbr0
NET=10.77.0
CTL_ADDR=$NET.1
declare -A NODE_ADDR=([n1]=$NET.11 [n2]=$NET.12)
HOSTS_TAG="# cifarflow test cluster"
FAKE_GPUS=2  # per namespaced node: /dev/cifarflow-gpu0..1 (shared: this is one machine)
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

SHORT=$(hostname -s)
node_names() { printf "%s\n" "${!NODE_ADDR[@]}" | sort | tr "\n" " "; }
all_nodes() { echo "$SHORT" $(node_names); }
slurmd_pidfile() { echo "$RUN_DIR/slurmd-$1.pid"; }  # SlurmdPidFile with %n
slurmd_running() { pid_alive "$(slurmd_pidfile "$1")"; }

dump_logs() {
    local f
    for f in "$LOG_DIR"/slurmctld.log "$LOG_DIR"/slurmd-*.log /var/log/munge/munged.log; do
        [[ -f $f ]] || continue
        echo "===== tail -n 40 $f =====" >&2
        tail -n 40 "$f" >&2 || true
    done
}

fail() { log "ERROR: $*"; dump_logs; exit 1; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sinfo >/dev/null && command -v munged >/dev/null \
        && command -v ip >/dev/null; then
        return 0
    fi
    log "installing slurm, munge and iproute2 packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurmctld slurmd slurm-client munge iproute2 >/dev/null
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
    local cpus sockets cores threads mem reserve realmem defmem tmp n hw
    # `slurmd -C` reports what slurmd itself will detect; use it so the node is not
    # drained for "low socket*core*thread count" / "low RealMemory".
    hw=$(slurmd -C 2>/dev/null | head -n1 || true)
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
    local hwspec="CPUs=${cpus} Boards=1 SocketsPerBoard=${sockets} CoresPerSocket=${cores} ThreadsPerCore=${threads} RealMemory=${realmem}"

    tmp=$(mktemp)
    cat >"$tmp" <<CONF
# Generated by tests/slurm/cluster.sh -- test cluster on one machine (see its header).
ClusterName=local
SlurmctldHost=${SHORT}(${CTL_ADDR})
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
# a requeued job may start again after this many seconds (default 120)
AuthInfo=cred_expire=30
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
StateSaveLocation=${CTLD_STATE}
SlurmdSpoolDir=${SLURMD_SPOOL}/%n
SlurmctldPidFile=${CTLD_PID}
SlurmdPidFile=${RUN_DIR}/slurmd-%n.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# node-local scratch per job, as Alliance clusters provide it
TaskProlog=${CONF_DIR}/cifarflow-task-prolog.sh
Epilog=${CONF_DIR}/cifarflow-epilog.sh
# timers (a node that stops answering is DOWN after SlurmdTimeout)
SlurmctldTimeout=30
SlurmdTimeout=30
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
# memory is enforced, as on a production cluster: a step above its request is killed
# (OUT_OF_MEMORY); polling /proc, since one cgroup tree cannot serve three slurmds here
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
JobCompType=jobcomp/none
MailProg=/bin/true
# nodes: this host, and n1/n2 in their namespaces (each advertises this machine's cores,
# and n1/n2 fake GPUs: gres.conf)
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName=${SHORT} NodeAddr=${CTL_ADDR} ${hwspec} State=UNKNOWN
CONF
    for n in $(node_names); do
        echo "NodeName=$n NodeAddr=${NODE_ADDR[$n]} ${hwspec} Gres=gpu:${FAKE_GPUS} State=UNKNOWN" >>"$tmp"
    done
    cat >>"$tmp" <<CONF
# preemption: a job of 'urgent' requeues the jobs of 'debug' it needs room from, after
# SIGTERM and a grace time (what a shared cluster does to a low-priority job)
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=${SHORT} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=1 GraceTime=20
PartitionName=urgent Nodes=${SHORT} Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=2 PreemptMode=OFF
PartitionName=multi Nodes=$(node_names | tr ' ' ,) Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=1
# a time limit, for the plan's check against the cluster's limits
PartitionName=short Nodes=${SHORT} Default=NO MaxTime=5 State=UP OverSubscribe=NO PriorityTier=1
CONF
    install -d -m 0755 "$CONF_DIR"
    echo "NodeName=$(node_names | tr ' ' ,) Name=gpu File=/dev/cifarflow-gpu[0-$(( FAKE_GPUS - 1 ))]" \
        | install -m 0644 /dev/stdin "$CONF_DIR/gres.conf"
    install -m 0755 /dev/stdin "$CONF_DIR/cifarflow-task-prolog.sh" <<PROLOG
#!/bin/sh
# what Alliance clusters give every task: a node-local SLURM_TMPDIR
d=${SCRATCH}/\${SLURM_JOB_USER}.\${SLURM_JOB_ID}.0
mkdir -p "\$d" && echo "export SLURM_TMPDIR=\$d"
PROLOG
    install -m 0755 /dev/stdin "$CONF_DIR/cifarflow-epilog.sh" <<EPILOG
#!/bin/sh
[ -n "\$SLURM_JOB_ID" ] && rm -rf ${SCRATCH}/*.\${SLURM_JOB_ID}.0
exit 0
EPILOG
    if [[ -f $CONF ]] && cmp -s "$tmp" "$CONF"; then
        rm -f "$tmp"
    else
        install -m 0644 "$tmp" "$CONF"; rm -f "$tmp"
        echo changed
    fi
}

# ---- the namespaced nodes' network: a bridge in this namespace, one veth per node
netns_of() { echo "cifarflow-$1"; }

make_network() {
    local n i
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge || fail "cannot create bridge $BRIDGE (need CAP_NET_ADMIN)"
        ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
    for n in $(node_names); do
        if [[ ! -e /run/netns/$(netns_of "$n") ]]; then
            ip netns add "$(netns_of "$n")"
            ip link add "cfv-$n" type veth peer name eth0 netns "$(netns_of "$n")"
            ip link set "cfv-$n" master "$BRIDGE" up
            ip -n "$(netns_of "$n")" addr add "${NODE_ADDR[$n]}/24" dev eth0
            ip -n "$(netns_of "$n")" link set eth0 up
            ip -n "$(netns_of "$n")" link set lo up
        fi
        grep -q "^${NODE_ADDR[$n]} $n " /etc/hosts \
            || echo "${NODE_ADDR[$n]} $n $HOSTS_TAG" >>/etc/hosts
    done
    install -d -m 1777 "$SCRATCH"
    for (( i = 0; i < FAKE_GPUS; i++ )); do
        [[ -c /dev/cifarflow-gpu$i ]] || mknod "/dev/cifarflow-gpu$i" c 1 3  # like /dev/null
    done
}

remove_network() {
    local n kept
    for n in $(node_names); do
        ip link del "cfv-$n" 2>/dev/null || true
        ip netns del "$(netns_of "$n")" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -f /dev/cifarflow-gpu[0-9]*
    if grep -q "$HOSTS_TAG" /etc/hosts; then
        # /etc/hosts may be a bind mount: rewrite it in place
        kept=$(grep -v "$HOSTS_TAG" /etc/hosts)
        printf '%s\n' "$kept" >/etc/hosts
    fi
}

node_pids() { # node: every process in its network namespace
    local want p
    want=$(stat -L -c %i "/run/netns/$(netns_of "$1")" 2>/dev/null) || return 0
    for p in /proc/[0-9]*; do
        [[ $(stat -L -c %i "$p/ns/net" 2>/dev/null) == "$want" ]] && echo "${p#/proc/}"
    done
    return 0
}

start_slurmd() { # node
    local n=$1
    slurmd_running "$n" && return 0
    log "starting slurmd of $n"
    install -d -m 0755 "$SLURMD_SPOOL/$n"
    if [[ $n == "$SHORT" ]]; then
        /usr/sbin/slurmd || fail "slurmd of $n failed to start"
    else
        # own hostname (UTS) and own /localscratch (mount namespace). Not `ip netns exec`:
        # it remounts /sys and hides the cgroup mount slurmd needs.
        # /localscratch is a folder on this host's disk (a job venv of the real training
        # stack is ~5.5 GB per node: more than a tmpfs should take of this machine's memory),
        # emptied whenever the node starts, as a reboot empties a node's local disk
        rm -rf "$NODE_SCRATCH/$n" && install -d -m 1777 "$NODE_SCRATCH/$n"
        nsenter --net="/run/netns/$(netns_of "$n")" unshare --uts --mount --propagation private \
            sh -c "hostname $n && mount --bind $NODE_SCRATCH/$n $SCRATCH && exec /usr/sbin/slurmd" \
            || fail "slurmd of $n failed to start"
    fi
}

node_state() { sinfo -h -n "$1" -o %T 2>/dev/null | head -n1; }

wait_ready() {
    local deadline=$(( SECONDS + WAIT_S )) n st ready resumed=" "
    while (( SECONDS < deadline )); do
        ready=1
        for n in $(all_nodes); do
            st=$(node_state "$n" || true)
            case $st in
                idle|mixed|allocated|completing) ;;
                *)  ready=0
                    # down or drained from an earlier run (a killed node): resume it once
                    # its slurmd is back
                    if [[ $st == down* || $st == drain* ]] && [[ $resumed != *" $n "* ]] \
                        && slurmd_running "$n"; then
                        scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
                        resumed="$resumed$n "
                    fi ;;
            esac
        done
        (( ready )) && return 0
        sleep 1
    done
    log "nodes not ready after ${WAIT_S}s"
    sinfo -N >&2 || true
    return 1
}

start_daemons() {
    local n
    install -d -m 0755 "$LOG_DIR" "$RUN_DIR" "$CTLD_STATE" "$SLURMD_SPOOL"
    for n in $(all_nodes); do start_slurmd "$n"; done
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
    for n in $(all_nodes); do slurmd_running "$n" || fail "slurmd of $n is not running"; done
}

cmd_start() {
    need_root
    install_packages
    start_munge
    make_network
    local changed
    changed=$(write_conf)
    if [[ $changed == changed ]] && running slurmctld "$CTLD_PID"; then
        log "slurm.conf changed; restarting slurm daemons"
        stop_slurm
    fi
    start_daemons
    wait_ready || fail "nodes did not become idle within ${WAIT_S}s"
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
    local n
    if running slurmctld "$CTLD_PID"; then
        # shuts down slurmctld and every registered slurmd
        timeout 10 scontrol shutdown >/dev/null 2>&1 || true
    fi
    kill_and_wait slurmctld "$CTLD_PID"
    for n in $(all_nodes); do kill_and_wait "slurmd of $n" "$(slurmd_pidfile "$n")"; done
}

cmd_kill_node() { # node: what a power loss does to it
    need_root
    local n=${1:?usage: kill-node NODE} pids
    [[ -n ${NODE_ADDR[$n]:-} ]] || { log "kill-node: $n is not one of: $(node_names)"; exit 2; }
    pids=$(node_pids "$n")
    log "killing node $n: $(wc -w <<<"$pids") processes"
    [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
    rm -f "$(slurmd_pidfile "$n")"
}

cmd_stop() {
    need_root
    local n
    stop_slurm
    for n in $(node_names); do cmd_kill_node "$n" >/dev/null 2>&1; done  # jobs left there
    remove_network
    kill_and_wait munged "$MUNGE_PID"
    log "stopped"
}

cmd_status() {
    local rc=0 n
    sinfo || rc=1
    squeue || rc=1
    for n in $(all_nodes); do
        case $(node_state "$n") in
            idle|mixed|allocated|completing) ;;
            *) rc=1 ;;
        esac
    done
    return $rc
}

case ${1:-} in
    start)  cmd_start ;;
    stop)   cmd_stop ;;
    status) cmd_status ;;
    kill-node) cmd_kill_node "${2:-}" ;;
    *) echo "usage: $0 {start|stop|status|kill-node NODE}" >&2; exit 2 ;;
esac
