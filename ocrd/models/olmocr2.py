"""olmOCR-2 (allenai/olmOCR-2-7B-1025; the pipeline's default is its FP8 quantisation).

Recipe, from allenai/olmocr at f7cfe4c: `olmocr/prompts/prompts.py`
(`build_no_anchoring_v4_yaml_prompt`, `PageResponse`), `olmocr/pipeline.py`
(`build_page_query`, `try_single_page`, `--target_longest_image_dim` 1288) and
`olmocr/train/front_matter.py` (`FrontMatterParser`):

- one prompt, the image after it; the page rendered at 1288 px on its longer side;
- `max_tokens` 8000; `temperature` 0.1 on the first try, raised on each retry
  (0.1, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1.0) because heat breaks repetition loops; an answer
  that did not finish (`finish_reason` other than `stop`) is not valid;
- a page whose front matter says `is_rotation_valid: false` is read again, turned by
  `rotation_correction` degrees (clockwise, one of 0, 90, 180, 270).

The answer: YAML front matter (primary_language, is_rotation_valid, rotation_correction,
is_table, is_diagram) between `---` lines, then the page's Markdown: `\\(`/`\\[` LaTeX, HTML
tables, figures as `![alt](page_startx_starty_width_height.png)` in pixels of the image the
model saw. The front matter is read here line by line (never by a YAML loader: the answer
is untrusted), and is no part of the page's text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ocrd.models.markdown_blocks import ImageBoxes, markdown_blocks
from ocrd.models.recipe import ImageRule, ImageSize, Model, Prompt, Reading, Sampling, SelfCheck
from ocrd.models.selfcheck import HARBOUR_PAGE, markdown_text
from ocrd.text.grounding import Block, Box

NAME = "olmocr-2"
PROMPT = (
    "Attached is one page of a document that you must process. "
    "Just return the plain text representation of this document as if you were reading it "
    "naturally. Convert equations to LateX and tables to HTML.\n"
    "If there are any figures or charts, label them with the following markdown syntax "
    "![Alt text describing the contents of the figure](page_startx_starty_width_height.png)\n"
    "Return your output as markdown, with a front matter section on top specifying values for "
    "the primary_language, is_rotation_valid, rotation_correction, is_table, and is_diagram "
    "parameters."
)
TEMPERATURE_BY_ATTEMPT = (0.1, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1.0)
FIELDS = frozenset(
    {"primary_language", "is_rotation_valid", "rotation_correction", "is_table", "is_diagram"}
)
MAX_FRONT_MATTER_LINES = 20  # the model writes five; more is not front matter
_FIELD = re.compile(r"^([A-Za-z_]{1,40})\s*:\s*(.{0,200}?)\s*$")
_FIGURE_NAME = re.compile(r"^page_(\d{1,6})_(\d{1,6})_(\d{1,6})_(\d{1,6})\.png$")


@dataclass(frozen=True)
class FrontMatter:
    """What olmOCR says about the page besides its text (defaults where it says nothing)."""

    primary_language: str | None = None
    is_rotation_valid: bool = True
    rotation_correction: int = 0  # degrees clockwise the page must turn to read upright
    is_table: bool = False
    is_diagram: bool = False


@dataclass(frozen=True)
class OlmocrAnswer:
    front: FrontMatter
    markdown: str


def read(answer: str) -> OlmocrAnswer:
    """The front matter and the Markdown after it; an answer without front matter is all
    Markdown, one cut off inside its front matter keeps the fields it has."""
    text = answer.lstrip("\ufeff \t\r\n")
    if not text.startswith("---"):
        return OlmocrAnswer(FrontMatter(), answer.strip())
    lines = text.split("\n", MAX_FRONT_MATTER_LINES + 2)
    fields: dict[str, str] = {}
    end = 1
    while end < len(lines) and end <= MAX_FRONT_MATTER_LINES:
        line = lines[end].strip()
        end += 1
        if line == "---":
            break
        field = _FIELD.match(line)
        if field is None or field.group(1).lower() not in FIELDS:  # the Markdown starts here
            end -= 1
            break
        fields[field.group(1).lower()] = field.group(2)
    return OlmocrAnswer(_front_matter(fields), "\n".join(lines[end:]).strip())


def _front_matter(fields: dict[str, str]) -> FrontMatter:
    def flag(name: str, default: bool) -> bool:
        value = fields.get(name, "").strip("'\"").lower()
        return {"true": True, "false": False}.get(value, default)

    language = fields.get("primary_language", "").strip("'\"")
    rotation = fields.get("rotation_correction", "0").strip("'\"")
    return FrontMatter(
        primary_language=language[:16] if language and language != "null" else None,
        is_rotation_valid=flag("is_rotation_valid", True),
        rotation_correction=int(rotation) if rotation in {"0", "90", "180", "270"} else 0,
        is_table=flag("is_table", False),
        is_diagram=flag("is_diagram", False),
    )


def figure_boxes(image_size: ImageSize) -> ImageBoxes:
    """Figures named `page_x_y_w_h.png`, in pixels of an image of `image_size`."""
    width, height = image_size

    def box(target: str, rest: str) -> Box | None:
        match = _FIGURE_NAME.match(target)
        if match is None or width <= 0 or height <= 0:
            return None
        x, y, w, h = (int(group) for group in match.groups())
        return Box.from_pixels(x, y, x + w, y + h, width, height)

    return box


def parse(answer: str, image_size: ImageSize) -> list[Block]:
    """The page's blocks, without the front matter."""
    return markdown_blocks(read(answer).markdown, figure_boxes(image_size))


def write(blocks: Sequence[Block], image_size: ImageSize) -> str:
    """Front matter, then the page's Markdown; figures named by their place in pixels of
    the image the model saw."""
    width, height = image_size
    front = (
        "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\n"
        "is_table: False\nis_diagram: False\n---\n"
    )
    parts = []
    for block in blocks:
        if block.label == "image" and block.boxes:
            x1, y1, x2, y2 = (round(v) for v in block.boxes[0].scaled(width, height))
            parts.append(f"![Figure](page_{x1}_{y1}_{x2 - x1}_{y2 - y1}.png)")
        elif block.label != "image":
            parts.append(markdown_text([block]).rstrip("\n"))
    return front + "\n\n".join(parts) + "\n"


def model() -> Model:
    return Model(
        name=NAME,
        hf_id="allenai/olmOCR-2-7B-1025",
        vllm_architecture="Qwen2_5_VLForConditionalGeneration",
        licence="Apache-2.0",
        parameters_billions=8.3,  # Qwen2.5-VL-7B: 7.6B language model and its vision tower
        dtype="bfloat16",
        source="github.com/allenai/olmocr olmocr/prompts/prompts.py, olmocr/pipeline.py, "
        "olmocr/train/front_matter.py",
        answer="YAML front matter (language, rotation, is_table, is_diagram), then Markdown "
        "with LaTeX, HTML tables, figures as ![alt](page_x_y_w_h.png) in pixels",
        pipeline=Reading.page,
        prompts=(Prompt("page", PROMPT),),
        image=ImageRule(max_long_side=1288),
        sampling=Sampling(temperature=TEMPERATURE_BY_ATTEMPT[0], max_tokens=8000),
        parse=parse,
        write=write,
        self_check=SelfCheck(HARBOUR_PAGE, task="page", long_side=1288, max_tokens=768),
    )
