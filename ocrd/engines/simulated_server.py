"""A simulated engine replica: one process speaking the HTTP of `vllm serve`, for tests of
ocrd's replica machinery (routing, supervision, self-check, metrics) and benchmarks at GPU
speed on a machine without a GPU.

    python -m ocrd.engines.simulated_server --replica 2 --socket /dev/shm/.../replica2.sock \\
        --media /dev/shm/.../pages [--seconds-per-page 0.5] [--capacity 16] ...

It answers `GET /health`, `GET /v1/models`, `GET /metrics` (a few `vllm:*` gauges and
counters with vLLM's names) and `POST /v1/chat/completions`. A page takes
`--seconds-per-page`, up to `--capacity` at once (more wait), and its text is the in-process
simulated engine's: derived from the pixels it is sent (a `file://` URL in the media folder
or a data URL), never read from them. Requests need `Authorization: Bearer <key>` with the
key from $OCRD_REPLICA_API_KEY, as ocrd's vLLM replicas do. With `--exit-on-marked-pages`
the process exits at once (status 3) when it is sent a page whose top-left corner is magenta:
a stand-in for a page that crashes the engine; with `--refuse-page-once N` the first request
for page N is answered 503, as a loaded server refuses one request and serves on.

For tests of fleets and ocrd's self-check: with `--answers-test-page` it answers ocrd's test
page with the text ocrd drew on it, as a model that reads would. It knows the page by its
pixels (the same as selfcheck.check_page() draws): nothing in ocrd's request tells the test
page from a page. With `--garble` it answers everything, the test page too, with
fluent-looking noise, as vLLM 0.19 answers DeepSeek-OCR-2 (vLLM #39919); with
`--reads-first N` it reads its first N requests and garbles all later ones, as a server
that guesses which request is the check would. `--record-file` appends one line per request
it receives (method, path, the Authorization header it was sent), for tests of what a
server is sent. With `--model NAME` its answers are in that model's format
(simulated_answers.py), and the test page it knows is that model's.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from aiohttp import web
from PIL import Image

from ocrd.config import PromptMode
from ocrd.engines.checkpage import draw_check_page
from ocrd.engines.recipes import default_model, prompt_for
from ocrd.engines.simulated import fingerprint
from ocrd.engines.simulated_answers import page_answer, test_page_answer
from ocrd.models import model as model_named

MARK = (255, 0, 255)  # magenta
MARK_SIDE = 4  # the top-left MARK_SIDE x MARK_SIDE pixels
CRASH_STATUS = 3
GARBLE = "l l l l ,,,, 0 0 0 :: " * 20  # what garbled output looks like: no word of the page


def marked(image: Image.Image) -> bool:
    """Whether the page carries the crash mark in its top-left corner."""
    corner = image.convert("RGB").crop((0, 0, MARK_SIDE, MARK_SIDE))
    return corner.tobytes() == bytes(MARK) * (MARK_SIDE * MARK_SIDE)


class SimulatedReplica:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.key = os.environ.get("OCRD_REPLICA_API_KEY")
        self.media = Path(args.media).resolve() if args.media else None
        self.slots = asyncio.Semaphore(args.capacity)
        self.running = 0
        self.done = 0
        self.refused = False
        self.recipe = model_named(args.model) if args.model else default_model()
        self._test_page: Image.Image | None = None

    def is_test_page(self, image: Image.Image) -> bool:
        if self._test_page is None:  # the model's test page, as ocrd draws it
            check = self.recipe.self_check
            self._test_page = draw_check_page(check.page, check.long_side)
        test = self._test_page
        return image.size == test.size and image.convert("RGB").tobytes() == test.tobytes()

    @web.middleware
    async def record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.args.record_file:
            authorization = request.headers.get("Authorization", "-")
            with open(self.args.record_file, "a") as record:
                record.write(f"{request.method} {request.path} {authorization}\n")
        response: web.StreamResponse = await handler(request)
        return response

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[self.record])
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        if not self.authorised(request):
            return web.json_response({"error": "invalid api key"}, status=401)
        return web.json_response({"data": [{"id": "simulated", "object": "model"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        labels = '{model_name="simulated"}'
        return web.Response(
            text=(
                "# HELP vllm:num_requests_running Requests being worked on (simulated).\n"
                "# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{labels} {self.running}\n"
                "# HELP vllm:request_success_total Requests answered (simulated).\n"
                "# TYPE vllm:request_success_total counter\n"
                f"vllm:request_success_total{labels} {self.done}\n"
            )
        )

    def authorised(self, request: web.Request) -> bool:
        return self.key is None or request.headers.get("Authorization") == f"Bearer {self.key}"

    async def chat(self, request: web.Request) -> web.Response:
        if not self.authorised(request):
            return web.json_response({"error": "invalid api key"}, status=401)
        body = await request.json()
        try:
            url, prompt = _image_and_prompt(body)
            image = self.load(url)
        except (KeyError, StopIteration, ValueError, OSError) as error:
            return web.json_response({"error": f"bad request: {error}"}, status=400)
        if self.args.exit_on_marked_pages and marked(image):
            print(f"simulated replica {self.args.replica}: marked page, exiting", flush=True)
            os._exit(CRASH_STATUS)
        size, digest = image.size, fingerprint(image)
        test_page = self.args.answers_test_page and self.is_test_page(image)
        del image
        request_id = request.headers.get("X-Request-Id", "")
        page = _page_number(request_id)
        if self.args.refuse_page_once and page == self.args.refuse_page_once and not self.refused:
            self.refused = True  # a refusal of one page by a server that still serves
            return web.json_response({"error": "overloaded, try again"}, status=503)
        text_prompt = prompt_for(self.recipe, PromptMode.text)
        layout_prompt = prompt_for(self.recipe, PromptMode.layout)
        asked_text = text_prompt != layout_prompt and text_prompt.endswith(prompt.strip() or "-")
        mode = PromptMode.text if asked_text else PromptMode.layout
        async with self.slots:
            self.running += 1
            try:
                await asyncio.sleep(self.args.seconds_per_page)
            finally:
                self.running -= 1
        self.done += 1
        if self.args.answers_file:  # one line per answer, kept across restarts (tests)
            with open(self.args.answers_file, "a") as answers:
                answers.write(request_id + (" test-page\n" if test_page else "\n"))
        unfinished = (
            mode is PromptMode.layout
            and self.args.unfinished_every > 0
            and page % self.args.unfinished_every == 0
        )
        text = self.text(test_page, page, size, digest, mode)
        return web.json_response(
            {
                "object": "chat.completion",
                "model": "simulated",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "length" if unfinished else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": 257,
                    "completion_tokens": self.args.tokens_per_page,
                },
            }
        )

    def text(
        self, test_page: bool, page: int, size: tuple[int, int], digest: str, mode: PromptMode
    ) -> str:
        if self.args.garble or (self.args.reads_first and self.done > self.args.reads_first):
            return GARBLE
        if test_page:
            return test_page_answer(self.recipe)
        return page_answer(self.recipe, page, size, digest, mode)

    def load(self, url: str) -> Image.Image:
        if url.startswith("data:"):
            return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
        parsed = urlparse(url)
        if parsed.scheme != "file" or self.media is None:
            raise ValueError("only data URLs and file URLs in the media folder")
        path = Path(unquote(parsed.path)).resolve()
        if self.media not in path.parents:
            raise ValueError(f"{path} is outside the media folder")
        image = Image.open(path)
        image.load()
        return image


def _image_and_prompt(body: dict[str, Any]) -> tuple[str, str]:
    content = body["messages"][0]["content"]
    url = next(part["image_url"]["url"] for part in content if part["type"] == "image_url")
    prompt = " ".join(part.get("text", "") for part in content if part["type"] == "text")
    return url, prompt


def _page_number(request_id: str) -> int:
    """ocrd names its requests ...-page-N; the simulated text says which page it was."""
    match = re.search(r"-page-(\d+)$", request_id)
    return int(match.group(1)) if match else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replica", type=int, required=True, help="its number, for people")
    parser.add_argument("--socket", help="Unix socket to listen on")
    parser.add_argument("--port", type=int, help="TCP port on 127.0.0.1 instead")
    parser.add_argument("--media", help="the folder file:// URLs may point into")
    parser.add_argument("--seconds-per-page", type=float, default=0.5)
    parser.add_argument("--capacity", type=int, default=16)
    parser.add_argument("--tokens-per-page", type=int, default=400)
    parser.add_argument("--unfinished-every", type=int, default=0)
    parser.add_argument("--exit-on-marked-pages", action="store_true")
    parser.add_argument("--answers-test-page", action="store_true")
    parser.add_argument("--garble", action="store_true")
    parser.add_argument("--answers-file", help="append each answered request's id here")
    parser.add_argument("--reads-first", type=int, default=0, help="then garbles")
    parser.add_argument("--record-file", help="append each request's method, path, key")
    parser.add_argument("--refuse-page-once", type=int, default=0, help="503 its first request")
    parser.add_argument("--model", help="answer as this OCR model writes (ocrd.models' names)")
    args = parser.parse_args(argv)
    if (args.socket is None) == (args.port is None):
        parser.error("give exactly one of --socket and --port")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    replica = SimulatedReplica(args)
    web.run_app(
        replica.app(),
        path=args.socket,
        host="127.0.0.1" if args.port else None,
        port=args.port,
        print=None,
        access_log=None,
        handle_signals=True,
    )


if __name__ == "__main__":
    main()
