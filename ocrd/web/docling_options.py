"""The conversion options of docling-serve's API, each honoured or refused, never ignored.

Honoured: `to_formats` (md, json, text), `image_export_mode` (placeholder, embedded,
referenced), `page_range`, `do_ocr` and `force_ocr` (the text layer against the pixels:
ocrd's `pdf_text`), `include_images` (figures), `md_page_break_placeholder` (the page
separator), `from_formats` (the file must be one of them), and options that change nothing
for a single document (`abort_on_error`, `md_compact_tables`: ocrd's pipe tables have no
padding). Any other option is taken only with docling-serve's default value: a client that
asks for something else (another OCR engine or language, enrichments, a VLM pipeline, a
timeout) gets 422 naming the option, since ocrd would convert the document otherwise than
asked. Unknown options are refused the same way.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ocrd.config import PdfText

FORMATS = ("md", "json", "text")
IMAGE_MODES = ("placeholder", "embedded", "referenced")
ALL_PAGES = (1, sys.maxsize)
# docling-serve's defaults (ConvertDocumentsOptions, docling-serve 1.31.0) of the options
# ocrd does not honour: a request may name them with these values and nothing else.
DEFAULTS: dict[str, Any] = {
    "ocr_engine": "auto",
    "ocr_preset": "auto",
    "ocr_lang": None,
    "ocr_custom_config": None,
    "pdf_backend": "docling_parse",
    "table_mode": "accurate",
    "table_cell_matching": True,
    "pipeline": "standard",
    "document_timeout": None,
    "do_table_structure": True,
    "do_pdf_heading_hierarchy": False,
    "include_page_images": False,
    "images_scale": 2.0,
    "chunking_options": None,
    "chunking_preset": None,
    "do_code_enrichment": False,
    "do_formula_enrichment": False,
    "do_picture_classification": False,
    "do_chart_extraction": False,
    "do_picture_description": False,
    "picture_description_area_threshold": 0.05,
}
# Values that mean the default too (docling-serve's two names of its PDF parser; an empty
# language list is "the engine's default").
ALSO_DEFAULT: dict[str, tuple[Any, ...]] = {
    "pdf_backend": ("threaded_docling_parse", "dlparse_v4", "dlparse_v2"),
    "ocr_lang": ([],),
}
NO_EFFECT = ("abort_on_error", "md_compact_tables")
INPUT_FORMATS = {
    "pdf": "pdf",
    "image": "image",
    **{kind: kind for kind in ("docx", "pptx", "xlsx", "html", "md", "csv")},  # docling's
}
MAX_PLACEHOLDER_CHARS = 1000  # a page separator, written between every two pages


class OptionRefused(Exception):
    """An option ocrd does not honour with the value asked for (answered 422)."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"{option}: {reason}")
        self.option = option


class DoclingOptions(BaseModel):
    """The options ocrd honours, as docling-serve names and defaults them."""

    model_config = ConfigDict(extra="allow")

    to_formats: list[str] = Field(default_factory=lambda: ["md"])
    image_export_mode: str = "placeholder"
    page_range: tuple[int, int] = ALL_PAGES
    do_ocr: bool = True
    force_ocr: bool = False
    include_images: bool = True
    md_page_break_placeholder: str = Field(default="", max_length=MAX_PLACEHOLDER_CHARS)
    from_formats: list[str] | None = None
    abort_on_error: bool = False
    md_compact_tables: bool = False

    def checked(self) -> DoclingOptions:
        """These options, or OptionRefused naming the first that ocrd cannot honour."""
        for name in self.to_formats:
            if name not in FORMATS:
                raise OptionRefused(
                    "to_formats", f"{name!r} is not served; ocrd answers {', '.join(FORMATS)}"
                )
        if self.image_export_mode not in IMAGE_MODES:
            raise OptionRefused(
                "image_export_mode",
                f"{self.image_export_mode!r} is not one of {', '.join(IMAGE_MODES)}",
            )
        first, last = self.page_range
        if not 1 <= first <= last:
            raise OptionRefused("page_range", f"[{first}, {last}] is no range of pages from 1")
        if self.force_ocr and not self.do_ocr:
            raise OptionRefused("force_ocr", "force_ocr asks for OCR, do_ocr: false for none")
        if self.from_formats is not None and not set(self.from_formats) & set(INPUT_FORMATS):
            raise OptionRefused(
                "from_formats",
                f"ocrd reads {', '.join(map(repr, INPUT_FORMATS))} only; none of them is "
                "allowed here",
            )
        for name, value in (self.model_extra or {}).items():
            _check_default(name, value)
        return self

    @property
    def pages(self) -> tuple[int, int] | None:
        return None if self.page_range == ALL_PAGES else self.page_range

    def pdf_text(self) -> PdfText | None:
        """force_ocr: every page from its pixels; do_ocr false: the text layer wherever it
        is good (a page without one is still recognised: ocrd never answers an empty
        scan); neither: the inbox's setting."""
        if "force_ocr" in self.model_fields_set and self.force_ocr:
            return PdfText.ocr
        if "do_ocr" in self.model_fields_set and not self.do_ocr:
            return PdfText.prefer
        return None

    def takes(self, kind: str) -> bool:
        """Whether a file of this kind ('pdf' or 'image') may be converted."""
        return self.from_formats is None or kind in self.from_formats


def _check_default(name: str, value: Any) -> None:
    if name not in DEFAULTS:
        raise OptionRefused(name, "ocrd does not know this option; leave it out")
    if value == DEFAULTS[name] or value in ALSO_DEFAULT.get(name, ()):
        return
    raise OptionRefused(
        name,
        f"{value!r} is not served (ocrd converts with its own engine "
        f"and settings; only {DEFAULTS[name]!r} is taken)",
    )


LIST_FIELDS = frozenset({"to_formats", "from_formats", "page_range", "ocr_lang"})


def from_form(fields: Mapping[str, list[str]]) -> DoclingOptions:
    """The options of a multipart request: each a form field (lists repeated, or a JSON
    list in one field, as clients send them); OptionRefused where one cannot be read."""
    values: dict[str, Any] = {}
    for name, given in fields.items():
        if name in LIST_FIELDS:
            values[name] = _listed(given)
        else:
            values[name] = _scalar(given[-1])
    return parse(values)


def _listed(given: list[str]) -> list[Any]:
    if len(given) == 1 and given[0].lstrip().startswith("["):
        try:
            parsed = json.loads(given[0])
        except ValueError:
            return given
        return parsed if isinstance(parsed, list) else given
    return [item for value in given for item in value.split(",") if item.strip()]


def _scalar(value: str) -> Any:
    """A form value as JSON where it is JSON (numbers, booleans, null, nested objects)."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def parse(values: Mapping[str, Any]) -> DoclingOptions:
    """The options of a JSON request's `options`; OptionRefused where one is malformed or
    cannot be honoured."""
    try:
        options = DoclingOptions.model_validate(dict(values))
    except ValidationError as error:
        first = error.errors()[0]
        name = ".".join(str(part) for part in first["loc"]) or "options"
        raise OptionRefused(name, first["msg"]) from None
    return options.checked()
