"""PyTorch Lightning: a LightningModule around the same model, data, optimizer and metric
records; Lightning's Trainer runs the loop with its DDP strategy.

Under Slurm, ``srun`` starts one task per device and Lightning reads its ranks from the
Slurm environment (it needs SLURM_NTASKS_PER_NODE == devices); locally Lightning spawns
its own workers. Segments stop at epoch boundaries (Lightning cannot resume exactly inside
an epoch); the checkpoint is Lightning's own file inside our verified checkpoint directory.
"""

from __future__ import annotations

import time
from pathlib import Path

from .. import checkpoint as ckpt
from .base import Strategy
from .ddp import DDPStrategy


class LightningStrategy(Strategy):
    name = "lightning"
    multi_process = True
    self_spawning = True
    job_resources = DDPStrategy.job_resources

    def setup(self):
        super().setup()  # threads only: Lightning owns devices and the process group

    def fit(self, engine_kwargs: dict) -> dict:
        return fit_lightning(self.cfg, self, **engine_kwargs)


def fit_lightning(cfg, strategy, data_dir, out_dir, resume_dir=None, work_dir=None,
                  until_epoch=None, budget_s=None, margin_s=60.0, start_time=None):
    import os

    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F

    from ..engine import (StopController, build_optimizer, build_scheduler, peak_memory_mb,
                          seed_everything, write_metrics)
    from ..loaders import Split, TensorBatches, eval_batches
    from ..models import build_model

    until_epoch = min(until_epoch or cfg.epochs, cfg.epochs)
    seed_everything(cfg.seed, cfg.deterministic)
    train_split = Split.load(Path(data_dir), train=True)
    test_split = Split.load(Path(data_dir), train=False)
    nodes = int(os.environ.get("SLURM_NNODES", 1)) if "SLURM_PROCID" in os.environ else 1
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())

    class EpochBatches(torch.utils.data.IterableDataset):
        def __init__(self, batches, epoch):
            self.batches, self.epoch = batches, epoch

        def __iter__(self):
            return self.batches.epoch(self.epoch)

        def __len__(self):
            return len(self.batches)

    class CifarModule(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = build_model(cfg.model)
            if cfg.channels_last:
                self.model = self.model.to(memory_format=torch.channels_last)
            self.history: list = []

        def forward(self, x):
            return self.model(x)

        def batches(self):
            t = self.trainer
            return TensorBatches(train_split, cfg.batch_size, cfg.seed, rank=t.global_rank,
                                 world_size=t.world_size, channels_last=cfg.channels_last,
                                 device="cpu")

        def train_dataloader(self):
            return torch.utils.data.DataLoader(EpochBatches(self.batches(), self.current_epoch),
                                               batch_size=None)

        def configure_optimizers(self):
            opt = build_optimizer(cfg, self.parameters())
            sched = build_scheduler(cfg, opt, len(self.batches()))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        def on_train_epoch_start(self):
            self.sums = torch.zeros(3, dtype=torch.float64, device=self.device)
            self.t0 = time.perf_counter()

        def training_step(self, batch, idx):
            x, y = batch
            out = self(x)
            loss = F.cross_entropy(out, y)
            self.sums += torch.stack([loss.detach().double() * len(y),
                                      (out.argmax(1) == y).sum().double(),
                                      torch.tensor(float(len(y)), dtype=torch.float64,
                                                   device=self.device)])
            return loss

        def on_train_epoch_end(self):
            wall = time.perf_counter() - self.t0
            reduce = self.trainer.strategy.reduce
            ips_rank = float(self.sums[2]) / wall
            sums = reduce(torch.cat([self.sums, torch.tensor([ips_rank], dtype=torch.float64,
                                                              device=self.device)]),
                          reduce_op="sum")
            self.model.eval()
            hits = torch.zeros(2, dtype=torch.float64, device=self.device)
            with torch.no_grad():
                for x, y, valid in eval_batches(test_split, cfg.eval_batch_size,
                                                self.global_rank, self.trainer.world_size,
                                                cfg.channels_last, self.device):
                    hits += torch.stack([((self(x).argmax(1) == y) & valid).sum().double(),
                                         valid.sum().double()])
            self.model.train()
            hits = reduce(hits, reduce_op="sum")
            record = {"epoch": self.current_epoch + 1, "train_loss": float(sums[0] / sums[2]),
                      "train_acc": float(sums[1] / sums[2]), "test_acc": float(hits[0] / hits[1]),
                      "images_per_sec": float(sums[3]), "images_per_sec_per_rank": ips_rank,
                      "wall_s": wall, "lr": self.trainer.optimizers[0].param_groups[0]["lr"],
                      "world_size": self.trainer.world_size,
                      "peak_mem_mb": peak_memory_mb(str(self.device)), "gpu_util_pct": None,
                      "slurm_job_id": os.environ.get("SLURM_JOB_ID", "")}
            self.history.append(record)
            if self.trainer.is_global_zero:
                print(f"epoch {record['epoch']}/{cfg.epochs} loss {record['train_loss']:.4f} "
                      f"test_acc {record['test_acc']:.3f} {record['images_per_sec']:,.0f} img/s",
                      flush=True)

        def on_save_checkpoint(self, checkpoint):
            checkpoint["cifarflow_history"] = self.history

        def on_load_checkpoint(self, checkpoint):
            self.history = checkpoint.get("cifarflow_history", [])

    class BudgetStop(pl.Callback):
        """Stop at an epoch boundary if the next epoch would overrun the budget."""

        def on_train_start(self, trainer, module):
            self.stop = StopController(budget_s, margin_s, strategy, start_time or time.time())

        def on_train_epoch_end(self, trainer, module):
            last = module.history[-1]["wall_s"] if module.history else 0.0
            local = 1.0 if (self.stop.signalled or time.time() + last > self.stop.deadline) else 0.0
            flag = trainer.strategy.reduce(torch.tensor(local, device=module.device), reduce_op="max")
            if float(flag) > 0 and trainer.current_epoch + 1 < until_epoch:
                trainer.should_stop = True
                if trainer.is_global_zero:
                    print(f"stopping after epoch {trainer.current_epoch + 1}: time budget or "
                          "signal; checkpointing", flush=True)

    devices = cfg.world_size // nodes
    trainer = pl.Trainer(accelerator="gpu" if use_cuda else "cpu", devices=devices,
                         num_nodes=nodes, strategy="ddp" if cfg.world_size > 1 else "auto",
                         max_epochs=until_epoch, enable_progress_bar=False, logger=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1,
                         num_sanity_val_steps=0, limit_val_batches=0, callbacks=[BudgetStop()],
                         deterministic=cfg.deterministic, default_root_dir=str(work_dir or out_dir))
    module = CifarModule()
    resume_ckpt = None
    if resume_dir:
        manifest = ckpt.read_manifest(Path(resume_dir), verify=True)
        if manifest["config_hash"] != cfg.shaping_hash():
            raise ckpt.CheckpointError(f"refusing to resume from {resume_dir}: the training "
                                       f"config changed {cfg.shaping_diff(manifest['config'])}")
        resume_ckpt = str(Path(resume_dir) / "lightning.ckpt")
    trainer.fit(module, ckpt_path=resume_ckpt)
    epoch = trainer.current_epoch  # epochs completed
    staging = Path(out_dir).with_name(f".{Path(out_dir).name}.staging")
    if trainer.is_global_zero:
        staging = ckpt.prepare_staging(Path(out_dir))
    trainer.strategy.barrier()
    trainer.save_checkpoint(staging / "lightning.ckpt")
    if trainer.is_global_zero:
        write_metrics(staging / "metrics.jsonl", module.history)
        ckpt.write_manifest(staging, "lightning", {
            "run": cfg.run, "config_hash": cfg.shaping_hash(), "config": cfg.to_dict(),
            "epoch": epoch, "step": 0, "epochs": cfg.epochs, "until_epoch": until_epoch,
            "done": epoch >= cfg.epochs, "world_size": trainer.world_size,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID", "")})
        ckpt.publish(staging, Path(out_dir))
        print(f"checkpoint {out_dir} written at epoch {epoch}", flush=True)
    trainer.strategy.barrier()
    return {"epoch": epoch, "step": 0}
