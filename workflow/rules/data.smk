# Both rules run where snakemake runs (the login node: it has internet, compute nodes don't).
localrules:
    fetch_dataset,
    extract_dataset,


rule fetch_dataset:
    output:
        archive=f"{PLAN.data_dir}/cifar-10-python.tar.gz",
    log:
        f"{RESULTS}/logs/fetch_dataset.log",
    params:
        cifarflow=PLAN.software.cifarflow,
        out_dir=lambda wildcards, output: Path(output.archive).parent,
        source=config["data"]["source"],
        args=PLAN.fetch_args,
    shell:
        "{params.cifarflow} fetch-data --source {params.source} --out-dir {params.out_dir}"
        " {params.args} > {log} 2>&1"


rule extract_dataset:
    input:
        archive=rules.fetch_dataset.output.archive,
    output:
        batches=directory(PLAN.batches),
    log:
        f"{RESULTS}/logs/extract_dataset.log",
    params:
        cifarflow=PLAN.software.cifarflow,
        out_dir=lambda wildcards, output: Path(output.batches).parent,
        md5=config["data"]["md5"],
        data_id=PLAN.data_id,
    shell:
        "{params.cifarflow} extract-data --archive {input.archive} --md5 {params.md5} "
        "--data-id {params.data_id} --out-dir {params.out_dir} > {log} 2>&1"
