"""LightOnOCR-2-1B (lightonai/LightOnOCR-2-1B) and its image-box variant (…-1B-bbox).

Recipe, from LightOn's own client (github.com/lightonai/LightOnOCR at 36755d4,
`lightonocr/models.py` and `lightonocr/client.py`) and the model card
(huggingface.co/lightonai/LightOnOCR-2-1B, README.md, "Usage Tips", as reproduced on
docs.doubleword.ai/inference-api/models/lightonai-lightonocr-2-1b-bbox-soup):

- no system prompt and no text prompt: the image alone ("the model has a tendency to repeat
  the prompt in its answer");
- `temperature` 0.2, `top_p` 0.9 (generations 1 and 2); `max_tokens` 4096 (the card);
- pages rendered at 1540 px on the longest edge, aspect ratio kept, one image per page: the
  1B models' processor would shrink a larger image to that anyway;
- LightOn's client repairs escaped math delimiters (`\\$x\\$` to `$x$`,
  `lightonocr/postprocess/fix_escaped_dollars.py`); ocrd does not (yet): the text stays as
  the model wrote it.

The answer is Markdown: headings, paragraphs, `$…$` math, HTML `<table>`s. The plain model
marks a figure `![image](image_N.png)`; the `-bbox` variant follows the link with the
figure's box, `![image](image_1.png)143,237,787,514`: x1,y1,x2,y2 normalised to 0..1000
of the page (as manuquadros/pdfparser's captures of it show, /work/shared/corpus/models/).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ocrd.models.markdown_blocks import markdown_blocks, no_boxes, thousandths_box
from ocrd.models.recipe import ImageRule, ImageSize, Model, Prompt, Reading, Sampling, SelfCheck
from ocrd.models.selfcheck import HARBOUR_PAGE, markdown_text
from ocrd.text.grounding import SCALE, Block, Box

NAME = "lightonocr-2"
BBOX_NAME = "lightonocr-2-bbox"
_NUMBER = r"\s*(-?\d{1,12}(?:\.\d{1,12})?)\s*"
_BOX_AFTER_LINK = re.compile(r"^" + ",".join([_NUMBER] * 4))


def figure_box(target: str, rest: str) -> Box | None:
    """The box written after a figure's link (`x1,y1,x2,y2`, 0..1000), if there is one."""
    match = _BOX_AFTER_LINK.match(rest)
    if match is None:
        return None
    a, b, c, d = (float(group) for group in match.groups())
    return thousandths_box(a, b, c, d)


def parse(answer: str, image_size: ImageSize) -> list[Block]:
    """The plain model's blocks; its figures have no boxes."""
    return markdown_blocks(answer, no_boxes)


def parse_bbox(answer: str, image_size: ImageSize) -> list[Block]:
    """The -bbox variant's blocks; its figures carry their boxes (relative already, so the
    size is unused)."""
    return markdown_blocks(answer, figure_box)


def write(blocks: Sequence[Block], image_size: ImageSize) -> str:
    """The plain model's Markdown: figures as bare links."""
    return markdown_text(blocks)


def write_bbox(blocks: Sequence[Block], image_size: ImageSize) -> str:
    """The -bbox variant's Markdown: each figure's link followed by its box (0..1000)."""
    parts, figures = [], 0
    for block in blocks:
        if block.label != "image":
            parts.append(markdown_text([block]).rstrip("\n"))
            continue
        figures += 1
        box = block.boxes[0] if block.boxes else Box(0, 0, SCALE, SCALE)
        corners = ",".join(str(round(v * 1000 / SCALE)) for v in (box.x1, box.y1, box.x2, box.y2))
        parts.append(f"![image](image_{figures}.png){corners}")
    return "\n\n".join(parts) + "\n"


def _model(name: str, hf_id: str, boxes: bool) -> Model:
    return Model(
        name=name,
        hf_id=hf_id,
        vllm_architecture="LightOnOCRForConditionalGeneration",
        licence="Apache-2.0",
        parameters_billions=1.0,
        dtype="bfloat16",
        source="github.com/lightonai/LightOnOCR lightonocr/models.py, lightonocr/client.py; "
        f"huggingface.co/{hf_id} README.md",
        answer="Markdown with $…$ math and HTML tables; figures as ![image](image_N.png)"
        + ("x1,y1,x2,y2 (0..1000)" if boxes else ""),
        pipeline=Reading.page,
        prompts=(Prompt("page", ""),),
        image=ImageRule(max_long_side=1540),
        sampling=Sampling(temperature=0.2, max_tokens=4096, top_p=0.9),
        parse=parse_bbox if boxes else parse,
        write=write_bbox if boxes else write,
        self_check=SelfCheck(HARBOUR_PAGE, task="page", long_side=1540, max_tokens=768),
    )


def model() -> Model:
    return _model(NAME, "lightonai/LightOnOCR-2-1B", boxes=False)


def bbox_model() -> Model:
    return _model(BBOX_NAME, "lightonai/LightOnOCR-2-1B-bbox", boxes=True)
