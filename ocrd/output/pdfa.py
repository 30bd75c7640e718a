"""PDF/A-2b for the archival searchable PDF (`pdf_archive: true`).

First pikepdf's PDF/A support (`pikepdf.pdfa`, on qpdf): it gives the file what PDF/A asks
of its structure (the sRGB output intent, XMP metadata declaring PDF/A-2B and agreeing with
the document information, print flags on annotations, no JavaScript) without touching page
content, fonts or image data (LZW streams, which PDF/A forbids, become Flate), then reopens
what it wrote and validates it against the veraPDF rules for PDF/A-2b. Its validator is an
allowlist: whatever it does not know to conform is refused, so a pass can be trusted.

A file that this refuses (fonts that are not embedded, JPEG 2000 images the validator
cannot check, say) goes through Ghostscript's pdfwrite in PDF/A-2 mode, which embeds fonts
and rewrites the whole file (JPEG passed through, other images, JPEG 2000 included, decoded
and stored as Flate, nothing downsampled), and then through the same preparation and
validation. What still does not pass is refused with the validator's
findings, never written as a PDF/A that is not one.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pikepdf

FLAVOUR = "2b"
GHOSTSCRIPT = "gs"
MAX_FINDINGS_SHOWN = 3
_PR_SET_PDEATHSIG = 1  # prctl option: a signal for the child when its parent dies


class PdfaError(Exception):
    """The file cannot be made PDF/A-2b; the message names the first findings."""

    def __init__(self, message: str, findings: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.findings = list(findings)


def _open(path: Path, passwords: Sequence[str]) -> pikepdf.Pdf:
    for password in ("", *passwords):
        try:
            return pikepdf.open(path, password=password)
        except pikepdf.PasswordError:
            continue
    raise PdfaError(f"{path.name}: encrypted, and no password of the inbox opens it")


def save_validated(source: Path, target: Path, passwords: Sequence[str] = ()) -> None:
    """Write `source` as PDF/A-2b to `target` (which must differ), validated as written;
    PdfaError with the validator's findings where it does not pass."""
    import pikepdf.pdfa  # needs the `pdfa` extra of pikepdf (jsonschema, fonttools)

    pdf = _open(source, passwords)
    try:
        pikepdf.pdfa.save(pdf, target, FLAVOUR, recompress_flate=False)
    except pikepdf.pdfa.PdfaError as error:
        findings = [str(finding) for finding in error.report.findings]
        shown = "; ".join(findings[:MAX_FINDINGS_SHOWN])
        raise PdfaError(f"not PDF/A-{FLAVOUR}: {shown}", findings) from None
    finally:
        pdf.close()


def _die_with_parent() -> None:
    """In the child before exec: killed with its parent, so a render worker stopped for
    taking too long leaves no Ghostscript behind (Linux; elsewhere nothing happens)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _descriptor(path: Path) -> tuple[int, ...]:
    """The descriptor a `/proc/self/fd/N` path names, for the child to keep; else none."""
    if path.parent == Path("/proc/self/fd") and path.name.isdigit():
        return (int(path.name),)
    return ()


def ghostscript_pdfa(
    source: Path, target: Path, passwords: Sequence[str], timeout_seconds: float
) -> None:
    """Rewrite `source` with Ghostscript's pdfwrite in PDF/A-2 mode, images lossless."""
    if shutil.which(GHOSTSCRIPT) is None:
        raise PdfaError(
            "Ghostscript (`gs`) is not installed; it is needed to make this PDF into PDF/A "
            "(Debian: apt-get install ghostscript)"
        )
    command = [
        GHOSTSCRIPT,
        "-q",
        "-dSAFER",
        "-dBATCH",
        "-dNOPAUSE",
        "-sDEVICE=pdfwrite",
        "-dPDFA=2",
        "-dPDFACompatibilityPolicy=1",
        "-sColorConversionStrategy=RGB",
        "-dPassThroughJPEGImages=true",
        "-dPassThroughJPXImages=false",
        "-dAutoFilterColorImages=false",
        "-sColorImageFilter=FlateEncode",
        "-dAutoFilterGrayImages=false",
        "-sGrayImageFilter=FlateEncode",
        "-dDownsampleColorImages=false",
        "-dDownsampleGrayImages=false",
        "-dDownsampleMonoImages=false",
        f"-sOutputFile={target}",
    ]
    for password in passwords[:1]:
        command.append(f"-sPDFPassword={password}")
    command.append(str(source))
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            preexec_fn=_die_with_parent,  # a render worker has one thread
            check=False,
            pass_fds=_descriptor(source),  # an input held open: the same number in Ghostscript
        )
    except subprocess.TimeoutExpired:
        raise PdfaError(
            f"Ghostscript took longer than {timeout_seconds:g} s to make the PDF/A"
        ) from None
    if result.returncode != 0 or not target.exists():
        detail = " ".join((result.stderr or result.stdout).split())[-300:]
        raise PdfaError(
            f"Ghostscript could not make the PDF/A (exit {result.returncode}: {detail})"
        )
