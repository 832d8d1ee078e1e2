"""cifarflow: one training engine for CIFAR-10 on Slurm, called by the Snakemake rules.

Where code runs shows in the folders (docs/architecture.md): ``controller`` (the Snakemake
process on the login node), ``job`` (inside a Slurm job, around the training), ``engine``
(the training process), ``results`` (afterwards). The modules at the top are what every
part uses (config, schema, orders, model_cards, data, synthetic, layout, slurm, files,
jobfacts, early_stop) and the command line's door (cli: it parses and dispatches).
"""

__version__ = "0.1.0"
