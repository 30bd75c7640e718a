"""DeepSeek-OCR-2 (deepseek-ai/DeepSeek-OCR-2), as ocrd runs it today.

Recipe, from the model's repository (github.com/deepseek-ai/DeepSeek-OCR-2 at 2f3699e,
`DeepSeek-OCR2-master/DeepSeek-OCR2-vllm/config.py` and `run_dpsk_ocr2_*.py`) and vLLM's
recipe (vllm-project/recipes, DeepSeek/DeepSeek-OCR-2.md):

- prompts `<image>\\n<|grounding|>Convert the document to markdown.` (layout: grounded
  Markdown) and `<image>\\nFree OCR.` (text only), as config.py has them;
- greedy decoding (temperature 0), max_tokens 8192, special tokens kept
  (`skip_special_tokens=False`: the grounding tags are the layout), as
  run_dpsk_ocr2_eval_batch.py has them; the end-of-sentence token stripped from the answer;
- an n-gram guard against repetition loops, token ids 128821 and 128822 (`<td>`, `</td>`)
  whitelisted so that long tables may repeat cells. The repository's scripts use n-gram 20
  to 40 within 50 to 90 tokens; ocrd uses vLLM's `NGramPerReqLogitsProcessor` with
  n-gram 30 within 90 tokens (vLLM's recipe);
- no prefix caching, no multimodal processor cache (every page is new).

The image: ocrd sends each page rendered at the inbox's dpi, at most 2048 pixels on its
longer side (`max_image_side`'s default); the model's processor tiles it itself.

The answer: `<|ref|>LABEL<|/ref|><|det|>[[x1, y1, x2, y2]]<|/det|>` before each block's
Markdown, boxes normalised to 0..999; read by `ocrd.text.grounding.parse_page`, the parser
every output uses today.
"""

from __future__ import annotations

from collections.abc import Sequence

from ocrd.models.recipe import (
    ImageRule,
    ImageSize,
    Model,
    NgramGuard,
    Prompt,
    Reading,
    Sampling,
    SelfCheck,
)
from ocrd.models.selfcheck import HARBOUR_PAGE
from ocrd.text.grounding import Block, parse_page

NAME = "deepseek-ocr-2"
END_OF_SENTENCE = "<｜end▁of▁sentence｜>"
LAYOUT_PROMPT = "<image>\n<|grounding|>Convert the document to markdown."
TEXT_PROMPT = "<image>\nFree OCR."
NGRAM_PROCESSOR = "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor"


def parse(answer: str, image_size: ImageSize) -> list[Block]:
    """The grounded answer's blocks; its boxes are relative already (the size is unused)."""
    return parse_page(answer.replace(END_OF_SENTENCE, ""))


def write(blocks: Sequence[Block], image_size: ImageSize) -> str:
    """Blocks as the model writes them: each block's grounding tag, then its Markdown."""
    parts = []
    for block in blocks:
        boxes = ", ".join(
            f"[{round(b.x1)}, {round(b.y1)}, {round(b.x2)}, {round(b.y2)}]" for b in block.boxes
        )
        parts.append(f"<|ref|>{block.label}<|/ref|><|det|>[{boxes}]<|/det|>\n{block.content}\n")
    return "\n".join(parts)


def model() -> Model:
    return Model(
        name=NAME,
        hf_id="deepseek-ai/DeepSeek-OCR-2",
        vllm_architecture="DeepseekOCR2ForCausalLM",
        licence="Apache-2.0",
        parameters_billions=3.0,
        dtype="bfloat16",
        source=(
            "github.com/deepseek-ai/DeepSeek-OCR-2 README.md; "
            "vllm-project/recipes DeepSeek/DeepSeek-OCR-2.md"
        ),
        answer="grounded Markdown: <|ref|>label<|/ref|><|det|>[[x1,y1,x2,y2]]<|/det|> "
        "before each block, boxes 0..999",
        pipeline=Reading.page,
        prompts=(Prompt("layout", LAYOUT_PROMPT), Prompt("text", TEXT_PROMPT)),
        image=ImageRule(max_long_side=2048),
        sampling=Sampling(
            temperature=0.0,
            max_tokens=8192,
            ngram_guard=NgramGuard(
                size=30,
                window=90,
                whitelist_token_ids=(128821, 128822),
                processor=NGRAM_PROCESSOR,
            ),
            skip_special_tokens=False,
            strip=(END_OF_SENTENCE,),
        ),
        parse=parse,
        write=write,
        # 768 px: one 1024 px view of the model (257 prompt tokens), the cheapest request.
        self_check=SelfCheck(HARBOUR_PAGE, task="layout", long_side=768, max_tokens=768),
    )
