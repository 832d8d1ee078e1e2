"""MPS-shared GPU packs (pack.per_gpu): the plan (which packs share, the request, the pack
job's command line, the pack line of `snakemake -n`, the fit check), and the pack driver's
placement of members on GPUs, M at a time, run for real with GPUs that a CUDA_VISIBLE_DEVICES
names (nothing here has CUDA or MPS: the driver stops at its one line before any member)."""

from types import SimpleNamespace

import pytest

from cifarflow.cli import parser
from cifarflow.config import with_defaults
from cifarflow.engine.gpu_monitor import visible_gpus
from cifarflow.controller.routing import check_fit
from cifarflow.job.mps_pack import GpuSlots, one_step
from cifarflow.job.pack import run_pack
from cifarflow.orders import PackOrder
from cifarflow.controller.pack_plan import build_packs, share_gpus
from cifarflow.controller.plan import build_runs
from cifarflow.controller.packs import job_shapes
from cifarflow.controller.plan import PlanError
from test_fit import partitions
from test_workflow_plan import bin_dir, make_plan, resources, wildcards  # noqa: F401

SWEEP = {"lr": [0.01, 0.02, 0.03, 0.04, 0.05]}


def shared_plan(tmp_path, bin_dir, **over):
    sections = {"strategies": ["cpu", "gpu"], "sweep": SWEEP,
                "pack": {"runs_per_job": 4, "per_gpu": 2},
                "resources": {"cpus_per_task": 2, "mem_mb": 3000}}
    return make_plan(tmp_path, bin_dir, **{**sections, **over})


def test_gpu_packs_share_their_gpus_and_cpu_packs_stay_steps(tmp_path, bin_dir):
    plan = shared_plan(tmp_path, bin_dir)
    kinds = {name: (p.kind, p.per_gpu, len(p.members)) for name, p in plan.packs.items()}
    assert kinds == {"cpu-pack001": ("steps", 1, 4), "cpu-pack002": ("steps", 1, 1),
                     "gpu-pack001": ("mps", 2, 4), "gpu-pack002": ("mps", 2, 1)}
    res = plan.pack_rules.resources("gpu")
    w4, w1 = wildcards(pack="gpu-pack001", segment=1), wildcards(pack="gpu-pack002", segment=1)
    # G = ceil(members / M) GPUs; cores and memory of every member, as a steps pack asks
    assert (res["slurm_extra"](w4), res["slurm_extra"](w1)) == ("--gpus-per-node=2",
                                                                "--gpus-per-node=1")
    assert (res["tasks"](w4), res["cpus_per_task"](w4), res["mem_mb_per_cpu"](w4, None, 1)) == \
        (4, 2, 1500)
    assert (res["nodes"], res["mpi"](w4)) == (1, "srun") and "gres" not in res
    assert plan.pack_rules.threads("gpu")(w4) == 8
    assert "slurm_extra" not in plan.pack_rules.resources("cpu")
    model = shared_plan(tmp_path, bin_dir, resources={"gpu_model": "h100", "cpus_per_task": 2,
                                                      "mem_mb": 3000})
    assert model.pack_rules.resources("gpu")["slurm_extra"](w4) == "--gpus-per-node=h100:2"


def test_the_pack_job_command_carries_per_gpu_to_train_pack(tmp_path, bin_dir):
    plan = shared_plan(tmp_path, bin_dir)
    w = wildcards(pack="gpu-pack001", segment=1)
    params = SimpleNamespace(prologue="", cifarflow="cifarflow", args=plan.pack_rules.args("gpu")(w))
    command = plan.pack_rules.command("gpu").format(
        params=params, resources=resources(cpus_per_task=2, runtime=30, mem_mb_per_cpu=1500),
        threads=8, output=SimpleNamespace(record="rec.json"))
    parsed = parser().parse_args(command.split()[1:])
    assert (parsed.per_gpu, parsed.threads, parsed.gpus, parsed.in_step) == (2, 2, 1, False)
    assert parsed.members == ["gpu_lr0p01", "gpu_lr0p02", "gpu_lr0p03", "gpu_lr0p04"]
    cpu = parser().parse_args(["train-pack", *plan.pack_rules.args("cpu")(
        wildcards(pack="cpu-pack001", segment=1)).split(), "--threads", "2", "--budget-min",
        "1", "--mem-per-cpu", "1", "--record", "r"])
    assert cpu.per_gpu == 1


