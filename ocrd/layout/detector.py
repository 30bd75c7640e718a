"""The layout detector itself: a transformers object-detection checkpoint (RT-DETR, RT-DETRv2,
or PP-DocLayoutV3 where the installed transformers has it), run in a process of its own.

Why a process: detection is CPU-bound (or holds a GPU stream), and torch holds the GIL
through parts of it; in the daemon's process it would stall the event loop that feeds the
OCR engine, and a crash in it (memory, a bad checkpoint) would take the daemon with it. In
its own process a page's detection runs beside everything else, and its death costs one
page a retry (ocrd/layout/service.py restarts it). Render workers are not used: each would
load its own copy of torch and the weights.

The checkpoint is loaded with `AutoModelForObjectDetection` and `AutoImageProcessor`,
safetensors only and no remote code: a checkpoint is data, never a program. Its
post-processing gives scored, labelled boxes in pixels; where it also gives the model's
reading order (`order_seq`, PP-DocLayoutV3), the regions keep that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from PIL import Image

from ocrd.layout.regions import Region

RAW_PER_KEPT = 4  # raw boxes sent back per region a page may keep (the rest scored lower)


@dataclass(frozen=True)
class DetectorSettings:
    source: str  # a folder, or a hub id
    threshold: float
    device: str  # auto, cpu, cuda
    max_regions: int


@dataclass(frozen=True)
class Detection:
    """What the detector found on one page: regions in pixels of the image it was given,
    and whether their order is the model's reading order."""

    regions: tuple[Region, ...]
    ordered: bool


class Detector:
    """A loaded checkpoint (in the detector's process)."""

    def __init__(self, settings: DetectorSettings) -> None:
        import torch
        from transformers import AutoImageProcessor, AutoModelForObjectDetection

        self.settings = settings
        self.device = settings.device
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        # trust_remote_code unset would ask on the terminal (or fail without one): refused here
        self.processor = AutoImageProcessor.from_pretrained(  # type: ignore[no-untyped-call]
            settings.source, trust_remote_code=False
        )
        self.model = AutoModelForObjectDetection.from_pretrained(
            settings.source, use_safetensors=True, trust_remote_code=False
        )
        self.model.to(self.device).eval()
        self.labels: dict[int, str] = {
            int(k): str(v) for k, v in (self.model.config.id2label or {}).items()
        }

    def detect(self, image: Image.Image) -> Detection:
        import torch

        rgb = image.convert("RGB")
        with torch.no_grad():
            inputs = self.processor(images=[rgb], return_tensors="pt").to(self.device)
            outputs = self.model(**inputs)
        found = self.processor.post_process_object_detection(
            outputs, threshold=self.settings.threshold, target_sizes=[(rgb.height, rgb.width)]
        )[0]
        ordered = "order_seq" in found
        return Detection(self._regions(found), ordered)

    def _regions(self, found: dict[str, Any]) -> tuple[Region, ...]:
        scores = found["scores"].float().cpu().tolist()
        labels = found["labels"].cpu().tolist()
        boxes = found["boxes"].float().cpu().tolist()
        keep = self.settings.max_regions * RAW_PER_KEPT
        best = sorted(sorted(range(len(scores)), key=lambda i: -scores[i])[:keep])
        return tuple(
            Region(self.labels.get(int(labels[i]), "text"), scores[i], *boxes[i]) for i in best
        )


def serve(connection: Connection, settings: DetectorSettings) -> None:
    """The detector process: load, say so (or say why not), then answer each image sent
    with its detection (or the error, in words) until the connection closes."""
    try:
        detector = Detector(settings)
    except Exception as error:  # any failure to load is the operator's to read
        connection.send(("failed", f"{type(error).__name__}: {error}"))
        return
    connection.send(("ready", sorted(set(detector.labels.values()))))
    while True:
        try:
            image = connection.recv()
        except (EOFError, OSError):
            return
        try:
            connection.send(("done", detector.detect(image)))
        except Exception as error:  # one page's failure, told to the daemon
            connection.send(("error", f"{type(error).__name__}: {error}"))
