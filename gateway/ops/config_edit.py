"""Editing `config.yaml` from the command line: a dotted key resolved against the schema,
a value parsed and type-checked as the daemon will read it, the file changed through a
round-trip YAML document (comments, key order and layout kept) and written atomically,
only when the whole resulting config is no worse than before (the check-config validator).

ruamel.yaml does the round trip (PyYAML drops comments); the daemon itself still reads the
file with PyYAML, so every edit is read back with the daemon's own parser before it is
written."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway import config as configuration
from gateway.errors import ConfigError, ConfigErrors
from gateway.sections import Field, Schema

_SEQ_INDENT = re.compile(r"^( *)[A-Za-z_][\w-]*:[ \t]*(#.*)?\n( *)- ", re.M)


@dataclass(frozen=True)
class Key:
    """A dotted key of the schema: its parts, and its field (None for a whole section;
    `inside` > 0 when the last parts address an entry of a mapping-valued field, such as
    `session_reset.by_platform.telegram.mode`)."""

    parts: tuple[str, ...]
    spec: Field | None
    section: Schema | None = None
    inside: int = 0

    @property
    def dotted(self) -> str:
        return ".".join(self.parts)


def resolve(dotted: str) -> Key:
    """The schema's key at `dotted`; a ConfigError naming the first unknown part."""
    parts = tuple(dotted.split("."))
    if not dotted or not all(parts):
        raise ConfigError(dotted, "is not a dotted key (e.g. platforms.api.port)")
    node: Field | Schema = configuration.schema()
    for i, part in enumerate(parts):
        here = ".".join(parts[:i])
        if isinstance(node, Field):
            kinds = node.kind if isinstance(node.kind, tuple) else (node.kind,)
            if dict in kinds:
                return Key(parts, node, inside=len(parts) - i)
            raise ConfigError(dotted, f"{here} is a value, not a section")
        if part not in node:
            known = ", ".join(node)
            where = f"{here}.{part}" if here else part
            raise ConfigError(where, f"not a key of the config schema (known here: {known})")
        node = node[part]
    if isinstance(node, Field):
        return Key(parts, node)
    return Key(parts, None, section=node)


def parse_value(key: Key, text: str) -> Any:
    """A command-line value as the daemon's YAML parser reads it (`true`, `8642`, `[1, 2]`,
    `null`); where the key takes a string and the parsed form does not fit, the text as it
    was typed (a system prompt with a colon in it stays a string)."""
    try:
        value = yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        value = text
    if isinstance(value, str) and not text.lstrip().startswith(("'", '"')):
        value = text  # text stays as typed, spaces included, unless it was quoted as YAML
    if key.spec is None or key.inside:
        return value
    if configuration.check_value(value, key.spec) is not None and isinstance(text, str):
        kinds = key.spec.kind if isinstance(key.spec.kind, tuple) else (key.spec.kind,)
        if str in kinds and configuration.check_value(text, key.spec) is None:
            return text
    problem = configuration.check_value(value, key.spec)
    if problem:
        raise ConfigError(key.dotted, problem)
    return value


