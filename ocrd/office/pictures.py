"""The engine's text of each picture, put in the picture's place in the DoclingDocument:
as docling's own picture OCR does, the text items are the picture's children, so the
Markdown shows them where the picture is and the chunker keeps them with it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ocrd.text.elements import elements


def with_picture_text(docling: Mapping[str, Any], texts: Mapping[str, str]) -> dict[str, Any]:
    """The document (as JSON) with each picture's text (Markdown, by the picture's
    `self_ref`) added under it, one text item a paragraph, heading or list item."""
    # docling-core takes over a second to import: only documents with pictures pay.
    from docling_core.types.doc.common.reference import RefItem
    from docling_core.types.doc.document import DoclingDocument
    from docling_core.types.doc.items.picture.picture import PictureItem
    from docling_core.types.doc.labels import DocItemLabel

    doc = DoclingDocument.model_validate(docling)
    for ref, markdown in texts.items():
        picture = RefItem.model_validate({"$ref": ref}).resolve(doc)
        if not isinstance(picture, PictureItem):
            continue
        for element in elements(markdown):
            if element.text.strip():
                doc.add_text(DocItemLabel.TEXT, element.text, parent=picture)
    return doc.export_to_dict()
