"""The layout stage of the models whose pipelines have one (PaddleOCR-VL-1.5, GLM-OCR): a
detector in processes of its own finds a page's regions (`service`, `detector`), which are
cleaned of what no page holds and put in reading order (`regions`). The engine that sends
each region to the model with its element's prompt is ocrd/engines/layout.py."""

from ocrd.layout.detector import Detection, DetectorSettings
from ocrd.layout.regions import Region, cleaned, reading_order
from ocrd.layout.service import DetectorError, Detectors

__all__ = [
    "Detection",
    "DetectorError",
    "DetectorSettings",
    "Detectors",
    "Region",
    "cleaned",
    "reading_order",
]
