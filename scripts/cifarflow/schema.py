"""The config's schema (workflow/schemas/config.schema.yaml), read once: its defaults filled
into a config, and the strings Snakemake's ``--config`` hands over typed as the schema asks.
No torch: the Snakefile imports this module."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


@functools.cache
def schema() -> dict:
    import yaml

    if not SCHEMA.is_file():
        raise ValueError(f"{SCHEMA} not found: cifarflow reads the schema from the checkout "
                         "it is installed from; install it editable (pip install -e .)")
    # libyaml's loader where pyyaml has it: every Snakemake start (each job's too) reads
    # the schema, 0.28 s with the pure-Python loader on 2 cores
    return yaml.load(SCHEMA.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def fill_defaults(value, node: dict):
    """value with every missing key that has a schema default filled in (recursively)."""
    if "properties" not in node:
        return value
    value = dict(value or {})
    for key, sub in node["properties"].items():
        if key in value:
            value[key] = fill_defaults(value[key], sub)
        elif "default" in sub:
            value[key] = fill_defaults(copy.deepcopy(sub["default"]), sub)
    return value


def typed_like_schema(value, node: dict):
    """``value`` with the strings Snakemake's `--config` hands over inside nested values
    ("0.1" in `--config 'sweep={"lr": [0.1, 0.2]}'`, "false" in a dict) turned into the
    number or boolean the schema asks for there; anything else as it was (validation then
    names it)."""
    if isinstance(value, dict) and ("properties" in node or "patternProperties" in node
                                    or isinstance(node.get("additionalProperties"), dict)):
        return {k: typed_like_schema(v, sub_schema(node, k)) for k, v in value.items()}
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [typed_like_schema(v, node["items"]) for v in value]
    for option in node.get("anyOf", []) + node.get("oneOf", []):
        typed = typed_like_schema(value, option)
        if typed is not value:
            return typed
    if not isinstance(value, str):
        return value
    kinds = node.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    text = value.strip()
    if "boolean" in kinds and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "integer" in kinds and text.lstrip("+-").isdigit():
        return int(text)
    if "number" in kinds:
        try:
            number = float(text)
        except ValueError:
            return value
        return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() \
            else number
    return value


def sub_schema(node: dict, key: str) -> dict:
    """The schema of ``key`` in an object's schema: its property, a matching pattern's, or
    the schema of any other property."""
    import re

    if key in node.get("properties", {}):
        return node["properties"][key]
    for pattern, sub in node.get("patternProperties", {}).items():
        if re.search(pattern, key):
            return sub
    other = node.get("additionalProperties")
    return other if isinstance(other, dict) else {}
