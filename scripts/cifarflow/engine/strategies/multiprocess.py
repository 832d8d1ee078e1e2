"""What every several-process strategy shares (ddp, fsdp, mps, lightning): started by
``cifarflow launch``, planned from the ``distributed`` section (its process count, nodes,
device, backend and lr_scaling; ``world_size`` is swept), the backend its process group
uses, and how it describes itself. Who builds the process group is the subclass's choice
(``DDPStrategy``; Lightning's Trainer)."""

from .base import Strategy

SETTINGS = ("nodes", "device", "backend", "lr_scaling")  # of the distributed section


class MultiProcessStrategy(Strategy):
    config_sections = ("distributed",)
    sweep_keys = {"world_size": ("ws", "distributed")}
    processes_from = "distributed.world_size"
    launched = True

    @classmethod
    def process_settings(cls, sections):
        d = sections["distributed"]
        return {**{k: d[k] for k in SETTINGS}, **cls.fixed_settings}

    def backend(self, cuda: bool) -> str:
        return self.cfg.backend if self.cfg.backend != "auto" else ("nccl" if cuda else "gloo")

    def describe(self):
        return {**super().describe(), "backend": self.backend_name,
                "lr_scaling": self.cfg.lr_scaling, "effective_lr": self.cfg.effective_lr()}
