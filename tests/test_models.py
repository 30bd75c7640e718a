"""The OCR models' descriptions: recipes, the parsers of their answers (tested on answers
their own projects published), and their self-check pages."""

from __future__ import annotations

import json
from pathlib import Path

import pymupdf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from ocrd.config import PromptMode, SamplingConfig
from ocrd.domain import PageResult, PageText
from ocrd.engines import deepseek, selfcheck
from ocrd.models import Model, deepseek_ocr2, model, models, olmocr2
from ocrd.models.selfcheck import HARBOUR_PAGE
from ocrd.output.docling import build_document
from ocrd.output.page import figure_box_px
from ocrd.text.grounding import SCALE, Block, Box, parse_page
from ocrd.text.markdown import page_markdown

CORPUS = Path(__file__).resolve().parents[1] / ".." / "shared" / "corpus"
LIGHTON = CORPUS / "models" / "lightonocr-2-1b-bbox"
GLM = CORPUS / "models" / "glm-ocr"
FIXTURES = Path(__file__).parent / "fixtures" / "models"
ALL = sorted(models())


def lighton_answer(stem: str) -> str:
    return (LIGHTON / f"pdfparser__{stem}.lightonocr-2-1b-bbox.raw.txt").read_text()


def labels(blocks: list[Block]) -> list[str]:
    return [block.label for block in blocks]


# The registry -------------------------------------------------------------------------


def test_every_model_is_described_with_its_source_and_a_prompt_for_its_self_check() -> None:
    known = models()
    assert next(iter(known)) == "deepseek-ocr-2"
    assert set(known) == {
        "deepseek-ocr-2",
        "lightonocr-2",
        "lightonocr-2-bbox",
        "olmocr-2",
        "glm-ocr",
        "paddleocr-vl-1.5",
    }
    for name, described in known.items():
        assert described.name == name
        assert "/" in described.hf_id and described.vllm_architecture and described.licence
        assert described.source
        assert isinstance(described.prompt(described.self_check.task), str)
        assert 0.5 < described.weights_gib < 20


def test_an_unknown_model_name_is_refused_with_the_names_there_are() -> None:
    with pytest.raises(KeyError, match=r"no OCR model is called 'tesseract'.*deepseek-ocr-2"):
        model("tesseract")
    with pytest.raises(KeyError, match=r"has no prompt for task 'table'.*layout, text"):
        model("deepseek-ocr-2").prompt("table")


def test_a_page_is_scaled_to_the_models_image_rule() -> None:
    a4_at_300_dpi = (2480, 3508)
    assert model("lightonocr-2").image.fitted(*a4_at_300_dpi) == (1088, 1540)
    assert model("olmocr-2").image.fitted(*a4_at_300_dpi) == (910, 1288)
    assert model("deepseek-ocr-2").image.fitted(1000, 800) == (1000, 800)  # never grown
    width, height = model("glm-ocr").image.fitted(50, 60)  # grown to its least pixels
    assert (width, height) == (103, 123) and width * height >= 12544


# DeepSeek-OCR-2: exactly today's behaviour ----------------------------------------------

GROUNDED = """<|ref|>title<|/ref|><|det|>[[62, 38, 934, 71]]<|/det|>
# Quarterly Report &amp; Outlook

<|ref|>text<|/ref|><|det|>[[62, 90, 934, 160]]<|/det|>
Revenue grew by 12% in Q3.

<|ref|>table<|/ref|><|det|>[[62, 210, 934, 400]]<|/det|>
<table><tr><td>Region</td><td>Q3</td></tr><tr><td>North</td><td>1.2</td></tr></table>

<|ref|>image<|/ref|><|det|>[[100, 420, 500, 700]]<|/det|>
"""
DEEPSEEK_ANSWERS = [
    GROUNDED,
    "plain text before any tag\n" + GROUNDED,
    "<|ref|>text<|/ref|><|det|>[[500, 900, 100, 1200], [-5, 3, 20.5, 8]]<|/det|>x",
    "<|ref|>Weird Label!<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>odd\n<|ref|>text<|det|>[[5, 6, 7, 8]]",
    "<|ref|>text<|/ref|><|det|>[[9, 10, 11, 12]] unclosed det\n<|ref|>tex",
    "",
]


