"""A config file's YAML, read strictly: a duplicate key or bad YAML is a ConfigError
naming the line, never a silently kept last value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gateway.errors import ConfigError, ConfigErrors


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, which keeps the last of two equal keys without a word; the
    composed node tree is checked for duplicates before anything is constructed."""


def _duplicate_keys(node: yaml.Node | None, prefix: str) -> list[ConfigError]:
    found: list[ConfigError] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[object, int] = {}
        for key_node, value_node in node.value:
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            path = f"{prefix}.{name}" if prefix else str(name)
            line = key_node.start_mark.line + 1
            if name is not None and name != "<<":
                if name in first:
                    found.append(
                        ConfigError(
                            path, f"duplicate key at line {line} (first at line {first[name]})"
                        )
                    )
                else:
                    first[name] = line
            found.extend(_duplicate_keys(value_node, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found.extend(_duplicate_keys(item, f"{prefix}[{i}]"))
    return found


def _parse(text: str, path: Path) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        duplicates = _duplicate_keys(node, "")
        if duplicates:
            raise duplicates[0] if len(duplicates) == 1 else ConfigErrors(duplicates)
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError("", f"{path}: not valid YAML{where}") from None
    finally:
        loader.dispose()


def parse(text: str, path: Path) -> Any:
    """The parsed YAML of a config file's text (duplicate keys and bad YAML refused)."""
    return _parse(text, path)


def read(path: Path | None) -> Any:
    """The parsed YAML of a config file; no file given means an empty one."""
    if path is None:
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError("", f"{path}: cannot be read ({exc.strerror})") from None
    return _parse(text, path)
