"""What this process's hardware computes natively (CPU flags, a GPU's compute capability),
and train.amp resolved for it: read by a training process (the strategies), and recorded
by the job's environment record. No torch at import."""

from __future__ import annotations

import platform
from pathlib import Path


BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # bf16 computed natively (AMX tiles, AVX512-BF16)
CPU_FLAGS = BF16_CPU_FLAGS + ("amx_tile", "amx_int8", "avx512f", "avx2")


def cpu_features(cpuinfo: str | None = None) -> dict:
    """The CPU's model and what it computes natively (/proc/cpuinfo flags): AMX,
    AVX512-BF16, AVX-512, AVX2; ``bf16_native`` when bf16 needs no emulation."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name", platform.processor()),
            "flags": [f for f in CPU_FLAGS if f in flags],
            "bf16_native": any(f in flags for f in BF16_CPU_FLAGS)}


def bf16_native(device_type: str, cpu: dict, cuda_capability: tuple[int, int] | None) -> bool:
    """Whether this device computes bf16 natively: a CPU with AMX or AVX512-BF16, a GPU of
    compute capability 8.0 or more (Ampere on). Elsewhere bf16 is emulated and slower."""
    if device_type == "cuda":
        return cuda_capability is not None and cuda_capability >= (8, 0)
    return device_type == "cpu" and bool(cpu.get("bf16_native"))


def resolve_amp(amp: str, device) -> str:
    """train.amp for this process's device: auto is bf16 where it is native, else none."""
    if amp != "auto":
        return amp
    import torch

    device = torch.device(device)
    capability = (torch.cuda.get_device_capability(device)
                  if device.type == "cuda" and torch.cuda.is_available() else None)
    return "bf16" if bf16_native(device.type, cpu_features(), capability) else "none"


def autocast(amp: str, device):
    """The forward's autocast context for ``amp`` (resolved) on ``device``: bf16, or none."""
    import contextlib

    import torch

    if amp == "bf16":
        return torch.autocast(device_type=str(device).split(":")[0], dtype=torch.bfloat16)
    return contextlib.nullcontext()