def test_one_step_holds_the_node_s_gpus_and_every_member_s_cores():
    order = PackOrder(pack="gpu-pack001", segment=1, results="r", data="d", until_epoch=1,
                      gpus=1, per_gpu=2, threads=2, mem_per_cpu=1500, record="rec.json",
                      members=("gpu_a", "gpu_b", "gpu_c"))
    step = one_step(order)
    assert step[:9] == [
        "srun", "--exact", "--ntasks=1", "--nodes=1", "--cpus-per-task=6",
        "--mem-per-cpu=1500", "--kill-on-bad-exit=1", "--job-name=gpu-pack001",
        "--gres=gpu:2"]
    assert step[9:] == order.replace(in_step=True).command()  # the same order, inside
    assert "--in-step" in step and step[-4:] == ["--members", "gpu_a", "gpu_b", "gpu_c"]


def test_dry_run_says_how_packs_share_gpus(tmp_path, bin_dir):
    plan = shared_plan(tmp_path, bin_dir)
    plan.announce()
    (line,) = [l for l in plan.log.infos if l.startswith("pack:")]
    assert line.endswith("; 2 GPU pack(s) share each GPU between 2 members through one "
                         "private MPS daemon per node (a pack of 4 asks gres=gpu:2; one Slurm "
                         "step holds the node's GPUs and starts the members)")
    plain = make_plan(tmp_path, bin_dir, strategies=["gpu"], sweep=SWEEP, pack={"runs_per_job": 4})
    plain.announce()
    assert "MPS" not in " ".join(plain.log.infos)


def test_fused_packs_are_not_shared_and_per_gpu_needs_packs(tmp_path, bin_dir):
    fused = shared_plan(tmp_path, bin_dir, pack={"runs_per_job": 4, "per_gpu": 2, "fuse": True})
    assert {p.kind for p in fused.packs.values()} == {"steps"}
    assert all(p.fuse for p in fused.packs.values())
    with pytest.raises(PlanError, match="pack.per_gpu: 2 shares a GPU between the members of a "
                       "pack: set pack.runs_per_job above 1"):
        make_plan(tmp_path, bin_dir, strategies=["gpu"], pack={"runs_per_job": 1, "per_gpu": 2})


def test_the_fit_check_knows_the_shared_shape():
    def shared(runs_per_job, per_gpu, lrs):
        runs = build_runs(with_defaults({"strategies": ["gpu"], "sweep": {"lr": lrs},
                                         "resources": {"cpus_per_task": 1, "mem_mb": 1000}}))
        packs = share_gpus(build_packs(runs, runs_per_job), runs, per_gpu, runs_per_job)
        return job_shapes(runs, packs)

    two = shared(2, 2, [0.1, 0.2])  # 2 members, 1 GPU, 2 CPUs: fits a node of multi
    assert two == {"pack gpu-pack001 (2 runs, 2 per GPU)": {
        "tasks": 2, "cpus_per_task": 1, "pack": True, "mem_per_cpu": 1000, "nodes": 1,
        "gpus_per_node": 1, "per_gpu": 2, "gpu_model": "", "runtime": 30}}
    assert check_fit(two, "multi", partitions()) == []
    # 6 members, 2 per GPU: 3 GPUs on one node, and n1/n2 have 2
    (error,) = check_fit(shared(6, 2, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]), "multi", partitions())
    assert error.startswith("pack gpu-pack001 (6 runs, 2 per GPU) asks 6 task(s) of 1 CPU(s), "
                            "on 1 node(s), 1000 MB per CPU, 3 GPU(s) per node")
    assert "set pack.runs_per_job: 4 (2 GPU(s) of a node x pack.per_gpu 2)" in error
    # without sharing, a GPU per member: the same pack asks one GPU per task
    assert "gpus_per_task" in next(iter(shared(6, 1, [0.1, 0.2]).values()))


def test_members_take_the_gpu_with_fewest_sharers_m_at_a_time():
    slots = GpuSlots(gpus=2, per_gpu=2)
    assert [slots.take() for _ in range(4)] == [(0, 1), (1, 1), (0, 2), (1, 2)]
    assert not slots.free()  # a fifth member waits
    slots.give(1)
    assert slots.free() and slots.take() == (1, 2)
    slots.give(0)
    slots.give(0)
    assert slots.take() == (0, 1)
    one = GpuSlots(gpus=1, per_gpu=3)
    assert [one.take() for _ in range(3)] == [(0, 1), (0, 2), (0, 3)] and not one.free()


