"""PyTorch Lightning as a thin adapter over the engine's loop.

Lightning's Trainer runs the batches: its DDP strategy, devices and nodes (under Slurm it
reads its ranks from srun's environment; locally it spawns its own workers). Everything
else is the engine's, called from Lightning's hooks: resume (the segment's), and the hooks
of the one loop (engine/loop.py) over the plain step: agreed stop/save decisions,
in-segment checkpoints, epoch records, evaluation and publish. The checkpoint is the
engine's own (model, optimizer, scheduler, RNG states, position in the epoch), so a
Lightning segment stops and resumes at any batch, exactly like the other strategies.
"""

from __future__ import annotations

import os

from .base import StrategyError
from .multiprocess import MultiProcessStrategy


class LightningStrategy(MultiProcessStrategy):
    """Lightning's Trainer builds the process group and wraps the model in DDP: the
    strategy's own setup is the base one (threads, the CUDA check), its distribute none."""
    name = "lightning"
    self_spawning = True
    packages = ("lightning",)

    def adopt(self, trainer) -> None:
        """Rank, world and device as Lightning set them up."""
        import torch.distributed as dist

        self.rank, self.local_rank = trainer.global_rank, trainer.local_rank
        self.world_size, self.device = trainer.world_size, trainer.strategy.root_device
        self.backend_name = dist.get_backend() if self.world_size > 1 else ""

    def train(self, segment) -> dict:
        import lightning.pytorch as pl
        import torch

        from ..loop import Loop
        from ..step import PlainStep

        strategy, cfg = self, segment.cfg
        segment.load_data()  # seeds first: the model is initialised as in the engine's loop

        class EpochBatches(torch.utils.data.IterableDataset):
            def __init__(self, batches, epoch, start):
                self.batches, self.epoch, self.start = batches, epoch, start

            def __iter__(self):
                return self.batches.epoch(self.epoch, self.start)

            def __len__(self):
                return len(self.batches) - self.start

        class Module(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.model, self.reason = segment.make_model(), None
                self.books = None  # the engine's loop over the plain step, at on_fit_start

            def setup(self, stage):
                strategy.adopt(self.trainer)
                self.batches = segment.make_batches()

            def configure_optimizers(self):
                opt, sched = segment.make_optimizer(self.model.parameters(), len(self.batches))
                return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

            def on_fit_start(self):
                segment.attach(strategy.wrap(self.model), self.trainer.optimizers[0],
                               self.trainer.lr_scheduler_configs[0].scheduler, self.batches)
                segment.resume()
                self.books = Loop(PlainStep(segment))
                # the partial one counts; 0 once the run is done (-1 would mean "no limit")
                self.trainer.fit_loop.max_epochs = segment.epochs_left()

            def on_train_start(self):
                self.books.begin()  # after Lightning's signal handlers, so ours are the ones

            def train_dataloader(self):
                p = segment.progress
                return torch.utils.data.DataLoader(EpochBatches(self.batches, p.epoch, p.step),
                                                   batch_size=None)

            def on_train_epoch_start(self):
                self.books.start_epoch()

            def training_step(self, batch, idx):
                loss, hits = self.books.step.compute(*batch)
                return {"loss": loss, "hits": hits}

            def on_train_batch_end(self, out, batch, idx):
                self.stop_on(self.books.after_batch(out["loss"].detach(), out["hits"],
                                                   len(batch[1])))

            def on_train_epoch_end(self):
                if segment.progress.step == segment.steps:  # not a mid-epoch stop
                    self.stop_on(self.books.end_epoch())

            def stop_on(self, reason):
                if reason:
                    self.reason, self.trainer.should_stop = reason, True

        plugins = []
        if cfg.nodes > 1 and "SLURM_PROCID" not in os.environ:
            raise StrategyError(f"lightning on {cfg.nodes} nodes takes its ranks from srun: "
                                "run it under Slurm (--profile profiles/slurm)")
        if "SLURM_PROCID" in os.environ:  # srun started the ranks; never requeue by itself
            from lightning.pytorch.plugins.environments import SLURMEnvironment

            plugins.append(SLURMEnvironment(auto_requeue=False))
        ddp = pl.strategies.DDPStrategy(process_group_backend=None if cfg.backend == "auto"
                                        else cfg.backend)
        trainer = pl.Trainer(
            accelerator="gpu" if self.uses_cuda() else "cpu", devices=cfg.world_size // cfg.nodes,
            num_nodes=cfg.nodes, strategy=ddp if cfg.world_size > 1 else "auto",
            max_epochs=segment.until_epoch, plugins=plugins, logger=False,
            enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
            use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1,
            num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=str(segment.out_dir.parent))
        module = Module()
        trainer.fit(module)
        return module.books.finish(module.reason)[cfg.run]
