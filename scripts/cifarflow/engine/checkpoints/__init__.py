"""Checkpoints and resume: the files on disk, the resume decision, a run's save, resume and
publish."""
