"""The environment record and its GPU check (the seed's "no kernel image" case)."""

import json

from conftest import ENV, cli
from cifarflow.job.environment import kernel_problems

ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]


def test_gpus_without_kernels_in_this_torch_are_named_with_a_way_out():
    ok = [("A100", (8, 0)), ("L40S", (8, 9)), ("H100", (9, 0)), ("future", (13, 0))]
    assert kernel_problems(ok, ARCHS, "2.14.1") == []  # sm_86 runs on 8.9; PTX on 13.0
    (problem,) = kernel_problems([("A100", (8, 0)), ("Tesla V100", (7, 0))], ARCHS, "2.14.1")
    assert problem.startswith("GPU 1 (Tesla V100, compute capability 7.0) is not supported by "
                              "torch 2.14.1")
    assert "no kernel image is available" in problem and "sm_70" in problem
    assert kernel_problems([("future", (13, 0))], ARCHS[:-1], "2.14.1")  # no PTX to fall back on


def test_expecting_a_gpu_where_torch_sees_none_is_one_line(tmp_path):
    """Torch sees no GPU (hidden here, so a GPU machine checks the message too)."""
    out = cli("record-env", "--out", tmp_path / "env.json", "--freeze", tmp_path / "freeze.txt",
              "--expect-gpu", check=False, env={**ENV, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert "runs train on cuda but torch" in out.stderr and "sees no GPU" in out.stderr
    info = json.loads((tmp_path / "env.json").read_text())  # recorded all the same
    assert info["cuda_available"] is False and "nvidia_driver" in info
