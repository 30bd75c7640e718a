"""What the simulated engines answer, in the format of the model they stand in for.

The page is never read: its text is derived from its number, size and a digest of its
pixels (the same page always gives the same text, different pages different text), written
as the model writes a page (its module's `write`: grounded Markdown, plain Markdown, front
matter and Markdown, a layout pipeline's JSON): a title, a paragraph and one figure. Asked
for plain text (the retry of an unfinished page, for a model that has such a prompt) it is
two plain paragraphs. Asked for one region of a page (its element's task, from ocrd's
layout stage: ocrd/engines/layout.py), it is that element as the model writes one: an HTML
table, a LaTeX formula, a line of text naming the task and the region's size. ocrd's test
page is answered with the page's own words, in the same format, as a model that reads
would.
"""

from __future__ import annotations

from ocrd.config import PromptMode
from ocrd.models import Model
from ocrd.models.markdown_blocks import markdown_blocks
from ocrd.models.selfcheck import page_blocks
from ocrd.text.grounding import Block, Box


def page_answer(
    recipe: Model, number: int, size: tuple[int, int], digest: str, mode: PromptMode
) -> str:
    body = f"Image {size[0]}x{size[1]} px, pixel digest {digest}."
    if mode is PromptMode.text and any(p.task == mode.value for p in recipe.prompts):
        return f"Simulated page {number}\n\n{body}"
    blocks = [
        Block("title", (Box(60, 40, 940, 90),), f"# Simulated page {number}"),
        Block("text", (Box(60, 120, 940, 200),), body),
        Block("image", (Box(100, 300, 600, 700),), ""),
    ]
    return recipe.write(blocks, size)


def element_answer(
    recipe: Model, task: str, number: int, size: tuple[int, int], digest: str
) -> str:
    """One region of a page, asked with the prompt of `task`, answered as the model answers
    an element: an HTML table, a LaTeX formula, or plain text naming the task, the region's
    size and digest (so that a test can tell which region's answer is where)."""
    recipe.prompt(task)  # KeyError for a task the model has no prompt for
    width, height = size
    if task in ("table", "chart"):
        return (
            f"<table><tr><td>Simulated {task}</td><td>{width}x{height}</td></tr>"
            f"<tr><td>page {number}</td><td>{digest}</td></tr></table>"
        )
    if task == "formula":
        return f"x_{{{number}}} = {width} \\times {height}"
    return f"Simulated {task} of page {number}: region {width}x{height} px, digest {digest}."


def test_page_answer(recipe: Model) -> str:
    """The model's test page, read perfectly, in the model's format."""
    check = recipe.self_check
    return recipe.write(page_blocks(check.page), check.page.pixel_size(check.long_side))


def written_as(recipe: Model, markdown: str, size: tuple[int, int]) -> str:
    """A page's Markdown (what a reader of it writes) in the model's own format."""
    return recipe.write(markdown_blocks(markdown), size)
