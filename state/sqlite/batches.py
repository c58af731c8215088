"""Batches of rows as one statement: a multi-row VALUES with every value bound as it is.

The writer's batched operations (appends, inbox bookkeeping, tallies) each run a batch as
one statement, so as one `sqlite3_step`: CPython's sqlite3 releases the GIL around every
step, and executemany (a step per row) would hand the GIL back and forth with the event
loop for every row. Bound values cost nothing to encode: no JSON text built in Python and
parsed again, element by element, in SQLite.

`statement(head, width, n, tail)` is `head` + the `(?,..,?),..` of n rows of `width` values +
`tail`; `chunks` cuts a batch to SQLite's limit on bound parameters. A statement text per
batch size: the texts are cached here, their prepared statements by the writer's
connection (`cached_statements`).
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

# SQLITE_MAX_VARIABLE_NUMBER since SQLite 3.32; a statement's own extra parameters fit
# in the margin.
MAX_PARAMS = 32_000

_SCALARS = frozenset((str, int, float))

# CPython's sqlite3 binds str, int, float and bytearray directly and sends every other value,
# None included, through its adapter lookup, whose failing attribute lookups format an
# exception per value: a batch's NULLs cost more than its text. An adapter registered for
# None (a C function returning None) answers that lookup at once; the value binds as NULL.
_AS_NULL = cast(Callable[[None], None], {}.get)  # {}.get(None) is None
sqlite3.register_adapter(type(None), _AS_NULL)


@functools.lru_cache(maxsize=256)
def statement(head: str, width: int, n: int, tail: str = "", constants: str = "") -> str:
    """`head` (up to VALUES), n rows of `width` parameters each followed by `constants`
    (SQL values every row ends with, `, 1, 1`), then `tail`."""
    row = "(" + ",".join("?" * width) + constants + ")"
    return head + ",".join([row] * n) + tail


def bindable(value: Any) -> Any:
    """A value as SQLite stores it: None and scalars as they are (a bool is an int), any
    other value as its JSON text."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    return json.dumps(value, ensure_ascii=False)


def chunks(rows: Sequence[Sequence[Any]], width: int) -> Iterator[tuple[int, list[Any]]]:
    """(rows in the chunk, their values in order) for as many chunks as the limit needs."""
    step = MAX_PARAMS // width
    for start in range(0, len(rows), step):
        chunk = rows[start : start + step]
        params = [v for row in chunk for v in row]
        if not all(v is None or type(v) in _SCALARS for v in params):
            params = list(map(bindable, params))
        yield len(chunk), params
