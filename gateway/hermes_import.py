"""`switchboard import --from-hermes [HERMES_HOME]`: bring a Hermes Agent home's sessions
over (state.db: sessions, messages, titles, lineage, token counts, per-model usage).

Works whether the daemon runs or not: the store waits out the daemon's write lock. Running
it twice imports nothing the second time. `--dry-run` reports the same counts and writes
nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from gateway.errors import EXIT_FAILURE, EXIT_OK
from state import SessionDB

DEFAULT_HERMES_HOME = "~/.hermes"


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    add_command: Callable[..., argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    p = add_command(sub, "import", "bring sessions over from another program",
                    description="Copy a Hermes Agent home's sessions, messages, titles, lineage "
                    "and token counts into this home; running it twice changes nothing.")  # fmt: skip
    p.add_argument(
        "--from-hermes", dest="from_hermes", nargs="?", const=DEFAULT_HERMES_HOME,
        required=True, metavar="HERMES_HOME",
        help=f"a Hermes Agent home (default {DEFAULT_HERMES_HOME}); its state.db is read, "
        "never written",
    )  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="count what would change; write nothing")
    return p


def hermes_db_file(arg: str) -> Path | None:
    """The state.db of a Hermes home (or the file itself), None when there is none."""
    source = Path(arg).expanduser()
    db_file = source / "state.db" if source.is_dir() else source
    return db_file if db_file.is_file() else None


async def run(args: argparse.Namespace, home: Path, db_file: Path | None) -> int:
    if db_file is None:
        print(f"switchboard: no Hermes state.db at {args.from_hermes}")
        return EXIT_FAILURE
    db = await SessionDB.open(home / "state.db")
    try:
        r = await db.import_hermes(db_file, dry_run=args.dry_run)
    finally:
        await db.close()
    verb = "would import" if args.dry_run else "imported"
    print(
        f"{verb} {r.sessions} sessions, {r.messages} messages, {r.titles} titles, "
        f"{r.usage_rows} usage rows from {db_file}; {r.skipped} already present"
    )
    for conflict in r.title_conflicts:
        print(f"  title kept off (already used here): {conflict}")
    return EXIT_OK
