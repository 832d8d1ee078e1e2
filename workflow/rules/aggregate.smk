localrules:
    aggregate_results,
    summarize_partial,


report: "../report/workflow.rst"


def runs_json(metrics):
    """What aggregation needs to know about each run, metrics path included."""
    return json.dumps(
        {
            name: {
                "strategy": run.strategy,
                "swept": run.swept,
                "spec": run.spec,
                "resources": run.resources,
                "segments": segment_number(metrics.get(name, "")),
                "metrics": metrics.get(name),
            }
            for name, run in RUNS.items()
        }
    )


rule aggregate_results:
    input:
        **final_metrics(),
        env=rules.record_environment.output.info,
    output:
        summary=report(f"{RESULTS}/summary.csv", category="Summary", caption="../report/summary.rst"),
        advice=report(f"{RESULTS}/advice.md", category="Summary", caption="../report/advice.rst"),
        plots=report(
            directory(f"{RESULTS}/plots"),
            patterns=["{name}.png"],
            category="Plots",
            caption="../report/plots.rst",
        ),
    params:
        runs=lambda wildcards, input: shlex.quote(
            runs_json({name: input[name] for name in RUNS if name in input.keys()})
        ),
    log:
        f"{RESULTS}/logs/aggregate_results.log",
    shell:
        "{PY} aggregate --runs {params.runs} --out-dir {RESULTS} --plots-dir {output.plots}"
        " > {log} 2>&1"


# After `snakemake --keep-going` left some runs failed: `snakemake summarize_partial`
# tabulates what finished and marks the rest missing.
rule summarize_partial:
    output:
        summary=f"{RESULTS}/partial/summary.csv",
    params:
        runs=lambda wildcards: shlex.quote(runs_json(existing_metrics())),
    log:
        f"{RESULTS}/logs/summarize_partial.log",
    shell:
        "{PY} aggregate --runs {params.runs} --out-dir {RESULTS}/partial"
        " --plots-dir {RESULTS}/partial/plots --keep-missing > {log} 2>&1"
