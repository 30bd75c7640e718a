"""What ocrd must know of an OCR model: its recipe, how to read its answer, how to check it.

A `Model` is a description, written down from the model's own card or repository (each
module names its source): which weights, which vLLM architecture serves them, which
prompts, what size of image, which sampling settings, how its answer becomes the blocks
every output is made from (`ocrd.text.grounding.Block`: a label, boxes in 0..999 of the
image, Markdown content), and a test page it must read. Nothing here runs a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from ocrd.models.selfcheck import CheckScore, CheckText, markdown_text, score_blocks
from ocrd.text.grounding import Block

ImageSize = tuple[int, int]  # width, height in pixels of the image the model saw
Parser = Callable[[str, ImageSize], list[Block]]
# A page's blocks written as the model writes its answer (the inverse of its parser): what
# ocrd's simulated engine answers as that model, so the daemon is tested in every model's
# format without the model.
Writer = Callable[[Sequence[Block], ImageSize], str]

BYTES_PER_PARAMETER = {"bfloat16": 2, "float16": 2, "float32": 4}


class Reading(StrEnum):
    """How a page is read: whole, or a layout stage first and one request per region."""

    page = "page"  # one request per page; the answer is the whole page
    regions = "regions"  # a layout detector cuts the page; each region gets its own prompt


@dataclass(frozen=True)
class Prompt:
    """One text the model is sent beside the image, for one task ("" sends the image
    alone)."""

    task: str
    text: str


@dataclass(frozen=True)
class ImageRule:
    """The image size the model was trained on: the page is scaled to fit inside both
    limits (None: no limit of that kind), keeping its aspect ratio."""

    max_long_side: int | None = None
    max_pixels: int | None = None
    min_pixels: int | None = None

    def fitted(self, width: int, height: int) -> ImageSize:
        """The size an image of `width` x `height` is sent at (only ever shrunk to fit,
        or grown to reach `min_pixels`)."""
        scale = 1.0
        if self.max_long_side is not None:
            scale = min(scale, self.max_long_side / max(width, height))
        if self.max_pixels is not None:
            scale = min(scale, math.sqrt(self.max_pixels / (width * height)))
        if self.min_pixels is not None and width * height * scale * scale < self.min_pixels:
            scale = math.sqrt(self.min_pixels / (width * height))
        side = math.ceil if scale > 1 else math.floor  # never under a least, never over a most
        return max(1, side(width * scale)), max(1, side(height * scale))


@dataclass(frozen=True)
class NgramGuard:
    """vLLM's per-request n-gram logits processor (DeepSeek-OCR's): no n-gram of `size`
    tokens may repeat within `window` tokens, except the whitelisted token ids."""

    size: int
    window: int
    whitelist_token_ids: tuple[int, ...] = ()
    # The vLLM logits processor that applies it (`--logits-processors`), in the model's code.
    processor: str = ""


@dataclass(frozen=True)
class Sampling:
    """Decoding settings, as the model's card gives them."""

    temperature: float
    max_tokens: int
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    stop: tuple[str, ...] = ()
    ngram_guard: NgramGuard | None = None
    skip_special_tokens: bool = True  # False where special tokens carry the layout
    strip: tuple[str, ...] = ()  # tokens left in the answer that are not text


@dataclass(frozen=True)
class SelfCheck:
    """The test page a replica reads before it gets work, and how its answer is judged:
    at least `pass_share` of the page's words must come back in the parsed blocks."""

    page: CheckText
    task: str  # which of the model's prompts it is read with
    long_side: int  # pixels of the page's longer side
    max_tokens: int
    pass_share: float = 0.8


@dataclass(frozen=True)
class RegionKind:
    """What a layout region of one detector label becomes: a block of `label` (ocrd's
    block labels, those the model's own parser gives), read with the model's prompt for
    `task` (None: kept as a region, not read, as figures are)."""

    label: str
    task: str | None


@dataclass(frozen=True)
class Layout:
    """The layout stage a model's published pipeline runs before its element prompts:
    which detector it publishes (a transformers checkpoint, on a hub), its score
    threshold, what each of the detector's labels becomes, and which labels the pipeline
    drops. A label not listed is read as text (`fallback`)."""

    detector: str
    threshold: float
    elements: dict[str, RegionKind]
    dropped: frozenset[str] = frozenset()
    fallback: RegionKind = RegionKind("text", "text")
    # A region's answer as its block's content, by the task it was read with (PaddleOCR-VL
    # answers tables in OTSL, which its pipeline turns into HTML).
    content: Callable[[str, str], str] = field(repr=False, default=lambda task, answer: answer)

    def element(self, label: str) -> RegionKind | None:
        """What a region of `label` becomes; None where the pipeline drops it."""
        if label in self.dropped:
            return None
        return self.elements.get(label, self.fallback)


@dataclass(frozen=True)
class Model:
    """One OCR model, as ocrd uses it."""

    name: str  # the name an inbox chooses it by
    hf_id: str
    vllm_architecture: str
    licence: str
    parameters_billions: float
    dtype: str
    source: str  # where the recipe was read: repository and file, or model card
    answer: str  # what its answer looks like, in a sentence
    pipeline: Reading
    prompts: tuple[Prompt, ...]
    image: ImageRule
    sampling: Sampling
    parse: Parser = field(repr=False)
    self_check: SelfCheck
    write: Writer = field(repr=False, default=lambda blocks, size: markdown_text(blocks))
    # The layout stage of the model's pipeline (ocrd runs it with `engine.layout`); None:
    # the model reads whole pages only.
    layout: Layout | None = None

    def prompt(self, task: str) -> str:
        for prompt in self.prompts:
            if prompt.task == task:
                return prompt.text
        tasks = ", ".join(prompt.task for prompt in self.prompts)
        raise KeyError(f"{self.name} has no prompt for task {task!r}; it has: {tasks}")

    @property
    def weights_gib(self) -> float:
        """An estimate of the weights' memory: parameters times bytes per parameter."""
        return self.parameters_billions * 1e9 * BYTES_PER_PARAMETER[self.dtype] / 2**30

    def blocks(self, answer: str, image_size: ImageSize) -> list[Block]:
        """The answer's blocks, after the tokens the recipe strips are gone."""
        for token in self.sampling.strip:
            answer = answer.replace(token, "")
        return self.parse(answer, image_size)

    def judge(self, answer: str) -> CheckScore:
        """How much of its test page the model read, by the words of its parsed answer."""
        page = self.self_check.page
        size = page.pixel_size(self.self_check.long_side)
        return score_blocks(page, self.blocks(answer, size), self.self_check.pass_share)
