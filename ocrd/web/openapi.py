"""The OpenAPI 3.1 description served at `/api/openapi.json`: the documents API in full, and
the reports beside it in brief. The JSON bodies' schemas come from the models the server
answers with, so the description cannot drift from what is sent."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ocrd.status import StatusReport

REF = "#/components/schemas/{model}"


def _json(schema: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": REF.format(model=schema)}}}


def _answer(description: str, schema: str = "ErrorBody") -> dict[str, Any]:
    return {"description": description, "content": _json(schema)}


def _file(description: str, media: str = "*/*") -> dict[str, Any]:
    return {
        "description": description,
        "content": {media: {"schema": {"type": "string", "contentMediaType": media}}},
    }


ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "an upload's id (26 letters and digits, from the upload's answer), or the "
    "claim id of a document finished since ocrd started (the status page links those)",
    "schema": {"type": "string", "pattern": r"^([a-z2-7]{26}|\d{8}T\d{6}-[0-9a-f]{6})$"},
}
WAIT = {
    "name": "wait",
    "in": "query",
    "required": False,
    "description": "answer once the document is done or failed, or after this many seconds",
    "schema": {"type": "number", "minimum": 0, "maximum": 300, "default": 0},
}
NOT_FOUND = _answer("no such document (or no such output)")
UNAUTHORISED = _answer("no bearer token, or a wrong one, where one is needed")
NOT_DONE = _answer("the document is not done (yet): the body says its state")


def _upload(max_upload_mb: float) -> dict[str, Any]:
    return {
        "summary": "Hand over a file to convert",
        "description": "The file lands in the inbox as if dropped there and goes the same way. "
        "Always needs the bearer token (from loopback too), and an inbox with "
        f"`uploads: true`. At most {max_upload_mb:g} MiB (`http.max_upload_mb`).",
        "operationId": "uploadDocument",
        "parameters": [
            {
                "name": "inbox",
                "in": "query",
                "required": False,
                "description": "the inbox's path or folder name; default: the first inbox "
                "with `uploads: true`",
                "schema": {"type": "string"},
            },
            {
                "name": "filename",
                "in": "query",
                "required": False,
                "description": "the file's name, for a raw body (default `upload`)",
                "schema": {"type": "string"},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["file"],
                        "properties": {
                            "inbox": {
                                "type": "string",
                                "description": "as the query parameter; before `file`",
                            },
                            "file": {
                                "type": "string",
                                "contentMediaType": "application/pdf",
                                "minLength": 1,  # an empty file is refused (400)
                            },
                        },
                    }
                },
                "application/octet-stream": {
                    "schema": {
                        "type": "string",
                        "contentMediaType": "application/octet-stream",
                        "minLength": 1,
                    }
                },
            },
        },
        "responses": {
            "202": {
                "description": "taken: it is in the inbox, waiting",
                "headers": {"Location": {"schema": {"type": "string"}}},
                "content": _json("UploadAccepted"),
            },
            "400": _answer("no file, an empty file, a malformed body, or an incomplete upload"),
            "401": _answer("no bearer token, or a wrong one"),
            "403": _answer("uploads are off (no inbox with `uploads: true`, or no token set)"),
            "404": _answer("no such inbox"),
            "408": _answer("the client sent nothing for a while, or took too long in all"),
            "413": _answer("larger than `http.max_upload_mb`"),
            "422": _answer("the inbox would never take a file of this name"),
            "503": _answer("the inbox's disk refused the file (full, read-only); try later"),
        },
    }


def _paths(max_upload_mb: float) -> dict[str, Any]:
    return {
        "/api/documents": {"post": _upload(max_upload_mb)},
        "/api/documents/{id}": {
            "get": {
                "summary": "A document's state, times and links to its outputs",
                "operationId": "getDocument",
                "parameters": [ID, WAIT],
                "responses": {
                    "200": _answer("the document", "DocumentStatus"),
                    "400": _answer("`wait` out of range"),
                    "401": UNAUTHORISED,
                    "404": NOT_FOUND,
                },
            }
        },
        "/api/documents/{id}/markdown": {
            "get": {
                "summary": "The document's Markdown, once done (a document split at separator "
                "sheets: every part's in order, each after a comment `<!-- part k of n: "
                "<stem>-k.md -->`)",
                "operationId": "getMarkdown",
                "parameters": [ID, WAIT],
                "responses": {
                    "200": _file("the Markdown", "text/markdown"),
                    "400": _answer("`wait` out of range"),
                    "401": UNAUTHORISED,
                    "404": NOT_FOUND,
                    "409": NOT_DONE,
                },
            }
        },
        "/api/documents/{id}/{name}": {
            "get": {
                "summary": "One output by name: `<stem>.md`, `<stem>.layout.json`, "
                "`<stem>.raw.jsonl`, `<stem>.pdf` (as listed in the document's `links.files`; "
                "a split document's parts are `<stem>-1.md`, `<stem>-1.pdf`, ...)",
                "operationId": "getOutput",
                "parameters": [ID, _name("name")],
                "responses": {
                    "200": _file("the file"),
                    "401": UNAUTHORISED,
                    "404": NOT_FOUND,
                    "409": NOT_DONE,
                },
            }
        },
        "/api/documents/{id}/{folder}/{name}": {
            "get": {
                "summary": "A figure, `<stem>.assets/<figure>`: where the Markdown's "
                "relative links lead when it is read from `/api/documents/{id}/markdown`",
                "operationId": "getFigure",
                "parameters": [ID, _name("folder"), _name("name")],
                "responses": {
                    "200": _file("the figure"),
                    "401": UNAUTHORISED,
                    "404": NOT_FOUND,
                    "409": NOT_DONE,
                },
            }
        },
        "/api/status": _report(
            "The daemon's state as JSON (what `ocrd status` reads): 200 when ready, else 503",
            _json("StatusReport"),
            guarded=True,
        ),
        "/healthz": _report("200 while the main loop ticks, else 503", _json("Liveness")),
        "/readyz": _report("200 when ready, else 503 with the problems", _json("Readiness")),
        "/metrics": _report(
            "Prometheus text format",
            {"text/plain": {"schema": {"type": "string"}}},
            guarded=True,
            always_ok=True,
        ),
    }


def _name(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _report(
    summary: str, content: dict[str, Any], guarded: bool = False, always_ok: bool = False
) -> dict[str, Any]:
    """A report's route. Health (not `guarded`) answers without the token, as a load
    balancer asks, unless `http.health_needs_token` says otherwise."""
    responses: dict[str, Any] = {"200": {"description": summary, "content": content}}
    if not always_ok:
        responses["503"] = {"description": summary, "content": content}
    responses["401"] = _answer("no bearer token, or a wrong one, where one is needed")
    operation: dict[str, Any] = {"summary": summary, "responses": responses}
    if not guarded:
        operation["security"] = [{}, {"bearer": []}]
    return {"get": operation}


LIVENESS = {
    "type": "object",
    "required": ["status", "seconds_since_main_loop_tick"],
    "properties": {
        "status": {"enum": ["ok", "stuck"]},
        "seconds_since_main_loop_tick": {"type": "number"},
    },
}
READINESS = {
    "type": "object",
    "required": ["ready", "engine", "engine_state", "problems"],
    "properties": {
        "ready": {"type": "boolean"},
        "engine": {"type": "string"},
        "engine_state": {"type": "string"},
        "problems": {"type": "array", "items": {"type": "string"}},
    },
}


def document(
    version: str, max_upload_mb: float, models: dict[str, type[BaseModel]]
) -> dict[str, Any]:
    models = {**models, "StatusReport": StatusReport}
    _, schemas = models_json_schema(
        [(model, "serialization") for model in models.values()], ref_template=REF
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ocrd",
            "version": version,
            "description": "Hand files to the OCR daemon over HTTP and fetch their Markdown. "
            "Clients other than loopback send `Authorization: Bearer <token>` (the token in "
            "the environment variable `http.token_env` names); uploads always do.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": _paths(max_upload_mb),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                **schemas.get("$defs", {}),
                "Liveness": LIVENESS,
                "Readiness": READINESS,
            },
        },
    }
