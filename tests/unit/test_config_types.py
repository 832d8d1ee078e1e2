"""Snakemake hands nested `--config` values over as strings; the workflow types them as the
schema asks before validating, so `--config 'sweep={"lr": [0.1, 0.2]}'` plans."""

from cifarflow.schema import schema, typed_like_schema


def test_strings_become_the_numbers_and_booleans_the_schema_asks_for():
    given = {"sweep": {"lr": ["0.1", "2e-3"], "batch_size": ["256"]},
             "env": {"check_wheelhouse": "false", "mode": "slurm_tmpdir"},
             "train": {"epochs": "3", "lr": "0.05", "model": "lenet"},
             "pack": {"fuse": "true"}, "results": "out"}
    typed = typed_like_schema(given, schema())
    assert typed["sweep"] == {"lr": [0.1, 0.002], "batch_size": [256]}
    assert typed["env"] == {"check_wheelhouse": False, "mode": "slurm_tmpdir"}
    assert typed["train"] == {"epochs": 3, "lr": 0.05, "model": "lenet"}
    assert typed["pack"]["fuse"] is True  # anyOf [boolean, enum]
    assert typed["results"] == "out"
    # what is not a number stays as it was: validation names it
    assert typed_like_schema({"train": {"epochs": "many"}}, schema())["train"]["epochs"] == "many"


def test_the_schema_read_by_libyaml_is_the_pure_python_read():
    """schema() reads with pyyaml's C loader where it has one (every job's Snakemake reads
    it): the same dict as yaml.safe_load, key for key."""
    import yaml

    from cifarflow.schema import SCHEMA, schema

    assert schema() == yaml.safe_load(SCHEMA.read_text())
