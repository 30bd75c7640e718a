"""Rendering: pages as RGB images, and figures cut from the source, in worker processes.

PDF parsing is the dangerous part of the pipeline (hostile files hang, crash or eat memory),
so files are opened only in child processes with an address-space limit, and every request
must come back within a time limit or the child is killed.

    detect.py    what an input is, by its bytes
    analysis.py  blank pages, and whether a PDF's text layer can stand in for OCR
    pdf.py       PDF sources (PyMuPDF)         } in the worker processes
    image.py     image sources (Pillow)        }
    protocol.py  the typed requests and replies between the daemon and its workers
    worker.py    the worker process
    pool.py      the daemon's side: the workers, time limits, hand-off of pixels
    wire.py      a request and its reply through a worker's socket, on the event loop
"""

from ocrd.render.detect import detect_format
from ocrd.render.errors import RenderError, RenderFailure
from ocrd.render.pool import RenderPool, SourceFile
from ocrd.render.protocol import Region, RenderLimits

__all__ = [
    "Region",
    "RenderError",
    "RenderFailure",
    "RenderLimits",
    "RenderPool",
    "SourceFile",
    "detect_format",
]
