"""The `ocrd` command: run, convert, check-config.

Only click is imported at the top: `ocrd run` must take over SIGHUP (whose default action
ends the process) within moments of starting, before the slow imports.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import click

from ocrd import __version__

F = TypeVar("F", bound=Callable[..., Any])
DEEPEST_TREE_RECURSION = 10_000
EXIT_CONFIG = 78  # EX_CONFIG: systemd's RestartPreventExitStatus=78 keeps the unit stopped
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a model's engine did not start or does not serve

if TYPE_CHECKING:
    from ocrd.config import Config, DocumentOptions, EngineConfig, PipelineConfig
    from ocrd.documents.compare import Sample

ENGINES = click.Choice(["auto", "vllm", "openai", "rapidocr", "simulated"])
config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, readable=False),  # unreadable, a folder: 78 (_load)
    help="YAML configuration file (see config.example.yaml).",
)
log_options = [
    click.option(
        "--log-format",
        type=click.Choice(["auto", "json", "console"]),
        default="auto",
        show_default=True,
        help="auto: readable on a terminal, JSON lines otherwise.",
    ),
    click.option(
        "--log-level",
        type=click.Choice(["debug", "info", "warning", "error"]),
        default="info",
        show_default=True,
    ),
]


def required_config(help_text: str) -> Callable[[F], F]:
    return click.option(
        "--config",
        "config_path",
        required=True,
        type=click.Path(path_type=Path, readable=False),  # unreadable, a folder: 78 (_load)
        help=help_text,
    )


def with_log_options(function: F) -> F:
    for option in reversed(log_options):
        function = option(function)
    return function


def configure_logging(log_format: str, log_level: str) -> None:
    from ocrd.log import configure_logging as configure

    configure(log_format, log_level)  # type: ignore[arg-type]


def _load(path: Path, strict: bool = False, engine_kind: str | None = None) -> Config:
    """The configuration, or exit 78 with the reason; `strict`: also refuse a file, hook
    program or model folder (of `engine_kind`'s engines where `--engine` names one) that
    others than this user and root may change (ocrd/config/strict.py)."""
    from ocrd.config import ConfigError, load_config
    from ocrd.config.strict import strict_mode_problems

    try:
        config = load_config(path)
    except ConfigError as error:
        click.echo(f"ocrd: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    refused = strict_mode_problems(path, config, engine_kind) if strict else []
    for line in refused:
        click.echo(f"ocrd: {path}: {line}", err=True)
    if refused:
        sys.exit(EXIT_CONFIG)
    return config


def _one_off_options(
    config_path: Path | None,
) -> tuple[EngineConfig, PipelineConfig, DocumentOptions]:
    """Engine, pipeline and document options for convert and rerender: the config's, with
    its first inbox's document options, or the defaults without a config."""
    from ocrd.config import DocumentOptions, EngineConfig, PipelineConfig

    if config_path is None:
        return EngineConfig(), PipelineConfig(), DocumentOptions()
    config = _load(config_path)
    return config.engine, config.pipeline, config.inboxes[0]


@click.group()
@click.version_option(__version__, prog_name="ocrd")
def main() -> None:
    """ocrd: watched-folder OCR. PDFs and page images in, Markdown out."""


@main.command()
@required_config("YAML configuration file.")
@click.option("--engine", type=ENGINES, default=None, help="Override engine.kind from the config.")
@with_log_options
def run(config_path: Path, engine: str | None, log_format: str, log_level: str) -> None:
    """Serve the inboxes of CONFIG until SIGTERM or SIGINT."""
    from ocrd.signals import EarlySignals

    early = EarlySignals().install()  # before the slow imports: a SIGHUP must not kill us
    # A path is at most PATH_MAX (4096) bytes, so at most 2048 folders deep; walking a tree
    # (ours, and watchdog's) recurses once a folder: deep trees must not end the daemon.
    sys.setrecursionlimit(max(sys.getrecursionlimit(), DEEPEST_TREE_RECURSION))
    from ocrd.daemon import Daemon

    configure_logging(log_format, log_level)
    config = _load(config_path, strict=True, engine_kind=engine)
    sys.exit(asyncio.run(Daemon(config, engine, config_path, early).run()))


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Folder for <name>.md (and <name>.error.json for failures).",
)
@config_option
@click.option("--engine", type=ENGINES, default=None, help="Override engine.kind.")
@with_log_options
def convert(
    files: tuple[Path, ...],
    out: Path,
    config_path: Path | None,
    engine: str | None,
    log_format: str,
    log_level: str,
) -> None:
    """Convert FILES once, leaving them untouched; exit 1 if any failed."""
    from ocrd.documents.convert import convert_files

    configure_logging(log_format, log_level)
    engine_config, pipeline_config, options = _one_off_options(config_path)
    if engine:
        engine_config = engine_config.model_copy(update={"kind": engine})
    terminal = sys.stderr.isatty()
    failed = asyncio.run(
        convert_files(list(files), out, engine_config, pipeline_config, options, terminal)
    )
    if failed:
        click.echo(
            f"ocrd: {failed} of {len(files)} files failed; see the .error.json files in {out}",
            err=True,
        )
    sys.exit(1 if failed else 0)


