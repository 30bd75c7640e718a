"""`ocrd convert`: the daemon's pipeline, run once over files given on the command line.

Originals are only read. Each input gives `<out>/<name>.md`, or `<out>/<name>.error.json`
with the reason it failed.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path, PurePath

from ocrd.config import EngineConfig, PipelineConfig
from ocrd.domain import DocumentFailed, DocumentSettings
from ocrd.engines import EngineDeadError, choose_engine, create_engine
from ocrd.files import free_name
from ocrd.log import get_logger
from ocrd.pipeline import Pipeline
from ocrd.settle import ERROR_SUFFIX, error_report, write_report
from ocrd.write import markdown_target, write_document


async def convert_files(
    files: list[Path],
    out: Path,
    engine_config: EngineConfig,
    pipeline_config: PipelineConfig,
    settings: DocumentSettings,
) -> int:
    """Convert every file; the number of files that failed."""
    log = get_logger()
    choice = choose_engine(engine_config)
    log.info("engine.selected", engine=choice.kind, reason=choice.reason)
    engine = create_engine(engine_config, choice.kind)
    await engine.start()
    pipeline = Pipeline.create(engine, pipeline_config, settings.render.max_image_side)
    documents = asyncio.Semaphore(pipeline_config.documents_in_flight_for(engine.max_concurrency))
    out.mkdir(parents=True, exist_ok=True)

    async def convert_one(path: Path) -> bool:
        async with documents:
            with tempfile.TemporaryDirectory(prefix="ocrd-convert-") as scratch:
                try:
                    result = await pipeline.convert(path, settings, Path(scratch))
                except DocumentFailed as failure:
                    report = free_name(out / f"{path.stem}{ERROR_SUFFIX}")
                    write_report(report, error_report(failure, None, choice.kind, path))
                    log.warning(
                        "document.finished",
                        path=str(path),
                        outcome="failed",
                        stage=failure.stage,
                        page=failure.page,
                        reason=failure.message,
                        error_report=str(report),
                    )
                    return False
                target = markdown_target(out, PurePath(path.name))
                write_document(result, settings, target, path.name)
        log.info(
            "document.finished",
            path=str(path),
            outcome="done",
            pages=len(result.pages),
            seconds=round(result.seconds, 3),
            finish_reasons=result.finish_reasons(),
            markdown=str(target),
        )
        return True

    try:
        outcomes = await asyncio.gather(*(convert_one(path) for path in files))
    except EngineDeadError as error:
        log.error("engine.dead", error=str(error))
        return len(files)
    finally:
        pipeline.renderers.shutdown()
        await engine.stop()
    return outcomes.count(False)
