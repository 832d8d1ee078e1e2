"""The docs stay in step with the code: every config key is documented, links resolve."""

import re

import yaml

from conftest import ROOT


def schema_keys(node: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, sub in node.get("properties", {}).items():
        keys += schema_keys(sub, f"{prefix}{key}.") if "properties" in sub else [prefix + key]
    return keys


def test_config_readme_lists_every_schema_key():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    text = (ROOT / "config/README.md").read_text()
    keys = schema_keys(schema)
    assert len(keys) > 60
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, f"config/README.md lacks {missing}"
    rows = {line.split("|")[1].strip(" `"): line for line in text.splitlines()
            if line.startswith("| `")}
    for key in keys:  # every choice the schema offers is in the key's row
        node = schema
        for part in key.split("."):
            node = node["properties"][part]
        absent = [v for v in node.get("enum", []) if str(v) not in rows[key]]
        assert not absent, f"config/README.md: {key} lacks {absent}"


def test_readme_is_short_and_every_local_link_resolves():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 200
    for doc in [readme, *ROOT.glob("docs/*.md"), *ROOT.glob("*/README.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if not target.startswith("http"):
                assert (doc.parent / target).exists(), f"{doc.name}: {target}"
