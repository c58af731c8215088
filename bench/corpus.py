"""Deterministic chat corpora for the benchmarks.

English-like text: the 200 most common English words carry most of the weight (Zipf), and
a long tail of synthetic words stands for names, jargon and typos, giving a vocabulary and
token distribution close to real chat logs. CJK messages draw from the 3,000 most-used
ideographs plus kana. Also builds (and caches) the 100,000-session / 1,000,000-message
state.db used by the listing and search benchmarks.
"""

from __future__ import annotations

import itertools
import math
import random
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from state.rows import make_preview  # noqa: E402
from state.sqlite import schema  # noqa: E402

COMMON = (
    "the be to of and a in that have i it for not on with he as you do at this but his by from "
    "they we say her she or an will my one all would there their what so up out if about who get "
    "which go me when make can like time no just him know take people into year your good some "
    "could them see other than then now look only come its over think also back after use two how "
    "our work first well way even new want because any these give day most us is are was were been "
    "has had did does said got made went thanks please yes ok sure maybe should need try run file "
    "code error test build deploy server config update fix bug issue change version release api "
    "data user message session chat bot reply send read write open close start stop check help "
    "today tomorrow yesterday week meeting call email team project plan idea question answer "
    "problem reason result example point number part place case fact group company system program "
    "python docker linux database query table index search log branch merge commit review"
).split()
SYLLABLES = "ka lo mi ne ra tu sh ver on al ex in de com pro ter ment ing ly ist ab qu zor fen gal tri ble".split()
CJK_COMMON = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 3000))
KANA = "".join(chr(c) for c in range(0x3041, 0x3094)) + "".join(
    chr(c) for c in range(0x30A1, 0x30F4)
)


def pct(values: list[float], p: float) -> float:
    """The p-quantile (0..1) of `values` by nearest rank: the smallest value with at least
    p of the values at or below it (the ceil(p*n)-th smallest)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered), math.ceil(len(ordered) * p)) - 1)]


def synthetic_vocab(rng: random.Random, size: int = 20_000) -> list[str]:
    words: list[str] = []
    seen = set(COMMON)
    while len(words) < size:
        w = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


class TextGen:
    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.vocab = COMMON + synthetic_vocab(self.rng)
        # Zipf weights: rank r has weight 1/r
        self.cum = list(itertools.accumulate(1.0 / (r + 1) for r in range(len(self.vocab))))

    def words(self, n: int) -> list[str]:
        return self.rng.choices(self.vocab, cum_weights=self.cum, k=n)

    def english(self, role: str) -> str:
        n = self.rng.randint(5, 30) if role == "user" else self.rng.randint(20, 120)
        ws = self.words(n)
        ws[0] = ws[0].capitalize()
        text = " ".join(ws)
        return text + self.rng.choice([".", "?", "!", ".", "."])

    def cjk(self) -> str:
        n = self.rng.randint(8, 60)
        chars = self.rng.choices(CJK_COMMON, cum_weights=self.cum[: len(CJK_COMMON)], k=n)
        if self.rng.random() < 0.3:
            chars += self.rng.choices(KANA, k=6)
        if self.rng.random() < 0.3:  # CJK glued to Latin, as people type it
            chars.insert(self.rng.randint(0, len(chars)), self.rng.choice(self.vocab[200:2000]))
        return "".join(chars)


def build_corpus_db(
    path: Path, sessions: int, messages: int, cjk_share: float, seed: int = 11
) -> float:
    """Create a state.db with the switchboard schema; returns seconds taken."""
    started = time.perf_counter()
    if path.exists():
        path.unlink()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    schema.migrate(conn, str(path))
    gen = TextGen(seed)
    rng = gen.rng
    per = messages // sessions
    t0 = time.time() - 365 * 86400
    sources = ["telegram", "discord", "slack", "api", "cli"]
    conn.execute("BEGIN")
    for s in range(sessions):
        sid = f"20250101_000000_{s:08x}"
        start = t0 + s * (365 * 86400 / sessions)
        rows = []
        for m in range(per):
            role = "user" if m % 2 == 0 else "assistant"
            text = gen.cjk() if rng.random() < cjk_share else gen.english(role)
            rows.append((sid, role, text, start + m * 30))
        conn.execute(
            "INSERT INTO sessions(id, source, user_id, chat_id, started_at, last_active, "
            "message_count, preview, ended_at, end_reason) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                sid,
                sources[s % 5],
                f"u{s % 5000}",
                f"c{s % 5000}",
                start,
                rows[-1][3],
                per,
                make_preview(rows[0][2]),
                rows[-1][3] + 60,
                "idle",
            ),
        )
        for sid_, role, text, ts in rows:
            cur = conn.execute(
                "INSERT INTO messages(session_id, role, content, timestamp) VALUES (?,?,?,?)",
                (sid_, role, text, ts),
            )
            aux = schema.aux_row(text, None, None)
            if aux is not None:
                conn.execute(
                    "INSERT INTO messages_aux(message_id, seg_text, tool_text) VALUES (?,?,?)",
                    (cur.lastrowid, aux[0], aux[1]),
                )
        if s % 5000 == 4999:
            conn.execute("COMMIT")
            conn.execute("BEGIN")
            print(f"  corpus: {s + 1}/{sessions} sessions", file=sys.stderr, flush=True)
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("ANALYZE")
    conn.close()
    return time.perf_counter() - started


def corpus_db(out: Path, sessions: int, messages: int, cjk_share: float) -> Path:
    """The cached corpus for these parameters (built on first use)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"corpus_{sessions}_{messages}_{int(cjk_share * 100)}.db"
    marker = path.with_suffix(".ok")
    if not marker.exists():
        print(f"building {path.name} (once) ...", file=sys.stderr, flush=True)
        secs = build_corpus_db(path, sessions, messages, cjk_share)
        marker.write_text(f"{secs:.1f}\n")
    return path
