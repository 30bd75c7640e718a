"""PDF sources in a render worker (PyMuPDF): pages rendered, text layers read, figures cut
from embedded images or rendered on their own.

PDF parsing is the dangerous part of the pipeline (hostile files hang, crash or eat
memory): this module runs only in worker processes, never in the daemon.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from ocrd.config import RenderSettings
from ocrd.domain import Figure, TextLayer
from ocrd.files.dropped import NotRegularFile, open_input
from ocrd.render.analysis import judge_text_layer, looks_blank
from ocrd.render.detect import not_a_file
from ocrd.render.errors import RenderError, RenderFailure
from ocrd.render.pixels import HANDED_OVER, hand_over, write_png
from ocrd.render.protocol import Region, RenderedPage, RenderLimits
from ocrd.render.separators import SeparatorRules, detect_on_pdf_page
from ocrd.text.grounding import Block, Box

EMBEDDED_COVER = 0.9  # an embedded image covering this much of a figure's box supplies it


class PdfSource:
    """A PDF opened in a worker: its pages rendered, its text layer read, figures cut."""

    def __init__(
        self, path: Path, settings: RenderSettings, limits: RenderLimits, root: Path | None = None
    ) -> None:
        import pymupdf

        self.settings = settings
        self.limits = limits
        try:
            fd = open_input(path, root)
        except NotRegularFile as error:
            raise not_a_file(error) from None
        try:  # MuPDF opens the file the descriptor holds: what was checked is what is read
            self.doc = pymupdf.open(f"/proc/self/fd/{fd}", filetype="pdf")
        except Exception as error:  # MuPDF raises its own types for broken files
            detail = str(error).replace(f"/proc/self/fd/{fd}", path.name)
            raise RenderError(
                f"the PDF is damaged beyond repair (MuPDF: {detail})", code=RenderFailure.damaged
            ) from None
        finally:
            os.close(fd)
        if self.doc.needs_pass and not self._unlock():
            tried = len(settings.passwords)
            raise RenderError(
                f"encrypted, no password matched (tried {tried} from the inbox's 'passwords'"
                " list); add its password there and drop the file in again",
                code=RenderFailure.encrypted,
            )
        self.page_count = self.doc.page_count
        if self.page_count == 0:
            raise RenderError(
                "no pages: the PDF is empty or its page tree is damaged",
                code=RenderFailure.no_pages,
            )

    def _unlock(self) -> bool:
        return any(self.doc.authenticate(password) for password in ("", *self.settings.passwords))

    def render(
        self,
        number: int,
        buffer: mmap.mmap,
        separators: SeparatorRules | None = None,
        layout: str = HANDED_OVER,
    ) -> RenderedPage:
        import pymupdf

        page = self.doc.load_page(number - 1)
        rect = page.rect
        longest = max(rect.width, rect.height)
        if longest <= 0:
            raise RenderError(f"page {number} has no area", page=number, code=RenderFailure.damaged)
        full = self.settings.dpi / 72
        width, height = round(rect.width * full), round(rect.height * full)
        if width * height > self.limits.max_page_pixels:
            raise RenderError(
                f"page {number} is {width}x{height} px at {self.settings.dpi} DPI, over the limit "
                f"of {self.limits.max_page_pixels} pixels (pipeline.max_page_pixels)",
                page=number,
                code=RenderFailure.too_large,
            )
        zoom = min(full, self.settings.max_image_side / longest)
        pixmap = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), alpha=False, colorspace="rgb")
        image = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples_mv)
        del pixmap
        blank = looks_blank(image)
        size, payload = hand_over(image, buffer, layout)
        mark = detect_on_pdf_page(page, separators, blank) if separators else None
        return RenderedPage(
            image.width,
            image.height,
            size,
            payload,
            rect.width,
            rect.height,
            blank,
            mark,
            layout=layout,
        )

    def text_layer(self, number: int, running_lines: bool = True) -> TextLayer:
        """The page's own text as Markdown, if it is good enough to stand in for OCR;
        without `running_lines`, what the layout model finds to be page headers and
        footers is left out."""
        page = self.doc.load_page(number - 1)
        rect = page.rect
        zoom = min(
            self.settings.dpi / 72, self.settings.max_image_side / max(rect.width, rect.height)
        )
        image_size = (round(rect.width * zoom), round(rect.height * zoom))
        usable, reason = judge_text_layer(page)
        if not usable:
            return TextLayer(False, reason, image_size=image_size)
        import pymupdf4llm

        markdown = pymupdf4llm.to_markdown(
            self.doc,
            pages=[number - 1],
            use_ocr=False,
            show_progress=False,
            header=running_lines,
            footer=running_lines,
        )
        blocks = tuple(
            Block(
                "text",
                (
                    Box.from_pixels(
                        x0 - rect.x0,
                        y0 - rect.y0,
                        x1 - rect.x0,
                        y1 - rect.y0,
                        rect.width,
                        rect.height,
                    ),
                ),
                text.strip(),
            )
            for x0, y0, x1, y1, text, _, kind in page.get_text("blocks")
            if kind == 0 and text.strip()
        )
        # A layout model may take a page's only line for a running header and leave it out:
        # the page's own text is never lost to that.
        text = markdown.strip() or "\n\n".join(block.content for block in blocks)
        return TextLayer(True, reason, text, blocks, image_size, (rect.width, rect.height))

    def figures(
        self, number: int, boxes: Sequence[Region], dpi: float, folder: Path, names: Sequence[str]
    ) -> list[Figure]:
        """Each box cut from the embedded image that covers it, at the image's own resolution
        where that is at least `dpi` (a scan's or a photo's original pixels); otherwise the
        box rendered on its own at `dpi` (lower only where the pixel limit says)."""
        import pymupdf

        page = self.doc.load_page(number - 1)
        rect = page.rect
        images = page.get_image_info(xrefs=True)
        cuts = []
        for (x1, y1, x2, y2), name in zip(boxes, names, strict=True):
            clip = pymupdf.Rect(
                rect.x0 + x1 * rect.width,
                rect.y0 + y1 * rect.height,
                rect.x0 + x2 * rect.width,
                rect.y0 + y2 * rect.height,
            )
            cut = self._embedded(clip, images, dpi, folder / name)
            cuts.append(cut or self._rendered(page, clip, dpi, folder / name))
        return cuts

    def _rendered(self, page: Any, clip: Any, dpi: float, path: Path) -> Figure:
        import pymupdf

        rect = page.rect
        zoom = dpi / 72
        pixels = clip.width * clip.height * zoom * zoom
        if pixels > self.limits.max_page_pixels:
            zoom *= (self.limits.max_page_pixels / pixels) ** 0.5
        matrix = pymupdf.Matrix(zoom, zoom)
        pixmap = page.get_pixmap(matrix=matrix, clip=clip, alpha=False, colorspace="rgb")
        image = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples_mv)
        write_png(image, path)
        box = (
            round((clip.x0 - rect.x0) * zoom),
            round((clip.y0 - rect.y0) * zoom),
            round((clip.x1 - rect.x0) * zoom),
            round((clip.y1 - rect.y0) * zoom),
        )
        return Figure(path, image.width, image.height, box, round(zoom * 72, 2))

    def _embedded(
        self, clip: Any, images: list[dict[str, Any]], dpi: float, path: Path
    ) -> Figure | None:
        """The figure from an upright embedded image covering most of `clip`, if the image
        is at least `dpi`; its box is in the image's own pixels. None otherwise."""
        import pymupdf

        for info in images:
            a, b, c, d = info["transform"][:4]
            bbox = pymupdf.Rect(info["bbox"])
            if not info.get("xref") or b or c or a <= 0 or d <= 0 or bbox.is_empty:
                continue  # inline, rotated, skewed or mirrored: rendering is safer
            if (bbox & clip).get_area() < EMBEDDED_COVER * clip.get_area():
                continue
            scale_x, scale_y = info["width"] / bbox.width, info["height"] / bbox.height
            if min(scale_x, scale_y) * 72 < dpi:
                continue  # coarser than rendering at `dpi`
            if info["width"] * info["height"] > self.limits.max_page_pixels:
                continue
            try:
                pixmap = rgb(pymupdf.Pixmap(self.doc, info["xref"]))
            except (RuntimeError, ValueError):  # a stencil mask, an odd colour space
                continue
            if pixmap is None or (pixmap.width, pixmap.height) != (info["width"], info["height"]):
                continue
            inside = clip & bbox
            box = (
                round((inside.x0 - bbox.x0) * scale_x),
                round((inside.y0 - bbox.y0) * scale_y),
                round((inside.x1 - bbox.x0) * scale_x),
                round((inside.y1 - bbox.y0) * scale_y),
            )
            image = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples_mv)
            crop = image.crop(box)
            write_png(crop, path)
            return Figure(path, crop.width, crop.height, box, round(scale_x * 72, 2))
        return None


def rgb(pixmap: Any) -> Any:
    """The pixmap as plain RGB, or None where it holds no colours (a mask)."""
    import pymupdf

    if pixmap.colorspace is None:
        return None
    if pixmap.alpha:
        pixmap = pymupdf.Pixmap(pixmap, 0)
    if pixmap.colorspace.n != 3:
        pixmap = pymupdf.Pixmap(pymupdf.csRGB, pixmap)
    return pixmap