@main.command()
@click.argument("document", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.argument("raw", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Folder for <name>.md and its companions.",
)
@config_option
@with_log_options
def rerender(
    document: Path, raw: Path, out: Path, config_path: Path | None, log_format: str, log_level: str
) -> None:
    """Write DOCUMENT's Markdown again from RAW (its .raw.jsonl), without any engine.

    The pages are rendered with the settings of the config's first inbox (or the defaults),
    as the daemon rendered them, so figures are cropped from the same pixels.
    """
    from ocrd.documents.rerender import RawFileError
    from ocrd.documents.rerender import rerender as rerender_document
    from ocrd.domain import DocumentFailed
    from ocrd.render import RenderLimits

    configure_logging(log_format, log_level)
    _, pipeline, options = _one_off_options(config_path)
    try:
        written = asyncio.run(
            rerender_document(
                document, raw, out, options.for_engine(None), RenderLimits.of(pipeline)
            )
        )
    except (RawFileError, DocumentFailed) as error:
        click.echo(f"ocrd: {error}", err=True)
        sys.exit(1)
    for markdown in written:
        click.echo(str(markdown))


@main.command()
@required_config("The YAML configuration whose engine section serves the models (the daemon's).")
@click.option(
    "--model",
    "models",
    multiple=True,
    required=True,
    help="A model to compare, given twice: engine.model or a key of engine.models.",
)
@click.option(
    "--diff",
    "diff_folder",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write each model's Markdown (<document>.<model>.md) and a unified diff "
    "(<document>.diff) of each document here.",
)
@click.argument("sample", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default="auto")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
)
def compare(
    config_path: Path,
    models: tuple[str, ...],
    diff_folder: Path | None,
    sample: tuple[Path, ...],
    log_format: str,
    log_level: str,
) -> None:
    """Read SAMPLE (PDFs and images: files, or folders of them) with two models, one after
    the other, and show each one's pages a second and how far their readings agree. Exit 1
    if a model could not read a document, 2 for a model CONFIG does not serve or a sample
    that is not there, 69 if a model's engine did not start or does not serve, 78 if CONFIG
    cannot be used."""
    from ocrd.documents.compare import SampleError, gather_sample

    configure_logging(log_format, log_level)
    config = _load(config_path)
    pair = _two_served_models(config, models)
    try:
        documents = gather_sample(sample)
    except SampleError as error:
        raise click.BadParameter(str(error), param_hint="SAMPLE") from None
    for line in documents.left_out:
        _say(f"left out of the sample: {line}")
    if diff_folder is not None:
        _made(diff_folder)
    sys.exit(_compare_models(config_path, config, pair, documents, diff_folder))


def _made(folder: Path) -> None:
    """The --diff folder, made before the models read anything: one that cannot be made
    is said at once."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise click.BadParameter(f"{folder}: {error.strerror}", param_hint="--diff") from None


def _say(line: str) -> None:
    click.echo(f"ocrd compare: {line}", err=True)


def _two_served_models(config: Config, models: tuple[str, ...]) -> tuple[str, str]:
    served = config.engine.served_models
    for name in models:
        if name not in served:
            raise click.BadParameter(
                f"{name!r}: the configuration serves no such model (it serves: "
                f'{", ".join(served)}); add it under engine.models (docs/fleets.md, "Models")',
                param_hint="--model",
            )
    if len(models) != 2 or models[0] == models[1]:
        raise click.BadParameter("give two different models", param_hint="--model")
    return models[0], models[1]


def _compare_models(
    config_path: Path,
    config: Config,
    pair: tuple[str, str],
    sample: Sample,
    diff_folder: Path | None,
) -> int:
    """Both models' readings of the sample, shown (and written); the exit status."""
    from ocrd.documents.compare import EngineNotReady, plan_model, read_with_both
    from ocrd.documents.compare_report import compare_runs, report, write_readings

    try:
        plans = (plan_model(config, pair[0]), plan_model(config, pair[1]))
    except ValueError as error:
        click.echo(f"ocrd: {config_path}: {error}", err=True)
        return EXIT_CONFIG
    for plan in plans:
        if plan.warning is not None:
            _say(plan.warning)
    try:
        runs = asyncio.run(read_with_both(plans, sample, config.pipeline, _say))
    except EngineNotReady as error:
        click.echo(f"ocrd: {error}", err=True)
        return EXIT_UNAVAILABLE
    compared = compare_runs(sample, runs)
    click.echo(report(runs, compared), nl=False)
    if diff_folder is not None:
        try:
            written = write_readings(diff_folder, runs, compared)
        except OSError as error:
            click.echo(
                f"ocrd: the readings could not be written to {diff_folder}: {error}", err=True
            )
            return 1
        click.echo(f"{len(written)} files written to {diff_folder}")
    failed = any(r.failure is not None for run in runs for r in run.readings.values())
    return 1 if failed else 0