@pytest.mark.parametrize("answer", DEEPSEEK_ANSWERS)
def test_deepseek_parses_as_the_grounding_parser_does_with_its_end_token_stripped(
    answer: str,
) -> None:
    described = model("deepseek-ocr-2")
    raw = answer + deepseek.END_OF_SENTENCE
    assert described.blocks(raw, (1000, 1400)) == parse_page(answer)
    assert deepseek_ocr2.parse(raw, (1, 1)) == parse_page(answer)


def test_deepseek_recipe_is_the_one_the_engines_use_today() -> None:
    described = model("deepseek-ocr-2")
    assert described.prompt("layout") == deepseek.PROMPTS[deepseek.PromptMode.layout]
    assert described.prompt("text") == deepseek.PROMPTS[deepseek.PromptMode.text]
    assert described.sampling.strip == (deepseek.END_OF_SENTENCE,)
    defaults = SamplingConfig()
    guard = described.sampling.ngram_guard
    assert guard is not None
    assert deepseek.ngram_args(defaults) == {
        "ngram_size": guard.size,
        "window_size": guard.window,
        "whitelist_token_ids": list(guard.whitelist_token_ids),
    }
    assert described.sampling.max_tokens == defaults.max_tokens
    assert described.sampling.temperature == 0.0
    assert described.sampling.skip_special_tokens is False


def test_deepseek_self_check_is_todays_page_and_judged_as_today() -> None:
    check = model("deepseek-ocr-2").self_check
    assert HARBOUR_PAGE.expected_text() == selfcheck.expected_text()
    assert (check.long_side, check.max_tokens) == (selfcheck.PAGE_SIDE, selfcheck.MAX_TOKENS)
    assert check.pass_share == selfcheck.PASS_SHARE
    assert HARBOUR_PAGE.pixel_size(check.long_side) == selfcheck.check_page().size
    table_html = "<table>" + "".join(
        "<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in selfcheck.TABLE
    )
    answers = [
        selfcheck.expected_text(),
        "<|ref|>title<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>\n# Harbour Museum Quarterly Report\n"
        "<|ref|>table<|/ref|><|det|>[[5, 6, 7, 8]]<|/det|>\n" + table_html + "</table>",
        "lantern lantern museum",
        "",
    ]
    for answer in answers:
        today = selfcheck.score(answer)
        judged = model("deepseek-ocr-2").judge(answer + deepseek.END_OF_SENTENCE)
        assert (judged.found, judged.expected, judged.passed) == (
            today.found,
            today.expected,
            today.passed,
        )


# LightOnOCR-2-1B-bbox: answers captured by manuquadros/pdfparser --------------------------


@pytest.mark.parametrize(
    "stem", sorted(p.name.split("__")[1].split(".")[0] for p in LIGHTON.glob("*.txt"))
)
def test_lighton_keeps_every_line_of_its_answer_in_one_block(stem: str) -> None:
    answer = lighton_answer(stem)
    blocks = model("lightonocr-2-bbox").blocks(answer, (1190, 1540))
    text = "\n".join(block.content for block in blocks)
    for line in answer.splitlines():
        if line.strip() and not line.startswith("![image]"):
            assert line.strip() in text


def test_lighton_labels_headings_tables_and_figures() -> None:
    answer = lighton_answer("31123167_p07")
    blocks = model("lightonocr-2-bbox").blocks(answer, (1163, 1540))
    assert labels(blocks)[:3] == ["text", "title", "table"]
    assert blocks[1].content == "# Table 2 Enzyme kinetic parameters"
    table = blocks[2].content
    start, end = answer.index("<table>"), answer.index("</table>") + len("</table>")
    assert table == answer[start:end]  # the model's HTML table, untouched
    assert "<table>" in page_markdown(blocks, "html")
    assert labels(blocks).count("image") == 1
    assert next(b.content for b in blocks if b.label == "sub_title").startswith("## LC-MS")


