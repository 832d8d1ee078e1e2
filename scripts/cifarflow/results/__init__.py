"""Afterwards, on the login node: the summary table, the plots, the advice, `cifarflow show`.
Imports: the shared top modules and ``job`` (tries); never ``controller``."""
