"""docling-serve's chunk routes (`/v1/chunk/{hybrid,hierarchical}/{file,source}` and their
`/async`): a conversion task whose answer is the DoclingDocument cut into chunks by
docling-core's chunkers, in docling-serve's answer shape (`chunks`, `documents`,
`processing_time`).

The hierarchical chunker is docling-core's own. The hybrid chunker is docling-core's
`HybridChunker` too, but docling-serve gives it a Hugging Face tokenizer
(`sentence-transformers/all-MiniLM-L6-v2` by default) that it downloads; ocrd downloads
nothing, so its tokens are counted by `WordPieceCount`: words cut into pieces of at most six
letters (three digits), each punctuation mark one, a close and slightly cautious stand-in
for a BERT word-piece count. `max_tokens` left out is 512, the default tokenizer's limit.
A request naming another tokenizer is refused (422), as is any chunking option ocrd does not
honour with the value asked for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ocrd.web.docling_options import DoclingOptions, OptionRefused, parse

CHUNKERS = ("hybrid", "hierarchical")
DEFAULT_TOKENIZER = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_MAX_TOKENS = 512  # the default tokenizer's model_max_length
DEFAULT_PLACEHOLDER = "![IMAGE]"
MAX_PLACEHOLDER_CHARS = 1000
_PIECES = re.compile(r"[^\W\d_]{1,6}|\d{1,3}|[^\w\s]|_")


# Each chunk carries about 200 bytes of JSON besides its text: chunks of a token or two would
# make an answer some 40 times its document's text, rebuilt at every fetch of the result.
MIN_MAX_TOKENS = 16


class ChunkingOptions(BaseModel):
    """docling-serve's chunking options (HybridChunkerOptions, HierarchicalChunkerOptions)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chunker: Literal["hybrid", "hierarchical"]
    use_markdown_tables: bool = False
    use_markdown_images: bool = False
    image_placeholder: str = Field(default=DEFAULT_PLACEHOLDER, max_length=MAX_PLACEHOLDER_CHARS)
    include_raw_text: bool = False
    max_tokens: int | None = Field(default=None, ge=MIN_MAX_TOKENS, le=1_000_000)
    tokenizer: str = DEFAULT_TOKENIZER
    merge_peers: bool = True

    def checked(self) -> ChunkingOptions:
        """These options, or OptionRefused naming one ocrd cannot honour."""
        if self.use_markdown_images:
            raise OptionRefused(
                "chunking_options.use_markdown_images",
                "images are not put into chunks; leave it false",
            )
        if self.tokenizer != DEFAULT_TOKENIZER:
            raise OptionRefused(
                "chunking_options.tokenizer",
                f"{self.tokenizer!r} is not served: ocrd downloads no tokenizer and counts "
                f"tokens as {DEFAULT_TOKENIZER!r} would, approximately",
            )
        if self.chunker == "hierarchical":
            for name in ("max_tokens", "tokenizer", "merge_peers"):
                if name in self.model_fields_set:
                    raise OptionRefused(
                        f"chunking_options.{name}", "only the hybrid chunker takes it"
                    )
        return self


