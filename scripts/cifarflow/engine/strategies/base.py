"""The strategy contract, and the registry.

A strategy says, in one class:

* **workflow side** (class methods, no torch: the Snakefile calls them) how a run is
  planned: which config sections it reads (and so which sweep keys apply), its world size
  and process settings, what it asks the scheduler for, and the command
  prefix that starts its processes (srun/torchrun, the MPS daemon);
* **process side**: device and process group, model wrapping, which checkpointer, how
  values are reduced across ranks, and who drives the loop (the engine's own, by default).

Wrap order, once for all strategies (``wrap``): move to device -> channels_last ->
``torch.compile`` -> ``distribute`` (DDP/FSDP; torchtitan's order: compile sees the plain
module).
"""

from __future__ import annotations

import functools
import os
from typing import ClassVar

from ..cuda import apply_cuda_switches, cuda_missing, gpu_request, use_assigned_gpu

STRATEGIES: dict[str, type["Strategy"]] = {}


class StrategyError(RuntimeError):
    """A set-up problem with one clear fix."""


def require_cuda(strategy: str) -> None:
    message = cuda_missing(strategy)
    if message:
        raise StrategyError(message)


class Strategy:
    """Every class attribute a strategy may set is here, with what it means; a strategy
    says what it is through them and overrides a method only to add behaviour."""
    name: ClassVar[str] = ""               # its name in config.strategies ("": a shared base)
    config_sections: ClassVar[tuple] = ()  # its sections besides train/resources (sweep keys apply)
    sweep_keys: ClassVar[dict] = {}        # its own sweep keys: name -> (label, section)
    processes_from: ClassVar[str] = ""     # "section.key" holding its process count ("": one)
    fixed_settings: ClassVar[dict] = {}    # process settings it has whatever the config says
    device_kind: ClassVar[str] = "cpu"     # cpu | cuda: what a single process trains on
    gpu_per_rank: ClassVar[bool] = True    # on cuda, a GPU per rank (False: all ranks share one)
    launched: ClassVar[bool] = False       # several processes, started by `cifarflow launch`
    self_spawning: ClassVar[bool] = False  # starts its own workers outside Slurm
    channels_last_params: ClassVar[bool] = True  # FSDP shards only contiguous parameters
    sharded_checkpoint: ClassVar[bool] = False  # a file per rank (DCP), not one state.pt
    packages: ClassVar[tuple] = ()         # optional distributions its processes import

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            STRATEGIES[cls.name] = cls

    # ---- workflow side (no torch) ------------------------------------------------------
    @classmethod
    def world_size(cls, sections: dict) -> int:
        if not cls.processes_from:
            return 1
        section, key = cls.processes_from.split(".")
        return int(sections[section][key])

    @classmethod
    def process_settings(cls, sections: dict) -> dict:
        """nodes, device, backend and lr_scaling of the run's TrainConfig."""
        return {"nodes": 1, "device": cls.device_kind, "backend": "auto", "lr_scaling": "none",
                **cls.fixed_settings}

    @classmethod
    def job_resources(cls, cfg, res: dict) -> dict:
        """Scheduler request of one segment (Snakemake resource names, as the Slurm executor
        plugin maps them). One rule for all: memory per process x processes per node,
        tasks per node, GPUs per node."""
        per_node = cfg.world_size // cfg.nodes
        out = {"cpus_per_task": int(res["cpus_per_task"]), "mem_mb": int(res["mem_mb"]) * per_node}
        if cls.launched:
            out["nodes"] = cfg.nodes
            # the plugin takes tasks_per_node or tasks, not both; Lightning reads
            # SLURM_NTASKS_PER_NODE, which only --ntasks-per-node sets
            out.update({"tasks_per_node": per_node} if per_node > 1 else {"tasks": cfg.world_size})
        gpus = cls.gpus_per_node(cfg)
        if gpus:
            out.update(gpu_request(res.get("gpu_model", ""), gpus))
        return out

    @classmethod
    def gpus_per_node(cls, cfg) -> int:
        if cfg.device != "cuda":
            return 0
        return cfg.world_size // cfg.nodes if cls.gpu_per_rank else 1

    @classmethod
    def launcher(cls, python: str, run) -> str:
        """How the run's processes start: `cifarflow launch` (srun in a Slurm job, torchrun
        or the command itself outside), as many as the spec.json of the command says (so
        the line is the same whatever the world size). A one-process run is one srun step
        of its own too, so a preempted segment ends its job well (Slurm signals the steps,
        not the batch script that the Snakemake jobstep runs in)."""
        spawn = " --self-spawning" if cls.self_spawning else ""
        # on cuda, Slurm binds each rank's step task to its own GPU (the rank then sees one,
        # ddp.gpu_index); ranks that share one GPU (mps) are not bound
        bind = " --gpus-per-task 1" if cls.gpus_per_node(run.config) and (
            cls.gpu_per_rank or not cls.launched) else ""
        return (f"{python} -m cifarflow launch "
                f"--cpus-per-task {run.resources['cpus_per_task']}{bind}{spawn} --")

    @classmethod
    def command_prefix(cls, python: str, run) -> str:
        """What the training command is started under (launcher, wrappers)."""
        return cls.launcher(python, run)

    # ---- process side ------------------------------------------------------------------
    def __init__(self, cfg, threads: int = 0):
        self.cfg, self.requested_threads = cfg, threads
        self.rank, self.local_rank, self.world_size = 0, 0, 1
        self.device, self.backend_name = "cpu", ""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def reduce_device(self) -> str:
        """Where tensors for collectives live: nccl reduces only CUDA tensors."""
        return self.device if self.backend_name == "nccl" else "cpu"

    def threads(self) -> int:
        """SLURM_CPUS_PER_TASK (set by the scheduler), else --threads, else all cores."""
        if os.environ.get("SLURM_CPUS_PER_TASK"):
            return int(os.environ["SLURM_CPUS_PER_TASK"])
        return self.requested_threads or os.cpu_count() or 1

    def uses_cuda(self) -> bool:
        import torch

        if self.cfg.device == "auto":
            return torch.cuda.is_available()
        return self.cfg.device == "cuda"

    def set_threads(self) -> None:
        import torch

        n = self.threads()
        os.environ["OMP_NUM_THREADS"] = str(n)
        torch.set_num_threads(n)

    def setup(self) -> None:
        self.set_threads()
        if self.uses_cuda():
            require_cuda(self.name)
            apply_cuda_switches(self.cfg)
            self.device = use_assigned_gpu()

    def train(self, segment) -> dict:
        """Drive the segment: the engine's own loop unless a framework brings one."""
        from ..loop import train_alone

        return train_alone(segment)

    def checkpointer(self):
        from ..checkpoints.files import FileCheckpointer

        return FileCheckpointer(self)

    def wrap(self, model):
        """Model already on self.device; returns what the loop calls: compiled (the plain
        module), then distributed."""
        if self.cfg.compile:
            import torch
            model = torch.compile(model)
        return self.distribute(model)

    def distribute(self, model):
        """The strategy's own wrapping (DDP, FSDP); none for one process."""
        return model

    def unwrap(self, model):
        model = getattr(model, "module", model)
        return getattr(model, "_orig_mod", model)

    def sync_buffers(self, model) -> None:
        """Before evaluating and saving (all ranks): buffers that each rank keeps for itself
        become rank 0's. Nothing to do where none are kept (DDP broadcasts them itself)."""

    def model_state(self, model) -> dict:
        return self.unwrap(model).state_dict()

    def load_model_state(self, model, state: dict) -> None:
        self.unwrap(model).load_state_dict(state)

    def optimizer_state(self, model, optimizer) -> dict:
        return optimizer.state_dict()

    def load_optimizer_state(self, model, optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)

    def all_reduce(self, tensor, op: str = "sum"):
        if self.world_size > 1:
            self.all_reduce_start(tensor, op).wait()
        return tensor

    def all_reduce_start(self, tensor, op: str = "sum"):
        """Start an all-reduce of ``tensor`` in place (several ranks); its Work's ``wait()``
        ends it: on NCCL, the current CUDA stream waits, the host does not."""
        import torch.distributed as dist

        return dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op],
                               async_op=True)

    def gather_objects(self, obj) -> list:
        """``obj`` of every rank, in rank order (a small picklable value)."""
        if self.world_size == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    @functools.cached_property
    def amp(self) -> str:
        """train.amp on this process's device (auto resolved: hardware.resolve_amp)."""
        from ..hardware import resolve_amp

        return resolve_amp(self.cfg.amp, self.device)

    def autocast(self):
        from ..hardware import autocast

        return autocast(self.amp, self.device)

    def teardown(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def describe(self) -> dict:
        return {"strategy": self.name, "world_size": self.world_size, "device": str(self.device),
                "threads": self.threads(), "amp": self.amp}
