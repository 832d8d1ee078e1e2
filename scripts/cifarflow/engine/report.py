"""What a segment tells: rank 0's lines on stdout, TensorBoard event files, and GPU
utilisation sampled while an epoch trains."""

from __future__ import annotations

import sys
from pathlib import Path

from .gpu_monitor import GpuSampler, nvml_reader

# TensorBoard tag -> metrics.jsonl field, written at every epoch's end
EPOCH_SCALARS = {"train/loss_epoch": "train_loss", "train/acc": "train_acc",
                 "test/acc": "test_acc", "lr": "lr", "throughput/images_per_sec": "images_per_sec"}
NO_GPU = {"gpu_util_pct": None, "gpu_mem_mb": None}


class Reporter:
    def __init__(self, strategy, tensorboard_dir: Path | None, stream=None,
                 sample_gpu: bool = True):
        self.strategy = strategy
        self.tensorboard_dir = Path(tensorboard_dir) if tensorboard_dir else None
        self.board = None  # rank 0's TensorBoard writer, when tensorboard_dir is set
        self.gpu: GpuSampler | None = None  # utilisation samples while training on a GPU
        self.stream = stream  # where lines go: stdout (None), or a fused member's own log
        self.sample_gpu = sample_gpu  # a fused group samples the GPU once, for all members

    def log(self, msg: str) -> None:
        if self.strategy.is_main:
            self.say(msg)

    def say(self, line: str) -> None:
        """One line, whatever the rank, in one write (ranks' lines do not interleave)."""
        out = self.stream or sys.stdout
        out.write(line + "\n")
        out.flush()

    def open(self, global_step: int) -> None:
        """Start the GPU sampler and the TensorBoard writer. Steps are batches since the
        start of the run, so segments draw one curve; steps past this resume point, left
        by a killed try, are hidden (TensorBoard drops earlier files' events from
        purge_step on)."""
        device = str(self.strategy.device)
        if device.startswith("cuda") and self.sample_gpu:
            read, why = nvml_reader(self.strategy.device)
            if read is None:
                self.log(f"GPU utilisation not sampled ({why}): pip install nvidia-ml-py")
            else:
                self.gpu = GpuSampler(read).start()
        if self.tensorboard_dir and self.strategy.is_main:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # an optional package (requirements-optional.txt)
                self.log("TensorBoard curves not written: tensorboard is not installed "
                         "(cifarflow install-optional, or train.tensorboard: false)")
                return
            self.board = SummaryWriter(str(self.tensorboard_dir), purge_step=global_step + 1)

    def epoch_started(self) -> None:
        if self.gpu:
            self.gpu.take()  # this epoch's training only

    def gpu_use(self) -> dict:
        return self.gpu.take() if self.gpu else dict(NO_GPU)

    def batch_loss(self, loss: float, step: int) -> None:
        if self.board:
            self.board.add_scalar("train/loss", loss, step)

    def epoch(self, record: dict, step: int, epochs: int) -> None:
        if self.board:
            for tag, key in EPOCH_SCALARS.items():
                self.board.add_scalar(tag, record[key], step)
            if "test_acc_tta" in record:  # eval.tta
                self.board.add_scalar("test/acc_tta", record["test_acc_tta"], step)
        tta = f" (tta {record['test_acc_tta']:.3f})" if "test_acc_tta" in record else ""
        self.log(f"epoch {record['epoch']}/{epochs} loss {record['train_loss']:.4f} "
                 f"train_acc {record['train_acc']:.3f} test_acc {record['test_acc']:.3f}{tta} "
                 f"{record['images_per_sec']:,.0f} img/s ({record['wall_s']:.1f} s)")

    def saved(self) -> None:
        if self.board:
            self.board.flush()  # a killed try's curve reaches the point it resumes from

    def close(self) -> None:
        if self.gpu:
            self.gpu.stop()
        if self.board:
            self.board.close()