@pytest.mark.parametrize("stem", ["31123167_p07", "32117944_p04"])
def test_lighton_figure_boxes_land_on_the_pages_own_images(stem: str) -> None:
    """The page's embedded image (where PyMuPDF says it is) lies inside the figure box the
    model gave, once that box is mapped to pixels of the page as rendered for the model."""
    described = model("lightonocr-2-bbox")
    with pymupdf.open(LIGHTON / f"pdfparser__{stem}.pdf") as document:
        page = document[0]
        width, _ = described.image.fitted(round(page.rect.width * 10), round(page.rect.height * 10))
        zoom = width / page.rect.width
        pixmap = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom))
        size = (pixmap.width, pixmap.height)
        embedded = [v * zoom for v in page.get_image_info()[0]["bbox"]]
    [figure] = [b for b in described.blocks(lighton_answer(stem), size) if b.label == "image"]
    left, top, right, bottom = figure_box_px(figure.boxes[0], size)
    overlap = max(0.0, min(right, embedded[2]) - max(left, embedded[0])) * max(
        0.0, min(bottom, embedded[3]) - max(top, embedded[1])
    )
    image_area = (embedded[2] - embedded[0]) * (embedded[3] - embedded[1])
    box_area = (right - left) * (bottom - top)
    assert overlap / image_area >= 0.9
    assert overlap / (image_area + box_area - overlap) >= 0.6


def test_lighton_blocks_make_a_docling_document_with_its_table_and_figure() -> None:
    """The blocks are the currency every output takes: a DoclingDocument of the page has the
    model's table with its cells, its title, and a picture over the page's own image."""
    answer = lighton_answer("31123167_p07")
    with pymupdf.open(LIGHTON / "pdfparser__31123167_p07.pdf") as document:
        page = document[0]
        width_pt, height_pt = page.rect.width, page.rect.height
        left, top, right, bottom = page.get_image_info()[0]["bbox"]
    size = model("lightonocr-2-bbox").image.fitted(round(width_pt * 10), round(height_pt * 10))
    result = PageResult(
        number=1,
        text=PageText(answer, "stop"),
        prompt=PromptMode.layout,
        image_size=size,
        page_size_pt=(width_pt, height_pt),
        blocks=model("lightonocr-2-bbox").blocks(answer, size),
    )
    doc = build_document([result], "page")
    [table] = doc.tables
    assert (table.data.num_rows, table.data.num_cols) == (7, 4)
    assert any(t.label.value == "title" and t.text.startswith("Table 2 Enzyme") for t in doc.texts)
    [picture] = doc.pictures
    box = picture.prov[0].bbox  # PDF points, origin bottom left
    overlap_x = min(box.r, right) - max(box.l, left)
    overlap_y = min(box.t, height_pt - top) - max(box.b, height_pt - bottom)
    assert overlap_x > 0 and overlap_y > 0
    assert overlap_x * overlap_y >= 0.9 * (right - left) * (bottom - top)


def test_lighton_box_is_read_from_thousandths_and_the_plain_model_gives_none() -> None:
    line = "![image](image_1.png)143,237,787,514"
    [figure] = model("lightonocr-2-bbox").blocks(line, (1000, 1000))
    assert figure_box_px(figure.boxes[0], (1000, 1000)) == (143, 237, 787, 514)
    [plain] = model("lightonocr-2").blocks(line, (1000, 1000))
    assert plain.label == "image" and plain.boxes == ()


