"""Handing pixels over from a worker: a page through the shared buffer, a figure as a PNG
file written durably."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from PIL import Image

from ocrd.files import rename_checked

FIGURE_PNG_LEVEL = 3  # zlib level for figure files: much faster than 6, a few % larger


# How a page's pixels cross to the daemon: four bytes a pixel, the layout Pillow keeps an RGB
# image in, so that taking them out of the buffer is a plain copy for the daemon's one
# process (unpacking three bytes a pixel costs it twice as much: the worker does that). A
# page written to a file for the engine (PPM) is RGB.
HANDED_OVER = "RGBX"
HANDED_OVER_BYTES = 4  # a pixel


def hand_over(image: Image.Image, buffer: mmap.mmap, layout: str) -> tuple[int, bytes | None]:
    """Put a page's pixels (an RGB image) where the daemon reads them, as `layout` ("RGB"
    or "RGBX"): the shared buffer if they fit."""
    pixels = image.tobytes("raw", layout)
    size = len(pixels)
    if size <= len(buffer):
        buffer[:size] = pixels
        return size, None
    return size, pixels


def write_png(image: Image.Image, path: Path) -> None:
    """Write durably under a temporary name first: a killed worker never leaves a torn
    figure, and the daemon can link the file into the outbox without copying it."""
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("wb") as handle:
        image.save(handle, format="PNG", compress_level=FIGURE_PNG_LEVEL)
        handle.flush()
        os.fsync(handle.fileno())
    rename_checked(partial, path)  # on a network share, a retried rename is no failure
