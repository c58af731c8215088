"""The words the side index holds, so a search for words it lacks skips its lookup.

The side index (`messages_aux_fts`, messages with CJK or emoji) holds the whole text of
those messages, Latin words too, so a search in plain words looks in it as well as in the
main index: an FTS5 lookup of every word in each of its segments, about a tenth of a small
search. Its vocabulary (the seg_text column's words, read through fts5vocab) is kept per
database file under the index's state it was read in: the averages record and the
structure record, which FTS5 rewrites at every write (its write counter grows). A search
whose required words are not all in it leaves the side index out and reads those two
records in its own statement: if they differ from the kept ones, the side index has
changed, the words are dropped and the search runs again with the side index.

Only plain words count (ASCII letters and digits: unicode61 and `[a-z0-9]+` agree on
them), and only words every hit must hold (terms of the query's top-level AND, no prefix);
anything else looks the side index up as before. The words are read on a thread of their
own, for a side index of at most MAX_ROWS rows, at most once per REREAD_S per file.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from urllib.parse import quote

from .. import query as q
from ..ranking import totals_of

MAX_ROWS = 5_000  # a bigger side index is always looked up (reading its words takes long)
REREAD_S = 30.0  # the least time between two readings of one file's words
KEPT_FILES = 16
_WORD = re.compile(r"[a-z0-9]+")

# the averages record (id 1) and the structure record (id 10) of the side index
STATE_SQL = (
    "(SELECT block FROM messages_aux_fts_data WHERE id = 1), "
    "(SELECT block FROM messages_aux_fts_data WHERE id = 10)"
)


@dataclass(frozen=True)
class Words:
    state: tuple[bytes | None, bytes | None]  # (averages record, structure record)
    words: frozenset[str]


_known: dict[str, Words] = {}
_read_at: dict[str, float] = {}
_lock = threading.Lock()


def required(tree: q.Node) -> frozenset[str] | None:
    """The plain words every match must hold (None: none known, the side index is always
    looked up)."""
    items = tree.items if isinstance(tree, q.And) else (tree,)
    out: set[str] = set()
    for term in items:
        if not isinstance(term, q.Term) or term.prefix or not term.text.isascii():
            continue  # an OR, a NOT, a prefix: no word it surely requires
        out.update(_WORD.findall(term.text.lower()))
    return frozenset(out) or None


def known(path: str | None) -> Words | None:
    return _known.get(path) if path else None


def forget(path: str) -> None:
    """The kept words are stale: the side index changed."""
    _known.pop(path, None)


def read_later(path: str, averages: bytes | None) -> None:
    """Read the file's words on a thread of their own, unless they were read less than
    REREAD_S ago or the side index is too big (its row count from `averages`)."""
    if totals_of(averages)[0] > MAX_ROWS:
        return
    now = time.monotonic()
    with _lock:
        if now - _read_at.get(path, -REREAD_S) < REREAD_S:
            return
        _read_at[path] = now
    threading.Thread(target=_read_quietly, args=(path,), name="side-words", daemon=True).start()


def _read_quietly(path: str) -> None:
    try:
        read(path)
    except sqlite3.Error:
        pass  # the file went away or is busy: the side index is looked up meanwhile


def read(path: str) -> Words | None:
    """Read and keep the side index's words (None: too many rows to keep)."""
    conn = sqlite3.connect("file::memory:", uri=True, isolation_level=None)
    try:
        conn.execute("ATTACH ? AS side", (f"file:{quote(path)}?mode=ro",))
        conn.execute(
            "CREATE VIRTUAL TABLE temp.side_words USING fts5vocab(side, messages_aux_fts, col)"
        )
        conn.execute("BEGIN")  # the words and the records of one snapshot
        state = conn.execute("SELECT " + STATE_SQL.replace("FROM ", "FROM side.")).fetchone()
        if totals_of(state[0])[0] > MAX_ROWS:
            return None
        rows = conn.execute("SELECT term FROM temp.side_words WHERE col = 'seg_text'")
        found = Words((state[0], state[1]), frozenset(r[0] for r in rows))
        conn.execute("COMMIT")
    finally:
        conn.close()
    with _lock:
        _known.pop(path, None)
        _known[path] = found
        while len(_known) > KEPT_FILES:
            del _known[next(iter(_known))]
    return found
