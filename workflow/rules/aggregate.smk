localrules:
    aggregate_results,
    summarize_partial,


report: "../report/workflow.rst"


rule aggregate_results:
    input:
        **get_final_metrics(),
        env=rules.record_environment.output.info,
        studies=get_study_records(),
    output:
        summary=report(
            f"{RESULTS}/summary.csv", category="Summary", caption="../report/summary.rst"
        ),
        advice=report(f"{RESULTS}/advice.md", category="Summary", caption="../report/advice.rst"),
        plots=report(
            directory(f"{RESULTS}/plots"),
            patterns=["{name}.png"],
            category="Plots",
            caption="../report/plots.rst",
        ),
        runs=f"{RESULTS}/runs.json",
    log:
        f"{RESULTS}/logs/aggregate_results.log",
    benchmark:
        f"{RESULTS}/benchmarks/aggregate_results.tsv"
    params:
        cifarflow=PLAN.software.cifarflow,
        out_dir=lambda wildcards, output: Path(output.summary).parent,
        study=PLAN.search_rules.study_args(),
    run:
        PLAN.outputs.write_runs_file(input, output.runs)
        shell(
            "{params.cifarflow} aggregate --runs {output.runs} --out-dir {params.out_dir}"
            " --plots-dir {output.plots} --env {input.env} {params.study} > {log} 2>&1"
        )


# After `snakemake --keep-going` left some runs failed: `snakemake summarize_partial`
# tabulates what finished and marks the rest missing.
rule summarize_partial:
    output:
        summary=f"{RESULTS}/partial/summary.csv",
        runs=f"{RESULTS}/partial/runs.json",
    log:
        f"{RESULTS}/logs/summarize_partial.log",
    params:
        cifarflow=PLAN.software.cifarflow,
        out_dir=lambda wildcards, output: Path(output.summary).parent,
    run:
        PLAN.outputs.write_runs_file(PLAN.outputs.existing_metrics(), output.runs)
        shell(
            "{params.cifarflow} aggregate --runs {output.runs} --out-dir {params.out_dir}"
            " --plots-dir {params.out_dir}/plots --keep-missing --results {RESULTS}"
            " > {log} 2>&1"
        )
