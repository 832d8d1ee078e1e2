# CIFAR-10 training on Slurm: one engine (scripts/cifarflow), many strategies.
# Edit config/config.yaml; run `snakemake -n` to see the plan.
from snakemake.utils import min_version

min_version("8.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/env.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/search.smk"
include: "workflow/rules/aggregate.smk"


rule all:
    default_target: True
    input:
        rules.aggregate_results.output,