def test_markdown_is_cut_into_labelled_blocks_as_the_outputs_expect() -> None:
    markdown = "\n".join(
        [
            "# Report",
            "Intro line one",
            "line two with $x$ inline.",
            "",
            "### Detail",
            "$$",
            "a = b",
            "$$",
            "\\[ c = d \\]",
            "| A | B |",
            "|---|---|",
            "| 1 | 2 |",
            "```",
            "# not a heading",
            "",
            "```",
            "<table><tr><td>x</td></tr>",
            "",
            "<tr><td>y</td></tr></table>",
            "Tail.",
        ]
    )
    blocks = model("lightonocr-2").blocks(markdown, (100, 100))
    assert [(b.label, b.content.splitlines()[0]) for b in blocks] == [
        ("title", "# Report"),
        ("text", "Intro line one"),
        ("sub_title", "### Detail"),
        ("equation", "$$"),
        ("equation", "\\[ c = d \\]"),
        ("table", "| A | B |"),
        ("text", "```"),
        ("table", "<table><tr><td>x</td></tr>"),
        ("text", "Tail."),
    ]
    assert blocks[1].content == "Intro line one\nline two with $x$ inline."
    assert "| 1 | 2 |" in page_markdown(blocks, "markdown")


# GLM-OCR: the SDK's published page results -----------------------------------------------


def test_glm_table_page_is_one_html_table_whose_box_maps_to_the_image() -> None:
    answer = (GLM / "glm-ocr__table.glm-ocr.json").read_text()
    [region] = json.loads(answer)[0]
    with Image.open(GLM / "glm-ocr__table.png") as image:
        size = image.size
    [table] = model("glm-ocr").blocks(answer, size)
    assert table.label == "table"
    assert table.content == region["content"] and table.content.startswith("<table")
    expected = [round(v / 1000 * side) for v, side in zip(region["bbox_2d"], size * 2, strict=True)]
    got = figure_box_px(table.boxes[0], size)
    assert all(abs(a - b) <= 1 for a, b in zip(got, expected, strict=True))


def test_glm_page_gives_headings_text_and_equations_in_reading_order() -> None:
    answer = (GLM / "glm-ocr__page.glm-ocr.json").read_text()
    regions = json.loads(answer)[0]
    blocks = model("glm-ocr").blocks(answer, (1000, 1000))
    assert len(blocks) == len(regions)
    assert blocks[0] == Block("sub_title", blocks[0].boxes, "## 7.4 胶缝")
    equations = [b for b in blocks if b.label == "equation"]
    assert len(equations) == sum(r["label"] == "formula" for r in regions) > 0
    assert all(b.content.startswith("$$") for b in equations)
    assert [b.content for b in blocks] == [r["content"] for r in regions]


def test_glm_image_regions_become_figures_and_a_centred_title_a_title() -> None:
    answer = (FIXTURES / "glm-ocr" / "GLM-4.5V_page0.json").read_text()
    blocks = model("glm-ocr").blocks(answer, (1700, 2200))
    assert blocks[0].label == "title"
    assert blocks[0].content.startswith("# GLM-4.5V and GLM-4.1V-Thinking")
    figures = [b for b in blocks if b.label == "image"]
    assert len(figures) == 2
    assert figure_box_px(figures[0].boxes[0], (1700, 2200)) == pytest.approx(
        (
            round(211 / 1000 * 1700),
            round(667 / 1000 * 2200),
            round(520 / 1000 * 1700),
            round(829 / 1000 * 2200),
        ),
        abs=1,
    )


def test_glm_answer_that_is_no_page_json_is_read_as_markdown() -> None:
    blocks = model("glm-ocr").blocks("# Title\n\nSome text.", (100, 100))
    assert labels(blocks) == ["title", "text"]


# olmOCR-2: its trained format, and its pipeline's output ----------------------------------


def test_olmocr_front_matter_is_read_and_is_no_part_of_the_text() -> None:
    answer = (FIXTURES / "olmocr" / "edgar.md").read_text()
    read = olmocr2.read(answer)
    assert read.front == olmocr2.FrontMatter("en", True, 0, True, False)
    blocks = model("olmocr-2").blocks(answer, (1000, 1288))
    assert blocks[0].content.startswith("Edgar (or Eadgar;[1] c. 944")
    text = "\n".join(b.content for b in blocks)
    assert "primary_language" not in text and "---" not in text


def test_olmocr_reads_a_turned_page_and_an_empty_one() -> None:
    rotated = olmocr2.read((FIXTURES / "olmocr" / "rotated.md").read_text())
    assert rotated.front.is_rotation_valid is False
    assert rotated.front.rotation_correction == 90
    assert rotated.markdown == "This document appears to be rotated and needs correction."
    blank = (FIXTURES / "olmocr" / "blanktext.md").read_text()
    assert olmocr2.read(blank).front.primary_language == "en"
    assert model("olmocr-2").blocks(blank, (1000, 1288)) == []


