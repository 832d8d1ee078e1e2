"""From config to runs and scheduler requests (what profiles/slurm turns into sbatch)."""

import copy

import pytest
import yaml

from conftest import ROOT
from cifarflow.config import with_defaults
from cifarflow.controller.plan import build_runs, segment_targets

BASE = with_defaults(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))


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


def test_requests_follow_one_rule_for_every_strategy():
    """memory per process x processes per node, tasks per node, GPUs per node."""
    runs = runs_for(strategies=["gpu", "mps", "ddp", "lightning"],
                    distributed={"device": "cuda", "world_size": 4, "nodes": 2},
                    resources={"gpu_model": "h100"})
    mem = BASE["resources"]["mem_mb"]
    gpu = runs["gpu"].resources
    assert (gpu["gres"], gpu["tasks_per_gpu"], gpu["mem_mb"]) == ("gpu:h100:1", 0, mem)
    assert "tasks" not in gpu and "nodes" not in gpu
    mps = runs["mps"].resources  # 4 replicas on one GPU of one node
    assert (mps["gres"], mps["tasks_per_node"], mps["nodes"], mps["mem_mb"]) == \
        ("gpu:h100:1", 4, 1, 4 * mem)
    for name in ("ddp", "lightning"):
        ddp = runs[name].resources
        assert (ddp["gres"], ddp["nodes"], ddp["tasks_per_node"], ddp["mem_mb"]) == \
            ("gpu:h100:2", 2, 2, 2 * mem)
        assert ddp["tasks_per_gpu"] == 0


def test_plan_yields_typed_configs_with_schema_defaults():
    runs = runs_for(strategies=["cpu", "ddp", "mps"])
    assert runs["cpu"].config.world_size == 1 and runs["cpu"].config.device == "cpu"
    assert runs["ddp"].config.world_size == BASE["distributed"]["world_size"]
    assert runs["mps"].config.world_size == BASE["mps"]["replicas"]
    assert runs["mps"].config.backend == "gloo" and runs["mps"].config.device == "cuda"
    assert yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())[
        "properties"]["train"]["properties"]["checkpoint_interval_s"]["default"] == "auto"
    assert runs["cpu"].config.checkpoint_interval_s == 300  # auto, for 3 small runs


def test_auto_checkpoint_intervals_keep_a_sweeps_writes_bounded():
    """train.checkpoint_interval_s auto: 300 s alone; max(300, runs x checkpoint / 25 MB/s)
    for the runs a plan trains at once (a grid's all, packed or not; a search's round); a
    number stays as set."""
    lr = [0.001 * (i + 1) for i in range(100)]
    lenets = runs_for(sweep={"lr": lr}, pack={"runs_per_job": 10})
    assert {r.config.checkpoint_interval_s for r in lenets.values()} == {300}  # 0.5 MB each
    resnets = runs_for(train={"model": "resnet18"}, sweep={"lr": lr})
    size = 44_695_848 * 2 + 38_560  # sgd with momentum: one buffer per parameter
    assert [r.config.checkpoint_interval_s for r in resnets.values()] == \
        pytest.approx([100 * size / 1e6 / 25] * 100)  # ~358 s
    bigger = runs_for(train={"model": "resnet18"}, sweep={"lr": lr, "seed": list(range(10))})
    assert bigger["cpu_lr0p001_seed0"].config.checkpoint_interval_s == \
        pytest.approx(1000 * size / 1e6 / 25)  # ~1 h: 1000 runs x 89 MB / 25 MB/s
    assert runs_for(train={"model": "resnet18"})["cpu"].config.checkpoint_interval_s == 300
    set_here = runs_for(train={"model": "resnet18", "checkpoint_interval_s": 60},
                        sweep={"lr": lr})
    assert {r.config.checkpoint_interval_s for r in set_here.values()} == {60}
    search = runs_for(train={"model": "resnet18"}, sweep={"search": {
        "space": {"lr": {"log_uniform": [0.001, 0.1]}}, "samples": 200, "rounds": 3}})
    assert len(search) == 600 and [r.config.checkpoint_interval_s for r in search.values()] \
        == pytest.approx([200 * size / 1e6 / 25] * 600)  # a round's 200, not all 600


def test_data_identity_covers_synthetic_parameters():
    a = runs_for()["cpu"].config
    b = runs_for(data={"synthetic": {**BASE["data"]["synthetic"], "noise": 0.5}})["cpu"].config
    assert a.data_id != b.data_id and a.shaping_hash() != b.shaping_hash()


def test_unknown_strategy_names_the_registry():
    with pytest.raises(ValueError, match="unknown strategy 'tpu'; known: cpu, ddp, fsdp"):
        runs_for(strategies=["cpu", "tpu"])


@pytest.mark.parametrize("over, message", [
    ({"strategies": ["ddp"], "distributed": {"backend": "nccl", "device": "cpu"}},
     "backend nccl needs device cuda"),
    ({"train": {"num_workers": 4}}, "num_workers 4 applies to loader: torchvision only"),
    ({"train": {"tf32_matmul": True}}, "tf32_matmul applies to CUDA matmuls only"),
])
def test_settings_a_run_cannot_honour_are_refused_at_plan_time(over, message):
    with pytest.raises(ValueError, match=message):
        runs_for(**over)


def test_the_same_settings_are_accepted_where_they_apply():
    runs_for(strategies=["ddp"], distributed={"backend": "nccl", "device": "cuda"})
    runs_for(train={"num_workers": 4, "loader": "torchvision"})
    assert runs_for(strategies=["gpu"], train={"tf32_matmul": True})["gpu"].config.tf32_matmul


def test_one_task_per_node_uses_tasks_not_tasks_per_node():
    ddp = runs_for(strategies=["ddp"], distributed={"world_size": 2, "nodes": 2})["ddp"].resources
    assert ddp["tasks"] == 2 and "tasks_per_node" not in ddp


def test_torchvision_loader_gets_one_worker_per_core():
    run = runs_for(train={"loader": "torchvision"}, resources={"cpus_per_task": 3})["cpu"]
    assert run.config.num_workers == 3


def test_world_size_not_a_multiple_of_nodes_is_refused():
    with pytest.raises(ValueError, match="not a multiple of nodes"):
        runs_for(strategies=["ddp"], distributed={"world_size": 3, "nodes": 2})
