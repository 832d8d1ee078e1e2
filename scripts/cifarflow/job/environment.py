"""What the training ran with: interpreter, torch, CUDA, modules, pip freeze."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from ..engine.hardware import cpu_features


def kernel_problems(gpus: list[tuple[str, tuple[int, int]]], arch_list: list[str],
                    torch_version: str) -> list[str]:
    """GPUs this torch build has no kernels for: the seed's "no kernel image is available
    for execution on the device". A cubin for sm_XY runs on compute capability X.Z, Z >= Y;
    PTX for compute_XY is compiled for any capability >= XY."""
    sm = [int(a[3:]) for a in arch_list if a.startswith("sm_") and a[3:].isdigit()]
    ptx = [int(a[8:]) for a in arch_list if a.startswith("compute_") and a[8:].isdigit()]
    problems = []
    for i, (name, (major, minor)) in enumerate(gpus):
        cc = 10 * major + minor
        if any(a // 10 == major and a <= cc for a in sm) or any(p <= cc for p in ptx):
            continue
        problems.append(
            f"GPU {i} ({name}, compute capability {major}.{minor}) is not supported by torch "
            f"{torch_version} (kernels for {' '.join(arch_list) or 'none'}): training would stop "
            f"with 'no kernel image is available for execution on the device'. Ask for a newer "
            f"GPU (resources.gpu_model) or install a torch build with sm_{cc} "
            f"(an older release, or the cluster's own wheel)")
    return problems


def driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout else None


def record_environment(out: Path, freeze: Path, expect_gpu: bool = False) -> dict:
    """Record the software; with ``expect_gpu`` (some run trains on cuda) also check, on
    this node, that torch sees the GPU and has kernels for it (ValueError if not)."""
    import torch
    import torchvision

    info = {
        "python": sys.version.split()[0], "executable": sys.executable,
        "platform": platform.platform(), "hostname": platform.node(),
        "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "torchvision": torchvision.__version__, "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda, "gpus": [torch.cuda.get_device_name(i)
                                                    for i in range(torch.cuda.device_count())],
        "torch_threads": torch.get_num_threads(),
        "loaded_modules": os.environ.get("LOADEDMODULES", ""),
        "virtual_env": os.environ.get("VIRTUAL_ENV", ""),
        "slurm": {k: v for k, v in os.environ.items() if k.startswith("SLURM_")},
        "gpu_capabilities": [list(torch.cuda.get_device_capability(i))
                             for i in range(torch.cuda.device_count())],
        "torch_cuda_arch_list": torch.cuda.get_arch_list() if torch.cuda.is_available() else [],
        "nvidia_driver": driver_version(),
        "cpu": {**cpu_features(), "torch_capability": torch.backends.cpu.get_cpu_capability()},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(info, indent=2))
    pip = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True)
    freeze.write_text(pip.stdout)
    print(json.dumps({k: info[k] for k in ("python", "torch", "torchvision", "cuda_available",
                                            "nvidia_driver", "cpu")}))
    if expect_gpu:
        if not info["cuda_available"]:
            raise ValueError(f"runs train on cuda but torch {torch.__version__} sees no GPU on "
                             f"{info['hostname']} (driver: {info['nvidia_driver'] or 'none'}): "
                             "check the GPU request (resources.gpu_model, slurm.partition)")
        problems = kernel_problems(list(zip(info["gpus"], map(tuple, info["gpu_capabilities"]))),
                                   info["torch_cuda_arch_list"], torch.__version__)
        if problems:
            raise ValueError("; ".join(problems))
    return info
