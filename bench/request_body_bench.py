"""The openai agent's request body per turn, for sessions of several history lengths.
Prints figures; asserts nothing.

  python bench/request_body_bench.py [--turns 8000] [--rounds 5] [--sessions 200]

Every turn sends the system prompt and the session's history window (the newest
`history_messages`, 200 by default) to the model again. For each window length the bench
plays turns round-robin over `--sessions` conversations of English-like chat text (5% CJK,
bench/corpus.py; one in ten a short stock text such as "ok" that recurs) that each grow by
a user message and a reply per turn, the window handing each turn new dicts around the same
strings as the store's windows do (state/history.py), and builds each turn's `messages`
JSON two ways: encoded whole (`json.dumps` of the list) and through the agent's
`EncodedMessages` (gateway/agent/openai.py), which reuses the JSON of the session's last
request. The figure is the CPU time (time.process_time) per body: the
median over rounds, the range in brackets. Both bodies are checked to decode to the same
messages.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import TextGen  # noqa: E402
from gateway.agent.openai import EncodedMessages  # noqa: E402

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
STOCK = ("ok", "thanks!", "Sure, done.", "yes")  # texts a conversation holds many times


def conversations(sessions: int, length: int, turns: int, seed: int = 5) -> list[list[dict]]:
    """Each session's messages: `length` to start with and two more for each of its turns."""
    gen, rng = TextGen(seed), random.Random(seed)
    per = length + 2 * (turns // sessions + 1)
    out = []
    for _ in range(sessions):
        msgs = []
        for i in range(per):
            role = "user" if i % 2 == 0 else "assistant"
            r = rng.random()
            text = gen.cjk() if r < 0.05 else rng.choice(STOCK) if r < 0.15 else gen.english(role)
            msgs.append({"role": role, "content": text})
        out.append(msgs)
    return out


def play(convs: list[list[dict]], length: int, turns: int, kept: bool) -> float:
    """CPU seconds per body over `turns` turns."""
    enc = EncodedMessages()  # with no session: json.dumps of the whole list
    sessions = len(convs)
    started = time.process_time()
    for t in range(turns):
        conv, n = convs[t % sessions], length + 2 * (t // sessions)
        window = [dict(m) for m in conv[n - length : n]]  # new dicts, the same strings
        messages = [SYSTEM, *window]
        enc.body(messages, session=f"s{t % sessions}" if kept else None)
    return (time.process_time() - started) / turns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=200)
    args = ap.parse_args()
    print(
        f"request body per turn, {args.turns} turns over {args.sessions} sessions, "
        f"CPU time per body: median of {args.rounds} rounds (range)"
    )
    print(f"{'window':>8} {'encoded whole':>24} {'EncodedMessages':>24} {'ratio':>7}")
    for length in (10, 50, 200):
        convs = conversations(args.sessions, length, args.turns)
        sample = [SYSTEM, *convs[0][:length]]
        assert json.loads(EncodedMessages().body(sample, "s")) == sample
        whole: list[float] = []
        kept: list[float] = []
        for _ in range(args.rounds):  # alternated: the machine's speed drifts
            whole.append(play(convs, length, args.turns, kept=False))
            kept.append(play(convs, length, args.turns, kept=True))
        w, k = statistics.median(whole), statistics.median(kept)
        cells = [
            f"{v * 1e6:7.1f} us ({min(vs) * 1e6:.1f}-{max(vs) * 1e6:.1f})"
            for v, vs in ((w, whole), (k, kept))
        ]
        print(f"{length:>8} {cells[0]:>24} {cells[1]:>24} {k / w:7.2f}")


if __name__ == "__main__":
    main()