def test_visible_gpus_from_cuda_visible_devices_else_nvidia_smi():
    def smi(stdout, rc=0):
        return lambda argv, **kw: SimpleNamespace(returncode=rc, stdout=stdout)

    listing = "GPU 0: NVIDIA H200 (UUID: GPU-a)\nGPU 1: NVIDIA H200 (UUID: GPU-b)\n"
    which = {"nvidia-smi": "/usr/bin/nvidia-smi"}.get
    assert visible_gpus({}, smi(listing), which) == 2
    assert visible_gpus({}, smi("", rc=9), which) == 0  # the tool, but no driver answers
    assert visible_gpus({}, smi(listing), lambda name: None) is None  # nothing known
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}, smi(listing), which) == 3
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, smi(listing), which) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,0"}, smi(listing), which) == 1
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, smi(""), which) == 2


def run_shared(tmp_path, members, gpus, monkeypatch, per_gpu=2):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "no-nvidia-tools"))  # no MPS here, for sure
    return run_pack(PackOrder(
        pack="gpu-pack001", segment=1, members=tuple(members), results=str(tmp_path / "results"),
        data=str(tmp_path / "data"), until_epoch=1, threads=1, budget_min=1, mem_per_cpu=100,
        gpus=1, slots=len(members), record=str(tmp_path / "rec.json"), per_gpu=per_gpu))


def test_the_driver_places_the_members_then_stops_at_one_line_without_mps(
        tmp_path, monkeypatch, capfd):
    members = ["gpu_a", "gpu_b", "gpu_c", "gpu_d", "gpu_e"]
    assert run_shared(tmp_path, members, "0,1", monkeypatch) == 2
    out, err = capfd.readouterr()
    assert ": 2 GPU(s) (CUDA_VISIBLE_DEVICES=0,1), 2 member(s) per GPU under one private MPS " \
           f"daemon, CUDA_MPS_PIPE_DIRECTORY={tmp_path}/nvidia-mps-" in out
    assert "[pack gpu-pack001] placement: GPU 0: gpu_a, gpu_c; GPU 1: gpu_b, gpu_d; then 1 " \
           "more as GPUs free\n" in out
    assert err.strip() == (
        "[pack gpu-pack001] pack.per_gpu 2: the members share GPUs through NVIDIA MPS, but "
        "nvidia-cuda-mps-control not found (no NVIDIA driver on this node): run on a GPU node "
        "(profiles/slurm asks for GPUs) or set pack.per_gpu: 1")
    assert "started" not in out and not (tmp_path / "results").exists()  # no member ran
    assert not (tmp_path / "rec.json").exists()


def test_the_driver_without_a_gpu_says_so(tmp_path, monkeypatch, capfd):
    assert run_shared(tmp_path, ["gpu_a", "gpu_b"], "", monkeypatch) == 2
    err = capfd.readouterr().err
    assert "but no GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES): run on a GPU node" in err


@pytest.mark.parametrize("pack", [{"runs_per_job": 4, "per_gpu": 2},  # mps: 2 GPUs
                                  {"runs_per_job": 4},                 # steps: a GPU a task
                                  {"runs_per_job": 4, "fuse": True}])  # one task, one GPU
def test_the_fit_check_sees_what_the_pack_job_asks(tmp_path, bin_dir, pack):
    """The fit check's shape of a pack and the rule's resources come from the same counts
    of its pack kind (packs.PACK_KINDS): tasks, memory per core and GPUs agree."""
    plan = shared_plan(tmp_path, bin_dir, strategies=["gpu"], pack=pack)
    res = plan.pack_rules.resources("gpu")
    for name, p in plan.packs.items():
        w = wildcards(pack=name, segment=1)
        (shape,) = [s for label, s in job_shapes(plan.runs, {name: p}).items()
                    if label.startswith(f"pack {name} ")]
        asked_gpus = int(res["slurm_extra"](w).rsplit("=", 1)[1])
        shaped_gpus = shape.get("gpus_per_node") or shape["tasks"] * shape["gpus_per_task"]
        assert (shape["tasks"], shape["cpus_per_task"], shape["mem_per_cpu"], shaped_gpus) == \
            (res["tasks"](w), res["cpus_per_task"](w), res["mem_mb_per_cpu"](w, None, 1),
             asked_gpus), (name, shape)