class Document:
    """A config file as a round-trip document: what it says, comments and all."""

    def __init__(self, path: Path) -> None:
        from ruamel.yaml import YAML

        self.path = path
        try:
            self.text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.text = ""
        except OSError as exc:
            raise ConfigError("", f"{path}: cannot be read ({exc.strerror})") from None
        configuration.parse(self.text, path)  # bad YAML or duplicate keys: refused as at load
        self._yaml = YAML()
        self._yaml.preserve_quotes = True
        self._yaml.width = 4096  # never fold a long value onto a line of its own
        self._yaml.representer.add_representer(
            type(None), lambda r, _d: r.represent_scalar("tag:yaml.org,2002:null", "null")
        )
        found = _SEQ_INDENT.search(self.text)
        if found:  # a list's dashes sit where this file has them
            offset = max(0, len(found.group(3)) - len(found.group(1)))
            self._yaml.indent(mapping=2, sequence=offset + 2, offset=offset)
        loaded = self._yaml.load(self.text) if self.text.strip() else None
        if loaded is None:
            from ruamel.yaml.comments import CommentedMap

            loaded = CommentedMap()
        if not isinstance(loaded, dict):
            raise ConfigError("config", "must be a mapping of keys to values")
        self.root: Any = loaded

    def get(self, parts: tuple[str, ...]) -> tuple[bool, Any]:
        node = self.root
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                return False, None
            node = node[part]
        return True, node

    def set(self, parts: tuple[str, ...], value: Any) -> None:
        from ruamel.yaml.comments import CommentedMap

        node = self.root
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if not isinstance(child, dict):
                if child is not None:
                    raise ConfigError(".".join(parts[: depth + 1]), "is not a mapping in the file")
                child = node[part] = CommentedMap()
            node = child
        node[parts[-1]] = _emittable(value)

    def unset(self, parts: tuple[str, ...]) -> bool:
        """Remove the key, and any mapping it leaves empty; False when it was not there."""
        trail = [self.root]
        for part in parts[:-1]:
            child = trail[-1].get(part)
            if not isinstance(child, dict):
                return False
            trail.append(child)
        if parts[-1] not in trail[-1]:
            return False
        del trail[-1][parts[-1]]
        for depth in range(len(parts) - 2, -1, -1):
            if trail[depth + 1]:
                break
            del trail[depth][parts[depth]]
        return True

    def render(self) -> str:
        if not self.root:
            return ""
        out = io.StringIO()
        self._yaml.dump(self.root, out)
        return out.getvalue()


def _emittable(value: Any) -> Any:
    """A value ruamel writes so that PyYAML (YAML 1.1) reads it back the same: a string
    such as `yes`, `on` or `1e3` is quoted."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    if isinstance(value, str):
        try:
            same = yaml.safe_load(value) == value and "\n" not in value
        except yaml.YAMLError:
            same = False
        return (
            value if same and value.strip() == value and value else DoubleQuotedScalarString(value)
        )
    if isinstance(value, list):
        seq = CommentedSeq(_emittable(v) for v in value)
        seq.fa.set_flow_style()
        return seq
    if isinstance(value, Mapping):
        out = CommentedMap((k, _emittable(v)) for k, v in value.items())
        out.fa.set_flow_style()
        return out
    return value


@dataclass(frozen=True)
class Outcome:
    """What an edit did: the file's values before and after (validated, defaults filled
    in), the problems the config still has that the edit did not bring, and whether the
    file changed at all."""

    before: dict[str, Any]
    after: dict[str, Any]
    remaining: list[ConfigError]
    changed: bool


def problems_of(
    text: str, path: Path, env: Mapping[str, str]
) -> tuple[dict[str, Any], list[ConfigError]]:
    data, _secrets, errors = configuration.check(configuration.parse(text, path), env)
    return data, errors


def commit(doc: Document, env: Mapping[str, str]) -> Outcome:
    """Validate the edited document as a whole and write it if the edit brings no new
    problem (those it would bring are raised, and nothing is written)."""
    new_text = doc.render()
    before, old_errors = problems_of(doc.text, doc.path, env)
    after, new_errors = problems_of(new_text, doc.path, env)
    known = {str(e) for e in old_errors}
    brought = [e for e in new_errors if str(e) not in known]
    if brought:
        raise brought[0] if len(brought) == 1 else ConfigErrors(brought)
    changed = new_text != doc.text
    if changed:
        write_atomically(doc.path, new_text)
    return Outcome(before, after, new_errors, changed)


def write_atomically(path: Path, text: str) -> None:
    """A temp file beside `path`, synced, then renamed over it (its mode kept): a reader,
    the daemon's reload included, sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def value_at(data: Mapping[str, Any], parts: tuple[str, ...]) -> tuple[bool, Any]:
    node: Any = data
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def show(value: Any) -> str:
    """A value as one line of YAML flow style (what `config set` would take back)."""
    if isinstance(value, str):
        return value
    return (
        yaml.safe_dump(value, default_flow_style=True, width=4096)
        .strip()
        .removesuffix("\n...")
        .removesuffix("...")
        .strip()
    )
