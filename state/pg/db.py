"""Small query helpers over psycopg's async connection (rows as dicts or tuples), the
connection class the store's writer and readers use, and the mapping of PostgreSQL's
unique violations to the store's errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, TypeVar, cast

from psycopg import AsyncConnection, AsyncRawCursor, errors, pq
from psycopg import abc as pgabc
from psycopg.abc import PQGen
from psycopg.rows import dict_row
from psycopg.types.array import ListBinaryDumper
from psycopg.waiting import Ready, Wait

from ..rows import Row
from .direct import ANY_PLANS as ANY_PLANS
from .direct import GENERIC_PLANS as GENERIC_PLANS
from .direct import PARSED_EVERY_RUN as PARSED_EVERY_RUN
from .direct import Direct as Direct
from .direct import Params as Params
from .direct import direct_of as direct_of
from .direct import go_direct as go_direct
from .direct import numbered as numbered
from .direct import positional

R = TypeVar("R")  # a record shape rows_as types its rows as
RV = TypeVar("RV")

try:  # the loops on which a connection keeps its socket registered (LoopConnection)
    from uvloop import Loop as _Uvloop

    REGISTERING_LOOPS: tuple[type, ...] = (_Uvloop,)
except ImportError:  # no uvloop (Windows, PyPy): psycopg's own wait everywhere
    REGISTERING_LOOPS = ()


class LoopConnection(AsyncConnection[Any]):
    """psycopg's asyncio connection, its socket left registered with uvloop between
    statements. psycopg's own wait registers the socket as the loop's reader for each wait
    of each statement and removes it after (in uvloop: a poll handle made and closed, four
    to six epoll_ctl calls and an ioctl, and a timer): a prepared `SELECT 1` on this
    connection takes about 15% less of the client's CPU than on psycopg's
    (`python bench/pg_roundtrip_bench.py`, docs/benchmarks.md).

    A statement's first wait to read (nearly every statement waits only to read: the query
    is flushed at once) uses the registration and waits on a future the reader resolves. A
    further wait of the same statement (an answer in several reads) registers the socket
    again, as psycopg does: uvloop closes a socket's registration when the socket reports
    an error (the server reset the connection) after running its reader once, and the read
    that follows may leave libpq waiting for more. Readable with nobody waiting (a notice,
    the server closing) takes the reader off until the next wait. Any error takes it off
    too, since libpq closes the socket of a lost connection, and `close` takes it off before
    the socket closes: no later socket with the same number meets a stale registration.

    A statement whose answer is the server's error for a connection it drops (an
    administrator's termination) ends the wait normally, the connection lost: that takes
    the reader off too.

    Everything else goes to psycopg's wait, the reader off: a wait to write (a query larger
    than the socket's buffer), a wait with a timeout, a wait interrupted by cancellation
    (psycopg sends a cancel request and reads the query's end), and every wait on another
    loop (the standard library's runs a reader once more after the task it woke has read
    the answer, which would take the reader off after every statement)."""

    _watched = -1  # the socket registered with the loop, or -1
    _waiter: asyncio.Future[None] | None = None

    async def wait(
        self,
        gen: PQGen[RV],
        interval: float = 0.1,
        timeout: float | None = None,  # noqa: ASYNC109 (psycopg's signature, overridden)
    ) -> RV:
        direct = direct_of(self)
        if direct is not None and direct.begin:  # psycopg's own statement: the BEGIN first
            await direct.send_begin(self)
        loop = asyncio.get_running_loop()
        if timeout is not None or not isinstance(loop, REGISTERING_LOOPS):
            self._unwatch()
            return await super().wait(gen, interval, timeout)
        try:
            state = next(gen)
            again = False
            while state == Wait.R:
                fd = self.pgconn.socket
                if self._watched != fd or again:
                    self._unwatch()
                    loop.add_reader(fd, self._readable)
                    self._watched = fd
                again = True
                waiter = self._waiter = loop.create_future()
                try:
                    await waiter
                except asyncio.CancelledError as exc:
                    self._unwatch()
                    return await super().wait(_Resumed(gen, state, exc), interval)
                state = gen.send(Ready.R)
        except StopIteration as done:
            if self.pgconn.status == pq.ConnStatus.BAD:  # lost: libpq closes its socket
                self._unwatch()
            return cast(RV, done.value)
        except BaseException:
            self._unwatch()
            raise
        self._unwatch()  # a wait to write
        return await super().wait(_Resumed(gen, state, None), interval)

    def _readable(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None:
            self._unwatch()
        elif not waiter.done():
            waiter.set_result(None)

    def _unwatch(self) -> None:
        fd, self._watched = self._watched, -1
        if fd >= 0:
            asyncio.get_running_loop().remove_reader(fd)

    async def close(self) -> None:
        self._unwatch()
        await super().close()


class _Resumed(Generator[Wait, "Ready | int", RV]):
    """The rest of a generator psycopg's wait takes over: first the interruption (psycopg
    then cancels the query on the server) or, with none, the state the generator waits in;
    then the generator itself."""

    def __init__(self, gen: PQGen[RV], state: Wait, exc: BaseException | None) -> None:
        self._gen, self._state, self._exc = gen, state, exc

    def send(self, ready: Ready | int | None) -> Wait:
        if self._exc is not None:
            exc, self._exc = self._exc, None
            raise exc
        if ready is None:  # psycopg's first next(): the state the generator waits in
            return self._state
        return self._gen.send(ready)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Wait:
        return self._gen.throw(typ, val, tb)


def binary_lists(conn: AsyncConnection) -> None:
    """Python lists go to the server in binary on this connection. psycopg's default for a
    list parameter is its text array dumper, which quotes and regex-escapes every element:
    1.1 ms for six 60-element arrays against 0.13 ms in binary: text dumping took about 13%
    of a replica's CPU (py-spy, one replica at 740 messages/s) while the writer's merged
    writes sent their rows as arrays (they send them as JSON now: `json_rows`). Lists
    still go as arrays to `= ANY(%s)` and the rarer writes' `unnest(%s::text[], ...)`;
    the server casts them as it did the text ones."""
    conn.adapters.register_dumper(list, ListBinaryDumper)


async def generic_plans(conn: AsyncConnection) -> None:
    """The writer's statements are planned once per connection, not at every run. Under
    `plan_cache_mode = auto` PostgreSQL planned most of them afresh at every bind (a custom
    plan for each array of keys and rows): in the server's statement log, the lease take's
    bind took 0.77 ms against 0.19-0.29 for its execution, and binds were about a third of
    the server's time per turn. Every writer statement looks rows up by key (`= ANY` of an
    array, a primary or unique key) or a time column that follows insertion order, whose
    generic plans use the same indexes (the session prune's predicate has no index to use).
    Only the writer's connection: the read pool's statements (search, the dashboard) keep
    custom plans, which their parameters can change.

    `random_page_cost = 1.1` (the default 4 prices a disk seek): with it, a generic plan
    scanned the whole session_routes table and hashed it three times in each batch's
    accept-and-take statement (once to lock the free routes, once to update them, once for
    the keys without a route), which the planner priced below five primary-key probes on the
    bench's 512 routes; with it they are probes (auto_explain's plans). A writer's
    statements touch a few rows by key, in pages a busy database keeps in memory. Server CPU
    per message at 800 msg/s on two replicas: 0.74-0.79 ms against 0.81-0.84 ms, four
    alternated pairs (docs/benchmarks.md)."""
    await conn.execute(b"SET plan_cache_mode = force_generic_plan")
    await conn.execute(b"SET random_page_cost = 1.1")


async def configure(conn: AsyncConnection) -> None:
    """The read pool's per-connection set-up: binary lists, its statements through libpq
    directly (one reader at a time uses a connection), and its `plan_cache_mode` (the
    server's, `auto` by default) kept per statement: a search of whole indexes runs under
    generic plans (`GENERIC_PLANS`, state/pg/slices.py says why), every other statement
    under the server's setting."""
    binary_lists(conn)
    found = await conn.execute(b"SHOW plan_cache_mode")
    mode = (await found.fetchone() or ("auto",))[0]
    go_direct(conn, Direct(plans=str(mode).encode()))


def _raw(sql: str, params: Params) -> tuple[bytes, Sequence[Any]] | None:
    """A long statement with parameters as a raw query and its parameters in order; None
    for any other (psycopg's own conversion, cached)."""
    if params is None or len(sql) <= PARSED_EVERY_RUN:
        return None
    return positional(sql, params)


# A merged write's rows go to the server as one JSON parameter (`json_rows`), read back as
# a table by `rowset`, rather than as one array parameter per column: psycopg dumps a list
# in Python, element by element (3.6 µs a list, 13 lists of 3 values 47.6 µs against 10.5
# for the same values as one JSON text, `python -m timeit`), and a batch's append alone
# sends 31 columns. Text comes back exactly as sent (JSON escapes it; NUL and lone
# surrogates never reach a statement: state/text.py), a float as its shortest repr, which
# double precision parses to the same value (a zero loses its sign: jsonb keeps numbers as
# numeric).
_ROWS_JSON = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, check_circular=False, separators=(",", ":")
)


