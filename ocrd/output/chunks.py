"""RAG-ready chunks of a DoclingDocument, cut by docling-core's hierarchical chunker (one
chunk per paragraph, list, table or picture caption, under the headings it stands below),
written as JSON Lines: `<name>.chunks.jsonl` with `outputs: [chunks]`.

Each line has docling-serve's chunk fields (`filename`, `chunk_index`, `text` with its
headings before it, `raw_text`, `headings`, `captions`, `doc_items`, `page_numbers`) and
the boxes the chunk covers (`boxes`: page, left, top, right, bottom in PDF points, origin
top left, as ocrd's layout file measures them), so a search hit leads to the place on the
page.
"""

from __future__ import annotations

from typing import Any

from docling_core.transforms.chunker.doc_chunk import DocChunk
from docling_core.transforms.chunker.hierarchical_chunker import (
    ChunkingDocSerializer,
    ChunkingSerializerProvider,
    HierarchicalChunker,
)
from docling_core.types.doc.base import CoordOrigin
from docling_core.types.doc.document import DoclingDocument

from ocrd.files import json_bytes

CHUNKS_SUFFIX = ".chunks.jsonl"


def _boxes(chunk: DocChunk, doc: DoclingDocument) -> list[dict[str, Any]]:
    boxes = []
    for item in chunk.meta.doc_items:
        for prov in item.prov:
            page = doc.pages.get(prov.page_no)
            bbox = prov.bbox
            if page is not None and bbox.coord_origin is CoordOrigin.BOTTOMLEFT:
                bbox = bbox.to_top_left_origin(page.size.height)
            found = {"page": prov.page_no, "box_pt": [round(v, 2) for v in bbox.as_tuple()]}
            if found not in boxes:  # the items of one block share its box
                boxes.append(found)
    return boxes


class WithPictureText(ChunkingSerializerProvider):
    """docling-core's chunking serialiser, going into pictures: the engine's text of a
    picture (a receipt pasted into a page) is put under it (ocrd/office/pictures.py), and
    the chunker's default leaves everything under a picture out."""

    def get_serializer(self, doc: DoclingDocument) -> ChunkingDocSerializer:
        serializer = ChunkingDocSerializer(doc=doc)
        params = serializer.params.model_copy(update={"traverse_pictures": True})
        return ChunkingDocSerializer(doc=doc, params=params)


def chunk_records(doc: DoclingDocument, filename: str) -> list[dict[str, Any]]:
    """The document's chunks as records, in reading order."""
    chunker = HierarchicalChunker(serializer_provider=WithPictureText())
    records = []
    for index, chunk in enumerate(chunker.chunk(doc)):
        assert isinstance(chunk, DocChunk)
        boxes = _boxes(chunk, doc)
        captions = [
            caption.resolve(doc).text
            for item in chunk.meta.doc_items
            for caption in getattr(item, "captions", [])
        ]
        records.append(
            {
                "filename": filename,
                "chunk_index": index,
                "text": chunker.contextualize(chunk),
                "raw_text": chunk.text,
                "headings": chunk.meta.headings,
                "captions": captions or None,
                "doc_items": [item.self_ref for item in chunk.meta.doc_items],
                "page_numbers": sorted({box["page"] for box in boxes}) or None,
                "boxes": boxes,
            }
        )
    return records


def chunk_lines(doc: DoclingDocument, filename: str) -> bytes:
    """The chunks as JSON Lines."""
    return b"".join(json_bytes(record) + b"\n" for record in chunk_records(doc, filename))
