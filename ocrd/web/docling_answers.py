"""Answers of docling-serve's API that hold no request handling: a task's result (a
conversion's, or a chunk task's), `GET /version`, and errors in docling-serve's shape
(`{"detail": ...}`) for what aiohttp answers by itself on these routes (an unknown route
under `/v1/`, a method a route does not take)."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from dataclasses import replace
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from ocrd import __version__
from ocrd.web.docling_chunks import chunk_answer
from ocrd.web.tasks import Images, Task, docling_document, document_content, errors_of

DOCLING_PREFIX = "/v1/"
DOCLING_PATHS = ("/health", "/version")


def result_body(task: Task, images: Images) -> dict[str, Any]:
    """docling-serve's answer to a settled task: ConvertDocumentResponse, or for a chunk
    task ChunkDocumentResponse. Blocking."""
    result = {
        "status": task.status.value,
        "errors": errors_of(task),
        "processing_time": task.processing_time,
    }
    chunking = task.options.chunking
    if chunking is None:
        return {"document": document_content(task, images), **result, "timings": {}}
    asked = ("json",) if task.options.include_converted_doc else ()
    content = document_content(
        replace(task, options=task.options.model_copy(update={"to_formats": asked})), images
    )
    return chunk_answer(docling_document(task, images), content, result, chunking)


def versions() -> dict[str, str]:
    """What docling-serve's `/version` names: the server's version and docling-core's
    (whose DoclingDocument ocrd writes), and Python's."""
    return {
        "ocrd": __version__,
        "docling-core": importlib.metadata.version("docling-core"),
        "python": f"{sys.implementation.cache_tag} ({platform.python_version()})",
    }


async def version(request: web.Request) -> web.Response:
    return web.json_response(versions())


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own errors (404, 405, 413) on docling-serve's paths, as docling-serve gives
    them: JSON with `detail`."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        docling = request.path.startswith(DOCLING_PREFIX) or request.path in DOCLING_PATHS
        if error.status < 400 or not docling:
            raise
        response = web.json_response({"detail": error.reason}, status=error.status)
        for name in ("Allow", "Retry-After"):
            if name in error.headers:
                response.headers[name] = error.headers[name]
        return response