def test_olmocr_table_keeps_the_cells_olmocr_bench_checks() -> None:
    answer = (FIXTURES / "olmocr" / "earnings_pg1_repeat1.md").read_text()
    blocks = model("olmocr-2").blocks(answer, (1000, 1288))
    [table] = [b for b in blocks if b.label == "table"]
    assert table.content.startswith("| Year Ended |")
    lines = (CORPUS / "olmocr-bench" / "dataset.jsonl").read_text().splitlines()
    tests = [json.loads(line) for line in lines if line.strip()]
    cells = [t["cell"] for t in tests if t["pdf"] == "earnings.pdf" and t["type"] == "table"]
    assert cells and all(f"| {cell} |" in table.content for cell in cells)
    assert "| Research and development | 3,423 |" in page_markdown(blocks, "markdown")


def test_olmocr_figure_box_is_read_in_pixels_of_the_image_it_saw() -> None:
    # The figure link as olmocr's own tests write it (tests/test_tests.py).
    answer = "---\nprimary_language: en\n---\n![Diagram of components.](page_370_682_1012_1012.png)"
    [figure] = model("olmocr-2").blocks(answer, (1700, 2200))
    assert figure.label == "image" and figure.content == "Diagram of components."
    assert figure_box_px(figure.boxes[0], (1700, 2200)) == pytest.approx(
        (370, 682, 1382, 1694), abs=1
    )


# PaddleOCR-VL-1.5: its pipeline's page JSON -----------------------------------------------

# The shape PaddleOCR-VL.en.md documents for `save_to_json` (PaddlePaddle/PaddleOCR b8fae77);
# written for this test, with the labels and boxes its documented demo page has: no file of
# the pipeline's output is published in a repository this test could name.
PADDLE_PAGE = {
    "input_path": "paddleocr_vl_demo.png",
    "page_index": None,
    "parsing_res_list": [
        {"block_label": "doc_title", "block_content": "Title", "block_bbox": [131, 36, 1384, 127]},
        {"block_label": "image", "block_content": "", "block_bbox": [775, 200, 1503, 684]},
        {
            "block_label": "paragraph_title",
            "block_content": "Part",
            "block_bbox": [28, 455, 341, 520],
        },
        {"block_label": "text", "block_content": "", "block_bbox": [389, 200, 742, 295]},
        {
            "block_label": "table",
            "block_content": "<table><tr><td>1</td></tr></table>",
            "block_bbox": [9, 9, 99, 99],
        },
        {
            "block_label": "display_formula",
            "block_content": "E = mc^2",
            "block_bbox": [9, 9, 99, 99],
        },
    ],
}


def test_paddle_regions_keep_their_labels_and_their_pixel_boxes() -> None:
    size = (1536, 1366)
    blocks = model("paddleocr-vl-1.5").blocks(json.dumps({"res": PADDLE_PAGE}), size)
    assert labels(blocks) == [
        "title",
        "image",
        "sub_title",
        "table",
        "equation",
    ]  # empty text dropped
    assert figure_box_px(blocks[1].boxes[0], size) == pytest.approx((775, 200, 1503, 684), abs=1)
    assert blocks[3].content.startswith("<table>")
    assert blocks[4].content == "$$\nE = mc^2\n$$"
    several_pages = model("paddleocr-vl-1.5").blocks(json.dumps([PADDLE_PAGE, PADDLE_PAGE]), size)
    assert len(several_pages) == 2 * len(blocks)


# Self-checks in each model's own answer format -------------------------------------------


