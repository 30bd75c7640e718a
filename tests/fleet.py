"""A stand-in for an inference fleet member: an OpenAI-compatible server on loopback.

Tests of the daemon's own fleet logic need a server that can vanish and come back on cue,
which real `vllm serve` on a CPU cannot do in test time. This one speaks the same API
(`GET /v1/models`, `POST /v1/chat/completions` with a PNG data URL), answers after a delay
with text in the shape of DeepSeek-OCR-2's grounding output, and can be switched:

- `stop()`: in-flight requests are dropped without an answer, new connections refused;
- `start()`: serving again on the same port;
- `refuse_pages = True`: every page is answered `400 Bad Request`;
- `api_key`: requests without `Authorization: Bearer <key>` get `401`;
- `garbled = True`: ocrd's self-check page is answered with noise (as vLLM 0.19 answers
  DeepSeek-OCR-2); otherwise the stand-in "reads" it by answering the text ocrd drew on it
  (it knows the test page by its pixels: nothing in ocrd's request tells it from a page);
  every request's method, path and headers are kept in `requests`;
- `crash_on_marked_pages = True`: a page whose top-left corner is magenta makes the server
  go away (in-flight requests dropped, as a crashing server's are) and come back a moment
  later, as a server under a supervisor would.

It is named a stand-in everywhere it is used: it reads nothing on the page.

`StandInRouter` is a stand-in for a router's worker API (`GET /workers`): it lists what it
is told, or answers an endless body (`endless_bytes`), as a hostile router would.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from conftest import write_config
from PIL import Image


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StandInFleetServer:
    def __init__(
        self, delay: float = 0.2, api_key: str | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        self.port = free_port()
        self.tls = tls  # serve https with this (server-side) context
        self.delay = delay
        self.api_key = api_key
        self.refuse_pages = False
        self.garbled = False
        self.crash_on_marked_pages = False
        self.crashes = 0
        self.self_checks = 0
        self.answered = 0
        self.dropped = 0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        # Each chat request: its headers, its body, and whether it carried the test page.
        self.posts: list[tuple[dict[str, str], dict[str, Any], bool]] = []
        self._server: ThreadingHTTPServer | None = None
        self._generation = 0
        self._lock = threading.Lock()
        self._reader: Any = None  # a CheckReader, made at the first page

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def https_url(self, host: str) -> str:
        return f"https://{host}:{self.port}/v1"

    def start(self) -> None:
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                fleet._record(self)
                if not fleet._authorised(self):
                    return self._json(401, {"error": "invalid api key"})
                if self.path.rstrip("/") != "/v1/models":
                    return self._json(404, {"error": "not found"})
                self._json(200, {"data": [{"id": "stand-in", "object": "model"}]})

            def do_POST(self) -> None:
                generation = fleet._generation
                fleet._record(self)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not fleet._authorised(self):
                    return self._json(401, {"error": "invalid api key"})
                test_text = fleet._test_page_text(body)
                test_page = test_text is not None
                with fleet._lock:
                    fleet.posts.append((dict(self.headers.items()), body, test_page))
                if test_text is not None:
                    with fleet._lock:
                        fleet.self_checks += 1
                    return self._json(200, fleet._self_check_answer(test_text))
                if fleet.crash_on_marked_pages and _marked(body):
                    with fleet._lock:
                        fleet.crashes += 1
                    threading.Thread(target=fleet._crash_and_return, daemon=True).start()
                time.sleep(fleet.delay)
                if fleet._generation != generation or fleet._server is None:
                    with fleet._lock:
                        fleet.dropped += 1
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)  # gone without an answer
                    return None
                if fleet.refuse_pages:
                    return self._json(400, {"error": "image could not be processed"})
                with fleet._lock:
                    fleet.answered += 1
                self._json(200, fleet._answer(body))

            def _json(self, status: int, data: dict[str, Any]) -> None:
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        ThreadingHTTPServer.allow_reuse_address = True
        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        if self.tls is not None:  # a handshake that fails never reaches the handler
            server.socket = self.tls.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        server, self._server = self._server, None
        self._generation += 1
        if server is not None:
            server.shutdown()
            server.server_close()

    def _crash_and_return(self) -> None:
        self.stop()
        time.sleep(1.0)  # down long enough for ocrd's probe to find it gone
        self.start()

    def _test_page_text(self, body: dict[str, Any]) -> str | None:
        """The text of ocrd's test page if the page sent is one (read by its pixels)."""
        from ocrd.engines.simulated_server import CheckReader

        with self._lock:
            if self._reader is None:
                self._reader = CheckReader()
        return self._reader.read(_image(body))

    def _self_check_answer(self, test_text: str) -> dict[str, Any]:
        text = "l l l l ,,,, 0 0 0 ::" * 20 if self.garbled else test_text
        return {
            "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 257, "completion_tokens": 120},
        }

    def _record(self, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.requests.append((handler.command, handler.path, dict(handler.headers.items())))

    def _authorised(self, handler: BaseHTTPRequestHandler) -> bool:
        return self.api_key is None or handler.headers.get("Authorization") == (
            f"Bearer {self.api_key}"
        )

    @staticmethod
    def _answer(body: dict[str, Any]) -> dict[str, Any]:
        content = body["messages"][0]["content"]
        url = next(part["image_url"]["url"] for part in content if part["type"] == "image_url")
        digest = hashlib.sha256(base64.b64decode(url.split(",", 1)[1])).hexdigest()[:16]
        text = (
            "<|ref|>title<|/ref|><|det|>[[60, 40, 940, 90]]<|/det|>\n# A page from the fleet\n\n"
            f"<|ref|>text<|/ref|><|det|>[[60, 120, 940, 200]]<|/det|>\nImage digest {digest}."
        )
        return {
            "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 257, "completion_tokens": 40},
        }


def _image(body: dict[str, Any]) -> Image.Image:
    content = body["messages"][0]["content"]
    url = next(part["image_url"]["url"] for part in content if part["type"] == "image_url")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def _marked(body: dict[str, Any]) -> bool:
    from ocrd.engines.simulated_server import marked

    return marked(_image(body))


class StandInRouter:
    """A router's `GET /workers` on loopback: lists `workers`, or, with `endless_bytes`,
    answers a body of that many bytes (a JSON list that never closes) without a length."""

    def __init__(self, workers: list[str]) -> None:
        self.port = free_port()
        self.workers = workers
        self.endless_bytes = 0
        self.sent = 0  # bytes of the last endless answer that went out
        self.reads = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        router = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection closes

            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                router.reads += 1
                if self.path != "/workers":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                if router.endless_bytes:
                    router._endless(self)
                    return
                listed = [{"url": url} for url in router.workers]
                self.wfile.write(json.dumps({"workers": listed}).encode())

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def _endless(self, handler: BaseHTTPRequestHandler) -> None:
        entry = b'{"url": "http://127.0.0.1:9"}, ' * 2048
        self.sent = 0
        try:
            handler.wfile.write(b'{"workers": [')
            while self.sent < self.endless_bytes:
                handler.wfile.write(entry)
                self.sent += len(entry)
        except (BrokenPipeError, ConnectionResetError):
            return  # the reader gave up: what it should do

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


def fleet_config(tmp_path: Path, fleet: StandInFleetServer, **openai: object) -> Path:
    """A config with one inbox whose engine is `fleet` (quick retries, small pages)."""
    engine = {
        "kind": "openai",
        "openai": {
            "base_urls": [fleet.url],
            "max_concurrency": 4,
            "retry_backoff_seconds": 0.2,
            "request_timeout_seconds": 30,
            **openai,
        },
    }
    return write_config(tmp_path, {"max_image_side": 768}, engine=engine)
