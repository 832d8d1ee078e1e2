# One rule per strategy (so profiles can set resources per strategy), each a checkpoint:
# segment k resumes from segment k-1; after each, the DAG is re-evaluated (final_segment)
# and a further segment is added only if this one stopped before its target epoch.
# On preemption Slurm sends SIGTERM to the whole step, then waits GraceTime: the shell and
# the log's tee ignore it, so the job lives until the segment has checkpointed and ended.
for _strategy in PLAN.unpacked:

    checkpoint:
        name:
            f"train_{_strategy}"
        input:
            data=rules.extract_dataset.output.batches,
            previous=get_previous_segment,
            spec=RUN.spec,
        output:
            ckpt=directory(RUN.segment("{segment}")),
        log:
            RUN.log("{segment}"),
        benchmark:
            f"{RESULTS}/benchmarks/train/{{run}}/segment-{{segment}}.tsv"
        wildcard_constraints:
            run=name_pattern([_strategy]),
            segment=r"\d+",
        threads: get_threads(_strategy)
        resources:
            **get_run_resources(_strategy),
            attempt=lambda wildcards, attempt: attempt,
        params:
            cifarflow=PLAN.software.job_cifarflow,
            prologue=PLAN.software.env_prologue(),
            args=get_segment_args,
            launch=get_launch_prefix(_strategy),
        shell:
            f"trap '' TERM; ({PLAN.run_rules.command}) 2>&1 | {KEEP_ATTEMPT_LOG}"


# Packed strategies (pack.runs_per_job > 1): one checkpoint per pack and segment trains
# segment k of each member that needs it (cifarflow/job/pack.py), one Slurm step per member;
# each member's segment directory, log and attempt count are its own, as unpacked.
for _strategy in PLAN.packed:

    checkpoint:
        name:
            f"train_{_strategy}"
        input:
            data=rules.extract_dataset.output.batches,
            previous=get_previous_pack_segment,
            specs=get_pack_specs,
        output:
            record=pack_marker(RESULTS, "{pack}", "{segment}"),
        log:
            f"{RESULTS}/logs/packs/{{pack}}/segment-{{segment}}.log",
        benchmark:
            f"{RESULTS}/benchmarks/packs/{{pack}}/segment-{{segment}}.tsv"
        wildcard_constraints:
            pack=pack_name_pattern(_strategy),
            segment=r"\d+",
        threads: get_pack_threads(_strategy)
        resources:
            **get_pack_resources(_strategy),
        params:
            cifarflow=PLAN.software.job_cifarflow,
            prologue=PLAN.software.env_prologue(),
            args=get_pack_args(_strategy),
        shell:
            f"trap '' TERM; ({get_pack_command(_strategy)}) > {{log}} 2>&1"
