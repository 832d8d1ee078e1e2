"""sweep.search at scale through the test cluster's profile: the dry run of 1000 sampled
trials x 3 segments in packs of 16 plans like a grid of the same size."""

import pytest

from conftest import ROOT, snakemake

pytestmark = pytest.mark.slurm

SEARCH = """strategies: [cpu]
data: {source: synthetic}
train: {epochs: 3}
segments: {count: 3}
resources: {cpus_per_task: 1, mem_mb: 1000, runtime: 5}
pack: {runs_per_job: 16, fuse: true}
sweep:
  search:
    space: {lr: {log_uniform: [0.0001, 0.5]}, momentum: {uniform: [0.0, 0.99]},
            weight_decay: {log_uniform: [0.000001, 0.001]}}
    samples: 1000
    sampler: random
"""


def test_a_1000_trial_search_plans_in_packs_through_the_profile(tmp_path):
    cfg = tmp_path / "search.yaml"
    cfg.write_text(SEARCH)
    out = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm",
                    configfile=[ROOT / "config" / "config.yaml", cfg])
    text = out.stdout + out.stderr
    assert "pack: 1000 runs of cpu in 63 packs of up to 16, one job per pack and segment" in text
    assert "pack.fuse: 1000 runs in 63 fused pack(s) (lenet bs " in text  # config.yaml's batch
    assert "plan: 63 segment job(s) per round, 3 round(s), 189 segment job(s) in all" in text
    assert "1000 sampled:" in text and "  lr: log_uniform [0.0001, 0.5]: sampled " in text
    assert "ask_trials" in text  # round 1 is asked before its packs train
