"""train.compile on CPU: a run goes on compiled from an uncompiled checkpoint (compile is a
performance knob a resume may change, docs/segments.md), torch.compile really generates
code, the checkpoint stays in the plain format, and the run keeps learning."""

import pytest
import torch

from conftest import ENV, cli, metrics_of, spec
from cifarflow.engine.checkpoints import files as ckpt

COMMON = dict(epochs=2, lr=0.05, momentum=0.9)


@pytest.mark.slow  # torch.compile of lenet's forward and backward: about 40 s on this CPU
def test_a_run_goes_on_compiled_from_an_uncompiled_checkpoint(cifar_dir, tmp_path):
    first, second, cache = tmp_path / "segment-1", tmp_path / "segment-2", tmp_path / "inductor"
    cli("train", "--spec", spec(**COMMON), "--data", cifar_dir, "--out", first,
        "--until-epoch", 1, "--threads", 2)
    cli("train", "--spec", spec(**COMMON, compile=True), "--data", cifar_dir, "--out", second,
        "--resume", first, "--threads", 2,
        env={**ENV, "TORCHINDUCTOR_CACHE_DIR": str(cache)})
    generated = list(cache.rglob("*.py"))
    assert generated, f"torch.compile generated no code under {cache}"
    history = metrics_of(second)
    assert [h["epoch"] for h in history] == [1, 2] and ckpt.read_manifest(second)["done"]
    assert history[1]["train_loss"] < history[0]["train_loss"]
    plain = torch.load(first / "state.pt", weights_only=False)["model"]
    compiled = torch.load(second / "state.pt", weights_only=False)["model"]
    assert list(compiled) == list(plain)  # no _orig_mod. prefix: resumable uncompiled
