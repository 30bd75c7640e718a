"""One page through each tiny OCR model on real vLLM (CPU, random weights): engine start
time, time a page, peak memory, and the prompt's size.

    python benchmarks/tiny_engines.py [qwen2_5_vl lightonocr ...] [--image PNG] [--max-tokens 32]

Each architecture runs in its own child process, one after the other (one engine at a time:
each wants most of a 2-core machine and a few GB). The child builds the model folder of
tests/tiny_models.py, starts `vllm.LLM` with `load_format="dummy"` and float32 (as the
tests' DeepSeek-OCR-2 does), reads the page once to warm up and then times a second read of
the same page with vLLM's multimodal caches off, so that the image is processed again.
Peak memory is the highest summed RSS of the child and its descendants (vLLM's engine core
runs in a process of its own), sampled every 0.2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import REPO
from PIL import Image

sys.path.insert(0, str(REPO / "tests"))
from tiny_model import cpu_preload
from tiny_models import BUILDERS, TinyModel, engine_arguments

DEFAULT_IMAGE = REPO.parent / "shared" / "corpus" / "models" / "glm-ocr" / "glm-ocr__page.png"
MAX_IMAGE_SIDE = 768
INSTRUCTION = "Convert the document to markdown."


def tree_rss_bytes(root: int) -> int:
    """Summed resident memory of `root` and every process beneath it."""
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
        pending.extend(int(child) for child in children)
    return total


class PeakMemory:
    """The highest tree RSS seen while the block runs."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, tree_rss_bytes(os.getpid()))

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def page_image(path: Path) -> Image.Image:
    image = Image.open(path).convert("RGB")
    image.thumbnail((MAX_IMAGE_SIDE, MAX_IMAGE_SIDE))
    return image


def run_one(name: str, image_path: Path, max_tokens: int) -> dict[str, object]:
    from vllm import LLM, SamplingParams

    image = page_image(image_path)
    with tempfile.TemporaryDirectory() as folder, PeakMemory() as memory:
        model: TinyModel = BUILDERS[name](Path(folder) / name)
        started = time.perf_counter()
        llm = LLM(**engine_arguments(model))
        start_seconds = time.perf_counter() - started
        request = {"prompt": model.prompt(INSTRUCTION), "multi_modal_data": {"image": image}}
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        llm.generate([request], params, use_tqdm=False)  # warm-up
        started = time.perf_counter()
        output = llm.generate([request], params, use_tqdm=False)[0]
        page_seconds = time.perf_counter() - started
        completion = output.outputs[0]
        placeholders = output.prompt_token_ids.count(model.image_token_id)
        llm.llm_engine.engine_core.shutdown()
        del llm
    return {
        "model": name,
        "architecture": model.architecture,
        "image": f"{image.width}x{image.height}",
        "prompt_tokens": len(output.prompt_token_ids),
        "image_tokens": placeholders,
        "expected_image_tokens": model.image_tokens(image.width, image.height),
        "generated_tokens": len(completion.token_ids),
        "finish_reason": completion.finish_reason,
        "engine_start_s": round(start_seconds, 1),
        "page_s": round(page_seconds, 2),
        "peak_rss_gib": round(memory.peak / 2**30, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help=f"some of {', '.join(BUILDERS)} (default all)")
    parser.add_argument("--image", type=Path, default=DEFAULT_IMAGE)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child's own run
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.image, args.max_tokens)), flush=True)
        return
    unknown = set(args.models) - set(BUILDERS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}: choose from {sorted(BUILDERS)}")
    env = {**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "LD_PRELOAD": cpu_preload()}
    for name in args.models or list(BUILDERS):
        command = [sys.executable, __file__, "--one", name, "--image", str(args.image)]
        command += ["--max-tokens", str(args.max_tokens)]
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
        if result.returncode == 0 and lines:
            print(lines[-1], flush=True)
        else:
            print(json.dumps({"model": name, "failed": result.stderr[-3000:]}), flush=True)


if __name__ == "__main__":
    main()
