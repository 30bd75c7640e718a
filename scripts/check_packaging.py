"""The package as users install it: build the sdist and the wheel, install the wheel into a
fresh virtual environment and use it from outside this checkout, and check that the `[vllm]`
extra resolves from PyPI on each Python version the README names.

    .venv/bin/python scripts/check_packaging.py [--python-versions 3.11,3.12,3.13]

Needs PyPI (the wheel's dependencies are installed; the extra is only resolved, with
`pip install --dry-run`, which installs nothing). A resolution of the extra reads the
metadata of some 200 wheels, among them torch (900 MB) and CUDA's libraries; where the index
serves no separate metadata files pip downloads each wheel whole, several GB a Python
version (4 minutes each, measured). With pip's fast-deps it reads only each wheel's
metadata, with HTTP range requests (1 minute, the same packages chosen); it is an
experimental pip feature, so the pip running it is pinned (PIP). The three resolutions
run at once.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# README, "Quick start": Python 3.11 or newer; these are the versions vLLM's wheels serve.
PYTHON_VERSIONS = "3.11,3.12,3.13"
QUIET_PIP = ("--disable-pip-version-check", "--quiet")
PIP = "pip==26.3"  # the resolutions' pip: it has --use-feature=fast-deps


def run(*command: str | Path, cwd: Path | None = None) -> str:
    print("+", " ".join(str(c) for c in command), flush=True)
    started = time.monotonic()
    result = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, check=False
    )
    print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}):\n{result.stdout[-4000:]}{result.stderr[-4000:]}")
    return result.stdout


def build(folder: Path) -> tuple[Path, Path]:
    run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", folder, ROOT)
    [wheel] = folder.glob("*.whl")
    [sdist] = folder.glob("*.tar.gz")
    return sdist, wheel


def installed_and_used(wheel: Path, folder: Path) -> Path:
    """The wheel in a fresh environment: every module imports and the command runs, with
    this checkout nowhere on the path. Returns that environment's python."""
    environment = folder / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    run(python, "-m", "pip", "install", *QUIET_PIP, PIP)
    run(python, "-m", "pip", "install", *QUIET_PIP, wheel)
    imports = (
        "import importlib, pkgutil, ocrd; "
        "[importlib.import_module(m.name) for m in "
        "pkgutil.walk_packages(ocrd.__path__, 'ocrd.') if m.name != 'ocrd.__main__']; "
        "print(ocrd.__file__)"
    )
    where = run(python, "-c", imports, cwd=folder).strip()
    if not where.startswith(str(environment)):
        sys.exit(f"ocrd was imported from {where}, not from the installed wheel")
    print(run(environment / "bin" / "ocrd", "--version", cwd=folder).strip())
    config = folder / "config.yaml"
    (folder / "data" / "inbox").mkdir(parents=True)
    config.write_text((ROOT / "config.example.yaml").read_text())
    run(environment / "bin" / "ocrd", "check-config", "--config", config, cwd=folder)
    return python


def resolve_vllm_extra(
    pip_python: Path, wheel: Path, python_version: str, folder: Path
) -> subprocess.Popen[str]:
    """`pip install 'inbox-ocrd[vllm]'` for this Python, from PyPI alone (--isolated: no
    local wheel folder or index of this machine's pip configuration), started. pip takes
    another Python's version only with --target; --dry-run writes nothing."""
    command = [
        pip_python,
        "-m",
        "pip",
        "--isolated",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--use-feature=fast-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--target",
        folder / f"target-{python_version}",
        "--find-links",
        folder / "wheels",
        "--disable-pip-version-check",
        f"{wheel}[vllm]",
    ]
    print("+", " ".join(str(c) for c in command), flush=True)
    return subprocess.Popen(
        [str(c) for c in command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def resolved_vllm(python_version: str, resolution: subprocess.Popen[str]) -> str:
    """The vLLM the extra resolved to on this Python; exits saying why when it did not."""
    output, _ = resolution.communicate()
    if resolution.returncode != 0:
        sys.exit(f"Python {python_version}: [vllm] does not resolve:\n{output[-4000:]}")
    chosen = [line for line in output.splitlines() if line.startswith("Would install")]
    vllm = [w for line in chosen for w in line.split() if w.startswith("vllm-")]
    if not vllm:
        sys.exit(f"Python {python_version}: the [vllm] extra resolved without vLLM:\n{output}")
    return vllm[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-versions", default=PYTHON_VERSIONS)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ocrd-packaging-") as name:
        folder = Path(name)
        sdist, wheel = build(folder / "dist")
        print(f"built {sdist.name} and {wheel.name}")
        python = installed_and_used(wheel, folder)
        # sdnotify comes as an sdist only, which --python-version does not take: its wheel
        # (pure Python, any version) is built once here.
        run(
            python,
            "-m",
            "pip",
            "wheel",
            *QUIET_PIP,
            "--no-deps",
            "--wheel-dir",
            folder / "wheels",
            "sdnotify",
        )
        versions = args.python_versions.split(",")
        resolving = time.monotonic()
        resolutions = [resolve_vllm_extra(python, wheel, v, folder) for v in versions]
        for version, resolution in zip(versions, resolutions, strict=True):
            print(f"Python {version}: [vllm] resolves with {resolved_vllm(version, resolution)}")
        print(f"  (resolved in {time.monotonic() - resolving:.0f} s)")
    print(f"packaging checked in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
