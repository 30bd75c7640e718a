"""A recognised page's figures, cut from its source page by the render workers: at most
the inbox's `max_figures_per_page` of them (a page's answer may hold thousands: a page that
went wrong, or a server that lies); what is left out is said in the log and the Markdown."""

from __future__ import annotations

from pathlib import Path

from ocrd.config import DocumentOptions
from ocrd.documents.sources import PageRef
from ocrd.domain import PageResult
from ocrd.log import FilteringBoundLogger
from ocrd.output.page import figure_name, figure_plan
from ocrd.render import RenderPool


async def cut_figures(
    renderers: RenderPool,
    source: PageRef,
    page: PageResult,
    settings: DocumentOptions,
    folder: Path,
) -> None:
    """Cut the page's figures, at most the inbox's `max_figures_per_page`, from its source
    page into `folder` (by the render workers)."""
    plan = figure_plan(page, settings.max_figures_per_page)
    page.figures_left_out = plan.left_out
    if not plan.regions:
        return
    names = [figure_name(page.number, n) for n in range(1, len(plan.regions) + 1)]
    regions = list(plan.regions.values())
    dpi = settings.figure_resolution
    cuts = await renderers.figures(source.source, source.number, regions, dpi, folder, names)
    page.figures = dict(zip(plan.regions, cuts, strict=True))
    for index, first in plan.same_as.items():
        page.figures[index] = page.figures[first]


def say_figures_left_out(
    log: FilteringBoundLogger, page: PageResult, settings: DocumentOptions
) -> None:
    """A page with more figures than the inbox allows says so in the log (and its Markdown)."""
    if page.figures_left_out:
        log.warning(
            "page.figures_left_out",
            page=page.number,
            left_out=page.figures_left_out,
            cut=len({figure.path for figure in page.figures.values()}),
            max_figures_per_page=settings.max_figures_per_page,
        )
