"""storage.estimate against what a real small local run wrote: every file and folder under
results/ and Snakemake's .snakemake/metadata. The estimate is an upper bound (it counts each
run's work/ checkpoint, there while a segment trains and gone after) within 40 %."""

import yaml

from conftest import snakemake
from cifarflow.config import with_defaults
from cifarflow.controller.pack_plan import build_packs
from cifarflow.controller.plan import build_runs
from cifarflow.controller.storage import estimate

CONFIG = {"strategies": ["cpu"],
          "data": {"source": "synthetic",
                   "synthetic": {"train_size": 500, "test_size": 100, "seed": 0, "noise": 0.35}},
          "train": {"epochs": 2, "batch_size": 100, "lr": 0.05, "log_interval_s": 5},
          "segments": {"count": 2}, "sweep": {"lr": [0.05, 0.1, 0.2]},
          "resources": {"cpus_per_task": 1, "mem_mb": 2000, "runtime": 10}}


def test_the_estimate_bounds_what_a_real_run_wrote(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    snakemake(tmp_path, "-c", "2", configfile=tmp_path / "config.yaml")
    written = [p for p in (tmp_path / "results").rglob("*")]
    written += list((tmp_path / ".snakemake" / "metadata").iterdir())
    runs = build_runs(with_defaults(CONFIG))
    est = estimate(runs.values(), build_packs(runs, 1).values(), real_data=False)
    assert len(written) <= est.inodes <= 1.4 * len(written), (len(written), est.inodes)
    weights = sum(p.stat().st_size for p in written if p.name == "state.pt")
    assert weights <= est.weights <= 1.6 * weights  # 6 checkpoints written, 9 counted
