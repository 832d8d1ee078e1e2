"""``weights_sha256``: a fingerprint of a model's weights that any machine, any strategy,
gives alike for the same weights.

Canonical form: every parameter and buffer of the state dict, by its unwrapped name
(``module.`` of DDP, ``_orig_mod.`` of torch.compile, ``_fsdp_wrapped_module.`` and
``_checkpoint_wrapped_module.`` gone), in sorted order; for each, its name, dtype and shape,
then its values as contiguous little-endian bytes of its own dtype (no cast: a bf16 tensor
hashes as bf16). A sharded tensor (FSDP's DTensor) is gathered whole first: a collective,
so every rank calls this with the same names. Channels-last and strided views hash as
their row-major values, so a fused member's view of its row hashes as the unfused model.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch

WRAPPERS = ("module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
FORMAT = b"cifarflow-weights-v1\n"


def canonical_name(name: str) -> str:
    """A state dict key without the wrappers' own names: ``module._orig_mod.fc.weight``
    and ``fc.weight`` are the same tensor."""
    return ".".join(part for part in name.split(".") if part not in WRAPPERS)


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The values, row-major, little-endian, in the tensor's own dtype."""
    full = getattr(tensor, "full_tensor", None)
    if full is not None:  # a DTensor: every rank gathers the whole
        tensor = full()
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    raw = flat.view(torch.uint8)
    if sys.byteorder == "big" and flat.element_size() > 1:
        raw = raw.reshape(-1, flat.element_size()).flip(1).reshape(-1)
    return raw.numpy().tobytes()


def weights_sha256(state: dict) -> str:
    """The hex sha256 of ``state`` (a model's state dict, as any strategy gives it) in
    canonical form. Two names that are one tensor once unwrapped are an error."""
    named = {}
    for name, value in state.items():
        key = canonical_name(name)
        if key in named:
            raise ValueError(f"state dict keys {name!r} and another both read {key!r} unwrapped")
        named[key] = value
    h = hashlib.sha256(FORMAT)
    for key in sorted(named):
        value = named[key]
        if isinstance(value, torch.Tensor):
            head = f"{key}\t{str(value.dtype).removeprefix('torch.')}\t{list(value.shape)}\n"
            h.update(head.encode())
            h.update(tensor_bytes(value))
        else:  # a module's extra state: its repr stands for it
            h.update(f"{key}\tobject\t{value!r}\n".encode())
    return h.hexdigest()


def checkpoint_weights_sha256(directory) -> str:
    """Recompute the digest from a published checkpoint's own files (``state.pt``, or a
    sharded checkpoint's ``shards/`` read whole): what a user checks the manifest against."""
    directory = Path(directory)
    if (directory / "state.pt").is_file():
        state = torch.load(directory / "state.pt", map_location="cpu", weights_only=False)
        return weights_sha256(state["model"])
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:  # the shards gathered offline, no process group
        dcp_to_torch_save(directory / "shards", Path(tmp) / "whole.pt")
        state = torch.load(Path(tmp) / "whole.pt", map_location="cpu", weights_only=False)
    return weights_sha256(state["model"])
