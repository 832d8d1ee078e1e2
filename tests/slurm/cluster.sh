#!/usr/bin/env bash
# A Slurm cluster on this one machine, for tests and CI, shaped like an Alliance (Compute
# Canada) cluster: the node of this host and two more nodes, n1 and n2, each a slurmd in its
# own network, UTS and mount namespace: its own address on a bridge, its own hostname and
# its own node-local /localscratch (a folder of its own), as on a real cluster.
# - Accounting in a real database: slurmdbd on MariaDB, associations enforced; the user is in
#   accounts def-cifar_cpu and def-cifar_gpu (and root), MaxSubmitJobs on each association.
# - No default partition: a submit plugin (job_submit.lua) routes a job that names none by
#   its time limit and whether it asks GPUs (cpubase_bycore_b1/_b3, gpubase_bygpu_b1/_b3),
#   and refuses a job without an account, a GPU job on a *_cpu account and a CPU job on a
#   *_gpu one, as Alliance sites do. Two hidden partitions the tests name: urgent (this host,
#   preempts the by-core ones) and multi (n1 and n2).
# - Typed fake GPUs (gres on character devices this script makes): n1 has 2 a100 and one
#   MIG-like a100_3g.20gb, n2 has 2 h100; nothing here has CUDA.
# - Lmod with the modulefiles StdEnv/2023, python/3.11 and scipy-stack/2023b (which puts a
#   numpy of its own on PYTHONPATH, as the real one does).
# - /project: a 1 GiB loop-mounted ext4 filesystem, small enough to fill.
# A task prolog sets SLURM_TMPDIR=/localscratch/<user>.<job>.0 as on Alliance clusters.
#
#   tests/slurm/cluster.sh start          # install (if needed), configure, start, wait until idle
#   tests/slurm/cluster.sh stop           # stop what this script started (idempotent)
#   tests/slurm/cluster.sh status         # sinfo + squeue; exit 0 if every node is up
#   tests/slurm/cluster.sh kill-node n1   # power loss of n1: SIGKILL everything on it
#                                         # (`start` brings it back)
#   tests/slurm/cluster.sh stop-accounting  # an accounting outage: slurmdbd stopped
#                                         # (`start` brings it back)
#   tests/slurm/cluster.sh stop-controller  # a slurmctld restart: stopped with its state
#                                         # saved (`start` brings it back, jobs and all)
#
# Needs root. No systemd: daemons are started by hand.
# Env knobs:
#   SLURM_WAIT_S=60        how long `start` waits for the node to become idle
#   SLURM_CLEAN=1          start slurmctld with -c (discard saved job state)
#   SLURM_NODE_CPUS=2      CPUs each node declares (the tests are written for 2)
#   SLURM_NODE_MEM_MB=16000  RealMemory each node declares
#   PROJECT_MB=1024        size of the /project filesystem
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
# typed fake GPUs per namespaced node (type:count); the devices /dev/cifarflow-gpu0.. are
# shared by the nodes: this is one machine
declare -A NODE_GPUS=([n1]="a100:2 a100_3g.20gb:1" [n2]="h100:2")
FAKE_DEVICES=3  # the most GPUs one node has
ACCOUNT=def-cifar  # the test user's accounts: def-cifar_cpu and def-cifar_gpu
MAX_SUBMIT=100     # MaxSubmitJobs of each of its associations
DBD_CONF=$CONF_DIR/slurmdbd.conf
DBD_PID=$RUN_DIR/slurmdbd.pid
MARIADB_PID=/run/mysqld/cifarflow-mariadbd.pid  # ours: a server we did not start is used, never stopped
DB_USER=slurm DB_PASS=cifarflow-test
MODULES=/etc/lmod/modules  # on Lmod's default MODULEPATH (/etc/lmod/modulespath)
SOFTWARE=/opt/cifarflow-software  # what the modules put on PATH / PYTHONPATH
PROJECT=/project
PROJECT_IMG=/var/tmp/cifarflow-project.img
PROJECT_MB=${PROJECT_MB:-1024}
MUNGE_PID=/run/munge/cifarflow-munged.pid  # ours: a munged we did not start is used, never stopped
WAIT_S=${SLURM_WAIT_S:-60}
# every node's declared shape, whatever this host has (write_conf)
NODE_CPUS=${SLURM_NODE_CPUS:-2}
NODE_MEM_MB=${SLURM_NODE_MEM_MB:-16000}

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

PACKAGES=(slurmctld slurmd slurm-client slurmdbd slurm-wlm-basic-plugins munge mariadb-server
          lmod iproute2 e2fsprogs)

