"""What a plan will hold under results/, said at `snakemake -n`: the registered models'
sizes stay those of their code, and the line counts files and bytes of every segment."""

import pytest

from cifarflow.config import with_defaults
from cifarflow.controller.plan import build_runs
from cifarflow.controller.storage import MODEL_BYTES, describe, state_bytes


@pytest.mark.parametrize("name", sorted(MODEL_BYTES))
def test_the_size_table_is_the_models_own(name):
    import torch

    from cifarflow.engine.models import build_model

    with torch.device("meta"):  # no memory: only the shapes
        model = build_model(name)
    assert MODEL_BYTES[name] == (sum(p.numel() * p.element_size() for p in model.parameters()),
                                 sum(b.numel() * b.element_size() for b in model.buffers()))


def test_a_checkpoint_holds_weights_and_the_optimizers_buffers():
    assert state_bytes("lenet", "sgd", 0.9) == 2 * 248_024  # 518 KB measured for state.pt
    assert state_bytes("lenet", "sgd", 0.0) == 248_024
    assert state_bytes("resnet18", "adam", 0.0) == 3 * 44_695_848 + 38_560
    assert state_bytes("pkg.mod:factory", "sgd", 0.9) is None


def test_the_line_counts_every_segment_and_what_keep_last_would_hold():
    runs = build_runs(with_defaults({"strategies": ["cpu"], "segments": {"count": 10},
                                     "train": {"model": "resnet18", "epochs": 10},
                                     "sweep": {"lr": [0.01 * i for i in range(1, 101)]}}))
    line = describe(runs.values(), "all")
    size = state_bytes("resnet18", "sgd", 0.9)
    # 100 runs x (2 + 10 x 7) files; 1,000 checkpoints of ~89 MB, 2 a run with "last"
    assert line.startswith(f"storage: 100 run(s) will hold ~7,200 files and "
                           f"~{(1000 * size + 1000 * 20_000) / 1e9:,.1f} GB under results/ "
                           f"(segments.keep_weights all; last would keep "
                           f"~{(200 * size + 1000 * 20_000) / 1e9:,.1f} GB)")
    assert "/project or /scratch" in line
    assert "last would keep" not in describe(runs.values(), "last")
