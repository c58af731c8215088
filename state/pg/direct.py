"""Statements sent through libpq directly on the connections one task uses at a time (the
writer's and the read pool's): `Direct`, set on a connection by `go_direct`, and the
placeholder numbering it shares with the query helpers of state/pg/db.py."""

from __future__ import annotations

import functools
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

from psycopg import AsyncConnection, errors, generators, pq
from psycopg import abc as pgabc
from psycopg.abc import PQGen
from psycopg.adapt import PyFormat, Transformer

Params = Sequence[Any] | Mapping[str, Any] | None  # positional (%s) or named (%(name)s)

# psycopg keeps what it parses of a statement's placeholders only for statements of at most
# 4096 bytes and 50 parameters (its _queries.MAX_CACHED_STATEMENT_LENGTH and _PARAMS); a
# longer one is parsed again at every run: the writer's merged accept, take and release
# (5 KB) took 73 us of a replica's CPU at each batch. Those run as raw queries instead,
# their placeholders numbered once here (`numbered`).
PARSED_EVERY_RUN = 4096
_PLACEHOLDER = re.compile(r"%(?:\(([^)]*)\))?(.)", re.DOTALL)


@functools.lru_cache(maxsize=1024)
def numbered(sql: str) -> tuple[bytes, tuple[str, ...] | int]:
    """A statement with psycopg's `%s` or `%(name)s` placeholders as PostgreSQL's `$n` (a
    name used twice is one number) and `%%` as `%`: the statement, and the names in their
    numbers' order (or, for `%s`, how many)."""
    names: dict[str, int] = {}
    count = 0

    def number(m: re.Match[str]) -> str:
        nonlocal count
        name, kind = m.group(1), m.group(2)
        if name is None and kind == "%":
            return "%"
        if kind != "s":
            raise ValueError(f"unsupported placeholder {m.group(0)!r} in a long statement")
        if name is None:
            count += 1
            return f"${count}"
        return f"${names.setdefault(name, len(names) + 1)}"

    text = _PLACEHOLDER.sub(number, sql)
    if names and count:
        raise ValueError("a statement mixes %s and %(name)s placeholders")
    return text.encode(), (tuple(names) if names else count)


def positional(sql: str, params: Params) -> tuple[bytes, Sequence[Any]]:
    """The statement with `$n` placeholders and its parameters in their order."""
    query, order = numbered(sql)
    if isinstance(order, int):
        values = list(cast(Sequence[Any], params))
        if len(values) != order:
            raise TypeError(f"the statement takes {order} parameters, {len(values)} given")
        return query, values
    named = cast(Mapping[str, Any], params)
    return query, [named[name] for name in order]


