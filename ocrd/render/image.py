"""Image sources in a render worker (Pillow): a scan's pages at their own resolution."""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from ocrd.config import RenderSettings
from ocrd.domain import Figure
from ocrd.files.dropped import NotRegularFile, open_input
from ocrd.render.analysis import looks_blank
from ocrd.render.detect import not_a_file
from ocrd.render.errors import RenderError, RenderFailure
from ocrd.render.pixels import HANDED_OVER, hand_over, write_png
from ocrd.render.protocol import Region, RenderedPage, RenderLimits
from ocrd.render.separators import SeparatorRules, detect_on_scan


class RasterSource:
    """An image file (PNG, JPEG, TIFF with any number of pages) opened in a worker."""

    def __init__(
        self, path: Path, settings: RenderSettings, limits: RenderLimits, root: Path | None = None
    ) -> None:
        Image.MAX_IMAGE_PIXELS = limits.max_page_pixels
        self.settings = settings
        self.limits = limits
        try:
            self.image = Image.open(os.fdopen(open_input(path, root), "rb"))
        except NotRegularFile as error:
            raise not_a_file(error) from None
        except Image.DecompressionBombError:
            raise RenderError(
                f"the image is over the limit of {limits.max_page_pixels} pixels",
                code=RenderFailure.too_large,
            ) from None
        except Exception as error:
            raise RenderError(f"cannot open the image: {error}", code=RenderFailure.image) from None
        self.page_count = getattr(self.image, "n_frames", 1)

    def _frame(self, number: int) -> Image.Image:
        self.image.seek(number - 1)
        width, height = self.image.size
        if width * height > self.limits.max_page_pixels:
            raise RenderError(
                f"page {number} is {width}x{height} px, over the limit of "
                f"{self.limits.max_page_pixels} pixels",
                page=number,
                code=RenderFailure.too_large,
            )
        return self.image.convert("RGB")

    def _dpi(self) -> float:
        return float(self.image.info.get("dpi", (72, 72))[0] or 72)  # may be a fraction

    def render(
        self,
        number: int,
        buffer: mmap.mmap,
        separators: SeparatorRules | None = None,
        layout: str = HANDED_OVER,
    ) -> RenderedPage:
        frame = self._frame(number)
        original = frame
        width, height = frame.size
        dpi = self._dpi()
        scale = min(1.0, self.settings.max_image_side / max(width, height))
        if scale < 1.0:
            scaled = (max(1, round(width * scale)), max(1, round(height * scale)))
            frame = frame.resize(scaled, Image.Resampling.LANCZOS)
        blank = looks_blank(frame)
        size, payload = hand_over(frame, buffer, layout)
        # A barcode is read from the scan's own pixels, before they were scaled down.
        mark = detect_on_scan(original, dpi, separators, blank) if separators else None
        return RenderedPage(
            frame.width,
            frame.height,
            size,
            payload,
            width * 72.0 / dpi,
            height * 72.0 / dpi,
            blank,
            mark,
            layout=layout,
        )

    def figures(
        self, number: int, boxes: Sequence[Region], dpi: float, folder: Path, names: Sequence[str]
    ) -> list[Figure]:
        """Crops of the original pixels: a scan's figures at the resolution it was scanned."""
        frame = self._frame(number)
        width, height = frame.size
        cuts = []
        for (x1, y1, x2, y2), name in zip(boxes, names, strict=True):
            box = (round(x1 * width), round(y1 * height), round(x2 * width), round(y2 * height))
            crop = frame.crop(box)
            write_png(crop, folder / name)
            cuts.append(Figure(folder / name, crop.width, crop.height, box, self._dpi()))
        return cuts