def own_format_answer(name: str, text: str) -> str:
    if name == "deepseek-ocr-2":
        return f"<|ref|>text<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>\n{text}"
    if name == "olmocr-2":
        return f"---\nprimary_language: en\nis_rotation_valid: True\n---\n{text}"
    if name == "glm-ocr":
        return json.dumps(
            [[{"index": 0, "label": "text", "content": text, "bbox_2d": [1, 2, 3, 4]}]]
        )
    if name == "paddleocr-vl-1.5":
        region = {"block_label": "text", "block_content": text, "block_bbox": [1, 2, 3, 4]}
        return json.dumps({"res": {"parsing_res_list": [region]}})
    return text


@pytest.mark.parametrize("name", ALL)
def test_each_model_passes_its_self_check_when_it_reads_and_fails_on_garbage(name: str) -> None:
    described = model(name)
    assert described.judge(own_format_answer(name, HARBOUR_PAGE.expected_text())).passed
    assert not described.judge(own_format_answer(name, "The the the lorem ipsum.")).passed
    assert not described.judge(own_format_answer(name, "")).passed


# Hostile answers ---------------------------------------------------------------------------


def test_boxes_out_of_range_or_inverted_are_clamped_and_ordered() -> None:
    [lighton] = model("lightonocr-2-bbox").blocks("![image](i.png)1200,-5,300,100", (1, 1))
    assert lighton.boxes == (Box(300 * SCALE / 1000, 0.0, SCALE, 100 * SCALE / 1000),)
    regions = [
        {"label": "image", "content": "", "bbox_2d": [900, 50, 100, 2000]},
        {"label": "text", "content": "a", "bbox_2d": ["__import__('os')", 1, 2, 3]},
        {"label": "text", "content": "b", "bbox_2d": [True, 1, 2, 3]},
        {"label": "text", "content": "c", "bbox_2d": [1, 2, 3]},
    ]
    glm = model("glm-ocr").blocks(json.dumps([regions]), (1, 1))
    assert glm[0].boxes == (Box(100 * SCALE / 1000, 50 * SCALE / 1000, 900 * SCALE / 1000, SCALE),)
    assert [b.boxes for b in glm[1:]] == [(), (), ()]
    nan = model("glm-ocr").blocks(
        '[[{"label": "text", "content": "d", "bbox_2d": [NaN, 1, 2, Infinity]}]]', (1, 1)
    )
    assert nan == [Block("text", (), "d")]
    [olm] = model("olmocr-2").blocks("![x](page_900_900_5000_5000.png)", (1000, 1000))
    assert olm.boxes == (Box(899.1, 899.1, SCALE, SCALE),)


def test_nothing_in_an_answer_is_ever_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    command = f"__import__('os').system('touch {marker}')"
    answers = [
        f"---\nrotation_correction: !!python/object/apply:os.system ['touch {marker}']\n---\nx",
        f"![image](i.png){command},1,2,3",
        json.dumps([[{"label": command, "content": command, "bbox_2d": command}]]),
        f"![x](page_{command}.png)",
    ]
    for name in ALL:
        for answer in answers:
            model(name).blocks(answer, (100, 100))
    assert not marker.exists()
    assert olmocr2.read(answers[0]).front.rotation_correction == 0


def test_huge_and_unterminated_answers_parse_into_no_more_text_than_they_hold() -> None:
    answers = [
        "<table><tr><td>cell\n" * 50_000,  # a table that never closes
        "$$\n" + "x = 1\n" * 50_000,  # a formula that never closes
        "```\n" + "code\n" * 50_000,
        "---\n" + "is_table: true\n" * 50_000,  # front matter that never closes
        "![image](i.png)1,2,3,4\n" * 20_000,
        "[" * 100_000 + "]" * 100_000,  # nesting too deep for a JSON reader
        "<|ref|>" * 20_000,
    ]
    for name in ALL:
        for answer in answers:
            blocks = model(name).blocks(answer, (1000, 1000))
            assert sum(len(b.content) for b in blocks) <= len(answer)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(ALL), st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_any_text_parses_into_blocks_with_sane_boxes(name: str, answer: str) -> None:
    described: Model = model(name)
    for block in described.blocks(answer, (640, 480)):
        for box in block.boxes:
            assert 0 <= box.x1 <= box.x2 <= SCALE and 0 <= box.y1 <= box.y2 <= SCALE
