"""PaddleOCR-VL-1.5 (PaddlePaddle/PaddleOCR-VL-1.5): a layout stage, then element prompts.

Recipe, from vllm-project/recipes at 19623e6 (`PaddlePaddle/PaddleOCR-VL.md`) and
PaddlePaddle/PaddleOCR at b8fae77 (`docs/version3.x/pipeline_usage/PaddleOCR-VL.en.md`):

- served with `vllm serve PaddlePaddle/PaddleOCR-VL --trust-remote-code
  --max-num-batched-tokens 16384 --no-enable-prefix-caching --mm-processor-cache-gb 0`;
- the page goes first to a layout detector (PP-DocLayoutV2 for 1.0, its successor for 1.5),
  which finds regions and their reading order; each region is cut out and sent with its
  task's prompt: `OCR:`, `Table Recognition:`, `Formula Recognition:`,
  `Chart Recognition:` (charts only when `use_chart_recognition`); `temperature` 0;
  image regions are kept, not read. (1.5 adds seal recognition and text spotting, whose
  prompts are not written down here: ocrd would not send them.)

Its layout stage for 1.5 is PP-DocLayoutV3 ("Layout Analysis Module of PaddleOCR-VL-1.5",
its model card at huggingface.co/PaddlePaddle/PP-DocLayoutV3, whose transformers
checkpoint is PaddlePaddle/PP-DocLayoutV3_safetensors, loaded by transformers'
`PPDocLayoutV3ForObjectDetection`, which returns the regions in the model's reading
order). Its 25 labels, and the layout score threshold 0.5, are those of PaddleOCR-VL.en.md
(the `layout_det_res` example: cls_id 6 doc_title, 14 image, 17 paragraph_title, 22 text,
24 vision_footnote; the parameter table: `layout_threshold` 0.5). Which label gets which
prompt follows the pipeline: tables (answered in OTSL, which the pipeline turns into an
HTML table, as ocrd/models/otsl.py does), formulas, charts (only with `use_chart_recognition`,
off by default: a chart is then kept as an image), every other region `OCR:`; images are
kept, not read; headers, footers and page numbers are read too (the pipeline's
`parsing_res_list` lists them), as furniture.

ocrd runs that pipeline where `engine.layout.detector` is set (ocrd/engines/layout.py):
`LAYOUT` below. Without a detector a page is sent whole with `OCR:` (which reads its text,
without layout). What is parsed here is what the pipeline publishes per page
(`save_to_json`, documented in PaddleOCR-VL.en.md, "Process the prediction results"):
`parsing_res_list`, one entry per region in reading order with
`block_label` (doc_title, paragraph_title, text, table, display_formula, image,
figure_title, vision_footnote, header, footer, number, …), `block_content` (tables as
HTML, formulas as LaTeX) and `block_bbox` in pixels of the page image, so the image's size
is needed to place them. An answer that is no such JSON is read as one region's Markdown.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

from ocrd.models.markdown_blocks import markdown_blocks
from ocrd.models.otsl import otsl_html
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

NAME = "paddleocr-vl-1.5"
PROMPTS = (
    Prompt("ocr", "OCR:"),
    Prompt("table", "Table Recognition:"),
    Prompt("formula", "Formula Recognition:"),
    Prompt("chart", "Chart Recognition:"),
)
LABELS = {
    "doc_title": "title",
    "paragraph_title": "sub_title",
    "display_formula": "equation",
    "inline_formula": "equation",
    "formula": "equation",
    "chart": "image",
    "vision_footnote": "footnote",
    "number": "page_number",
}
_KINDS = {  # the detector's labels that are not plain text, as ocrd's blocks
    "doc_title": "title",
    "paragraph_title": "sub_title",
    "figure_title": "figure_title",
    "vision_footnote": "footnote",
    "number": "page_number",
    "algorithm": "code",
    "header": "header",
    "footer": "footer",
}


def element_content(task: str, answer: str) -> str:
    """A region's answer as its block's content: a table's OTSL as HTML, as the pipeline
    does; every other answer as it is."""
    return otsl_html(answer) if task == "table" else answer


LAYOUT = Layout(
    detector="PaddlePaddle/PP-DocLayoutV3_safetensors",
    threshold=0.5,
    elements={
        **{label: RegionKind(kind, "ocr") for label, kind in _KINDS.items()},
        "table": RegionKind("table", "table"),
        "display_formula": RegionKind("equation", "formula"),
        "inline_formula": RegionKind("equation", "formula"),
        "image": RegionKind("image", None),
        "header_image": RegionKind("image", None),
        "footer_image": RegionKind("image", None),
        "chart": RegionKind("image", None),  # `use_chart_recognition` is off by default
    },
    fallback=RegionKind("text", "ocr"),
    content=element_content,
)
MAX_PAGES = 1000  # pages read from one answer; more is no page's answer


def parse(answer: str, image_size: ImageSize) -> list[Block]:
    """The page's blocks in the pipeline's reading order, boxes placed on an image of
    `image_size` pixels."""
    try:
        result = json.loads(answer)
    except (ValueError, RecursionError):
        return markdown_blocks(answer)
    regions = list(_regions(result))
    if not regions and not _is_result(result):
        return markdown_blocks(answer)
    return [block for region in regions if (block := _block(region, image_size)) is not None]


def _is_result(value: Any) -> bool:
    return isinstance(value, dict) and ("parsing_res_list" in value or "res" in value)


def _regions(value: Any) -> Iterator[dict[str, Any]]:
    """The regions of one result (`{"parsing_res_list": …}`, maybe inside `"res"`) or of a
    list of them (a PDF's pages)."""
    pages = value if isinstance(value, list) else [value]
    for page in pages[:MAX_PAGES]:
        if isinstance(page, dict) and isinstance(page.get("res"), dict):
            page = page["res"]
        if isinstance(page, dict) and isinstance(page.get("parsing_res_list"), list):
            yield from (r for r in page["parsing_res_list"] if isinstance(r, dict))


def _block(region: dict[str, Any], image_size: ImageSize) -> Block | None:
    raw_label = region.get("block_label")
    label = clean_label(raw_label) if isinstance(raw_label, str) else "text"
    label = LABELS.get(label, label)
    content = region.get("block_content")
    content = content.strip() if isinstance(content, str) else ""
    if label == "equation" and content and not content.startswith(("$", "\\[")):
        content = f"$$\n{content}\n$$"
    box = _box(region.get("block_bbox"), image_size)
    if not content and label != "image":
        return None
    return Block(label, (box,) if box else (), content)


def _box(value: Any, image_size: ImageSize) -> Box | None:
    width, height = image_size
    if not isinstance(value, list) or len(value) != 4 or width <= 0 or height <= 0:
        return None
    numbers = [v for v in value if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) != 4 or not all(math.isfinite(v) for v in numbers):
        return None
    x1, y1, x2, y2 = (float(v) for v in numbers)
    return Box.from_pixels(x1, y1, x2, y2, width, height)


WRITTEN_LABELS = {
    "title": "doc_title",
    "sub_title": "paragraph_title",
    "equation": "display_formula",
}


def write(blocks: Sequence[Block], image_size: ImageSize) -> str:
    """The pipeline's page JSON: one region per block, boxes in pixels of the image."""
    width, height = image_size
    regions = []
    for block in blocks:
        box = block.boxes[0] if block.boxes else Box(0, 0, SCALE, SCALE)
        regions.append(
            {
                "block_label": WRITTEN_LABELS.get(block.label, block.label),
                "block_content": block.content.lstrip("#").strip()
                if block.label in WRITTEN_LABELS
                else block.content,
                "block_bbox": [round(v) for v in box.scaled(width, height)],
            }
        )
    return json.dumps({"parsing_res_list": regions}, ensure_ascii=False)


def model() -> Model:
    return Model(
        name=NAME,
        hf_id="PaddlePaddle/PaddleOCR-VL-1.5",
        vllm_architecture="PaddleOCRVLForConditionalGeneration",
        licence="Apache-2.0",
        parameters_billions=0.9,
        dtype="bfloat16",
        source="vllm-project/recipes PaddlePaddle/PaddleOCR-VL.md; PaddlePaddle/PaddleOCR "
        "docs/version3.x/pipeline_usage/PaddleOCR-VL.en.md",
        answer="per region text, HTML tables, LaTeX; the pipeline's page JSON "
        "parsing_res_list [{block_label, block_content, block_bbox (pixels)}]",
        pipeline=Reading.regions,
        prompts=PROMPTS,
        image=ImageRule(),  # the model's processor resizes the region itself
        # The recipe gives no max_tokens: 4096 is ocrd's bound for one region.
        sampling=Sampling(temperature=0.0, max_tokens=4096),
        parse=parse,
        write=write,
        # The whole test page in one "OCR:" request: the words must come back.
        self_check=SelfCheck(HARBOUR_PAGE, task="ocr", long_side=1024, max_tokens=768),
        layout=LAYOUT,
    )
