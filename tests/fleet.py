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
  (it knows the self-check request by its request id, not by its pixels);
- `crash_on_marked_pages = True`: a page whose top-left corner is magenta makes the server
  go away (in-flight requests dropped, as a crashing server's are) and come back a moment
  later, as a server under a supervisor would.

It is named a stand-in everywhere it is used: it reads nothing on the page.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import socket
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
    def __init__(self, delay: float = 0.2, api_key: str | None = None) -> None:
        self.port = free_port()
        self.delay = delay
        self.api_key = api_key
        self.refuse_pages = False
        self.garbled = False
        self.crash_on_marked_pages = False
        self.crashes = 0
        self.self_checks = 0
        self.answered = 0
        self.dropped = 0
        self._server: ThreadingHTTPServer | None = None
        self._generation = 0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                if not fleet._authorised(self):
                    return self._json(401, {"error": "invalid api key"})
                if self.path.rstrip("/") != "/v1/models":
                    return self._json(404, {"error": "not found"})
                self._json(200, {"data": [{"id": "stand-in", "object": "model"}]})

            def do_POST(self) -> None:
                generation = fleet._generation
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not fleet._authorised(self):
                    return self._json(401, {"error": "invalid api key"})
                if self.headers.get("X-Request-Id", "").startswith("ocrd-self-check"):
                    with fleet._lock:
                        fleet.self_checks += 1
                    return self._json(200, fleet._self_check_answer())
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

    def _self_check_answer(self) -> dict[str, Any]:
        from ocrd.engines.selfcheck import expected_text

        text = "l l l l ,,,, 0 0 0 ::" * 20 if self.garbled else expected_text()
        return {
            "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 257, "completion_tokens": 120},
        }

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


def _marked(body: dict[str, Any]) -> bool:
    from ocrd.engines.simulated_server import marked

    content = body["messages"][0]["content"]
    url = next(part["image_url"]["url"] for part in content if part["type"] == "image_url")
    return marked(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))


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