install_packages() {
    local p missing=()
    for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    (( ${#missing[@]} )) || return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
    # Debian postinst may try to start services; without systemd they just fail. Fine.
}

# ---- accounting: MariaDB, slurmdbd, the associations
sql() { mariadb --protocol=socket -u root "$@"; }

start_mariadb() {
    install -d -o mysql -g mysql -m 0755 /run/mysqld
    if ! sql -e "select 1" >/dev/null 2>&1; then
        [[ -d /var/lib/mysql/mysql ]] || mariadb-install-db --user=mysql >/dev/null \
            || fail "mariadb-install-db failed"
        log "starting mariadbd"
        setsid /usr/sbin/mariadbd --user=mysql --pid-file="$MARIADB_PID" --skip-networking \
            --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
            >>"$LOG_DIR/mariadb.log" 2>&1 </dev/null &
        local i
        for i in $(seq 1 60); do sql -e "select 1" >/dev/null 2>&1 && break; sleep 0.5; done
        sql -e "select 1" >/dev/null 2>&1 || fail "mariadbd does not answer"
    fi
    sql -e "CREATE USER IF NOT EXISTS '$DB_USER'@'localhost';
            ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
            GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'localhost'; FLUSH PRIVILEGES;"
}

write_dbd_conf() {
    install -m 0600 /dev/stdin "$DBD_CONF" <<DBD
# Generated by tests/slurm/cluster.sh: the accounting daemon, on MariaDB (its socket)
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
PidFile=${DBD_PID}
LogFile=${LOG_DIR}/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=${DB_USER}
StoragePass=${DB_PASS}
StorageLoc=slurm_acct_db
DBD
}

start_slurmdbd() {
    write_dbd_conf
    if ! running slurmdbd "$DBD_PID"; then
        log "starting slurmdbd"
        /usr/sbin/slurmdbd || fail "slurmdbd failed to start"
    fi
    local i
    for i in $(seq 1 60); do
        sacctmgr -n show cluster >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    fail "slurmdbd does not answer (sacctmgr show cluster)"
}

# the cluster, the accounts and the user's associations, as an Alliance site sets them up
# (sacctmgr -i: no prompt; "Nothing new added" when they exist already)
add_associations() {
    local user=${SUDO_USER:-$(id -un)}
    sacctmgr -i add cluster local >/dev/null 2>&1 || true
    sacctmgr -i add account "${ACCOUNT}_cpu" "${ACCOUNT}_gpu" Cluster=local \
        Description="test allocation" Organization=cifarflow >/dev/null 2>&1 || true
    sacctmgr -i add user "$user" Account="${ACCOUNT}_cpu,${ACCOUNT}_gpu" Cluster=local \
        >/dev/null 2>&1 || true
    sacctmgr -i modify user where name="$user" account="${ACCOUNT}_cpu,${ACCOUNT}_gpu" \
        set MaxSubmitJobs="$MAX_SUBMIT" >/dev/null 2>&1 || true
    sacctmgr -n -P show assoc where user="$user" format=Account | grep -q "${ACCOUNT}_gpu" \
        || fail "sacctmgr: the associations of $user were not added"
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

node_gres() { # node -> gpu:a100:2,gpu:a100_3g.20gb:1
    local t out=()
    for t in ${NODE_GPUS[$1]}; do out+=("gpu:$t"); done
    (IFS=,; echo "${out[*]}")
}

write_gres_conf() { # one line per node and type, on the fake devices
    local n t type count first tmp
    tmp=$(mktemp)
    for n in $(node_names); do
        first=0
        for t in ${NODE_GPUS[$n]}; do
            type=${t%%:*} count=${t##*:}
            echo "NodeName=$n Name=gpu Type=$type File=/dev/cifarflow-gpu[$first-$(( first + count - 1 ))]" >>"$tmp"
            first=$(( first + count ))
        done
    done
    install -m 0644 "$tmp" "$CONF_DIR/gres.conf"; rm -f "$tmp"
}

# the submit plugin: what Alliance sites check and decide when a job is submitted
write_job_submit() {
    install -m 0644 /dev/stdin "$CONF_DIR/job_submit.lua" <<'LUA'
-- Generated by tests/slurm/cluster.sh: routing and account checks as on Alliance clusters.
-- A job that names no partition goes to the first partition of its kind (CPU or GPU) whose
-- MaxTime holds its time limit; a job without an account is refused, and so is a GPU job on
-- a *_cpu account or a CPU job on a *_gpu one (each allocation pays for one kind). A job
-- naming the partition "default" is routed as one naming none.
local ROUTES = {
  cpu = {{180, "cpubase_bycore_b1"}, {1440, "cpubase_bycore_b3"}},
  gpu = {{180, "gpubase_bygpu_b1"}, {1440, "gpubase_bygpu_b3"}},
}
local DEFAULT_MINUTES = 60

local function asks_gpus(job)
  for _, field in ipairs({"tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket"}) do
    local value = job[field]
    if value ~= nil and string.find(value, "gpu") then return true end
  end
  return false
end

function slurm_job_submit(job, part_list, submit_uid)
  local kind = asks_gpus(job) and "gpu" or "cpu"
  local account = job.account
  if account == nil or account == "" then
    slurm.log_user("You must specify an account for your job: --account=def-<PI>_cpu for "
                   .. "CPU jobs, --account=def-<PI>_gpu for GPU jobs (sacctmgr show assoc "
                   .. "user=$USER lists yours)")
    return slurm.ERROR
  end
  if kind == "gpu" and string.match(account, "_cpu$") then
    slurm.log_user("Account " .. account .. " is for CPU jobs; this job asks GPUs: submit it with "
                   .. string.gsub(account, "_cpu$", "_gpu"))
    return slurm.ERROR
  end
  if kind == "cpu" and string.match(account, "_gpu$") then
    slurm.log_user("Account " .. account .. " is for GPU jobs; this job asks no GPU: submit it with "
                   .. string.gsub(account, "_gpu$", "_cpu"))
    return slurm.ERROR
  end
  -- "default" is how a user says "route it" (Alliance documents it): no such partition here
  if job.partition == nil or job.partition == "" or job.partition == "default" then
    local minutes = job.time_limit
    if minutes == nil or minutes == slurm.NO_VAL or minutes == 0 then minutes = DEFAULT_MINUTES end
    for _, route in ipairs(ROUTES[kind]) do
      if minutes <= route[1] then
        job.partition = route[2]
        slurm.log_info("job_submit.lua: %s job of %d min -> %s", kind, minutes, route[2])
        return slurm.SUCCESS
      end
    end
    slurm.log_user(string.format("No partition takes a %s job of %d minutes: the longest "
                                 .. "takes %d minutes", kind, minutes,
                                 ROUTES[kind][#ROUTES[kind]][1]))
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS
LUA
}

write_conf() { # -> prints "changed" if slurm.conf content changed
    local cpus sockets cores threads realmem defmem tmp n
    # Every node's shape is declared here, not read from this host (`slurmd -C`, `nproc`):
    # SlurmdParameters=config_overrides lets slurmd run nodes of this shape on any host, so
    # a 2-, 16- or 64-core machine shows the same cluster and the tests see the same
    # partitions (what a job of N tasks can ever get, where a pack's members go).
    cpus=$NODE_CPUS sockets=1 cores=$NODE_CPUS threads=1 realmem=$NODE_MEM_MB
    # Without DefMemPerCPU a job that does not ask for --mem gets the WHOLE node's
    # memory under CR_*_Memory, so nothing else could run next to it.
    defmem=$(( realmem / cpus ))
    (( defmem > 1024 )) && defmem=1024
    local gpu_nodes
    gpu_nodes=$(node_names | xargs | tr ' ' ,)
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
# accounting in slurmdbd (MariaDB), associations and their limits enforced: a job needs an
# account the user is in (sacct, sacctmgr answer)
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStorageEnforce=associations,limits,qos
AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:a100_3g.20gb,gres/gpu:h100
# what Alliance sites do at submission: route by time limit and GPUs, check the account
JobSubmitPlugins=lua
# memory is enforced, as on a production cluster: a step above its request is killed
# (OUT_OF_MEMORY); polling /proc, since one cgroup tree cannot serve three slurmds here
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
JobCompType=jobcomp/none
MailProg=/bin/true
# nodes: this host, and n1/n2 in their namespaces (each declares NODE_CPUS cores and
# NODE_MEM_MB of memory whatever the host has, and n1/n2 typed fake GPUs: gres.conf)
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName=${SHORT} NodeAddr=${CTL_ADDR} ${hwspec} State=UNKNOWN
CONF
    for n in $(node_names); do
        echo "NodeName=$n NodeAddr=${NODE_ADDR[$n]} ${hwspec} Gres=$(node_gres "$n") State=UNKNOWN" >>"$tmp"
    done
    cat >>"$tmp" <<CONF
# partitions as Alliance names them, none the default: the submit plugin places a job that
# names none (job_submit.lua); each has its MaxTime. A job of 'urgent' requeues the jobs of
# the by-core partitions it needs room from, after SIGTERM and a grace time (what a shared
# cluster does to a low-priority job). urgent and multi are hidden: only tests name them.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=cpubase_bycore_b1 Nodes=${SHORT} Default=NO DefaultTime=60 MaxTime=3:00:00 State=UP OverSubscribe=NO PriorityTier=1 GraceTime=20
PartitionName=cpubase_bycore_b3 Nodes=${SHORT},${gpu_nodes} Default=NO DefaultTime=60 MaxTime=1-00:00:00 State=UP OverSubscribe=NO PriorityTier=1 GraceTime=20
PartitionName=gpubase_bygpu_b1 Nodes=${gpu_nodes} Default=NO DefaultTime=60 MaxTime=3:00:00 State=UP OverSubscribe=NO PriorityTier=1
PartitionName=gpubase_bygpu_b3 Nodes=${gpu_nodes} Default=NO DefaultTime=60 MaxTime=1-00:00:00 State=UP OverSubscribe=NO PriorityTier=1
PartitionName=urgent Nodes=${SHORT} Default=NO Hidden=YES MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=2 PreemptMode=OFF
PartitionName=multi Nodes=${gpu_nodes} Default=NO Hidden=YES MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=1
CONF
    install -d -m 0755 "$CONF_DIR"
    write_gres_conf
    write_job_submit
    # the daemons read gres.conf at start: a change to it restarts them, as slurm.conf's does
    echo "# gres.conf: $(md5sum <"$CONF_DIR/gres.conf" | cut -c1-32)" >>"$tmp"
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

# ---- Lmod's modules, as an Alliance cluster's StdEnv gives them (the login shell and every
# job: /etc/profile.d/lmod.sh defines `module`)
write_modules() {
    local py site
    py=$(command -v python3)
    install -d "$SOFTWARE/python/3.11/bin" "$MODULES/StdEnv" "$MODULES/python" "$MODULES/scipy-stack"
    ln -sf "$py" "$SOFTWARE/python/3.11/bin/python"
    ln -sf "$py" "$SOFTWARE/python/3.11/bin/python3"
    # scipy-stack puts its own numpy on PYTHONPATH: a job that keeps the login shell's
    # PYTHONPATH imports it ahead of its venv's
    site=$SOFTWARE/scipy-stack/2023b/lib/python3.11/site-packages
    install -d "$site/numpy"
    echo '__version__ = "1.0.0+scipy-stack-2023b"  # the module'"'"'s numpy, not a venv'"'"'s' \
        >"$site/numpy/__init__.py"
    cat >"$MODULES/StdEnv/2023.lua" <<LUA
help([[The standard environment of the test cluster (tests/slurm/cluster.sh)]])
setenv("CC_CLUSTER", "cifarflow-test")
setenv("EBVERSIONSTDENV", "2023")
LUA
    cat >"$MODULES/python/3.11.lua" <<LUA
help([[Python 3.11 (this machine's python3)]])
depends_on("StdEnv/2023")
prepend_path("PATH", "$SOFTWARE/python/3.11/bin")
setenv("EBVERSIONPYTHON", "3.11")
LUA
    cat >"$MODULES/scipy-stack/2023b.lua" <<LUA
help([[numpy and friends on PYTHONPATH, as the real scipy-stack module does]])
depends_on("python/3.11")
prepend_path("PYTHONPATH", "$site")
setenv("EBVERSIONSCIPYMINSTACK", "2023b")
LUA
}

# ---- /project: a small filesystem of its own (a loop-mounted image), before the nodes
# start: their mount namespaces see what is mounted then
mount_project() {
    mountpoint -q "$PROJECT" && return 0
    install -d -m 0755 "$PROJECT"
    if [[ ! -s $PROJECT_IMG ]]; then
        truncate -s "${PROJECT_MB}M" "$PROJECT_IMG"
        mkfs.ext4 -q -F -m 0 "$PROJECT_IMG" || fail "mkfs.ext4 of $PROJECT_IMG failed"
    fi
    mount -o loop "$PROJECT_IMG" "$PROJECT" || fail "cannot loop-mount $PROJECT_IMG on $PROJECT"
    chmod 1777 "$PROJECT"
}

unmount_project() {
    mountpoint -q "$PROJECT" && umount -l "$PROJECT" 2>/dev/null || true
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
    for (( i = 0; i < FAKE_DEVICES; i++ )); do
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
    install -d -m 0755 "$LOG_DIR" "$RUN_DIR"
    start_munge
    write_modules
    mount_project
    make_network
    local changed
    changed=$(write_conf)  # first: sacctmgr finds slurmdbd through slurm.conf
    start_mariadb
    start_slurmdbd
    add_associations
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
    unmount_project
    kill_and_wait slurmdbd "$DBD_PID"
    kill_and_wait mariadbd "$MARIADB_PID"
    kill_and_wait munged "$MUNGE_PID"
    log "stopped"
}

cmd_stop_accounting() { # an accounting outage: slurmdbd stopped (`start` brings it back)
    need_root
    kill_and_wait slurmdbd "$DBD_PID"
}

cmd_stop_controller() { # a slurmctld restart: stopped, its state saved (`start` brings it back)
    need_root
    kill_and_wait slurmctld "$CTLD_PID"
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
    stop-accounting) cmd_stop_accounting ;;
    stop-controller) cmd_stop_controller ;;
    *) echo "usage: $0 {start|stop|status|kill-node NODE|stop-accounting|stop-controller}" >&2; exit 2 ;;
esac
