"""GLM-OCR (zai-org/GLM-OCR): a layout stage, then one request per region.

Recipe, from zai-org/GLM-OCR at cef4d0e: `README.md` ("Deploy with vLLM", licences) and
`glmocr/config.yaml` (the SDK's defaults), `glmocr/layout/layout_detector.py`,
`glmocr/postprocess/result_formatter.py`:

- the page (PDFs rendered at 200 dpi) goes first to PP-DocLayoutV3
  (PaddlePaddle/PP-DocLayoutV3_safetensors, threshold 0.3), which finds regions and their
  reading order; the SDK loads it with transformers' `PPDocLayoutV3ForObjectDetection`
  (transformers 5.3 or later, its pyproject says), whose post-processing returns the
  regions sorted by the model's own reading order (`order_seq`);
- each region is cut out and sent with its task's prompt (`task_prompt_mapping`):
  `Text Recognition:` (abstract, algorithm, content, doc_title, figure_title,
  paragraph_title, reference_content, text, vertical_text, vision_footnote, seal,
  formula_number), `Table Recognition:` (table), `Formula Recognition:` (display_formula,
  inline_formula); image and chart regions are kept, not read (`skip`); header, footer,
  number, footnote, aside_text, reference, footer_image and header_image are dropped
  (`abandon`) (`label_task_mapping`; the 25 labels are the checkpoint's `id2label`);
- `max_tokens` 8192, `temperature` 0, `top_p` 0.00001, `top_k` 1, `repetition_penalty`
  1.1; images between 12,544 and 71,372,800 pixels;
- served with `vllm serve zai-org/GLM-OCR --speculative-config '{"method": "mtp",
  "num_speculative_tokens": 3}'`.

ocrd runs that pipeline where `engine.layout.detector` is set (ocrd/engines/layout.py):
`LAYOUT` below is the SDK's mapping. Without a detector, a page is sent whole with
`Text Recognition:` (the model alone, sent a whole page, is not what it was tuned for).
Either way what is parsed here is what the SDK publishes per page:
`[[{index, label, content, bbox_2d}, …]]`, labels text, table, formula, image, `bbox_2d`
normalised to 0..1000, content after the SDK's clean-up (a title as `# …`, a section
heading as `## …`, tables as HTML, formulas as `$$ … $$`). An answer that is no such JSON
is read as one region's Markdown.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

from ocrd.models.markdown_blocks import markdown_blocks, thousandths_box
from ocrd.models.recipe import (
    ImageRule,
    ImageSize,
    Layout,
    Model,
    Prompt,
    Reading,
    RegionKind,
    Sampling,
    SelfCheck,
)
from ocrd.models.selfcheck import HARBOUR_PAGE
from ocrd.text.grounding import SCALE, Block, Box, clean_label

NAME = "glm-ocr"
PROMPTS = (
    Prompt("text", "Text Recognition:"),
    Prompt("table", "Table Recognition:"),
    Prompt("formula", "Formula Recognition:"),
)
_TEXT_LABELS = {
    "abstract": "text",
    "algorithm": "code",
    "content": "text",
    "doc_title": "title",
    "figure_title": "figure_title",
    "paragraph_title": "sub_title",
    "reference_content": "text",
    "text": "text",
    "vertical_text": "text",
    "vision_footnote": "footnote",
    "seal": "text",
    "formula_number": "text",
}
LAYOUT = Layout(
    detector="PaddlePaddle/PP-DocLayoutV3_safetensors",
    threshold=0.3,
    elements={
        **{label: RegionKind(kind, "text") for label, kind in _TEXT_LABELS.items()},
        "table": RegionKind("table", "table"),
        "display_formula": RegionKind("equation", "formula"),
        "inline_formula": RegionKind("equation", "formula"),
        "image": RegionKind("image", None),
        "chart": RegionKind("image", None),
    },
    dropped=frozenset(
        {"header", "footer", "number", "footnote", "aside_text", "reference"}
        | {"footer_image", "header_image"}
    ),
)
LABELS = {"table": "table", "formula": "equation", "image": "image", "chart": "image"}


def parse(answer: str, image_size: ImageSize) -> list[Block]:
    """The page's blocks, in the SDK's reading order; boxes are relative already (the size
    is unused)."""
    try:
        regions = json.loads(answer)
    except (ValueError, RecursionError):
        return markdown_blocks(answer)
    if not isinstance(regions, list):
        return markdown_blocks(answer)
    return [block for region in _regions(regions) if (block := _block(region)) is not None]


def _regions(value: list[Any]) -> Iterator[dict[str, Any]]:
    """The regions of every page: a list of pages (lists), or one page's list."""
    for item in value:
        if isinstance(item, dict):
            yield item
        elif isinstance(item, list):
            yield from (region for region in item if isinstance(region, dict))