def chunking_options(chunker: str, values: object) -> ChunkingOptions:
    """A request's chunking options for `chunker`; OptionRefused where one is malformed or
    not honoured."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise OptionRefused("chunking_options", "give an object of options")
    given = dict(values)
    if given.setdefault("chunker", chunker) != chunker:
        raise OptionRefused("chunking_options.chunker", f"this route's chunker is {chunker!r}")
    try:
        options = ChunkingOptions.model_validate(given)
    except ValidationError as error:
        first = error.errors()[0]
        name = ".".join(str(part) for part in first["loc"]) or "chunking_options"
        raise OptionRefused(f"chunking_options.{name}", first["msg"]) from None
    return options.checked()


def _piece_count(text: str) -> int:
    return len(_PIECES.findall(text))


def chunk_items(
    document: dict[str, Any], filename: str, options: ChunkingOptions
) -> list[dict[str, Any]]:
    """The document's chunks as docling-serve answers them (ChunkedDocumentResultItem).
    Blocking; docling-core is imported here, as it takes a second."""
    from docling_core.transforms.chunker.doc_chunk import DocChunk
    from docling_core.types.doc.document import DoclingDocument

    doc = DoclingDocument.model_validate(document)
    chunker = _chunker(options)
    items = []
    for index, chunk in enumerate(chunker.chunk(doc)):
        assert isinstance(chunk, DocChunk)
        text = chunker.contextualize(chunk)
        refs = [item.self_ref for item in chunk.meta.doc_items]
        pages = sorted({prov.page_no for item in chunk.meta.doc_items for prov in item.prov})
        metadata: dict[str, Any] = {"has_image": any(r.startswith("#/pictures/") for r in refs)}
        if chunk.meta.origin is not None:
            metadata["origin"] = chunk.meta.origin.model_dump(mode="json")
        items.append(
            {
                "filename": filename,
                "chunk_index": index,
                "text": text,
                "raw_text": chunk.text if options.include_raw_text else None,
                "num_tokens": _piece_count(text) if options.chunker == "hybrid" else None,
                "headings": chunk.meta.headings,
                "captions": chunk.meta.captions,
                "doc_items": refs,
                "page_numbers": pages,
                "metadata": metadata,
            }
        )
    return items


def _chunker(options: ChunkingOptions) -> Any:
    from docling_core.transforms.chunker.hierarchical_chunker import (
        ChunkingDocSerializer,
        ChunkingSerializerProvider,
        HierarchicalChunker,
    )
    from docling_core.transforms.chunker.hybrid_chunker import HybridChunker
    from docling_core.transforms.chunker.tokenizer.base import BaseTokenizer
    from docling_core.transforms.serializer.markdown import MarkdownParams, MarkdownTableSerializer
    from docling_core.types.doc.document import DoclingDocument

    class Serializers(ChunkingSerializerProvider):
        """docling-serve's serialisation: Markdown tables where asked, and its image
        placeholder; and the engine's text under a picture (see ocrd/output/chunks.py)."""

        def get_serializer(self, doc: DoclingDocument) -> ChunkingDocSerializer:
            params = MarkdownParams(
                image_placeholder=options.image_placeholder, traverse_pictures=True
            )
            if options.use_markdown_tables:
                return ChunkingDocSerializer(
                    doc=doc, table_serializer=MarkdownTableSerializer(), params=params
                )
            return ChunkingDocSerializer(doc=doc, params=params)

    class WordPieceCount(BaseTokenizer):
        """Tokens counted without a downloaded vocabulary (see the module's words)."""

        max_tokens: int

        def count_tokens(self, text: str) -> int:
            return _piece_count(text)

        def get_max_tokens(self) -> int:
            return self.max_tokens

        def get_tokenizer(self) -> Any:
            return _piece_count  # semchunk takes a token counter

    if options.chunker == "hierarchical":
        return HierarchicalChunker(serializer_provider=Serializers())
    tokenizer = WordPieceCount(max_tokens=options.max_tokens or DEFAULT_MAX_TOKENS)
    return HybridChunker(
        tokenizer=tokenizer, merge_peers=options.merge_peers, serializer_provider=Serializers()
    )


def split_form(fields: dict[str, list[str]]) -> tuple[dict[str, list[str]], dict[str, Any], bool]:
    """A chunk request's form fields: the conversion's (`convert_*`, and `target_type`,
    `callbacks` as they are), the chunking options (`chunking_*`), `include_converted_doc`."""
    converting: dict[str, list[str]] = {}
    chunking: dict[str, Any] = {}
    include = False
    for name, values in fields.items():
        if name.startswith("chunking_"):
            chunking[name.removeprefix("chunking_")] = _form_value(values[-1])
        elif name.startswith("convert_"):
            converting[name.removeprefix("convert_")] = values
        elif name == "include_converted_doc":
            include = _flag(values[-1])
        elif name in ("target_type", "callbacks"):
            converting[name] = values
        else:
            raise OptionRefused(
                name,
                "a chunk request takes convert_*, chunking_* and "
                "include_converted_doc fields; leave it out",
            )
    return converting, chunking, include


def _form_value(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _flag(value: object) -> bool:
    if isinstance(value, str):
        value = _form_value(value.strip().lower())
    if not isinstance(value, bool):
        raise OptionRefused("include_converted_doc", "give true or false")
    return value


@dataclass(frozen=True)
class Chunking:
    """What a chunk task asked for."""

    options: ChunkingOptions
    include_converted_doc: bool = False


def source_options(
    payload: dict[str, Any], chunker: str | None
) -> tuple[DoclingOptions, Chunking | None]:
    """A JSON request's conversion options, and a chunk request's chunking; OptionRefused
    where one is malformed or not honoured."""
    if chunker is None:
        return parse(payload.get("options") or {}), None
    include = _flag(payload.get("include_converted_doc", False))
    chunking = Chunking(chunking_options(chunker, payload.get("chunking_options")), include)
    return parse(payload.get("convert_options") or {}), chunking


def chunk_answer(
    document: dict[str, Any] | None,
    content: dict[str, Any],
    result: dict[str, Any],
    options: dict[str, Any],
) -> dict[str, Any]:
    """docling-serve's answer to a chunk task (ChunkDocumentResponse): the chunks of
    `document` (none where it failed), and the document's item with `content` (the
    DoclingDocument in it only where the task asked for it). Blocking."""
    chunking = ChunkingOptions.model_validate(options)
    chunks = [] if document is None else chunk_items(document, content["filename"], chunking)
    item = {
        "kind": "ExportResult",
        "content": content,
        "status": result["status"],
        "errors": result["errors"],
        "timings": {},
    }
    return {"chunks": chunks, "documents": [item], "processing_time": result["processing_time"]}
