"""weights_sha256: the same weights give the same digest whatever wraps the model, however
its tensors are laid out in memory and after a save/load round trip; other weights, other
names or another dtype give another."""

import hashlib
import io
import struct

import pytest
import torch

from cifarflow.engine.checkpoints.digest import canonical_name, weights_sha256
from cifarflow.engine.models import build_model

# the digest of PINNED's state: the canonical form, fixed (a change makes every older
# summary.csv's digests incomparable: give the form a new FORMAT line instead)
PINNED_DIGEST = "aa9e6d14df2c0828371b19d5cf4b50fff9b36ed7f5c1f656f3ac9b5d4fcb4d9d"


def pinned() -> dict:
    return {"fc.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4,
            "fc.bias": torch.tensor([-1.5, 2.0], dtype=torch.bfloat16),
            "bn.num_batches_tracked": torch.tensor(7, dtype=torch.int64)}


def lenet(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("lenet", {})


class Wrapper(torch.nn.Module):
    """What DDP is to a state dict: the model as its ``module``."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def test_the_canonical_form_is_pinned_across_machines():
    """The form written out by hand (struct: little-endian whatever this machine is)."""
    h = hashlib.sha256(b"cifarflow-weights-v1\n")
    h.update(b"bn.num_batches_tracked\tint64\t[]\n" + struct.pack("<q", 7))
    h.update(b"fc.bias\tbfloat16\t[2]\n" + struct.pack("<f", -1.5)[2:] + struct.pack("<f", 2.0)[2:])
    h.update(b"fc.weight\tfloat32\t[2, 3]\n" + struct.pack("<6f", *[i / 4 for i in range(6)]))
    assert weights_sha256(pinned()) == h.hexdigest() == PINNED_DIGEST


def test_wrappers_names_are_not_part_of_a_tensors_name():
    assert canonical_name("module._orig_mod.layer1.0.conv1.weight") == "layer1.0.conv1.weight"
    assert canonical_name("_fsdp_wrapped_module.fc._checkpoint_wrapped_module.bias") == "fc.bias"
    assert canonical_name("modules.0.weight") == "modules.0.weight"  # a real name stays


def test_the_digest_ignores_wrapping_order_and_memory_layout():
    model = lenet()
    plain = weights_sha256(model.state_dict())
    assert weights_sha256(Wrapper(torch.compile(model)).state_dict()) == plain  # module._orig_mod.
    assert "module._orig_mod.conv1.weight" in Wrapper(torch.compile(model)).state_dict()
    assert weights_sha256(dict(reversed(model.state_dict().items()))) == plain
    assert weights_sha256(lenet().to(memory_format=torch.channels_last).state_dict()) == plain
    flat = torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()
                      if p.dtype == torch.float32])
    views, at = {}, 0  # a fused member's weights: strided views into one flat row
    for name, value in model.state_dict().items():
        if value.dtype == torch.float32:
            views[name] = flat[at:at + value.numel()].view(value.shape)
            at += value.numel()
        else:
            views[name] = value
    assert weights_sha256(views) == plain


def test_a_save_and_load_round_trip_keeps_the_digest():
    model = lenet()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict()}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)["model"]
    other = lenet(seed=1)
    other.load_state_dict(loaded)
    assert weights_sha256(loaded) == weights_sha256(other.state_dict()) == \
        weights_sha256(model.state_dict())


def test_other_weights_names_or_dtypes_differ():
    base = pinned()
    digest = weights_sha256(base)
    one_ulp = dict(base, **{"fc.weight": torch.nextafter(base["fc.weight"],
                                                         torch.tensor(10.0))})
    assert weights_sha256(one_ulp) != digest
    assert weights_sha256(dict(base, **{"fc.bias": base["fc.bias"].float()})) != digest
    renamed = {("head.weight" if k == "fc.weight" else k): v for k, v in base.items()}
    assert weights_sha256(renamed) != digest
    reshaped = dict(base, **{"fc.weight": base["fc.weight"].reshape(3, 2)})
    assert weights_sha256(reshaped) != digest  # same bytes, another shape
    assert weights_sha256(lenet(seed=1).state_dict()) != weights_sha256(lenet().state_dict())


def test_two_keys_that_unwrap_to_one_name_are_refused():
    with pytest.raises(ValueError, match="both read 'fc.bias'"):
        weights_sha256({"fc.bias": torch.zeros(1), "module.fc.bias": torch.zeros(1)})


def test_a_sharded_tensor_hashes_as_the_whole(tmp_path):
    """FSDP's DTensor (here on a one-rank mesh) is gathered whole before it is hashed."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        state = pinned()
        sharded = dict(state, **{"fc.weight": distribute_tensor(state["fc.weight"], mesh,
                                                                [Shard(0)])})
        assert weights_sha256(sharded) == PINNED_DIGEST
    finally:
        dist.destroy_process_group()
