"""Reading the small text files users write (inventory, --config, a mitigation policy, a saved
DCGM scrape) with the one-line errors every command promises: the file, the line, what is
wrong. `err` is the SkewscopeError subclass of the caller (its exit code)."""
from __future__ import annotations

from pathlib import Path


def read_text(path, what: str, err, prefix: str = "") -> str:
    """The file as text (UTF-8, a BOM dropped); err("PREFIXPATH: cannot read WHAT (why)") or
    err("...: not UTF-8 text")."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise err(f"{prefix}{p}: cannot read {what} ({e.strerror or e})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise err(f"{prefix}{p}: not UTF-8 text") from None


def yaml_error(e, name: str, err):
    """err("NAME:LINE: not valid YAML (problem)") from a yaml.YAMLError."""
    mark = getattr(e, "problem_mark", None)
    at = f":{mark.line + 1}" if mark is not None else ""
    return err(f"{name}{at}: not valid YAML ({getattr(e, 'problem', None) or e})")


def compose_yaml(text: str, name: str, err):
    """The YAML node tree (line numbers for every key: node.start_mark.line + 1), or None for
    an empty document."""
    import yaml  # a dependency; only YAML files need it
    try:
        return yaml.compose(text)
    except yaml.YAMLError as e:
        raise yaml_error(e, name, err) from None


def scalar_value(node):
    """A node's Python value (a quoted string stays a string)."""
    import yaml  # a dependency; only YAML files need it
    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:str":
        return node.value
    return yaml.safe_load(yaml.serialize(node))