class Direct:
    """A connection's statements sent through libpq directly (`direct_of`): the writer's
    and the read pool's.

    psycopg's cursor wraps each statement in Python work of its own (a cursor object, its
    placeholders converted, its prepared-statement bookkeeping, the result's checks and row
    factory): a prepared statement of two parameters through the query helpers took 108
    (91-117) us of the client's CPU on that path against 69 (62-97) us here (the helper
    rows of `bench/pg_roundtrip_bench.py`). Here the statement's placeholders are numbered
    once per process (`numbered`), its parameters dumped and its rows loaded by psycopg's
    own Transformer (the types and Python values psycopg gives), and it is prepared by
    psycopg's rules: after `prepare_threshold` runs (at once with `prepare=True`, never with
    `prepare=False`), at most `prepared_max` statements, the least recently used
    deallocated. Errors are psycopg's exceptions from the server's result. Only for a
    connection one task uses at a time (it bypasses the connection's lock), set up by
    `go_direct`.

    With `plans` (the connection's `plan_cache_mode`) it keeps that setting per statement:
    a statement runs under the mode its caller names, any other under `plans`; the mode
    changes (a SET, one round trip) only outside a transaction, where no ROLLBACK can undo
    it behind this object's back. `ANY_PLANS` runs a statement under whichever is set, as
    does a statement without parameters (its plan is the same under every mode).

    A BEGIN held back (`hold_begin`, the writer's at each batch) goes with the
    transaction's first statement, in one round trip (libpq's pipeline mode: BEGIN, the
    statement, a sync point), rather than in one of its own; anything else the connection
    sends first (psycopg's own statements, savepoints, a prepare) sends it alone before
    (`LoopConnection.wait`), and a COMMIT or ROLLBACK with nothing sent since drops it."""

    __slots__ = (
        "runs",
        "names",
        "serial",
        "stale",
        "prepare_threshold",
        "prepared_max",
        "home",
        "plans",
        "begin",
    )

    def __init__(
        self, prepare_threshold: int = 5, prepared_max: int = 100, plans: bytes | None = None
    ) -> None:
        self.prepare_threshold, self.prepared_max = prepare_threshold, prepared_max
        self.home = self.plans = plans  # the statements' plan_cache_mode, the one now
        self.runs: OrderedDict[tuple[bytes, tuple[int, ...]], int] = OrderedDict()
        self.names: OrderedDict[tuple[bytes, tuple[int, ...]], bytes] = OrderedDict()
        self.serial = 0
        self.stale: list[bytes] = []  # evicted names, deallocated before the next prepare
        self.begin = False  # a BEGIN held back for the next statement

    def hold_begin(self) -> None:
        self.begin = True

    async def send_begin(self, conn: AsyncConnection) -> None:
        """The BEGIN held back, alone (before something else the connection sends)."""
        if self.begin:
            self.begin = False
            await self.command(conn, b"BEGIN")

    async def result(
        self,
        conn: AsyncConnection,
        sql: str,
        params: Params,
        prepare: bool | None,
        binary: bool = False,
        plans: bytes | None = None,
    ) -> tuple[pq.abc.PGresult, pgabc.Transformer]:
        """Run the statement; its (successful) result, its columns in binary with `binary`,
        and the Transformer that loads it; under `plans` (a plan_cache_mode) when this
        Direct keeps the setting."""
        call = await self._call(conn, sql, params, prepare, binary, plans)
        if self.begin:
            return (await self._piped(conn, [call]))[0]
        pgconn = conn.pgconn
        results = await conn.wait(_sent(pgconn, call))
        if call.name is not None and _deallocated(results):
            # deallocated behind this cache's back (DEALLOCATE ALL, DISCARD ALL): every
            # statement is prepared again from now on, and outside a transaction this one
            # runs again at once (in one, the error has aborted it: the caller redoes it)
            self.names.clear()
            if pgconn.transaction_status == pq.TransactionStatus.IDLE:
                results = await conn.wait(_sent(pgconn, call._replace(name=None)))
        return _checked(conn, results), call.tx

    async def results(
        self, conn: AsyncConnection, statements: Sequence[tuple[str, Params]]
    ) -> list[tuple[pq.abc.PGresult, pgabc.Transformer]]:
        """Several statements in one round trip (libpq's pipeline mode: with a BEGIN held
        back, it goes first), run in order, each in a snapshot of its own taken when it
        starts (under READ COMMITTED), so each sees what the ones before it did and what
        other transactions committed meanwhile. The first that fails raises its error (the
        rest do not run)."""
        calls = [
            await self._call(conn, sql, params, None, False, None) for sql, params in statements
        ]
        return await self._piped(conn, calls)

    async def _call(
        self,
        conn: AsyncConnection,
        sql: str,
        params: Params,
        prepare: bool | None,
        binary: bool,
        plans: bytes | None,
    ) -> _Call:
        """The statement ready to send: numbered, its parameters dumped, prepared (or
        counted towards it) by psycopg's rules, the plan mode it asks for set."""
        fmt = pq.Format.BINARY if binary else pq.Format.TEXT
        pgconn = conn.pgconn
        if self.home is not None and plans != ANY_PLANS and params and not self.begin:
            wanted = plans or self.home
            if wanted != self.plans and pgconn.transaction_status == pq.TransactionStatus.IDLE:
                await self.command(conn, b"SET plan_cache_mode = " + wanted)
                self.plans = wanted
        if params is None:  # as psycopg: no placeholders in a statement without parameters
            query: bytes = sql.encode()
            values: Sequence[Any] = ()
        else:
            query, values = positional(sql, params)
        tx: pgabc.Transformer = Transformer(conn)
        dumped = tx.dump_sequence(values, [PyFormat.AUTO] * len(values)) if values else ()
        key = (query, tuple(tx.types or ()))
        name = self.names.get(key)
        if name is not None:
            self.names.move_to_end(key)
        elif prepare is not False:
            runs = self.runs.pop(key, 0) + 1
            if prepare or runs >= self.prepare_threshold:
                name = await self._prepare(conn, key, query, tx)
            else:
                self.runs[key] = runs
                while len(self.runs) > 4 * self.prepared_max:
                    self.runs.popitem(last=False)
        return _Call(query, name, dumped, tx, fmt)

    async def _piped(
        self, conn: AsyncConnection, calls: Sequence[_Call]
    ) -> list[tuple[pq.abc.PGresult, pgabc.Transformer]]:
        """The calls (after the BEGIN held back, if any) in one round trip: their results.
        A wait that ends any other way leaves the connection mid-pipeline: it is closed, and
        its transaction with it (nothing of it was committed)."""
        begin, self.begin = self.begin, False
        pgconn = conn.pgconn
        pgconn.enter_pipeline_mode()
        try:
            if begin:
                pgconn.send_query_params(b"BEGIN", None)
            for call in calls:
                _send(pgconn, call)
            pgconn.pipeline_sync()
            found = await conn.wait(_fetched(pgconn, len(calls) + begin))
        except BaseException:
            pgconn.finish()
            raise
        pgconn.exit_pipeline_mode()
        if any(c.name is not None for c in calls) and any(_deallocated(r) for r in found):
            self.names.clear()  # prepared again from now on; the caller redoes its transaction
        for results in found:
            _checked(conn, results)
        return [(r[-1], c.tx) for r, c in zip(found[begin:], calls, strict=True)]

    async def _prepare(
        self,
        conn: AsyncConnection,
        key: tuple[bytes, tuple[int, ...]],
        query: bytes,
        tx: pgabc.Transformer,
    ) -> bytes:
        pgconn = conn.pgconn
        await self.send_begin(conn)
        while len(self.names) >= self.prepared_max:
            self.stale.append(self.names.popitem(last=False)[1])
        if self.stale:
            pgconn.send_query(b"; ".join(b"DEALLOCATE " + n for n in self.stale))
            _checked(conn, await conn.wait(generators.execute(pgconn)))
            self.stale.clear()
        self.serial += 1
        name = f"_sb_{self.serial}".encode()
        pgconn.send_prepare(name, query, param_types=tx.types if key[1] else None)
        _checked(conn, await conn.wait(generators.execute(pgconn)))
        self.names[key] = name
        return name

    async def command(self, conn: AsyncConnection, sql: bytes) -> None:
        """A statement without parameters or rows (BEGIN, COMMIT), in the simple protocol."""
        if self.begin and sql in (b"COMMIT", b"ROLLBACK"):
            self.begin = False  # nothing was sent in the transaction: nothing to end
            return
        await self.send_begin(conn)
        conn.pgconn.send_query(sql)
        _checked(conn, await conn.wait(generators.execute(conn.pgconn)))


