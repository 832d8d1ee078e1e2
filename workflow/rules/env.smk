# Runs as a job like the training (on a compute node under profiles/slurm), with the
# same prologue, so it records the software the training really ran with.
rule record_environment:
    output:
        info=f"{RESULTS}/environment/environment.json",
        freeze=f"{RESULTS}/environment/pip-freeze.txt",
    params:
        py=PY,
        prologue=PROLOGUE,
    log:
        f"{RESULTS}/logs/record_environment.log",
    resources:
        runtime=10,
        mem_mb=2000,
        **SLURM_PLACEMENT,
    shell:
        "{params.prologue}{params.py} record-env --out {output.info} --freeze {output.freeze} > {log} 2>&1"
