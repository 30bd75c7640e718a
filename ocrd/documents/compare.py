"""`ocrd compare`: a user's own sample read by two of the configured models, so that they can
choose between them on their documents rather than on published benchmarks.

Each model's engine is made as the daemon makes it (`engine.for_model`: the engine section's
settings with the model's entry in `engine.models` laid over them; its kind chosen as the
daemon chooses it; its self-check run at its start) and the sample goes through the
daemon's own pipeline (render workers, the model's recipe, its parser, its Markdown). Every
page is read by the model (a PDF's own text layer never stands in for it), with the
settings of the first inbox that names the model (else the first inbox's), without figures
or split documents: what is compared is text.

The models run one after the other, never at once: an in-process vLLM engine takes its
share of a GPU's memory (`vllm.gpu_memory_utilization`, 0.9 unless set), so two of them on
one GPU would need shares set for both, and one engine alone on the machine is what each
model's pages a second mean. Each engine is stopped before the next starts. The documents
of the sample are read together, as the daemon reads an inbox's: the total's pages a second
is the model's throughput on the sample, a document's seconds are its own, from its start
to its last page.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ocrd.config import (
    Config,
    DocumentOptions,
    OutputKind,
    PdfText,
    PipelineConfig,
    UnfinishedPages,
)
from ocrd.documents.pipeline import DocumentContext, Pipeline
from ocrd.documents.sources import folder_files
from ocrd.domain import DocumentFailed
from ocrd.engines import (
    Engine,
    EngineChoice,
    EngineDeadError,
    EngineStartError,
    EngineState,
    choose_engine,
    create_engine,
)
from ocrd.files.dropped import printable
from ocrd.output.write import render_markdown
from ocrd.render import RenderError, detect_format

# Between pages, as the daemon writes them by default: the diff shows where a page starts,
# and the agreement is worked out page by page (ocrd/text/agreement.py).
PAGE_SEPARATOR = "\n\n<!-- page {page} -->\n\n"

Say = Callable[[str], None]


class SampleError(Exception):
    """The sample cannot be read: a path that is missing, or nothing in it to read."""


class EngineNotReady(Exception):
    """A model's engine did not start, or started but does not serve (no server reachable,
    the self-check failed)."""


@dataclass(frozen=True)
class SampleDocument:
    path: Path
    label: str  # unique within the sample: the report's name for it, and its diff files'


@dataclass(frozen=True)
class Sample:
    documents: tuple[SampleDocument, ...]
    left_out: tuple[str, ...] = ()  # a folder's entries that are no PDF or image, and why


def gather_sample(paths: Sequence[Path]) -> Sample:
    """The documents of the files and folders given (a folder's PDFs and images, in its
    subfolders too, in natural name order); SampleError naming a path that cannot be read."""
    found: list[tuple[Path, str]] = []
    left_out: list[str] = []
    for path in paths:
        if path.is_dir():
            found += _folder_documents(path, left_out)
        elif path.is_file():
            found.append((path, path.name))
        elif path.exists() or path.is_symlink():
            raise SampleError(f"{printable(str(path))}: neither a file nor a folder")
        else:
            raise SampleError(f"{printable(str(path))}: no such file or folder")
    if not found:
        where = "; ".join(left_out) or "they are empty"
        raise SampleError(f"no PDF or image to read in {_listed(paths)} ({where})")
    return Sample(_labelled(found), tuple(left_out))


def _folder_documents(folder: Path, left_out: list[str]) -> list[tuple[Path, str]]:
    files, skipped, unlistable = folder_files(folder)
    top = folder.resolve().name or "sample"  # a sample in / still gets a name
    left_out += [f"{printable(top)}/{entry}" for entry in skipped]
    left_out += [f"{printable(top)}/{name}: this user may not list it" for name in unlistable]
    documents = []
    for path in files:
        label = f"{top}/{path.relative_to(folder).as_posix()}"
        try:
            detect_format(path)
        except RenderError as error:  # a scanner's XML, a note: not part of the sample
            left_out.append(f"{printable(label)}: {error}")
            continue
        documents.append((path, label))
    return documents


def _labelled(found: list[tuple[Path, str]]) -> tuple[SampleDocument, ...]:
    """Each document with a label of its own: `name-2.pdf` for a second `name.pdf`."""
    taken: set[str] = set()
    documents = []
    for path, label in found:
        unique, number = label, 1
        while unique in taken:
            number += 1
            stem, dot, suffix = label.rpartition(".")
            unique = f"{stem}-{number}.{suffix}" if dot and stem else f"{label}-{number}"
        taken.add(unique)
        documents.append(SampleDocument(path, unique))
    return tuple(documents)


def _listed(paths: Sequence[Path]) -> str:
    return ", ".join(printable(str(path)) for path in paths)


@dataclass(frozen=True)
class ModelPlan:
    """One model's engine, made (not started), and how its documents are read."""

    model: str
    choice: EngineChoice
    engine: Engine
    options: DocumentOptions
    gpu_share: float | None  # vLLM started here: its share of each GPU's memory

    @property
    def warning(self) -> str | None:
        """What a user needs to know of this engine before it starts: a vLLM engine this
        command starts itself needs GPU memory a running daemon may hold; RapidOCR (what
        `auto` chooses without a GPU) reads without the model."""
        if self.choice.kind == "rapidocr":
            return (
                f"{self.model}: its engine is RapidOCR ({self.choice.reason}), which reads "
                "without any model: its reading says nothing of this model. Set the "
                "engine's kind, or serve the model from vLLM servers (kind: openai)."
            )
        if self.gpu_share is None:
            return None
        return (
            f"{self.model}: its engine is vLLM started by this command, which loads the "
            f"model and needs {self.gpu_share:g} of each GPU's memory free "
            "(vllm.gpu_memory_utilization); a daemon running on the same GPUs holds its own "
            "share, and the engine may then fail to start. The daemon need not stop: serve "
            "the model from vLLM servers and name them in the configuration (engine.models."
            f'{self.model}: kind openai, openai.base_urls; docs/fleets.md, "Models").'
        )


