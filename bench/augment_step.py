"""The cost of train.augment in the engine's training step, and each model's images/s, on CPU
(issue 37: augmentation at most 5 % over none, for lenet and resnet18; fastnet against resnet18).

One process; per case the engine's own pieces: TensorBatches (with or without
augment={flip, crop}), the registered model in channels_last, SGD momentum 0.9,
F.cross_entropy with label_smoothing, backward, step. A case is `--steps` timed steps after
2 warm-up steps; `--reps` rounds alternate the cases (off, on, off, on, ...) so the machine's
drift hits both; the figure is the median over rounds of each case's ms per step.

    PYTHONPATH=scripts python bench/augment_step.py --model lenet --batch 512
    PYTHONPATH=scripts python bench/augment_step.py --model resnet18 --batch 128 --steps 4
    PYTHONPATH=scripts python bench/augment_step.py --model fastnet --batch 128 --steps 4 --only on

Prints one JSON line per case: model, batch, augment, ms_per_step (median), images_per_s,
the rounds' figures, and the augmentation's own ms per batch (draws + apply, measured apart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from cifarflow.engine.augment import Augment
from cifarflow.engine.loaders import Split, TensorBatches
from cifarflow.engine.models import build_model

CROP = {"lenet": 4, "resnet18": 4, "fastnet": 2}


def timed_steps(model, optimizer, batches, steps: int, epoch: int) -> float:
    it = batches.epoch(epoch)
    for _ in range(2):  # warm-up
        x, y = next(it)
        step(model, optimizer, x, y)
    start = time.perf_counter()
    for _ in range(steps):
        x, y = next(it)
        step(model, optimizer, x, y)
    return (time.perf_counter() - start) / steps * 1e3


def step(model, optimizer, x, y):
    loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["on", "off"], default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    n = a.batch * (a.steps + 2)
    gen = torch.Generator().manual_seed(0)
    split = Split(torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=gen),
                  torch.randint(0, 10, (n,), generator=gen))
    model = build_model(a.model).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    aug = Augment(flip=True, crop=CROP.get(a.model, 4))
    cases = {"off": TensorBatches(split, a.batch, seed=0),
             "on": TensorBatches(split, a.batch, seed=0, augment=aug)}
    if a.only:
        cases = {a.only: cases[a.only]}
    rounds = {name: [] for name in cases}
    for r in range(a.reps):
        for name, batches in cases.items():
            rounds[name].append(timed_steps(model, optimizer, batches, a.steps, r))
    raw = split.images[:a.batch]
    own = []
    for b in range(20):
        t = time.perf_counter()
        aug.batch(raw, 0, 0, b)
        own.append((time.perf_counter() - t) * 1e3)
    for name, ms in rounds.items():
        med = statistics.median(ms)
        print(json.dumps({"model": a.model, "batch": a.batch, "threads": a.threads,
                          "augment": f"flip+crop{aug.crop}" if name == "on" else "none",
                          "ms_per_step": round(med, 2), "images_per_s": round(a.batch / med * 1e3),
                          "rounds_ms": [round(v, 2) for v in ms],
                          "augment_ms_per_batch": round(statistics.median(own), 3)}))


if __name__ == "__main__":
    main()
