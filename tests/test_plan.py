"""From config to runs and scheduler requests (what profiles/slurm turns into sbatch)."""

import copy

import pytest
import yaml

from conftest import ROOT
from cifarflow.plan import build_runs, segment_targets

BASE = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def runs_for(**over):
    cfg = copy.deepcopy(BASE)
    for key, value in over.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and key != "sweep" else value
    return build_runs(cfg)


def test_segment_targets_split_epochs_evenly():
    assert segment_targets(10, 3) == [4, 7, 10]
    assert segment_targets(2, 5) == [1, 2]  # never more segments than epochs
    assert segment_targets(4, 1) == [4]


def test_run_names_follow_swept_values():
    runs = runs_for(strategies=["cpu", "ddp", "mps"],
                    sweep={"batch_size": [256, 512], "world_size": [2, 4], "replicas": [2]})
    assert sorted(runs) == ["cpu_bs256", "cpu_bs512", "ddp_bs256_ws2", "ddp_bs256_ws4",
                            "ddp_bs512_ws2", "ddp_bs512_ws4", "mps_bs256_rep2", "mps_bs512_rep2"]
    assert runs["ddp_bs512_ws4"].spec["world_size"] == 4
    assert runs["ddp_bs512_ws4"].resources["tasks_per_node"] == 4


def test_cpus_sweep_changes_the_request_not_only_threads():
    runs = runs_for(sweep={"cpus_per_task": [1, 4]})
    assert runs["cpu_cpus4"].resources["cpus_per_task"] == 4 and runs["cpu_cpus4"].threads == 4
    assert runs["cpu_cpus1"].resources["cpus_per_task"] == 1


def test_gpu_requests_avoid_the_once_per_gpu_trap():
    runs = runs_for(strategies=["gpu", "mps", "ddp"], distributed={"device": "cuda", "world_size": 4,
                                                                   "nodes": 2},
                    resources={"gpu_model": "h100"})
    assert {k: runs["gpu"].resources[k] for k in ("gpu", "tasks_per_gpu", "gpu_model")} == \
        {"gpu": 1, "tasks_per_gpu": 0, "gpu_model": "h100"}
    mps = runs["mps"].resources
    assert mps["gpu"] == 1 and mps["tasks_per_gpu"] == 0 and mps["tasks"] == 4
    ddp = runs["ddp"].resources
    assert ddp["gres"] == "gpu:h100:2" and ddp["nodes"] == 2 and ddp["tasks_per_node"] == 2
    assert ddp["mem_mb"] == 2 * BASE["resources"]["mem_mb"]  # --mem is per node


def test_one_task_per_node_uses_tasks_not_tasks_per_node():
    ddp = runs_for(strategies=["ddp"], distributed={"world_size": 2, "nodes": 2})["ddp"].resources
    assert ddp["tasks"] == 2 and "tasks_per_node" not in ddp


def test_torchvision_loader_gets_one_worker_per_core():
    run = runs_for(train={"loader": "torchvision"}, resources={"cpus_per_task": 3})["cpu"]
    assert run.spec["num_workers"] == 3


def test_world_size_not_a_multiple_of_nodes_is_refused():
    with pytest.raises(ValueError, match="not a multiple of nodes"):
        runs_for(strategies=["ddp"], distributed={"world_size": 3, "nodes": 2})
