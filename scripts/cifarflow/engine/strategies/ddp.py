"""DistributedDataParallel: N processes, one per GPU (nccl) or per CPU slot (gloo).

Processes come from ``srun`` under Slurm (rank from SLURM_PROCID, master = first host of
SLURM_JOB_NODELIST, port derived from the job id) or from ``torchrun`` locally (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Anything inconsistent fails loudly instead of
hanging or silently training a world of one.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

from ...slurm import first_hostname
from ..cuda import apply_cuda_switches
from .base import StrategyError, require_cuda
from .multiprocess import MultiProcessStrategy


@dataclass
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str


def too_few_gpus(strategy: str, ranks: int, gpus: int) -> str:
    """The one line for more ranks on a machine than GPUs, outside Slurm (torchrun)."""
    return (f"{strategy}: {ranks} ranks on this machine need a GPU each, but {gpus} GPU(s) "
            "visible: NCCL cannot put two ranks on one GPU; use strategy mps for replicas "
            f"sharing one GPU (NVIDIA MPS), or set distributed.world_size to at most {gpus}")


def gpu_index(local_rank: int, local_world_size: int, visible: int, slurm: bool = True,
              strategy: str = "ddp") -> int:
    """This rank's GPU: its local rank when the task sees all of the node's GPUs, 0 when
    Slurm bound one GPU to each task (--gpu-bind, --gpus-per-task). Outside Slurm
    (``slurm`` False: torchrun) every rank sees the machine's GPUs, and too few is an error
    before NCCL starts (else NCCL's "Duplicate GPU detected")."""
    if visible >= local_world_size:
        return local_rank
    if not slurm:
        raise StrategyError(too_few_gpus(strategy, local_world_size, visible))
    if visible == 1:
        return 0
    raise StrategyError(f"{local_world_size} processes on this node but {visible} GPUs visible "
                        "to each: request one GPU per task (gres gpu:<tasks per node>)")


def shared_gpus(gpus: list) -> list[int]:
    """Ranks whose (host, GPU uuid) another rank also has."""
    return [r for r, gpu in enumerate(gpus) if gpus.count(gpu) > 1]


def first_host(nodelist: str) -> str:
    """First host of a Slurm hostlist such as ``cn[0012-0014,0020],gpu7``."""
    host = first_hostname(nodelist)
    if host:
        return host
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise StrategyError(f"cannot parse SLURM_JOB_NODELIST {nodelist!r}")
    prefix, ranges = m.groups()
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def port_for_job(job_id: str) -> int:
    """Distinct per job so two jobs sharing a node do not collide."""
    return 20000 + int(re.sub(r"\D", "", job_id) or 0) % 20000


def dist_env(environ=os.environ) -> DistEnv | None:
    if "RANK" in environ and "WORLD_SIZE" in environ:  # torchrun
        return DistEnv(int(environ["RANK"]), int(environ.get("LOCAL_RANK", 0)),
                       int(environ["WORLD_SIZE"]),
                       int(environ.get("LOCAL_WORLD_SIZE", environ["WORLD_SIZE"])),
                       environ.get("MASTER_ADDR", "127.0.0.1"),
                       int(environ.get("MASTER_PORT", 29500)), "torchrun")
    if "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:  # srun
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
        if not nodelist:
            raise StrategyError("SLURM_JOB_NODELIST is unset: cannot find the master host")
        world = int(environ["SLURM_NTASKS"])
        nodes = int(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES") or 1)
        return DistEnv(int(environ["SLURM_PROCID"]), int(environ.get("SLURM_LOCALID", 0)), world,
                       -(-world // nodes), environ.get("MASTER_ADDR") or first_host(nodelist),
                       int(environ.get("MASTER_PORT") or port_for_job(environ.get("SLURM_JOB_ID", "0"))),
                       "srun")
    return None


def require_dist_env(world_size: int, environ=os.environ) -> DistEnv:
    env = dist_env(environ)
    if env is not None:
        return env
    if world_size == 1:  # asked for a world of one: a single local process is that
        return DistEnv(0, 0, 1, 1, "127.0.0.1", free_port(), "single process")
    raise StrategyError("this strategy needs several processes but found no launcher: run it "
                        "through the workflow (srun under Slurm, torchrun locally) or "
                        "`torchrun --nproc-per-node N -m cifarflow train ...`")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def resolve(addr: str) -> str:
    try:
        return socket.getaddrinfo(addr, None, proto=socket.IPPROTO_TCP)[0][4][0]
    except socket.gaierror as exc:
        raise StrategyError(f"cannot resolve master address {addr!r}: {exc}") from exc


class DDPStrategy(MultiProcessStrategy):
    """The process group (gloo or nccl) over the launched ranks, and DDP. Where ranks sit
    follows ``gpu_per_rank``: on cuda, its own GPU each (two ranks on one GPU is then a
    wrong request, refused), or all on GPU 0 (mps)."""
    name = "ddp"

    def pick_device(self, env: DistEnv) -> str:
        import torch

        if not self.uses_cuda():
            return "cpu"
        index = (gpu_index(env.local_rank, env.local_world_size, torch.cuda.device_count(),
                           slurm=env.launcher == "srun", strategy=self.name)
                 if self.gpu_per_rank else 0)
        apply_cuda_switches(self.cfg)
        torch.cuda.set_device(index)
        return f"cuda:{index}"

    def setup(self):
        import datetime

        import torch
        import torch.distributed as dist

        if self.uses_cuda():
            require_cuda(self.name)
        env = require_dist_env(self.cfg.world_size)
        if env.world_size != self.cfg.world_size:
            raise StrategyError(f"{env.launcher} started {env.world_size} processes but the run "
                                f"expects world_size={self.cfg.world_size}: fix tasks/nproc")
        self.rank, self.local_rank, self.world_size = env.rank, env.local_rank, env.world_size
        self.set_threads()
        self.device = self.pick_device(env)
        backend = self.backend(self.device != "cpu")
        addr = resolve(env.master_addr)
        init = f"tcp://[{addr}]:{env.master_port}" if ":" in addr else f"tcp://{addr}:{env.master_port}"
        if self.is_main:
            print(f"[{self.name}] world {env.world_size} via {env.launcher}, backend {backend}, "
                  f"master {env.master_addr}:{env.master_port}, device {self.device}", flush=True)
        dist.init_process_group(backend, init_method=init, rank=env.rank,
                                world_size=env.world_size,
                                timeout=datetime.timedelta(seconds=float(
                                    os.environ.get("CIFARFLOW_DIST_TIMEOUT_S", 300))))
        self.backend_name = backend
        if self.device != "cpu" and self.gpu_per_rank:
            gpus = self.gather_objects((socket.gethostname(),
                                        str(torch.cuda.get_device_properties(self.device).uuid)))
            shared = shared_gpus(gpus)
            if shared:
                raise StrategyError(f"ranks {shared} share one GPU: request one GPU per task "
                                    "(gres gpu:<tasks per node>)")

    def distribute(self, model):
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [self.device] if str(self.device).startswith("cuda") else None
        return DDP(model, device_ids=ids)