def plan_model(config: Config, model: str) -> ModelPlan:
    """The engine serving `model`, made as the daemon makes it; ValueError where the
    configuration cannot serve it (a model ocrd does not know, a GPU that is not there)."""
    settings = config.engine.for_model(model)
    choice = choose_engine(settings)
    engine = create_engine(settings, choice.kind)
    share = settings.vllm.gpu_memory_utilization if choice.kind == "vllm" else None
    return ModelPlan(model, choice, engine, reading_options(config, model), share)


def reading_options(config: Config, model: str) -> DocumentOptions:
    """The settings of the first inbox that names `model` (else the first inbox's), for
    reading every page with the model and writing only its text."""
    inbox = next((i for i in config.inboxes if i.model == model), config.inboxes[0])
    return inbox.model_copy(
        update={
            "model": model,
            "pdf_text": PdfText.ocr,
            "figures": False,
            "outputs": (OutputKind.markdown,),
            "pdf_archive": False,
            "split_on": (),
            "split_barcode": None,
            "unfinished_pages": UnfinishedPages.done,  # its text, marked, is what it read
            "page_separator": PAGE_SEPARATOR,
            "layout_file": False,
            "keep_raw": False,
        }
    )


@dataclass(frozen=True)
class ModelReading:
    """One document as one model read it: its Markdown, or why it could not be read."""

    pages: int
    seconds: float
    markdown: str | None = None
    failure: str | None = None


@dataclass(frozen=True)
class ModelRun:
    """A model's reading of the whole sample."""

    model: str
    choice: EngineChoice
    start_seconds: float  # its engine's start, self-check included
    seconds: float  # from the first document's start to the last one's end
    readings: dict[str, ModelReading]  # by the document's label

    @property
    def pages(self) -> int:
        return sum(reading.pages for reading in self.readings.values())