def json_rows(rows: Iterable[Sequence[Any]]) -> str:
    """Rows (sequences of None, bool, int, float and str) as `rowset`'s parameter."""
    return _ROWS_JSON.encode(rows if isinstance(rows, list) else list(rows))


def rowset(param: str, types: Sequence[str], *, ordinality: bool = False) -> str:
    """A FROM item of the rows of a JSON parameter (`json_rows`; `param` is its placeholder),
    a column of each type in `types` (then, with `ordinality`, the row's number from 1),
    to alias as `unnest` was: `FROM {rowset('%s', ('text', 'bigint'))} AS u(k, v)`."""
    columns = ", ".join(f"(r->>{i})::{t}" for i, t in enumerate(types))
    number = ", n" if ordinality else ""
    # unnest of an array the statement builds: the planner counts on 10 rows, as for the
    # array parameters this replaces; for jsonb_array_elements it counts on 100, and the
    # writer's generic plans, made while the tables were small, then scanned inbox,
    # sessions and session_routes whole at every batch instead of probing their keys
    return (
        f"(SELECT {columns}{number} FROM unnest(ARRAY(SELECT jsonb_array_elements("
        f"{param}::jsonb))) WITH ORDINALITY AS x(r, n))"
    )


def _dict_cursor(conn: AsyncConnection, raw: object) -> Any:
    return AsyncRawCursor(conn, row_factory=dict_row) if raw else conn.cursor(row_factory=dict_row)


