"""ocrd: a watched-folder OCR daemon."""

from ocrd.version import __version__

__all__ = ["__version__"]
