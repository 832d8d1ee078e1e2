localrules:
    aggregate_results,
    summarize_partial,


report: "../report/workflow.rst"


rule aggregate_results:
    input:
        **final_metrics(),
        env=rules.record_environment.output.info,
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
    log:
        f"{RESULTS}/logs/aggregate_results.log",
    params:
        cifarflow=CIFARFLOW,
        out_dir=lambda wildcards, output: Path(output.summary).parent,
        runs=lambda wildcards, input: shlex.quote(
            runs_json({name: input[name] for name in RUNS if name in input.keys()})
        ),
    shell:
        "{params.cifarflow} aggregate --runs {params.runs} --out-dir {params.out_dir}"
        " --plots-dir {output.plots}"
        " > {log} 2>&1"


# After `snakemake --keep-going` left some runs failed: `snakemake summarize_partial`
# tabulates what finished and marks the rest missing.
rule summarize_partial:
    output:
        summary=f"{RESULTS}/partial/summary.csv",
    log:
        f"{RESULTS}/logs/summarize_partial.log",
    params:
        cifarflow=CIFARFLOW,
        out_dir=lambda wildcards, output: Path(output.summary).parent,
        runs=lambda wildcards: shlex.quote(runs_json(existing_metrics())),
    shell:
        "{params.cifarflow} aggregate --runs {params.runs} --out-dir {params.out_dir}"
        " --plots-dir {params.out_dir}/plots --keep-missing > {log} 2>&1"