@main.command()
@required_config("The daemon's YAML configuration (its http.listen address and inboxes).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def status(config_path: Path, as_json: bool) -> None:
    """Show what the daemon serving CONFIG is doing; exit 1 if it is not ready, 2 if it is
    not reachable, 3 if the daemon answering serves other inboxes than CONFIG lists, 78 if
    CONFIG cannot be used."""
    from ocrd.web.client import fetch_status, format_status, other_daemon

    config = _load(config_path)
    try:
        report = fetch_status(config.http)
    except OSError as error:
        click.echo(f"ocrd: {error}", err=True)
        sys.exit(2)
    click.echo(report.model_dump_json(indent=2) if as_json else format_status(report))
    mismatch = other_daemon(report, config)
    if mismatch is not None:
        click.echo(f"ocrd: {config_path}: {mismatch}", err=True)
        sys.exit(3)
    sys.exit(0 if report.ready else 1)


@main.command()
@click.option("--pid", required=True, type=int, help="The daemon's process ($MAINPID).")
@click.option(
    "--timeout",
    type=float,
    default=100.0,
    show_default=True,
    help="Seconds to wait for the daemon to confirm (the unit's TimeoutStartSec= bounds it).",
)
def reload(pid: int, timeout: float) -> None:
    """Reload a daemon and wait until it has: the unit's ExecReload=. Exit 1 if it kept
    its configuration (the file is invalid) or did not confirm."""
    from ocrd.notify import ReloadNotConfirmed, reload_and_wait, reload_record_path

    record = reload_record_path()
    if record is None:
        raise click.UsageError(
            "ocrd reload waits for the reload record in $RUNTIME_DIRECTORY, which systemd sets "
            "for the unit (RuntimeDirectory=ocrd); by hand, send SIGHUP: kill -HUP PID"
        )
    try:
        done = reload_and_wait(pid, record, timeout)
    except ReloadNotConfirmed as error:
        click.echo(f"ocrd: {error}", err=True)
        sys.exit(1)
    if not done.applied:
        click.echo(f"ocrd: the configuration in use stays in effect: {done.reason}", err=True)
        sys.exit(1)
    for line in done.refused:
        click.echo(f"ocrd: kept until a restart: {line}", err=True)
    click.echo(f"ocrd (process {pid}) reloaded its configuration")


@main.command("check-config")
@config_option
@click.option(
    "--unit",
    "unit_file",
    type=click.File("r"),
    help="The systemd unit ocrd runs under, with its drop-ins: `systemctl cat ocrd` "
    "(give - to read it from standard input) or systemd/ocrd.service. Each folder its "
    "sandbox does not let ocrd write is named, with the setting to change.",
)
def check_config(config_path: Path | None, unit_file: TextIO | None) -> None:
    """Validate CONFIG and its folders; exit non-zero on any problem."""
    from ocrd.config.checks import check_folders
    from ocrd.config.sandbox import read_unit, unwritable_folders

    if config_path is None:
        raise click.UsageError("--config is required")
    config = _load(config_path, strict=True)
    problems = check_folders(config, create=False)
    if unit_file is not None:
        problems += unwritable_folders(config, read_unit(unit_file.read()))
    for problem in problems:
        click.echo(f"ocrd: {config_path}: {problem}", err=True)
    if problems:
        sys.exit(EXIT_CONFIG)  # as `ocrd run` refuses
    click.echo(f"{config_path}: OK ({len(config.inboxes)} inboxes, engine {config.engine.kind})")
