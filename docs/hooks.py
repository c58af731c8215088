"""MkDocs hooks: the reference pages are generated from the code at build time, so they
cannot drift from it.

A page asks for a generated part with a marker line:

- ``<!-- generated: cli -->``: every ``switchboard`` command's help, from ``gateway.cli``'s
  argparse parser;
- ``<!-- generated: config -->``: every configuration key, its default and its comment, from
  ``config.example.yaml`` (which a test checks against the config schema);
- ``<!-- generated: openapi -->``: the dashboard API's OpenAPI document
  (``gateway.web.openapi``), as tables and as JSON;
- ``<!-- generated: metrics -->``: every ``/metrics`` series, read from the source that
  declares it (``gateway/ops/metrics.py`` and each ``metrics.gauge(...)`` call), with the
  labels the code sets.

A marker that names no generator fails the build.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: no generator named {name!r}")
        return GENERATORS[name]()

    return _MARKER.sub(generate, markdown)


# --- the command line -----------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    seen: set[int] = set()
    found = []
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    found.append((name, sub))
    return found


def _walk(parser: argparse.ArgumentParser, path: list[str], out: list[tuple[list[str], Any]]):
    out.append((path, parser))
    for name, sub in _subcommands(parser):
        _walk(sub, [*path, name], out)


def cli_reference() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal's width
    from gateway.cli import build_parser

    commands: list[tuple[list[str], argparse.ArgumentParser]] = []
    _walk(build_parser(), ["switchboard"], commands)
    lines = ["| command | what it does |", "|---|---|"]
    for path, parser in commands[1:]:
        summary = (parser.description or "").split(". ")[0].rstrip(".")
        anchor = "-".join(path)
        lines.append(f"| [`{' '.join(path)}`](#{anchor}) | {_cell(summary)} |")
    lines.append("")
    for path, parser in commands:
        anchor = "-".join(path)
        lines += [f"## `{' '.join(path)}` {{ #{anchor} }}", "", "```text",
                  parser.format_help().rstrip(), "```", ""]  # fmt: skip
    return "\n".join(lines)


# --- the configuration ----------------------------------------------------------------

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<rest>.*)$")
_COMMENT = re.compile(r"^ *#\s?(?P<text>.*)$")


def _split_comment(rest: str) -> tuple[str, str]:
    """The value and the comment of `key: value  # comment` (values hold no ' #')."""
    value, sep, comment = rest.partition(" #")
    return value.strip(), comment.strip() if sep else ""


def config_keys(text: str) -> tuple[str, list[dict[str, Any]]]:
    """The file's opening comment and its keys, in order: path, default, comment, and
    whether the key holds a mapping (a section)."""
    intro: list[str] = []
    keys: list[dict[str, Any]] = []
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not keys and line.startswith("#"):
            intro.append(line.lstrip("# "))
            continue
        comment = _COMMENT.match(line)
        if comment and keys:
            keys[-1]["comment"] += " " + comment.group("text").strip()
            continue
        match = _KEY.match(line)
        if not match:
            continue
        indent = len(match.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = match.group("key")
        if stack and stack[-1][1] == "endpoints":
            key = "<name>"  # an example endpoint: its name is the operator's
        stack.append((indent, key))
        value, note = _split_comment(match.group("rest"))
        keys.append({"path": ".".join(k for _, k in stack), "default": value,
                     "comment": note, "section": value == ""})  # fmt: skip
    return " ".join(intro), keys


def _cell(text: str) -> str:
    """Text for a table cell: pipes escaped, and angle brackets outside code spans shown
    as written rather than read as HTML (`<name>`, `<hostname>-<pid>`)."""
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).strip()


def config_reference() -> str:
    _, keys = config_keys((ROOT / "config.example.yaml").read_text(encoding="utf-8"))
    lines: list[str] = []
    table_open = False
    for entry in keys:
        depth = entry["path"].count(".")
        if entry["section"] and (
            depth == 0 or entry["path"].startswith("platforms.") and depth == 1
        ):
            level = "##" if depth == 0 else "###"
            lines += ["", f"{level} `{entry['path']}`", ""]
            if entry["comment"]:
                lines += [_cell(entry["comment"][0].upper() + entry["comment"][1:]), ""]
            table_open = False
            continue
        if not table_open:
            lines += ["| key | default | meaning |", "|---|---|---|"]
            table_open = True
        default = f"`{_cell(entry['default'])}`" if entry["default"] else "(a section)"
        lines.append(f"| `{entry['path']}` | {default} | {_cell(entry['comment'])} |")
    return "\n".join(lines)


# --- the dashboard API ----------------------------------------------------------------


def openapi_reference() -> str:
    from gateway.web.openapi import document

    doc = document()
    lines = [f"`{doc['info']['title']}`, version {doc['info']['version']}, OpenAPI "
             f"{doc['openapi']}.", ""]  # fmt: skip
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            lines += [f"### `{method.upper()} {path}`", "", op["summary"] + ".", ""]
            if op.get("description"):
                lines += [op["description"], ""]
            params = op.get("parameters") or []
            if params:
                lines += ["| parameter | in | type | meaning |", "|---|---|---|---|"]
                for p in params:
                    kind = p["schema"].get("type", "")
                    if p["schema"].get("enum"):
                        kind += ": " + ", ".join(f"`{v}`" for v in p["schema"]["enum"])
                    lines.append(f"| `{p['name']}` | {p['in']} | {_cell(kind)} | "
                                 f"{_cell(p.get('description', ''))} |")  # fmt: skip
                lines.append("")
            body = op.get("requestBody", {}).get("content", {})
            for content_type, spec in body.items():
                props = spec.get("schema", {}).get("properties")
                lines.append(f"Request body: `{content_type}`"
                             + (": " + ", ".join(f"`{k}`" for k in props) if props else "") + ".")  # fmt: skip
                lines.append("")
            codes = ", ".join(sorted(op.get("responses", {})))
            lines += [f"Answers: {codes}.", ""]
    lines += ['??? note "The whole document (JSON)"', "", "    ```json"]
    lines += ["    " + line for line in json.dumps(doc, indent=2).splitlines()]
    lines += ["    ```", ""]
    return "\n".join(lines)


# --- the metrics ----------------------------------------------------------------------

_DECLARED = re.compile(r'self\.(\w+)\s*=\s*(Counter|Histogram)\(\s*"(\w+)",\s*"([^"]+)"')
_LABELLED = re.compile(r'LabelledGauge\(\s*"(\w+)",\s*"([^"]+)",\s*"(\w+)"')
_INC = re.compile(r"metrics\.(\w+)\.inc\(([^)]*)\)")
_LABEL = re.compile(r'(\w+)=("([^"]*)"|[\w.]+)')


def _call_text(source: str, start: int) -> str:
    """The text of a call from its opening parenthesis to the matching one."""
    depth, quote = 0, ""
    for i in range(start, len(source)):
        ch = source[i]
        if quote:
            quote = "" if ch == quote and source[i - 1] != "\\" else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return source[start : i + 1]
    return source[start:]


def metric_series() -> list[dict[str, Any]]:
    """Every series /metrics can show: name, type, help and labels, found in the code."""
    sources = {p: p.read_text(encoding="utf-8") for p in sorted((ROOT / "gateway").rglob("*.py"))}
    found: dict[str, dict[str, Any]] = {}
    attrs: dict[str, str] = {}
    for attr, kind, name, help_ in _DECLARED.findall(sources[ROOT / "gateway/ops/metrics.py"]):
        attrs[attr] = name
        found[name] = {"name": name, "type": kind.lower(), "help": help_, "labels": {}}
    for name, help_, label in _LABELLED.findall(sources[ROOT / "gateway/ops/metrics.py"]):
        found[name] = {"name": name, "type": "gauge", "help": help_, "labels": {}}
        found[name]["labels"][label] = {f"the {label}"}
    for text in sources.values():
        for match in re.finditer(r"\.gauge\(", text):
            call = _call_text(text, match.end() - 1)
            head = re.match(r'\(\s*"(\w+)",\s*"([^"]+)"', call)
            if head:
                kind = "counter" if 'kind="counter"' in call else "gauge"
                found[head[1]] = {"name": head[1], "type": kind, "help": head[2], "labels": {}}
        for attr, args in _INC.findall(text):
            if attr in attrs:
                for key, value, literal in _LABEL.findall(args):
                    found[attrs[attr]]["labels"].setdefault(key, set()).add(
                        f"`{literal}`" if value.startswith('"') else f"the {key}"
                    )
    return list(found.values())


def metrics_reference() -> str:
    lines = ["| metric | type | what it counts | labels |", "|---|---|---|---|"]
    for m in metric_series():
        labels = "; ".join(
            f"`{k}`: " + ", ".join(sorted(v)) for k, v in sorted(m["labels"].items())
        )
        lines.append(f"| `{m['name']}` | {m['type']} | {_cell(m['help'])} | {labels} |")
    return "\n".join(lines)


GENERATORS = {"cli": cli_reference, "config": config_reference, "openapi": openapi_reference,
              "metrics": metrics_reference}  # fmt: skip
