"""The project's own files stand alone: nothing points outside the repository (a user's
clone has no sibling folders), and the README's links lead to files that exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = (".md", ".py", ".yaml", ".yml", ".toml")
# Built from pieces so this file does not match itself.
OUTSIDE = ["../" + "shared", "shared/" + "DESIGN", "shared/" + "recipes", "shared/" + "STYLE"]
NOT_SHIPPED = ["DESIGN" + ".md", "recipes" + ".md", "STYLE" + ".md"]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def project_files() -> list[Path]:
    """The tracked files (git), or every file outside hidden and virtualenv folders when
    the tree is not a git checkout (an unpacked source archive)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [
            str(p.relative_to(ROOT))
            for p in ROOT.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
        ]
    return [ROOT / n for n in names if n.endswith(CHECKED) and (ROOT / n).is_file()]


def test_no_project_file_refers_to_documents_outside_the_repository() -> None:
    files = project_files()
    assert any(f.name == "README.md" for f in files)  # the listing found the project
    found = [
        f"{f.relative_to(ROOT)}:{n}: {line.strip()}"
        for f in files
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if any(ref in line for ref in OUTSIDE + NOT_SHIPPED)
    ]
    assert found == []


def test_every_relative_link_in_the_documentation_leads_to_a_file() -> None:
    broken = []
    for doc in (f for f in project_files() if f.suffix == ".md"):
        for target in _LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            if not path.exists() or not path.is_relative_to(ROOT):
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_the_readme_links_the_architecture_document() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/architecture.md)" in readme
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    for topic in ("Session keys", "sessions.json", "state.db", "Lineage", "Titles", "Search",
                  "Chat commands", "Reset policies", "writer", "Exit codes", "HTTP API"):  # fmt: skip
        assert any(topic in h for h in headings), topic


def _layout_entries(page: str) -> list[str]:
    """The modules the code layout page's block names: each indented line's first word is
    a path inside the top-level folder named by the last unindented line."""
    block = page.split("```", 2)[1]
    top, entries = "", []
    for line in block.splitlines():
        if not line.strip():
            continue
        word = line.split()[0]
        if not line.startswith(" "):
            top = word
        elif word.endswith(".py"):
            entries.append(top + word)
    return entries


def test_the_code_layout_page_names_every_module_once() -> None:
    modules = {
        str(p.relative_to(ROOT))
        for package in ("gateway", "state")
        for p in (ROOT / package).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    listed = _layout_entries((ROOT / "docs" / "layout.md").read_text(encoding="utf-8"))
    assert sorted(modules - set(listed)) == [], "modules missing from docs/layout.md"
    assert sorted(set(listed) - modules) == [], "the Layout names modules that do not exist"
    assert sorted(m for m in set(listed) if listed.count(m) > 1) == [], "listed twice"


RUN = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/switchboard run"
TEST = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"


def test_the_readme_is_a_short_introduction_opening_with_the_run_and_test_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300, "the README is an introduction; detail goes in docs/"
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    assert [b.strip() for b in blocks[:2]] == [RUN, TEST]


def test_every_documentation_page_is_in_the_site_navigation() -> None:
    """mkdocs --strict in CI refuses a page left out of the navigation too; this says so
    without building the site."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    listed = set(re.findall(r"([\w/-]+\.md)\s*$", nav, re.M))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert sorted(pages - listed) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(listed - pages) == [], "the nav names pages that do not exist"
