"""The interactive API page at `/docs` (Swagger UI, served from the files of the pinned
`swagger-ui-bundle-v2` package: no CDN, no validator, no request to anywhere but ocrd; its
files need no token, the descriptions and API calls the page makes send the token it was
opened with, `/docs?token=...`), and the OpenAPI 3.1
description of docling-serve's routes as ocrd serves them at `/openapi.json` (where
docling-serve serves its own); the page shows it and the documents API's
(`/api/openapi.json`)."""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Any

from aiohttp import web

from ocrd import __version__

STATIC = (
    "swagger-ui.css",
    "index.css",
    "swagger-ui-bundle.js",
    "swagger-ui-standalone-preset.js",
    "favicon-32x32.png",
    "favicon-16x16.png",
)
PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="UTF-8"><title>ocrd API</title>
<link rel="stylesheet" href="/docs/static/swagger-ui.css">
<link rel="stylesheet" href="/docs/static/index.css">
<link rel="icon" type="image/png" href="/docs/static/favicon-32x32.png" sizes="32x32">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/static/swagger-ui-bundle.js"></script>
<script src="/docs/static/swagger-ui-standalone-preset.js"></script>
<script src="/docs/initializer.js"></script>
</body>
</html>
"""
INITIALIZER = """window.onload = function () {
  // The token the browser came with (/docs?token=...), sent with the page's own requests
  // to this server only: the descriptions, and "Try it out" from a host other than loopback.
  var token = new URLSearchParams(window.location.search).get("token");
  window.ui = SwaggerUIBundle({
    urls: [
      {url: "/openapi.json", name: "docling-serve API (v1)"},
      {url: "/api/openapi.json", name: "ocrd documents API"}
    ],
    dom_id: "#swagger-ui",
    deepLinking: true,
    // Swagger UI's default sends the description's URL to validator.swagger.io: none.
    validatorUrl: null,
    requestInterceptor: function (request) {
      var here = new URL(request.url, window.location.href).origin === window.location.origin;
      if (token && here && !request.headers.Authorization) {
        request.headers.Authorization = "Bearer " + token;
      }
      return request;
    },
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    layout: "StandaloneLayout"
  });
};
"""


def _bundle() -> Path:
    import swagger_ui_bundle  # the pinned package's files

    return Path(str(swagger_ui_bundle.swagger_ui_path))


async def page(request: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")


async def initializer(request: web.Request) -> web.Response:
    return web.Response(text=INITIALIZER, content_type="application/javascript")


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in STATIC:
        raise web.HTTPNotFound()
    path = _bundle() / name
    content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return web.FileResponse(
        path, headers={"Content-Type": content_type, "Cache-Control": "max-age=86400"}
    )


def add_routes(router: web.UrlDispatcher, description: dict[str, Any]) -> None:
    async def openapi(request: web.Request) -> web.Response:
        return web.json_response(description)

    router.add_get("/docs", page)
    router.add_get("/docs/initializer.js", initializer)
    router.add_get("/docs/static/{name}", static)
    router.add_get("/openapi.json", openapi)


# --- the description -----------------------------------------------------------------------------

REF = "#/components/schemas/{}"


def _json(schema: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": REF.format(schema)}}}


def _answers(ok: str, *errors: int) -> dict[str, Any]:
    answers: dict[str, Any] = {"200": {"description": "OK", "content": _json(ok)}}
    for status in errors:
        answers[str(status)] = {"description": ERRORS[status], "content": _json("Detail")}
    return answers


ERRORS = {
    400: "no file, an empty file, a malformed body",
    401: "no token, or a wrong one (X-Api-Key or Authorization: Bearer)",
    403: "no inbox takes uploads, or no token is configured",
    404: "no such task (or its result is not there yet)",
    408: "the request took too long",
    413: "the file is over http.max_upload_mb",
    422: "an option, source or target ocrd does not serve: `detail` names it",
    503: "the inbox's disk refused the file",
    504: "not converted within http.docling.max_sync_wait_seconds; the task goes on",
}
OPTIONS = {
    "to_formats": {
        "type": "array",
        "items": {"enum": ["md", "json", "text", "html", "doctags"]},
        "default": ["md"],
    },
    "image_export_mode": {
        "enum": ["placeholder", "embedded", "referenced"],
        "default": "placeholder",
    },
    "page_range": {
        "type": "array",
        "items": {"type": "integer", "minimum": 1},
        "minItems": 2,
        "maxItems": 2,
    },
    "do_ocr": {
        "type": "boolean",
        "default": True,
        "description": "false: a page's text layer wherever it is good (pdf_text: prefer)",
    },
    "force_ocr": {
        "type": "boolean",
        "default": False,
        "description": "true: every page from its pixels (pdf_text: ocr)",
    },
    "include_images": {"type": "boolean", "default": True},
    "md_page_break_placeholder": {"type": "string"},
    "from_formats": {"type": "array", "items": {"type": "string"}},
    "abort_on_error": {"type": "boolean", "default": False},
    "md_compact_tables": {"type": "boolean", "default": False},
}
TEXT_OR_NULL = {"type": ["string", "null"]}
CHUNKING = {
    "use_markdown_tables": {"type": "boolean", "default": False},
    "use_markdown_images": {"const": False, "default": False},
    "image_placeholder": {"type": "string", "maxLength": 1000, "default": "![IMAGE]"},
    "include_raw_text": {"type": "boolean", "default": False},
    "max_tokens": {
        "type": ["integer", "null"],
        "minimum": 16,
        "maximum": 1000000,
        "description": "hybrid only; tokens counted without a downloaded vocabulary",
    },
    "tokenizer": {"const": "sentence-transformers/all-MiniLM-L6-v2", "description": "hybrid only"},
    "merge_peers": {"type": "boolean", "default": True, "description": "hybrid only"},
}
# How a conversion ended, in a convert result and in each document of a chunk result.
OUTCOME = {
    "status": {"enum": ["success", "partial_success", "failure"]},
    "errors": {"type": "array", "items": {"type": "object"}},
    "timings": {"type": "object"},
}
SCHEMAS: dict[str, Any] = {
    "Detail": {"type": "object", "properties": {"detail": {"type": "string"}}},
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"enum": ["ok", "unavailable"]}, "detail": {"type": "string"}},
    },
    "FileSource": {
        "type": "object",
        "required": ["kind", "base64_string", "filename"],
        "properties": {
            "kind": {"const": "file"},
            "base64_string": {"type": "string", "contentEncoding": "base64", "minLength": 1},
            "filename": {"type": "string", "minLength": 1},
        },
    },
    "HttpSource": {
        "type": "object",
        "required": ["kind", "url"],
        "properties": {
            "kind": {"const": "http"},
            "url": {"type": "string", "format": "uri"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "description": "only from a host http.docling.url_hosts lists",
    },
    "Options": {
        "type": "object",
        "properties": OPTIONS,
        "description": "other docling-serve options only with their default value",
    },
    "TaskStatus": {
        "type": "object",
        "required": ["task_id", "task_status"],
        "properties": {
            "task_id": {"type": "string"},
            "task_type": {"enum": ["convert", "chunk"]},
            "task_status": {
                "enum": ["pending", "started", "success", "partial_success", "failure"]
            },
            "task_position": {"type": ["integer", "null"]},
            "task_meta": {"type": "object"},
            "error_message": {"type": ["string", "null"]},
        },
    },
    "ConvertResult": {
        "type": "object",
        "properties": {
            "document": {"$ref": REF.format("Document")},
            **OUTCOME,
            "processing_time": {"type": "number"},
        },
    },
    "Document": {
        "type": "object",
        "required": ["filename"],
        "properties": {
            "filename": {"type": "string"},
            **{f"{name}_content": TEXT_OR_NULL for name in ("md", "html", "text", "doctags")},
            "doclang_content": {"type": "null"},
            "json_content": {"type": ["object", "null"], "description": "a DoclingDocument"},
        },
        "description": "null for each format to_formats did not ask for",
    },
    "ChunkResult": {
        "type": "object",
        "required": ["chunks", "documents", "processing_time"],
        "properties": {
            "chunks": {"type": "array", "items": {"$ref": REF.format("Chunk")}},
            "documents": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "kind": {"const": "ExportResult"},
                        "content": {"$ref": REF.format("Document")},
                        **OUTCOME,
                    },
                },
            },
            "processing_time": {"type": "number"},
        },
    },
    "Chunk": {
        "type": "object",
        "required": ["filename", "chunk_index", "text", "doc_items"],
        "properties": {
            "filename": {"type": "string"},
            "chunk_index": {"type": "integer"},
            "text": {"type": "string", "description": "with its headings before it"},
            "raw_text": TEXT_OR_NULL,
            "num_tokens": {"type": ["integer", "null"], "description": "hybrid only"},
            "headings": {"type": ["array", "null"], "items": {"type": "string"}},
            "captions": {"type": ["array", "null"], "items": {"type": "string"}},
            "doc_items": {"type": "array", "items": {"type": "string"}},
            "page_numbers": {"type": ["array", "null"], "items": {"type": "integer"}},
            "metadata": {"type": ["object", "null"]},
        },
    },
    "ChunkSourceRequest": {
        "type": "object",
        "required": ["sources"],
        "properties": {
            "convert_options": {"$ref": REF.format("Options")},
            "chunking_options": {"type": "object", "properties": CHUNKING},
            "include_converted_doc": {"type": "boolean", "default": False},
            "sources": {
                "type": "array",
                "minItems": 1,
                "maxItems": 1,
                "items": {"$ref": REF.format("FileSource")},
            },
            "target": {"type": "object", "properties": {"kind": {"const": "inbody"}}},
        },
    },
    "Versions": {"type": "object", "additionalProperties": {"type": "string"}},
    "SourceRequest": {
        "type": "object",
        "required": ["sources"],
        "properties": {
            "options": {"$ref": REF.format("Options")},
            "sources": {
                "type": "array",
                "minItems": 1,
                "maxItems": 1,
                "items": {"$ref": REF.format("FileSource")},
            },
            "target": {"type": "object", "properties": {"kind": {"const": "inbody"}}},
        },
    },
}
FILE_PART = {
    "type": "string",
    "contentMediaType": "application/octet-stream",
    "minLength": 1,  # an empty file is refused (400)
}
FILE_BODY = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["files"],
            "properties": {
                "files": FILE_PART,
                "target_type": {"const": "inbody"},
                **OPTIONS,
            },
        }
    }
}
SOURCE_BODY = {"application/json": {"schema": {"$ref": REF.format("SourceRequest")}}}
CHUNK_FILE_BODY = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["files"],
            "properties": {
                "files": FILE_PART,
                "target_type": {"const": "inbody"},
                "include_converted_doc": {"type": "boolean", "default": False},
                **{f"convert_{name}": schema for name, schema in OPTIONS.items()},
                **{f"chunking_{name}": schema for name, schema in CHUNKING.items()},
            },
        }
    }
}
CHUNK_SOURCE_BODY = {"application/json": {"schema": {"$ref": REF.format("ChunkSourceRequest")}}}
TASK_ID = {"name": "task_id", "in": "path", "required": True, "schema": {"type": "string"}}
WAIT = {
    "name": "wait",
    "in": "query",
    "required": False,
    "schema": {"type": "number", "minimum": 0, "maximum": 300, "default": 0},
}
SECURITY: list[dict[str, list[str]]] = [{"apiKey": []}, {"bearer": []}]


def _convert(
    summary: str, body: dict[str, Any], asynchronous: bool, result: str = "ConvertResult"
) -> dict[str, Any]:
    errors = (400, 401, 403, 408, 413, 422, 503) + (() if asynchronous else (504,))
    ok = "TaskStatus" if asynchronous else result
    return {
        "post": {
            "summary": summary,
            "security": SECURITY,
            "requestBody": {"required": True, "content": body},
            "responses": _answers(ok, *errors),
        }
    }


def _chunk_paths() -> dict[str, Any]:
    """docling-serve's chunk routes: a task answered with the document's chunks."""
    paths = {}
    for chunker in ("hybrid", "hierarchical"):
        for kind, body in (("file", CHUNK_FILE_BODY), ("source", CHUNK_SOURCE_BODY)):
            path = f"/v1/chunk/{chunker}/{kind}"
            summary = f"Chunk a {kind} ({chunker} chunker)"
            paths[path] = _convert(f"{summary}, answered when done", body, False, "ChunkResult")
            paths[f"{path}/async"] = _convert(f"{summary} as a task", body, True)
    return paths


def describe(url_sources: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 description of docling-serve's routes as ocrd serves them; `http`
    sources only where `url_sources` (http.docling.url_hosts lists hosts)."""
    schemas = dict(SCHEMAS)
    if url_sources:
        kinds = [{"$ref": REF.format("FileSource")}, {"$ref": REF.format("HttpSource")}]
        request = dict(schemas["SourceRequest"])
        request["properties"] = {
            **request["properties"],
            "sources": {**request["properties"]["sources"], "items": {"oneOf": kinds}},
        }
        schemas["SourceRequest"] = request
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ocrd: docling-serve's conversion API",
            "version": __version__,
            "description": "docling-serve 1.38.2's v1 routes, answered by ocrd (docs/http.md, "
            "'docling-serve's API').",
        },
        "paths": {
            "/v1/convert/file": _convert("Convert a file, answered when done", FILE_BODY, False),
            "/v1/convert/file/async": _convert("Convert a file as a task", FILE_BODY, True),
            "/v1/convert/source": _convert(
                "Convert a source, answered when done", SOURCE_BODY, False
            ),
            "/v1/convert/source/async": _convert("Convert a source as a task", SOURCE_BODY, True),
            "/v1/status/poll/{task_id}": {
                "get": {
                    "summary": "A task's state (wait: until it settles)",
                    "parameters": [TASK_ID, WAIT],
                    "security": SECURITY,
                    "responses": _answers("TaskStatus", 401, 404, 422),
                }
            },
            "/v1/result/{task_id}": {
                "get": {
                    "summary": "A settled task's result",
                    "parameters": [TASK_ID],
                    "security": SECURITY,
                    "responses": {
                        **_answers("ConvertResult", 401, 404),
                        "200": {
                            "description": "a conversion's result, or a chunk task's",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "oneOf": [
                                            {"$ref": REF.format("ConvertResult")},
                                            {"$ref": REF.format("ChunkResult")},
                                        ]
                                    }
                                }
                            },
                        },
                    },
                }
            },
            **_chunk_paths(),
            "/version": {
                "get": {
                    "summary": "The versions of ocrd, docling-core and Python",
                    "security": SECURITY,
                    "responses": _answers("Versions", 401),
                }
            },
            "/health": {
                "get": {
                    "summary": "200 while conversions are taken; 503 naming why while every "
                    "one would be refused (no inbox takes uploads, no token set)",
                    "responses": {
                        status: {"description": "", "content": _json("Health")}
                        for status in ("200", "503")
                    },
                }
            },
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
                "bearer": {"type": "http", "scheme": "bearer"},
            },
        },
    }