def _block(region: dict[str, Any]) -> Block | None:
    content = region.get("content")
    content = _unwrapped(content) if isinstance(content, str) else ""
    raw_label = region.get("label")
    label = clean_label(raw_label) if isinstance(raw_label, str) else "text"
    label = LABELS.get(label, label)
    if label == "text" and content.startswith("#"):
        level = len(content) - len(content.lstrip("#"))
        if content[level : level + 1] == " ":
            label = "title" if level == 1 else "sub_title"
    box = _box(region.get("bbox_2d"))
    if not content.strip() and label != "image":
        return None
    return Block(label, (box,) if box else (), content)


def _unwrapped(content: str) -> str:
    """A region's content without the `<div align="center">` the SDK wraps centred text in."""
    text = content.strip()
    if text.startswith("<div") and text.endswith("</div>") and ">" in text:
        return text[text.index(">") + 1 : -len("</div>")].strip()
    return text


def _box(value: Any) -> Box | None:
    if not isinstance(value, list) or len(value) != 4:
        return None
    numbers = [v for v in value if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) != 4 or not all(math.isfinite(v) for v in numbers):
        return None
    return thousandths_box(*(float(v) for v in numbers))


WRITTEN_LABELS = {"equation": "formula", "title": "text", "sub_title": "text"}


def write(blocks: Sequence[Block], image_size: ImageSize) -> str:
    """The SDK's page JSON: one region per block, boxes in 0..1000."""
    regions = []
    for index, block in enumerate(blocks):
        box = block.boxes[0] if block.boxes else Box(0, 0, SCALE, SCALE)
        regions.append(
            {
                "index": index,
                "label": WRITTEN_LABELS.get(block.label, block.label),
                "content": block.content,
                "bbox_2d": [round(v * 1000 / SCALE) for v in (box.x1, box.y1, box.x2, box.y2)],
            }
        )
    return json.dumps([regions], ensure_ascii=False)


def model() -> Model:
    return Model(
        name=NAME,
        hf_id="zai-org/GLM-OCR",
        vllm_architecture="GlmOcrForConditionalGeneration",
        licence="MIT (model); its layout stage PP-DocLayoutV3 Apache-2.0",
        parameters_billions=0.9,
        dtype="bfloat16",
        source="github.com/zai-org/GLM-OCR README.md, glmocr/config.yaml, "
        "glmocr/postprocess/result_formatter.py",
        answer="per region Markdown/HTML/LaTeX; the SDK's page JSON "
        "[[{label, content, bbox_2d (0..1000)}]]",
        pipeline=Reading.regions,
        prompts=PROMPTS,
        image=ImageRule(min_pixels=12544, max_pixels=71372800),
        sampling=Sampling(
            temperature=0.0, max_tokens=8192, top_p=0.00001, top_k=1, repetition_penalty=1.1
        ),
        parse=parse,
        write=write,
        # The whole test page in one "Text Recognition:" request: the words must come back.
        self_check=SelfCheck(HARBOUR_PAGE, task="text", long_side=1024, max_tokens=768),
        layout=LAYOUT,
    )
