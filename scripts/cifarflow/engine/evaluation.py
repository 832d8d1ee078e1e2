"""The test accuracy at an epoch's end: of one model (across the ranks that hold the split
between them), or of a fused group's K members at once; with eval.tta flip also
``test_acc_tta``, each image classified by the mean of the logits of it and its mirror
(airbench's TTA). The model is in eval mode while it is measured, in train mode after."""

from __future__ import annotations

import torch

from .augment import mirror
from .loaders import eval_batches


@torch.no_grad()
def evaluate(model, split, cfg, strategy) -> dict:
    """``test_acc`` (and ``test_acc_tta``) of ``model`` on ``split``, each rank reading its
    share of the batches, the hits summed over ranks."""
    s = strategy
    s.sync_buffers(model)
    model.eval()
    tta = cfg.tta == "flip"
    hits = torch.zeros(3, dtype=torch.float64, device=s.device)
    for x, y, valid in eval_batches(split, cfg.eval_batch_size, s.rank, s.world_size,
                                    cfg.channels_last, s.device):
        with s.autocast():
            logits = model(x)
            both = (logits.float() + model(mirror(x)).float()) if tta else logits
        hits += torch.stack([((logits.argmax(1) == y) & valid).sum(),
                             ((both.argmax(1) == y) & valid).sum(), valid.sum()]).double()
    model.train()
    totals = s.all_reduce(hits.to(s.reduce_device))
    accs = {"test_acc": float(totals[0] / totals[2])}
    if tta:
        accs["test_acc_tta"] = float(totals[1] / totals[2])
    return accs


@torch.no_grad()
def evaluate_fused(fused, split, cfg, strategy) -> list[dict]:
    """The same of every member of a fused model (fused/model.py's FusedModel) on the shared
    split, one process: a list of K dicts."""
    s = strategy
    tta = cfg.tta == "flip"
    fused.train(False)
    hits = torch.zeros(2, fused.size, dtype=torch.float64, device=s.device)
    total = 0
    for x, y, valid in eval_batches(split, cfg.eval_batch_size, 0, 1, cfg.channels_last,
                                    s.device):
        with s.autocast():
            logits = fused.forward(x, shared_input=True)
            both = logits.float() + fused.forward(mirror(x), shared_input=True).float() \
                if tta else logits
        hits[0] += ((logits.argmax(-1) == y) & valid).sum(1).double()
        hits[1] += ((both.argmax(-1) == y) & valid).sum(1).double()
        total += int(valid.sum())
    fused.train(True)
    accs, accs_tta = (hits / total).tolist()
    return [{"test_acc": a, **({"test_acc_tta": t} if tta else {})}
            for a, t in zip(accs, accs_tta)]
