"""What every strategy shares, and the registry.

A strategy says (1) how the workflow launches it and what it asks the scheduler for
(class attributes and ``job_resources``, no torch needed: the Snakefile reads them), and
(2) inside the process, how to set up the device and process group, wrap the model and
checkpoint it. Wrap order, once for all strategies: move to device -> channels_last ->
``torch.compile`` -> DDP/FSDP wrapping (torchtitan's order; compile sees the plain module).
"""

from __future__ import annotations

import os
from typing import ClassVar

STRATEGIES: dict[str, type["Strategy"]] = {}


class StrategyError(RuntimeError):
    """A set-up problem with one clear fix."""


def get_strategy(name: str) -> type["Strategy"]:
    from . import load_all

    load_all()
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}") from None


class Strategy:
    name: ClassVar[str] = ""
    multi_process: ClassVar[bool] = False   # launched by {resources.mpi}: srun / torchrun
    checkpointer_kind: ClassVar[str] = "file"
    channels_last_params: ClassVar[bool] = True  # FSDP shards only contiguous parameters

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            STRATEGIES[cls.name] = cls

    # ---- workflow side (no torch) ------------------------------------------------------
    @classmethod
    def job_resources(cls, world_size: int, res: dict) -> dict:
        """Scheduler request of one training job (Snakemake resource names, as the Slurm
        executor plugin maps them); res is config['resources'] after the sweep."""
        return {"cpus_per_task": int(res["cpus_per_task"]), "mem_mb": int(res["mem_mb"])}

    self_spawning: ClassVar[bool] = False   # starts its own workers outside Slurm

    @classmethod
    def launcher(cls, python: str, world_size: int, resources: dict) -> str:
        """The value of {resources.mpi}: empty for one process (no srun, no torchrun)."""
        if not cls.multi_process or world_size == 1:
            return ""
        spawn = " --self-spawning" if cls.self_spawning else ""
        return (f"{python} -m cifarflow launch --nproc {world_size} --nodes "
                f"{resources.get('nodes', 1)} --cpus-per-task {resources['cpus_per_task']}"
                f"{spawn} --")

    # ---- process side ------------------------------------------------------------------
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank, self.local_rank, self.world_size = 0, 0, 1
        self.device = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def threads(self) -> int:
        """SLURM_CPUS_PER_TASK (set by the scheduler), else the configured/rule's threads."""
        if os.environ.get("SLURM_CPUS_PER_TASK"):
            return int(os.environ["SLURM_CPUS_PER_TASK"])
        return self.cfg.threads or os.cpu_count() or 1

    def setup(self) -> None:
        import torch

        n = self.threads()
        os.environ["OMP_NUM_THREADS"] = str(n)
        torch.set_num_threads(n)

    def wrap(self, model):
        """Model already on self.device; returns what the loop calls."""
        if self.cfg.compile:
            import torch
            model = torch.compile(model)
        return model

    def unwrap(self, model):
        model = getattr(model, "module", model)
        return getattr(model, "_orig_mod", model)

    def model_state(self, model) -> dict:
        return self.unwrap(model).state_dict()

    def load_model_state(self, model, state: dict) -> None:
        self.unwrap(model).load_state_dict(state)

    def optimizer_state(self, model, optimizer) -> dict:
        return optimizer.state_dict()

    def load_optimizer_state(self, model, optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)

    def all_reduce(self, tensor, op: str = "sum"):
        return tensor

    def barrier(self) -> None:
        pass

    def autocast(self):
        import contextlib
        import torch

        if self.cfg.amp == "bf16":
            return torch.autocast(device_type=str(self.device).split(":")[0], dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def teardown(self) -> None:
        pass

    def describe(self) -> dict:
        return {"strategy": self.name, "world_size": self.world_size, "device": str(self.device),
                "threads": self.threads()}
