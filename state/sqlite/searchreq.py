"""What a search asks: the request, the SQL of its filters, and the literal checks the
segmented index needs (shared by the SQLite and PostgreSQL stores)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from .. import query as q
from ..textindex import is_cjk, is_symbol
from .listing import SessionFilter

EVERY_SESSION = SessionFilter(include_children=True)


@dataclass(frozen=True, init=False)
class SearchRequest:
    query: str
    sources: Sequence[str] = ()
    exclude_sources: Sequence[str] = ()
    roles: Sequence[str] = ()
    scope: SessionFilter = EVERY_SESSION
    exclude_session_ids: Sequence[str] = ()
    sort: str = "relevance"
    limit: int = 20
    offset: int = 0
    # Match tool names and arguments whatever the role filter (Hermes's default).
    include_tools: bool = False
    # Rewound rows (active=0, not compacted) were taken back by the user: hidden unless asked.
    include_inactive: bool = False

    def __init__(
        self,
        query: str,
        sources: Sequence[str] = (),
        exclude_sources: Sequence[str] = (),
        roles: Sequence[str] = (),
        scope: SessionFilter = EVERY_SESSION,
        exclude_session_ids: Sequence[str] = (),
        sort: str = "relevance",
        limit: int = 20,
        offset: int = 0,
        include_tools: bool = False,
        include_inactive: bool = False,
    ) -> None:
        # one update of the instance's dict: a frozen dataclass's own __init__ sets each
        # field through object.__setattr__, a few microseconds per search
        self.__dict__.update(
            query=query,
            sources=sources,
            exclude_sources=exclude_sources,
            roles=roles,
            scope=scope,
            exclude_session_ids=exclude_session_ids,
            sort=sort,
            limit=limit,
            offset=offset,
            include_tools=include_tools,
            include_inactive=include_inactive,
        )


def filters(req: SearchRequest, mark: str = "?") -> tuple[str, list[object], bool]:
    """(WHERE text over `m` and `s`, its parameters, whether it filters on sessions);
    `mark` is the placeholder (`%s` for PostgreSQL)."""
    key = (
        req.scope,
        tuple(req.sources),
        tuple(req.exclude_sources),
        tuple(req.roles),
        req.include_inactive,
        tuple(req.exclude_session_ids),
        mark,
    )
    try:
        where, params, scoped = _filters(*key)
    except TypeError:  # a scope holding lists: not hashable, not cached
        where, params, scoped = _filters.__wrapped__(*key)
    return where, list(params), scoped


@functools.lru_cache(maxsize=256)
def _filters(
    within: SessionFilter,
    sources: tuple[str, ...],
    exclude_sources: tuple[str, ...],
    roles: tuple[str, ...],
    include_inactive: bool,
    exclude_session_ids: tuple[str, ...],
    mark: str,
) -> tuple[str, tuple[object, ...], bool]:
    scope = SessionFilter(
        source=within.source,
        sources=tuple(within.sources) + sources,
        exclude_sources=tuple(within.exclude_sources) + exclude_sources,
        user_id=within.user_id,
        chat_id=within.chat_id,
        thread_id=within.thread_id,
        include_children=True,
        include_archived=True,
        thread_exact=within.thread_exact,
        routed_only=within.routed_only,
    )
    where, params = scope.where("s", mark)
    scoped = where not in ("1", "TRUE")  # what SessionFilter.where says for no clause
    if roles:
        where += f" AND m.role IN ({', '.join(mark for _ in roles)})"
        params += list(roles)
    if not include_inactive:
        where += " AND NOT (COALESCE(m.active, 1) = 0 AND COALESCE(m.compacted, 0) = 0)"
    if exclude_session_ids:
        where += f" AND m.session_id NOT IN ({', '.join(mark for _ in exclude_session_ids)})"
        params += list(exclude_session_ids)
    return where, tuple(params), scoped


def _like(piece: str) -> str:
    return "%" + piece.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def literal_where(
    tree: q.Node, tools: bool, mark: str = "?", like: str = "LIKE"
) -> tuple[str, tuple[str, ...]]:
    """The segmented index drops punctuation (`100%完成` finds `100完成`), so a CJK/emoji
    term that holds any must also appear literally: a LIKE with `%`, `_` escaped. Only
    terms every hit must contain (the query's top-level AND) are checked."""
    items = tree.items if isinstance(tree, q.And) else (tree,)
    clauses: list[str] = []
    params: list[str] = []
    cols = ("m.content", "m.tool_name", "m.tool_calls") if tools else ("m.content",)
    for term in items:
        if not isinstance(term, q.Term) or not term.needs_aux:
            continue
        for piece in term.text.split():
            if all(ch.isalnum() or is_cjk(ch) or is_symbol(ch) for ch in piece):
                continue
            ors = " OR ".join(f"{c} {like} {mark} ESCAPE '\\'" for c in cols)
            clauses.append(f" AND ({ors})")
            params += [_like(piece)] * len(cols)
    return "".join(clauses), tuple(params)
