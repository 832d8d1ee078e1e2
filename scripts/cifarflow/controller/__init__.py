"""The controller: what the Snakemake process plans on the login node (no torch): runs,
packs, chains, requests, the checks at `snakemake -n`, the watches while it trains.
Imports: the shared top modules, ``engine`` (strategy classes), ``job``, ``results``."""
