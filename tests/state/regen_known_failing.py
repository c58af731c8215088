"""Rewrite KNOWN_FAILING in hermes_suite_lists.py from a fresh run of Hermes's store suite
(`python -m tests.state.regen_known_failing`), after implementing part of it."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from tests.state.hermes_suite import run


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        got = run(Path(tmp) / "suite")
    failing = sorted(k for k, v in got.items() if v == "failed")
    lists = Path(__file__).with_name("hermes_suite_lists.py")
    text = lists.read_text(encoding="utf-8")
    body = "".join(f"    {name!r},\n" for name in failing)
    text = re.sub(
        r"KNOWN_FAILING: frozenset\[str\] = frozenset\(\{\n.*?\}\)\n",
        lambda _m: "KNOWN_FAILING: frozenset[str] = frozenset({\n" + body + "})\n",
        text,
        flags=re.S,
    )
    lists.write_text(text, encoding="utf-8")
    passed = sum(v == "passed" for v in got.values())
    print(f"passed {passed}, failing {len(failing)}")


if __name__ == "__main__":
    main()