# A statement's wish among Direct's plan modes: whichever the connection has set.
ANY_PLANS = b"any"
GENERIC_PLANS = b"force_generic_plan"


class _Call(NamedTuple):
    """A statement ready to send (Direct._call)."""

    query: bytes
    name: bytes | None  # prepared as
    dumped: Sequence[pgabc.Buffer | None]
    tx: pgabc.Transformer
    fmt: pq.Format


def _deallocated(results: list[pq.abc.PGresult]) -> bool:
    return (
        results[-1].status == pq.ExecStatus.FATAL_ERROR
        and results[-1].error_field(pq.DiagnosticField.SQLSTATE) == b"26000"
    )


def _fetched(pgconn: pq.abc.PGconn, n: int) -> PQGen[list[list[pq.abc.PGresult]]]:
    """A pipeline's n commands' results, then its sync point's."""
    yield from generators.send(pgconn)
    found = []
    for _ in range(n):
        found.append((yield from generators.fetch_many(pgconn)))
    yield from generators.fetch_many(pgconn)  # the sync point
    return found


def _sent(pgconn: pq.abc.PGconn, call: _Call) -> PQGen[list[pq.abc.PGresult]]:
    """The statement sent, and the wait for its results."""
    _send(pgconn, call)
    return generators.execute(pgconn)


def _send(pgconn: pq.abc.PGconn, call: _Call) -> None:
    """The statement (prepared as `name`, or unnamed) queued in libpq."""
    query, name, dumped, tx, fmt = call
    if name is None:
        pgconn.send_query_params(
            query,
            dumped or None,
            param_types=tx.types,
            param_formats=tx.formats,
            result_format=fmt,
        )
    else:
        pgconn.send_query_prepared(
            name, dumped or None, param_formats=tx.formats, result_format=fmt
        )


def _checked(conn: AsyncConnection, results: list[pq.abc.PGresult]) -> pq.abc.PGresult:
    """The last result, or the server's error as psycopg raises it."""
    for res in results:
        if res.status == pq.ExecStatus.FATAL_ERROR:
            raise errors.error_from_result(res, encoding=conn.info.encoding)
    return results[-1]


def go_direct(conn: AsyncConnection, direct: Direct | None = None) -> None:
    """Send the connection's statements through `direct` (a new Direct by default) from now
    on. psycopg itself then prepares nothing there: it deallocates every prepared statement
    of its connection (`DEALLOCATE ALL`) after a ROLLBACK once it has prepared one, which
    would take the direct path's statements with them."""
    conn.prepare_threshold = None
    conn.direct = direct or Direct()  # type: ignore[attr-defined]


def direct_of(conn: AsyncConnection) -> Direct | None:
    """The connection's Direct, set by whoever opened it (the writer's and the read pool's
    connections have one); None on others."""
    return getattr(conn, "direct", None)
