"""Small query helpers over psycopg's async connection (rows as dicts or tuples), the
connection class the store's writer and readers use, and the mapping of PostgreSQL's
unique violations to the store's errors."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

from psycopg import AsyncConnection, AsyncRawCursor, errors, generators, pq
from psycopg import abc as pgabc
from psycopg.abc import PQGen
from psycopg.adapt import PyFormat, Transformer
from psycopg.rows import dict_row
from psycopg.types.array import ListBinaryDumper
from psycopg.waiting import Ready, Wait

from ..rows import Row

R = TypeVar("R")  # a record shape rows_as types its rows as

Params = Sequence[Any] | Mapping[str, Any] | None  # positional (%s) or named (%(name)s)
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


# psycopg keeps what it parses of a statement's placeholders only for statements of at most
# 4096 bytes and 50 parameters (its _queries.MAX_CACHED_STATEMENT_LENGTH and _PARAMS); a
# longer one is parsed again at every run: the writer's merged accept, take and release
# (5 KB) took 73 us of a replica's CPU at each batch. Those run as raw queries instead,
# their placeholders numbered once here (`_numbered`).
PARSED_EVERY_RUN = 4096
_PLACEHOLDER = re.compile(r"%(?:\(([^)]*)\))?(.)", re.DOTALL)


@functools.lru_cache(maxsize=1024)
def _numbered(sql: str) -> tuple[bytes, tuple[str, ...] | int]:
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


def _raw(sql: str, params: Params) -> tuple[bytes, Sequence[Any]] | None:
    """A long statement with parameters as a raw query and its parameters in order; None
    for any other (psycopg's own conversion, cached)."""
    if params is None or len(sql) <= PARSED_EVERY_RUN:
        return None
    return _positional(sql, params)


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


class Direct:
    """A connection's statements sent through libpq directly (`direct_of`): the writer's
    and the read pool's.

    psycopg's cursor wraps each statement in Python work of its own (a cursor object, its
    placeholders converted, its prepared-statement bookkeeping, the result's checks and row
    factory): a prepared statement of two parameters through the query helpers took 108
    (91-117) us of the client's CPU on that path against 69 (62-97) us here (the helper
    rows of `bench/pg_roundtrip_bench.py`). Here the statement's placeholders are numbered
    once per process (`_numbered`), its parameters dumped and its rows loaded by psycopg's
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
    does a statement without parameters (its plan is the same under every mode)."""

    __slots__ = (
        "runs",
        "names",
        "serial",
        "stale",
        "prepare_threshold",
        "prepared_max",
        "home",
        "plans",
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
        fmt = pq.Format.BINARY if binary else pq.Format.TEXT
        pgconn = conn.pgconn
        if self.home is not None and plans != ANY_PLANS and params:
            wanted = plans or self.home
            if wanted != self.plans and pgconn.transaction_status == pq.TransactionStatus.IDLE:
                await self.command(conn, b"SET plan_cache_mode = " + wanted)
                self.plans = wanted
        if params is None:  # as psycopg: no placeholders in a statement without parameters
            query: bytes = sql.encode()
            values: Sequence[Any] = ()
        else:
            query, values = _positional(sql, params)
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
        results = await conn.wait(_sent(pgconn, query, name, dumped, tx, fmt))
        if (
            name is not None
            and results[-1].status == pq.ExecStatus.FATAL_ERROR
            and results[-1].error_field(pq.DiagnosticField.SQLSTATE) == b"26000"
        ):
            # deallocated behind this cache's back (DEALLOCATE ALL, DISCARD ALL): every
            # statement is prepared again from now on, and outside a transaction this one
            # runs again at once (in one, the error has aborted it: the caller redoes it)
            self.names.clear()
            if pgconn.transaction_status == pq.TransactionStatus.IDLE:
                results = await conn.wait(_sent(pgconn, query, None, dumped, tx, fmt))
        return _checked(conn, results), tx

    async def _prepare(
        self,
        conn: AsyncConnection,
        key: tuple[bytes, tuple[int, ...]],
        query: bytes,
        tx: pgabc.Transformer,
    ) -> bytes:
        pgconn = conn.pgconn
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
        conn.pgconn.send_query(sql)
        _checked(conn, await conn.wait(generators.execute(conn.pgconn)))


# A statement's wish among Direct's plan modes: whichever the connection has set.
ANY_PLANS = b"any"
GENERIC_PLANS = b"force_generic_plan"


def _sent(
    pgconn: pq.abc.PGconn,
    query: bytes,
    name: bytes | None,
    dumped: Sequence[pgabc.Buffer | None],
    tx: pgabc.Transformer,
    fmt: pq.Format,
) -> PQGen[list[pq.abc.PGresult]]:
    """The statement sent (prepared as `name`, or unnamed), and the wait for its results."""
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
    return generators.execute(pgconn)


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


def _positional(sql: str, params: Params) -> tuple[bytes, Sequence[Any]]:
    """The statement with `$n` placeholders and its parameters in their order."""
    query, order = _numbered(sql)
    if isinstance(order, int):
        values = list(cast(Sequence[Any], params))
        if len(values) != order:
            raise TypeError(f"the statement takes {order} parameters, {len(values)} given")
        return query, values
    named = cast(Mapping[str, Any], params)
    return query, [named[name] for name in order]


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
