"""Inside a Slurm job, around the training: the launcher, packs, tries and takeover, the
private MPS daemon, the job's software and its environment record (no torch at import).
Imports: the shared top modules and ``engine``; never ``controller`` or ``results``."""
