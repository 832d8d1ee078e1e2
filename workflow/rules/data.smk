# Both rules run where snakemake runs (the login node: it has internet, compute nodes don't).
localrules:
    fetch_dataset,
    extract_dataset,


rule fetch_dataset:
    output:
        archive=f"{DATA_DIR}/cifar-10-python.tar.gz",
    params:
        py=PY,
        out_dir=lambda wildcards, output: Path(output.archive).parent,
        source=config["data"]["source"],
        args=" ".join(
            shlex.quote(a)
            for a in [
                "--url", config["data"]["url"],
                "--md5", config["data"]["md5"],
                "--archive", config["data"]["archive"] or "",
                *(f"--{k.replace('_', '-')}={v}" for k, v in config["data"]["synthetic"].items()),
            ]
        ),
    log:
        f"{RESULTS}/logs/fetch_dataset.log",
    shell:
        "{params.py} fetch-data --source {params.source} --out-dir {params.out_dir} {params.args}"
        " > {log} 2>&1"


rule extract_dataset:
    input:
        archive=rules.fetch_dataset.output.archive,
    output:
        batches=directory(BATCHES),
    params:
        py=PY,
        out_dir=lambda wildcards, output: Path(output.batches).parent,
        md5=config["data"]["md5"],
    log:
        f"{RESULTS}/logs/extract_dataset.log",
    shell:
        "{params.py} extract-data --archive {input.archive} --md5 {params.md5} "
        "--out-dir {params.out_dir} > {log} 2>&1"
