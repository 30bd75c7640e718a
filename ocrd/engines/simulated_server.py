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
pixels (selfcheck.check_page()'s fixed page, or a page selfcheck.draw_check() drew,
read by CheckReader): nothing in ocrd's request tells the test
page from a page. With `--garble` it answers everything, the test page too, with
fluent-looking noise, as vLLM 0.19 answers DeepSeek-OCR-2 (vLLM #39919); with
`--replays-seen` it reads only its first request, then answers a picture it was sent
before with that answer and garbles new ones (a server that caches by picture). With
`--reads-first N` it reads its first N requests and garbles all later ones, as a server
that guesses which request is the check would. `--record-file` appends one line per request
it receives (method, path, the Authorization header it was sent), for tests of what a
server is sent.
With `--model NAME` its answers, the test page's too, are written in that model's format
(simulated_answers.py).
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

import numpy as np
from aiohttp import web
from PIL import Image

from ocrd.config import PromptMode
from ocrd.engines.recipes import default_model, prompt_for
from ocrd.engines.selfcheck import COLUMNS, DRAWN_ROWS, TABLE, check_page, expected_text
from ocrd.engines.simulated import fingerprint
from ocrd.engines.simulated_answers import element_answer, page_answer, written_as
from ocrd.models import model as model_named

Pixels = np.ndarray[Any, Any]
MARK = (255, 0, 255)  # magenta
MARK_SIDE = 4  # the top-left MARK_SIDE x MARK_SIDE pixels
CRASH_STATUS = 3
GARBLE = "l l l l ,,,, 0 0 0 :: " * 20  # what garbled output looks like: no word of the page


def marked(image: Image.Image) -> bool:
    """Whether the page carries the crash mark in its top-left corner."""
    corner = image.convert("RGB").crop((0, 0, MARK_SIDE, MARK_SIDE))
    return corner.tobytes() == bytes(MARK) * (MARK_SIDE * MARK_SIDE)


class CheckReader:
    """Reads ocrd's drawn test page (selfcheck.draw_check) without a model: every pixel
    outside the table's body cells is the blank page's, and each cell's pixels are those
    of one word of its column, drawn there. Anything else is not the test page."""

    def __init__(self) -> None:
        blank = tuple(("",) * len(TABLE[0]) for _ in range(DRAWN_ROWS))
        self.blank = np.asarray(check_page((TABLE[0], *blank)))
        changed = np.zeros(self.blank.shape[:2], dtype=bool)
        # A page with each column's k-th word in all its cells, for k up to the list's end.
        self.filled: list[Pixels] = []
        for k in range(max(len(column) for column in COLUMNS)):
            row = tuple(column[k % len(column)] for column in COLUMNS)
            filled = np.asarray(check_page((TABLE[0], *(row,) * DRAWN_ROWS)))
            changed |= (filled != self.blank).any(axis=2)
            self.filled.append(filled)
        self.cells = _cell_boxes(changed, DRAWN_ROWS, len(COLUMNS))

    def read(self, image: Image.Image) -> str | None:
        """The page's text if `image` is a drawn test page, else None."""
        if image.size != (self.blank.shape[1], self.blank.shape[0]):
            return None
        seen = np.asarray(image.convert("RGB"))
        outside = seen.copy()
        for top, bottom, left, right in self.cells.values():
            outside[top:bottom, left:right] = self.blank[top:bottom, left:right]
        if not np.array_equal(outside, self.blank):
            return None
        rows = []
        for r in range(DRAWN_ROWS):
            row = tuple(self._word(seen, r, c) for c in range(len(COLUMNS)))
            if None in row:
                return None
            rows.append(tuple(str(word) for word in row))
        return expected_text((TABLE[0], *rows))

    def _word(self, seen: Pixels, r: int, c: int) -> str | None:
        top, bottom, left, right = self.cells[(r, c)]
        for k, filled in enumerate(self.filled):
            if k < len(COLUMNS[c]) and np.array_equal(
                seen[top:bottom, left:right], filled[top:bottom, left:right]
            ):
                return COLUMNS[c][k]
        return None


def _cell_boxes(
    changed: Pixels, rows: int, columns: int
) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    """The (top, bottom, left, right) pixel box of each body cell: the rows and columns of
    pixels that the words ever change, split into runs."""
    ys = _runs(np.flatnonzero(changed.any(axis=1)))
    xs = _runs(np.flatnonzero(changed.any(axis=0)), gap=20)  # a word's letters are one run
    assert (len(ys), len(xs)) == (rows, columns), (ys, xs)
    return {
        (r, c): (ys[r][0], ys[r][1] + 1, xs[c][0], xs[c][1] + 1)
        for r in range(rows)
        for c in range(columns)
    }


def _runs(indices: Pixels, gap: int = 1) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for index in indices.tolist():
        if runs and index <= runs[-1][1] + gap:
            runs[-1] = (runs[-1][0], index)
        else:
            runs.append((index, index))
    return runs


class SimulatedReplica:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.key = os.environ.get("OCRD_REPLICA_API_KEY")
        self.media = Path(args.media).resolve() if args.media else None
        self.slots = asyncio.Semaphore(args.capacity)
        self.running = 0
        self.done = 0
        self.refused = False
        self.seen: dict[str, str] = {}  # each picture's answer (--replays-seen)
        self.recipe = model_named(args.model) if args.model else default_model()
        # Drawn before serving (a few seconds): a check's answer must not wait on it.
        self._reader = CheckReader() if args.answers_test_page else None

    def read_test_page(self, image: Image.Image) -> str | None:
        """The text of ocrd's test page (the fixed one, or a drawn one), if it is one."""
        if self._reader is None:
            self._reader = CheckReader()
        if image.size == self._reader.blank.shape[1::-1]:
            fixed = check_page()
            if image.convert("RGB").tobytes() == fixed.tobytes():
                return expected_text()
        return self._reader.read(image)

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
        test_text = self.read_test_page(image) if self.args.answers_test_page else None
        test_page = test_text is not None
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
        task = self.element_task(prompt) if not test_page else None
        text = (
            self.text(test_text, page, size, digest, mode)
            if task is None
            else element_answer(self.recipe, task, page, size, digest)
        )
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

    def element_task(self, prompt: str) -> str | None:
        """With --reads-elements: the model's task whose prompt this is (each request is
        one region of a page, from ocrd's layout stage); None otherwise."""
        if not self.args.reads_elements:
            return None
        asked = prompt.strip()
        return next((p.task for p in self.recipe.prompts if p.text.strip() == asked), None)

    def text(
        self,
        test_text: str | None,
        page: int,
        size: tuple[int, int],
        digest: str,
        mode: PromptMode,
    ) -> str:
        if self.args.garble or (self.args.reads_first and self.done > self.args.reads_first):
            return GARBLE
        if self.args.replays_seen and self.done > 1:  # a cache by picture: new ones garbled
            return self.seen.get(digest, GARBLE)
        text = self._read(test_text, page, size, digest, mode)
        if self.args.replays_seen:
            self.seen[digest] = text
        return text

    def _read(
        self,
        test_text: str | None,
        page: int,
        size: tuple[int, int],
        digest: str,
        mode: PromptMode,
    ) -> str:
        """The answer, written as the model (`--model`) writes a page."""
        if test_text is not None:
            return written_as(self.recipe, test_text, size)
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
    parser.add_argument(
        "--replays-seen",
        action="store_true",
        help="reads its first request; then answers a picture seen before as it did, "
        "and garbles new ones",
    )
    parser.add_argument("--record-file", help="append each request's method, path, key")
    parser.add_argument("--refuse-page-once", type=int, default=0, help="503 its first request")
    parser.add_argument("--model", help="answer as this OCR model writes (ocrd.models' names)")
    parser.add_argument(
        "--reads-elements",
        action="store_true",
        help="answer each request as one region of a page: the element its prompt asks "
        "for (ocrd's layout stage), not a whole page",
    )
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
