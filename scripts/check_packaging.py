"""The package as users install it: build the sdist and the wheel, install the wheel into a
fresh virtual environment and use it from outside this checkout, and check that the `[vllm]`
extra resolves on each Python version the README names.

    .venv/bin/python scripts/check_packaging.py [--python-versions 3.11,3.12,3.13]

Needs PyPI (the wheel's dependencies are installed; the extra is only resolved, with
`pip install --dry-run`, which reads the packages' metadata and installs nothing).
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


def run(*command: str | Path, cwd: Path | None = None) -> str:
    print("+", " ".join(str(c) for c in command), flush=True)
    result = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}):\n{result.stdout[-4000:]}{result.stderr[-4000:]}")
    return result.stdout


def build(folder: Path) -> tuple[Path, Path]:
    run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", folder, ROOT)
    [wheel] = folder.glob("*.whl")
    [sdist] = folder.glob("*.tar.gz")
    return sdist, wheel


def installed_and_used(wheel: Path, folder: Path) -> None:
    """The wheel in a fresh environment: every module imports and the command runs, with
    this checkout nowhere on the path."""
    environment = folder / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel)
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


def vllm_extra_resolves(wheel: Path, python_version: str, folder: Path) -> None:
    """`pip install 'inbox-ocrd[vllm]'` finds a consistent set of wheels for this Python
    (pip takes another Python's version only with --target; --dry-run writes nothing)."""
    output = run(
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
        "--only-binary=:all:", "--python-version", python_version,
        "--target", folder / "target", "--find-links", folder / "wheels",
        "--disable-pip-version-check", f"{wheel}[vllm]",
    )  # fmt: skip
    chosen = [line for line in output.splitlines() if line.startswith("Would install")]
    vllm = [w for line in chosen for w in line.split() if w.startswith("vllm-")]
    if not vllm:
        sys.exit(f"Python {python_version}: the [vllm] extra resolved without vLLM:\n{output}")
    print(f"Python {python_version}: [vllm] resolves with {vllm[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-versions", default=PYTHON_VERSIONS)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ocrd-packaging-") as name:
        folder = Path(name)
        sdist, wheel = build(folder / "dist")
        print(f"built {sdist.name} and {wheel.name}")
        installed_and_used(wheel, folder)
        # sdnotify comes as an sdist only, which --python-version does not take: its wheel
        # (pure Python, any version) is built once here.
        run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
            folder / "wheels", "sdnotify")  # fmt: skip
        for version in args.python_versions.split(","):
            vllm_extra_resolves(wheel, version, folder)
    print(f"packaging checked in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
