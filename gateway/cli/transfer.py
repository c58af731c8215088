"""`switchboard sessions export | import`: a store's sessions as JSONL (one session with
its messages and lineage a line) out to a file or stdout, and such a file read back in,
with progress on a terminal and every line that cannot be used reported."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import Progress

from gateway.cli.plain import err
from gateway.errors import EXIT_FAILURE, EXIT_OK
from gateway.ops.status import BACKUP_META
from gateway.wording import plural
from state import Store


async def _export(db: Store, fh: Any, args: argparse.Namespace, ids: list[str] | None) -> int:
    total = len(ids) if ids else await db.session_count(args.source)
    n = 0
    with Progress(console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("exporting", total=total)
        async for rec in db.export_all(source=args.source, session_ids=ids):
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
            progress.update(task, advance=1)
    return n


async def cmd_export(db: Store, args: argparse.Namespace) -> int:
    ids = [await db.resolve_session_ref(args.session_id)] if args.session_id else None
    if args.file == "-":
        n = await _export(db, sys.stdout, args, ids)
        sys.stdout.flush()
        err.print(f"exported {plural(n, 'session')}")
        return EXIT_OK
    try:
        fh = open(args.file, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        err.print(f"switchboard: cannot write {args.file}: {exc.strerror}")
        return EXIT_FAILURE
    with fh:
        n = await _export(db, fh, args, ids)
    if ids is None and args.source is None:  # the whole store: `switchboard status` shows it
        backup = {"at": time.time(), "sessions": n, "file": str(Path(args.file).absolute())}
        await db.set_meta(BACKUP_META, json.dumps(backup))
    err.print(f"exported {plural(n, 'session')} to {args.file}")
    return EXIT_OK


class _LineCounter:
    """Lines of an import that could not be used, for the final count."""

    def __init__(self) -> None:
        self.bad = 0


def _records(
    fh: Any, name: str, size: int | None, progress: Progress, bad: _LineCounter
) -> Iterator[dict[str, Any]]:
    task = progress.add_task(f"importing {escape(name)}", total=size)
    for n, line in enumerate(fh, 1):
        progress.update(task, advance=len(line))
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            err.print(f"line {n}: not JSON; skipped")
            bad.bad += 1
            continue
        if isinstance(rec, dict):
            yield rec
        else:
            err.print(f"line {n}: not a JSON object; skipped")
            bad.bad += 1


async def cmd_import(db: Store, args: argparse.Namespace) -> int:
    bad = _LineCounter()
    with Progress(console=err, transient=True, disable=not err.is_terminal) as progress:
        if args.file == "-":
            records = _records(sys.stdin.buffer, "stdin", None, progress, bad)
            report = await db.import_records(records)
        else:
            path = Path(args.file)
            if not path.is_file():
                err.print(f"switchboard: not found: {path}")
                return EXIT_FAILURE
            with path.open("rb") as fh:
                records = _records(fh, path.name, path.stat().st_size, progress, bad)
                report = await db.import_records(records)
    for old, new in report.renamed_titles:
        err.print(f"  title {old!r} was taken; kept as {new!r}")
    for problem in report.errors:
        err.print(f"  {problem}")
    if report.replaced:
        err.print(
            f"  {plural(report.replaced, 'character')} no store can hold (NUL, lone "
            "surrogates) kept as U+FFFD"
        )
    err.print(
        f"imported {plural(report.imported, 'session')}, {plural(report.messages, 'message')}; "
        f"{report.skipped_existing} already present"
    )
    rejected = bad.bad + len(report.errors)
    if rejected:
        err.print(f"switchboard: {plural(rejected, 'record')} could not be imported (see above)")
        return EXIT_FAILURE
    return EXIT_OK
