"""The project's own files stand alone: nothing points outside the repository (a user's
clone has no sibling folders), the README's links lead to files that exist, and the text
describes the product as it is, with no words of its development history."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = (".md", ".py", ".yaml", ".yml", ".toml")
# Built from pieces so this file does not match itself.
OUTSIDE = ["../" + "shared", "shared/" + "DESIGN", "shared/" + "recipes", "shared/" + "STYLE"]
NOT_SHIPPED = ["DESIGN" + ".md", "recipes" + ".md", "STYLE" + ".md", "SCALE" + "OUT"]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Words of the development history: a tracker's issue numbers, the numbered stops of a
# work journal. "issue" before a count of what is issued is the verb, and "stop" before a
# count of what a command stops is an instruction: both are product text.
HISTORY = [
    re.compile(r"\b[Ii]ssues? #\d+"),
    re.compile(
        r"\b[Ii]ssues? \d+(?!\d)(?! (?:requests?|queries|query|calls?|commands?|"
        r"statements?|tokens?|certificates?|reads?|writes?)\b)"
    ),
    re.compile(r"\b(?:[Ff]ix(?:es|ed)?|[Cc]loses?|[Rr]efs?|PR|[Pp]ull request) #\d+"),
    re.compile(
        r"\b[Ss]tops? \d+(?!\d)(?! (?:of|replicas?|daemons?|process(?:es)?|shards?|"
        r"workers?|seconds?|minutes?)\b)"
    ),
    re.compile(r"\b[Ss]tops?-\d+"),
]
_DEFINED = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)", re.MULTILINE)
HISTORY_NAME = re.compile(
    r"(?i:(?:^|_)(?:issues?|stops?|items?)_?\d+(?:_|$))|(?:Issue|Stop|Item)s?_?\d+"
)
HISTORY_DIRS = ("gateway", "state", "tests", "bench")


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
    for topic in (
        "Session keys",
        "sessions.json",
        "state.db",
        "Lineage",
        "Titles",
        "Search",
        "Chat commands",
        "Reset policies",
        "writer",
        "Exit codes",
        "HTTP API",
    ):
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


def _history_files() -> list[Path]:
    """Every Markdown file (README.md, docs/, CONTRIBUTING.md, the test suites' guides) and
    every Python file of the packages, the tests and the benchmarks, but this one."""
    return [
        f
        for f in project_files()
        if f.suffix == ".md" or (f.suffix == ".py" and f.relative_to(ROOT).parts[0] in HISTORY_DIRS)
        if f != Path(__file__).resolve()  # its cases below are history on purpose
    ]


def test_no_text_carries_words_of_the_development_history() -> None:
    """Docs, comments, docstrings and strings state what the product does; none names an
    issue number or a stop of a work journal."""
    files = _history_files()
    assert any(f.name == "CONTRIBUTING.md" for f in files)
    found = [
        f"{f.relative_to(ROOT)}:{n}: {m.group(0)!r} in {line.strip()[:100]}"
        for f in files
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        for pattern in HISTORY
        for m in pattern.finditer(line)
    ]
    assert found == [], "\n".join(found)


def test_no_test_or_function_is_named_after_an_issue() -> None:
    named = [
        f"{f.relative_to(ROOT)}: {m.group(1)}"
        for f in _history_files()
        if f.suffix == ".py"
        for m in _DEFINED.finditer(f.read_text(encoding="utf-8"))
        if HISTORY_NAME.search(m.group(1))
    ]
    assert named == [], "\n".join(named)


@pytest.mark.parametrize(
    "text, history",
    [
        ("typing starts when a turn runs (issue 15)", True),
        ("Issue 17 on Discord, which has no ack", True),
        ("issues 15 and 16", True),
        ("issue 15 items 17 and 20", True),
        ("see issue #3", True),
        ("closes #12", True),
        ("moved less than the spread (README, stop 36)", True),
        ("stop 39's figures", True),
        ("stops 35 and 38", True),
        ("the stop-36 run", True),
        ("Issue 18 stays open", True),
        ("a client may issue 3 requests at once", False),
        ("stop 2 replicas, then start them", False),
        ("stop 3 of the 5 daemons", False),
        ("a title numbered `plan #2`", False),
        ("item 1 of the list", False),
    ],
)
def test_the_history_patterns_tell_history_from_product_text(text: str, history: bool) -> None:
    assert any(p.search(text) for p in HISTORY) is history


@pytest.mark.parametrize(
    "name, history",
    [
        ("test_issue_15_item_2", True),
        ("test_issue15_typing", True),
        ("test_stop_36_figures", True),
        ("TestIssue21Dashboard", True),
        ("test_stop_task_ends_a_loop_that_swallowed_its_cancel", False),
        ("test_an_issue_of_the_token_is_refused", False),
        ("test_replies_keep_their_order", False),
    ],
)
def test_the_name_pattern_tells_history_from_behaviour(name: str, history: bool) -> None:
    assert bool(HISTORY_NAME.search(name)) is history
