# One rule per strategy (so profiles can set resources per strategy), each a checkpoint:
# segment k resumes from segment k-1; after each, the DAG is re-evaluated (final_segment)
# and a further segment is added only if this one stopped before its target epoch.
# On preemption Slurm sends SIGTERM to the whole step, then waits GraceTime: the shell and
# the log's tee ignore it, so the job lives until the segment has checkpointed and ended.
for _strategy in UNPACKED:

    checkpoint:
        name:
            f"train_{_strategy}"
        input:
            data=rules.extract_dataset.output.batches,
            previous=previous_segment,
            spec=f"{RESULTS}/runs/{{run}}/spec.json",
        output:
            ckpt=directory(f"{RESULTS}/runs/{{run}}/segment-{{segment}}"),
        log:
            f"{RESULTS}/logs/train/{{run}}/segment-{{segment}}.log",
        benchmark:
            f"{RESULTS}/benchmarks/train/{{run}}/segment-{{segment}}.tsv"
        wildcard_constraints:
            run=run_name_pattern([_strategy]),
            segment=r"\d+",
        threads: get_threads(_strategy)
        resources:
            **run_resources(_strategy),
            attempt=lambda wildcards, attempt: attempt,
        params:
            cifarflow=JOB_CIFARFLOW,
            prologue=get_prologue(_strategy),
            args=train_params,
            launch=get_launch_prefix(_strategy),
        shell:
            "trap '' TERM; ({params.prologue}{params.launch} {params.cifarflow} train"
            " --spec {input.spec} {params.args} --threads {resources.cpus_per_task}"
            " --budget-min {resources.runtime} --mem-mb {resources.mem_mb}"
            " --attempt {resources.attempt}) 2>&1"
            f" | {KEEP_ATTEMPT_LOG}"


# Packed strategies (pack.runs_per_job > 1): one checkpoint per pack and segment trains
# segment k of each member that needs it (cifarflow/pack.py), one Slurm step per member;
# each member's segment directory, log and attempt count are its own, as unpacked.
for _strategy in PACKED:

    checkpoint:
        name:
            f"train_{_strategy}"
        input:
            data=rules.extract_dataset.output.batches,
            previous=previous_pack_segment,
            specs=pack_specs,
        output:
            record=f"{RESULTS}/packs/{{pack}}/segment-{{segment}}.json",
        log:
            f"{RESULTS}/logs/packs/{{pack}}/segment-{{segment}}.log",
        benchmark:
            f"{RESULTS}/benchmarks/packs/{{pack}}/segment-{{segment}}.tsv"
        wildcard_constraints:
            pack=pack_name_pattern(_strategy),
            segment=r"\d+",
        threads: pack_threads
        resources:
            **pack_resources(_strategy),
        params:
            cifarflow=JOB_CIFARFLOW,
            prologue=env_prologue(),
            args=pack_params,
        shell:
            "trap '' TERM; {params.prologue}{params.cifarflow} train-pack {params.args}"
            " --threads {resources.cpus_per_task} --budget-min {resources.runtime}"
            " --mem-per-cpu {resources.mem_mb_per_cpu}"
            " --slots {threads} --record {output.record} > {log} 2>&1"
