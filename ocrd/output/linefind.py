"""Text lines found on a page's image, for models that give their text without positions.

RapidOCR (PP-OCR's models in ONNX, inside the `rapidocr` wheel, run by onnxruntime on the
CPU) marks where lines of text are and, with `read`, reads them roughly; `textlayer.py`
shares the model's words out over these lines. It costs CPU time in the render worker
(about a second a page), so it runs only for pages that need it; where it fails, the page
keeps the layer it gets without found lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ocrd.output.textlayer import FoundLine

RENDER_DPI = 144  # as the daemon renders a PDF page for an engine
MAX_SIDE_PX = 2048


class LineFinder:
    """RapidOCR's detector, loaded on first use and kept for the next page."""

    def __init__(self, threads: int = 1, read: bool = True) -> None:
        self.threads = threads
        self.read = read  # recognise the lines' text too (slower, places words better)
        self._detector: Any = None

    def _loaded(self) -> Any:
        if self._detector is None:
            from rapidocr import RapidOCR

            self._detector = RapidOCR(
                params={
                    "Global.log_level": "warning",
                    "Global.use_cls": False,
                    "Global.use_rec": self.read,
                    "EngineConfig.onnxruntime.intra_op_num_threads": self.threads,
                }
            )
        return self._detector

    def find(self, pixels: np.ndarray[Any, Any]) -> list[FoundLine]:
        """The lines on an RGB image (height x width x 3): upright boxes around each (a
        rotated line's box holds all of it) as fractions of the image, and their text
        where they are read."""
        height, width = pixels.shape[:2]
        output = self._loaded()(pixels[:, :, ::-1], use_cls=False, use_rec=self.read)  # BGR
        if output.boxes is None or not width or not height:
            return []
        texts = list(getattr(output, "txts", None) or ()) if self.read else []
        found = []
        for index, box in enumerate(output.boxes):
            xs = [float(point[0]) for point in box]
            ys = [float(point[1]) for point in box]
            region = (min(xs) / width, min(ys) / height, max(xs) / width, max(ys) / height)
            found.append(FoundLine(region, str(texts[index]) if index < len(texts) else ""))
        return found

    def find_on_pdf_pages(self, doc: Any, numbers: Sequence[int]) -> dict[int, list[FoundLine]]:
        """The lines on pages `numbers` (0-based) of an open PyMuPDF document, rendered as
        shown (its /Rotate and CropBox applied), as the daemon renders for an engine."""
        found = {}
        for number in numbers:
            page = doc[number]
            longest = max(page.rect.width, page.rect.height) or 1.0
            dpi = max(1, min(RENDER_DPI, int(MAX_SIDE_PX * 72 / longest)))
            pixmap = page.get_pixmap(dpi=dpi, colorspace="rgb", alpha=False)
            pixels = np.frombuffer(pixmap.samples, dtype=np.uint8)
            found[number] = self.find(pixels.reshape(pixmap.height, pixmap.width, 3))
        return found
