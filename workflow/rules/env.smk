# Runs as a job like the training (on a compute node under profiles/slurm), with the
# same prologue, so it records the software the training really ran with. When runs train
# on cuda it asks for one such GPU and checks torch has kernels for it.
rule record_environment:
    output:
        info=f"{RESULTS}/environment/environment.json",
        freeze=f"{RESULTS}/environment/pip-freeze.txt",
    log:
        f"{RESULTS}/logs/record_environment.log",
    resources:
        **PLAN.placement.job(PLAN.software.env_gpu),
        runtime=10,
        mem_mb=2000,
    params:
        cifarflow=PLAN.software.job_cifarflow,
        prologue=PLAN.software.env_prologue(),
        expect_gpu="--expect-gpu" if PLAN.software.env_gpu else "",
    shell:
        "{params.prologue}{params.cifarflow} record-env --out {output.info}"
        " --freeze {output.freeze} {params.expect_gpu} > {log} 2>&1"