async def read_with_both(
    plans: tuple[ModelPlan, ModelPlan], sample: Sample, pipeline_config: PipelineConfig, say: Say
) -> tuple[ModelRun, ModelRun]:
    """The sample read by each model in turn, each engine stopped before the next starts."""
    runs: list[ModelRun] = []
    try:
        for plan in plans:
            say(f"{plan.model}: starting its {plan.choice.kind} engine ({plan.choice.reason})")
            runs.append(await read_sample(plan, sample, pipeline_config, say))
    finally:
        for unstarted in plans[len(runs) + 1 :]:  # made, never started: its folders go
            await unstarted.engine.stop()
    return runs[0], runs[1]


async def read_sample(
    plan: ModelPlan, sample: Sample, pipeline_config: PipelineConfig, say: Say
) -> ModelRun:
    """Start the model's engine, read every document of the sample with it, stop it.
    EngineNotReady where it did not start or does not serve."""
    engine = plan.engine
    started = time.monotonic()
    pipeline: Pipeline | None = None
    try:
        await _started(plan)
        start_seconds = time.monotonic() - started
        say(f"{plan.model}: engine ready in {start_seconds:.1f} s ({engine.summary})")
        pipeline = Pipeline.create(engine, pipeline_config, plan.options.max_image_side)
        await pipeline.renderers.warm_up()  # imports and workers are not the model's time
        began = time.monotonic()
        at_once = pipeline_config.documents_in_flight_for(engine.max_concurrency)
        readings = await _read_all(pipeline, plan, sample, at_once, say)
        seconds = time.monotonic() - began
    finally:
        if pipeline is not None:
            pipeline.renderers.shutdown()
        await engine.stop()
    return ModelRun(plan.model, plan.choice, start_seconds, seconds, readings)


async def _started(plan: ModelPlan) -> None:
    """The plan's engine started and serving; EngineNotReady otherwise (a daemon's pages
    would wait for it; a comparison does not)."""
    what_to_do = (
        "\nocrd compare reads only with an engine that serves: start its servers or correct "
        "its settings, then run it again"
    )
    try:
        await plan.engine.start()
    except EngineStartError as error:
        raise EngineNotReady(f"{plan.model}: its engine did not start: {error}") from None
    health = plan.engine.health
    if health.state is not EngineState.ready:
        problem = f": {health.problem}" if health.problem else ""
        raise EngineNotReady(
            f"{plan.model}: its {plan.choice.kind} engine is {health.state.value} after its "
            f"start{problem}{what_to_do}"
        )


async def _read_all(
    pipeline: Pipeline, plan: ModelPlan, sample: Sample, documents_in_flight: int, say: Say
) -> dict[str, ModelReading]:
    at_once = asyncio.Semaphore(documents_in_flight)

    async def one(document: SampleDocument) -> ModelReading:
        async with at_once:
            reading = await read_document(pipeline, document, plan.options)
        if reading.failure is not None:
            say(f"{plan.model}: {printable(document.label)}: failed: {reading.failure}")
        else:
            pages = f"{reading.pages} page{'' if reading.pages == 1 else 's'}"
            say(f"{plan.model}: {printable(document.label)}: {pages} in {reading.seconds:.1f} s")
        return reading

    readings = await asyncio.gather(*(one(document) for document in sample.documents))
    return {d.label: r for d, r in zip(sample.documents, readings, strict=True)}


async def read_document(
    pipeline: Pipeline, document: SampleDocument, options: DocumentOptions
) -> ModelReading:
    """One document through the daemon's pipeline, its Markdown as the daemon writes it."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ocrd-compare-") as scratch:
        context = DocumentContext.of(document.path, options, Path(scratch))
        try:
            result = await pipeline.convert(context)
        except DocumentFailed as failure:
            where = f" (page {failure.page})" if failure.page else ""
            return ModelReading(0, time.monotonic() - started, failure=f"{failure.message}{where}")
        except EngineDeadError as error:
            return ModelReading(0, time.monotonic() - started, failure=f"the engine died: {error}")
    markdown = render_markdown(result, options, "")
    return ModelReading(len(result.pages), result.seconds, markdown)
