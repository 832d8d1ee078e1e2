"""What the training ran with: interpreter, torch, CUDA, modules, pip freeze."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path


def record_environment(out: Path, freeze: Path) -> dict:
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
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(info, indent=2))
    pip = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True)
    freeze.write_text(pip.stdout)
    print(json.dumps({k: info[k] for k in ("python", "torch", "torchvision", "cuda_available")}))
    return info