def _loaded(
    res: pq.abc.PGresult,
    tx: pgabc.Transformer,
    make: Callable[[Sequence[Any]], Any],
    n: int | None = None,
) -> list[Any]:
    tx.set_pgresult(res)
    count = res.ntuples if n is None else min(n, res.ntuples)
    return tx.load_rows(0, count, make) if count else []


def _dict_maker(res: pq.abc.PGresult, conn: AsyncConnection) -> Callable[[Sequence[Any]], Row]:
    encoding = conn.info.encoding
    names = [(res.fname(i) or b"").decode(encoding) for i in range(res.nfields)]
    return lambda values: dict(zip(names, values, strict=True))


async def rows(conn: AsyncConnection, sql: str, params: Params = None) -> list[Row]:
    direct = direct_of(conn)
    if direct is not None:
        res, tx = await direct.result(conn, sql, params, None)
        return _loaded(res, tx, _dict_maker(res, conn))
    raw = _raw(sql, params)
    async with _dict_cursor(conn, raw) as cur:
        await cur.execute(*(raw or (sql.encode(), params)))
        return list(await cur.fetchall())


async def rows_then(
    conn: AsyncConnection, first: tuple[str, Params], then: tuple[str, Params]
) -> tuple[list[Row], list[Row]]:
    """Two statements' rows, in one round trip where the connection has a Direct (`piped`)."""
    one, two = await piped(conn, [first, then], (True, True))
    return one, two


