"""The daemon's lifecycle, top to bottom: check, start the parts in order (the HTTP server
first, so that /healthz answers while the engine loads; then its lease on every work area,
so that no other daemon sharing an inbox takes its claims while the engine loads),
announce readiness, serve, and on the way out drain and stop the parts in reverse order,
through one exit stack (the leases are given up once the documents have drained).

What the daemon serves with (the main loop, reloading, the status report) is
`ocrd/service.py`; what happens to one document is `ocrd/documents/document.py`.

Exit status: 0 after SIGTERM or SIGINT; 70 when the engine died or the main loop met an
unexpected error (systemd restarts the unit); 78 when the configuration or a folder is
wrong, or another daemon runs under the same instance name (it does not:
RestartPreventExitStatus=78).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from ocrd import __version__
from ocrd.config import Config, checks
from ocrd.documents.dispatch import Admission, DocumentDispatcher
from ocrd.documents.document import DocumentRunner
from ocrd.documents.pipeline import Pipeline
from ocrd.engines import (
    Engine,
    EngineDeadError,
    EngineStartError,
    choose_engine,
    create_engine,
)
from ocrd.intake.inboxes import Intake
from ocrd.log import get_logger
from ocrd.notify import SystemdNotifier
from ocrd.output.hooks import Hooks
from ocrd.service import Service
from ocrd.sharing.instances import InstanceNameError, Instances, Stopped, instance_name
from ocrd.sharing.leases import LeaseConflict, TakenOver
from ocrd.signals import EarlySignals
from ocrd.status import StatusReport
from ocrd.supervise import HealthWatch
from ocrd.uploads.uploads import Uploads
from ocrd.web.activity import Activity
from ocrd.web.documents import Documents
from ocrd.web.metrics import Metrics
from ocrd.web.server import WebServer

EXIT_OK = 0
EXIT_FATAL = 70  # EX_SOFTWARE: systemd restarts the unit
EXIT_CONFIG = 78  # EX_CONFIG: the unit does not restart (RestartPreventExitStatus=78)


class StartRefused(Exception):
    """The configuration cannot work on this machine; the message says what to change."""


class Daemon:
    def __init__(
        self,
        config: Config,
        engine_kind: str | None = None,
        config_path: Path | None = None,
        early_signals: EarlySignals | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.engine_kind = engine_kind
        self.early_signals = early_signals or EarlySignals()
        self.log = get_logger()
        self.notifier = SystemdNotifier()
        self.activity = Activity()
        self.health_watch = HealthWatch(self.notifier, lambda _: self.fail())
        self.metrics = Metrics(lambda: self.report(), self.replica_metrics)
        self.hooks = Hooks(lambda *labels: self.metrics.hooks.labels(*labels).inc())
        self.report: Callable[[], StatusReport] = lambda: StatusReport.loading(__version__)
        self.uploads = Uploads(config)  # taken from the start, while the engine loads
        self.documents = Documents(config)
        self.stopping = asyncio.Event()
        self.instances: Instances  # made in `run`, where a bad instance name can exit 78
        self.engine: Engine | None = None  # once started
        self.serving: Service | None = None  # once every part runs
        self.exit_code = EXIT_OK
        self._reload_early = False  # a SIGHUP that came before serving started
        self._reload: Callable[[], None] = self._reload_once_serving

    async def run(self) -> int:
        self.install_signal_handlers()
        problems = checks.problems(self.config)
        if problems:
            for line in problems:
                self.log.error("startup.refused", reason=line)
            return EXIT_CONFIG
        for warning in checks.folder_warnings(self.config):
            self.log.warning("startup.warning", reason=warning)
        try:
            self.instances = Instances(instance_name(), self.config.instances, self)
        except InstanceNameError as error:
            self.log.error("startup.refused", reason=str(error))
            return EXIT_CONFIG
        try:
            async with contextlib.AsyncExitStack() as parts:
                web = await parts.enter_async_context(self.web_server())
                await parts.enter_async_context(self.uploads.tidying())
                await parts.enter_async_context(self.held_leases())
                engine = await parts.enter_async_context(self.started_engine())
                pipeline = await parts.enter_async_context(self.started_pipeline(engine))
                parts.push_async_callback(self.hooks.stop)
                service = await self.started_service(engine, pipeline, web)
                parts.push_async_callback(service.drain)
                self.notifier.ready(service.status_line())
                self.log.info(
                    "daemon.ready",
                    inboxes=[str(i.path) for i in self.config.inboxes],
                    instance=self.instances.name,
                )
                await service.serve()
        except (StartRefused, LeaseConflict) as refused:
            self.log.error("startup.refused", reason=str(refused))
            self.exit_code = EXIT_CONFIG
        except Stopped:
            pass  # asked to stop while it waited for its lease
        except EngineStartError as error:
            self.log.error(
                "engine.start_failed",
                error=str(error),
                action="exiting so that systemd restarts ocrd; files wait in the inbox",
            )
            self.exit_code = EXIT_FATAL
        except Exception:
            self.log.exception("daemon.failed", action="exiting so that systemd restarts ocrd")
            self.exit_code = EXIT_FATAL
        self.log.info(
            "daemon.stopped",
            exit_code=self.exit_code,
            loop_lag_worst_ms=round(self.health_watch.pulse.worst * 1000, 1),
        )
        return self.exit_code

    # --- the parts, in the order they start ----------------------------------------------

    @contextlib.asynccontextmanager
    async def web_server(self) -> AsyncIterator[WebServer]:
        web = WebServer(
            self.config.http,
            lambda: self.report(),
            self.health_watch.pulse.liveness,
            self.metrics,
            self.uploads,
            self.documents,
        )
        await web.serve()
        try:
            yield web
        finally:
            await web.stop()

    @contextlib.asynccontextmanager
    async def held_leases(self) -> AsyncIterator[Instances]:
        """This daemon's lease on every inbox's work area (its claims there are its own),
        renewed in the background until it stops, then given up."""
        try:
            for inbox in self.config.inboxes:
                await self.instances.join(inbox.work, self.stopping)
            yield self.instances
        finally:
            await self.instances.leave()

    @contextlib.asynccontextmanager
    async def started_engine(self) -> AsyncIterator[Engine]:
        config = self.config.engine
        if self.engine_kind:
            config = config.model_copy(update={"kind": self.engine_kind})
        choice = choose_engine(config)
        self.log.info("engine.selected", engine=choice.kind, reason=choice.reason)
        try:
            engine = create_engine(config, choice.kind)
        except ValueError as error:  # e.g. engine.vllm.gpus names a GPU that is not there
            raise StartRefused(str(error)) from None
        try:
            async with self.health_watch.loading(engine, choice.kind):
                await engine.start()
            self.health_watch.watch(engine)
            self.engine = engine
            yield engine
        finally:
            await engine.stop()

    @contextlib.asynccontextmanager
    async def started_pipeline(self, engine: Engine) -> AsyncIterator[Pipeline]:
        side = max(inbox.max_image_side for inbox in self.config.inboxes)
        page_done = (self.activity.page_done, self.metrics.page_done)
        pipeline = Pipeline.create(engine, self.config.pipeline, side, page_done)
        try:
            await pipeline.renderers.warm_up()
            yield pipeline
        finally:
            await self.documents_ended()
            pipeline.renderers.shutdown()

    async def documents_ended(self) -> None:
        """No document runs once this returns: the service's drain has waited for them;
        should it have been cut short, those still running are stopped here (their claims
        stay for the next start), so that the render pool and the engine are never stopped
        under a document."""
        if self.serving is not None:
            await self.serving.dispatcher.drain(0)

    async def started_service(self, engine: Engine, pipeline: Pipeline, web: WebServer) -> Service:
        """Documents, intake and dispatch wired together; the inboxes watched."""
        runner = DocumentRunner(
            pipeline,
            on_finished=[
                lambda _, summary: self.activity.document_finished(summary),
                lambda _, summary: self.metrics.document_finished(summary),
                self.hooks.document_finished,
                self.documents.document_finished,
            ],
            on_storage_fault=[self.metrics.storage_fault, self.report_status],
        )
        intake = Intake(self.instances)
        dispatcher = DocumentDispatcher(
            intake,
            runner,
            Admission(1),
            self.document_crashed,
            lambda inbox: self.instances.shared(inbox.config.work),
            self.stopping,
        )
        service = Service(
            config=self.config,
            config_path=self.config_path,
            engine_kind=self.engine_kind,
            engine=engine,
            pipeline=pipeline,
            runner=runner,
            intake=intake,
            dispatcher=dispatcher,
            health_watch=self.health_watch,
            activity=self.activity,
            notifier=self.notifier,
            web=web,
            stopping=self.stopping,
            instances=self.instances,
        )
        self.serving = service
        self.documents.follow(runner)
        for config in self.config.inboxes:
            _, recovered = await intake.add(config)
            dispatcher.add(recovered)
        self.report = service.status_report
        engine.subscribe(lambda _: service.report_status())  # a replica went down or came back
        engine.subscribe(lambda _: service.follow_engine_capacity())  # a fleet grew or shrank
        self._reload = service.request_reload
        if self._reload_early:
            service.request_reload()
        return service

    # --- what the parts made first report to the daemon ----------------------------------

    def report_status(self, *_: object) -> None:
        """The status told to systemd anew (a storage fault), once the service runs."""
        if self.serving is not None:
            self.serving.report_status()

    async def replica_metrics(self) -> str:
        """The engine's replicas' own metrics, once the engine runs."""
        return await self.engine.metrics_text() if self.engine is not None else ""

    # --- several daemons on one inbox (instances.LeaseListener) ---------------------------
    # Until the service runs, no document runs and every work area is served.

    def serves(self, work: Path) -> bool:
        return self.serving.serves(work) if self.serving is not None else True

    async def lease_lost(self, work: Path, reason: str) -> list[str]:
        return await self.serving.lease_lost(work, reason) if self.serving is not None else []

    async def lease_regained(self, work: Path) -> None:
        if self.serving is not None:
            await self.serving.lease_regained(work)

    async def claims_taken_over(self, work: Path, taken: TakenOver) -> None:
        if self.serving is not None:
            await self.serving.claims_taken_over(work, taken)

    def lease_conflict(self, error: LeaseConflict) -> None:
        """Another daemon runs under this instance's name: end with 78 (not restarted)."""
        self.log.error("instance.conflict", reason=str(error), action="stopping")
        self.exit_code = EXIT_CONFIG
        self.stopping.set()

    def lease_failed(self, error: BaseException) -> None:
        self.fail()

    # --- signals and failures ------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """The event loop takes the signals over; those that came before it could (the
        process had started but not got this far) are acted on now."""
        loop = asyncio.get_running_loop()
        for stop in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(stop, self.request_stop, stop)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        for early in self.early_signals.take():
            if early == signal.SIGHUP:
                self.request_reload()
            else:
                self.request_stop(early)

    def request_stop(self, signum: int | None = None) -> None:
        if not self.stopping.is_set():
            name: str | None = signal.Signals(signum).name if signum else None
            self.log.info("daemon.stopping", signal=name)
            self.stopping.set()

    def request_reload(self) -> None:
        """SIGHUP: the main loop reloads at its next tick (one that came while the engine
        was loading is applied once serving starts)."""
        self._reload()

    def _reload_once_serving(self) -> None:
        self._reload_early = True

    def fail(self) -> None:
        """End the daemon with exit status 70, for systemd to restart it."""
        self.exit_code = EXIT_FATAL
        self.stopping.set()

    def document_crashed(self, error: BaseException) -> None:
        """A document's task ended with an exception: a dead engine, or a bug that escaped
        the document's state machine. Either way a clean restart is the way on."""
        if isinstance(error, EngineDeadError):
            self.health_watch.dead(error)
            return
        self.log.error(
            "document.crashed",
            error=repr(error),
            exc_info=error,
            action="exiting so that systemd restarts ocrd; the claim stays",
        )
        self.fail()
