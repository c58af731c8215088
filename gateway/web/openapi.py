"""The OpenAPI 3 description of /api, served at /api/openapi.json. A test checks that it
names exactly the routes gateway/web/api.py registers."""

from __future__ import annotations

from typing import Any

from gateway import adapters

_ERROR = {
    "description": "error",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def _q(
    name: str, description: str, kind: str = "string", enum: list[str] | None = None
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": kind}
    if enum:
        schema["enum"] = enum
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "session id",
    "schema": {"type": "string"},
}
_PLATFORMS = list(adapters.sources())


def _op(
    summary: str,
    *,
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    content: str = "application/json",
    mutating: bool = False,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "parameters": params or [],
        "responses": {
            "200": {
                "description": "ok",
                "content": {
                    content: {
                        "schema": {"type": "object"}
                        if content == "application/json"
                        else {"type": "string"}
                    }
                },
            },
            "400": _ERROR,
            "401": _ERROR,
        },
    }
    if mutating:
        op["responses"]["403"] = _ERROR
        op["description"] = (
            "Cookie sessions must send the X-CSRF-Token header and a same-origin Origin; "
            "bearer-key clients need neither."
        )
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    return op


def _json(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """A JSON object body. OpenAPI 3.0 wants `required` absent rather than empty."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return {"application/json": {"schema": schema}}


def document() -> dict[str, Any]:
    listing = [
        _q("platform", "only this platform", enum=_PLATFORMS),
        _q("chat_type", "only this chat type", enum=["dm", "group", "channel", "thread"]),
        _q("titled", "titled or untitled only", enum=["yes", "no"]),
        _q("status", "live (not ended) or ended only", enum=["live", "ended"]),
        _q("from", "first day (YYYY-MM-DD, UTC) of the sort column"),
        _q("to", "last day (YYYY-MM-DD, UTC) of the sort column"),
        _q("sort", "last activity or start time", enum=["active", "started"]),
        _q("order", "newest or oldest first", enum=["desc", "asc"]),
        _q("children", "1: every session (default: live ones, roots, branches, compression tips)"),
        _q("after", "the `next` cursor of the previous page"),
        _q("limit", "page size, 1-500 (default 50)", "integer"),
    ]
    paths: dict[str, Any] = {
        "/api/sessions": {"get": _op("One keyset page of sessions", params=listing)},
        "/api/sessions/{id}": {
            "get": _op(
                "Metadata, a page of the transcript and the lineage tree",
                params=[
                    _ID,
                    _q("after", "messages after this id", "integer"),
                    _q("at", "start a little before this message id", "integer"),
                ],
            ),
            "delete": _op(
                "Delete a session (its children are kept as roots); 409 if live",
                params=[_ID],
                mutating=True,
            ),
        },
        "/api/sessions/{id}/title": {
            "post": _op(
                "Rename (an empty title clears it)",
                params=[_ID],
                body=_json({"title": {"type": "string"}}, ["title"]),
                mutating=True,
            ),
        },
        "/api/sessions/{id}/export": {
            "get": _op("One session as JSONL", params=[_ID], content="application/x-ndjson")
        },
        "/api/export": {
            "get": _op(
                "Every session as JSONL, oldest first",
                params=[_q("platform", "only this platform", enum=_PLATFORMS)],
                content="application/x-ndjson",
            ),
        },
        "/api/import": {
            "post": _op(
                "Import a JSONL export; existing sessions are skipped",
                body={"application/x-ndjson": {"schema": {"type": "string"}}},
                mutating=True,
            ),
        },
        "/api/prune": {
            "post": _op(
                "Delete ended sessions idle for longer than older_than_days",
                body=_json(
                    {
                        "older_than_days": {"type": "number", "minimum": 1},
                        "platform": {"type": "string", "enum": _PLATFORMS},
                        "dry_run": {"type": "boolean"},
                    },
                    ["older_than_days"],
                ),
                mutating=True,
            ),
        },
        "/api/empty-sessions": {
            "post": _op(
                "Delete ended sessions without messages (dry_run: count them)",
                body=_json({"dry_run": {"type": "boolean"}}),
                mutating=True,
            ),
        },
        "/api/search": {
            "get": _op(
                "Search messages (the /search query language)",
                params=[
                    {**_q("q", 'words, "exact phrase", OR, NOT, prefix*'), "required": True},
                    _q("platform", "only this platform", enum=_PLATFORMS),
                    _q("role", "only this role", enum=["user", "assistant", "tool", "system"]),
                    _q("sort", "ranking", enum=["relevance", "newest", "oldest"]),
                    _q("limit", "1-100 (default 20)", "integer"),
                    _q("offset", "skip this many", "integer"),
                ],
            ),
        },
        "/api/insights": {
            "get": _op(
                "Activity figures for the last `days` days",
                params=[
                    _q("days", "1-3660 (default 30)", "integer"),
                    _q("platform", "only this platform", enum=_PLATFORMS),
                ],
            ),
        },
        "/api/health": {"get": _op("The daemon's health (adapters, writer queue, last error)")},
        "/api/openapi.json": {"get": _op("This document")},
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "switchboard dashboard API", "version": "1"},
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "cookie": {"type": "apiKey", "in": "cookie", "name": "switchboard_session"},
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {"type": "object", "properties": {"message": {"type": "string"}}}
                    },
                }
            },
        },
        "security": [{"bearer": []}, {"cookie": []}],
        "paths": paths,
    }