async def piped(
    conn: AsyncConnection, statements: Sequence[tuple[str, Params]], dicts: Sequence[bool]
) -> list[list[Any]]:
    """Statements' rows (dicts where `dicts` says so, else tuples), in one round trip where
    the connection has a Direct; each takes its snapshot when it starts, after the ones
    before it have run (their waits for locks included), as it would sent after their
    answers. The first that fails raises its error, and the rest do not run."""
    direct = direct_of(conn)
    if direct is None:
        return [
            await (rows if as_dict else tuples)(conn, sql, params)
            for (sql, params), as_dict in zip(statements, dicts, strict=True)
        ]
    found = await direct.results(conn, statements)
    return [
        _loaded(res, tx, _dict_maker(res, conn) if as_dict else tuple)
        for (res, tx), as_dict in zip(found, dicts, strict=True)
    ]


async def rows_as(
    shape: type[R], conn: AsyncConnection, sql: str, params: Params = None
) -> list[R]:
    """`rows`, typed as the record `shape` (a TypedDict whose keys the query's columns name)."""
    return cast(list[R], await rows(conn, sql, params))


async def row(conn: AsyncConnection, sql: str, params: Params = None) -> Row | None:
    direct = direct_of(conn)
    if direct is not None:
        res, tx = await direct.result(conn, sql, params, None)
        found = _loaded(res, tx, _dict_maker(res, conn), 1)
        return cast(Row, found[0]) if found else None
    raw = _raw(sql, params)
    async with _dict_cursor(conn, raw) as cur:
        await cur.execute(*(raw or (sql.encode(), params)))
        return cast(Row | None, await cur.fetchone())


async def _execute(
    conn: AsyncConnection,
    sql: str,
    params: Params,
    prepare: bool | None = None,
    binary: bool = False,
) -> Any:
    raw = _raw(sql, params)
    if raw is None:
        return await conn.execute(sql.encode(), params, prepare=prepare, binary=binary)
    cur = AsyncRawCursor(conn)
    return await cur.execute(*raw, prepare=prepare, binary=binary)


async def tuples(
    conn: AsyncConnection,
    sql: str,
    params: Params = None,
    *,
    prepare: bool | None = None,
    binary: bool = False,
    plans: bytes | None = None,
) -> list[tuple[Any, ...]]:
    """`prepare=False` keeps a statement out of psycopg's prepared ones, whose generic plan
    PostgreSQL may settle on after a few runs whatever the parameters. `binary`: the
    columns come in binary (their Python values are the same for integers, floats, text
    and arrays of them; parsed in less of the client's CPU, a quarter less for a search
    window's 400 rows). `plans`: the plan_cache_mode to run it under, where the
    connection's Direct keeps that setting (the read pool's)."""
    direct = direct_of(conn)
    if direct is not None:
        res, tx = await direct.result(conn, sql, params, prepare, binary, plans)
        return _loaded(res, tx, tuple)
    cur = await _execute(conn, sql, params, prepare, binary)
    return list(await cur.fetchall())


async def value(conn: AsyncConnection, sql: str, params: Params = None) -> Any:
    direct = direct_of(conn)
    if direct is not None:
        res, tx = await direct.result(conn, sql, params, None)
        found = _loaded(res, tx, tuple, 1)
        return found[0][0] if found else None
    cur = await _execute(conn, sql, params)
    found = await cur.fetchone()
    return None if found is None else found[0]


async def run(conn: AsyncConnection, sql: str, params: Params = None) -> int:
    """Execute; returns the row count."""
    direct = direct_of(conn)
    if direct is not None:
        res, _tx = await direct.result(conn, sql, params, None)
        return -1 if res.command_tuples is None else res.command_tuples
    cur = await _execute(conn, sql, params)
    return int(cur.rowcount)


async def begin(conn: AsyncConnection) -> None:
    """BEGIN: where the connection has a Direct, sent with the transaction's first
    statement (one round trip less), else at once."""
    direct = direct_of(conn)
    if direct is not None:
        direct.hold_begin()
    else:
        await conn.execute(b"BEGIN")


async def command(conn: AsyncConnection, sql: bytes) -> None:
    """BEGIN, COMMIT and the like: directly where the connection has a Direct."""
    direct = direct_of(conn)
    if direct is not None:
        await direct.command(conn, sql)
    else:
        await conn.execute(sql)


def violated(exc: errors.UniqueViolation) -> str:
    """The name of the unique index or constraint a violation hit."""
    return exc.diag.constraint_name or ""


def marks(n: int) -> str:
    return ", ".join("%s" for _ in range(n))
