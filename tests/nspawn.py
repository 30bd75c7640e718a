"""A real systemd, booted as PID 1 in a systemd-nspawn container, for tests of ocrd.service.

The host's PID 1 need not be systemd and the host needs no D-Bus (shared/NOTES.md, "Booting a
real systemd here"): a Debian bookworm minbase root file system with its own systemd 252, and
one with systemd 254 from bookworm-backports on top of it, are debootstrapped once and kept
as tarballs in a cache folder keyed by the scripts that built them; each boot unpacks a fresh
copy. The
container runs with `--register=no --keep-unit --private-network` in a cgroup of its own, on
the unified cgroup hierarchy (so that the unit's DevicePolicy= is enforced), and commands
enter it with `nsenter -a` at its systemd's PID.

Needs root, systemd-nspawn and debootstrap (scripts/install_test_packages.sh), and for a
first build Debian's mirror; without them the tests fail saying so rather than skip.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from mounts import tmpfs

# Root file systems live on a tmpfs: unpacking, pip's writes and removal of ~1 GB in some
# 20,000 files take minutes on a slow CI disk and seconds in memory. ACLs, renames and
# inotify behave there as on ext4.
ROOTFS_TMPFS_SIZE = "4g"

DEBIAN_MIRROR = os.environ.get("OCRD_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
HOST_LOCAL_CAS = Path("/usr/local/share/ca-certificates")

# Each systemd a test boots: the scripts that build its root file system, run by bash with
# ROOTFS and MIRROR set, each on top of the previous one's result. Their text is the cache
# key: change one and the next run builds afresh. The stock bookworm root is built once and
# is the base of the backports one.
DEBIAN_12 = r"""
set -euo pipefail
debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,dbus,python3,python3-venv,procps,ca-certificates,acl \
  bookworm "$ROOTFS" "$MIRROR"
chroot "$ROOTFS" apt-get clean
# A console login prompt is of no use to a test and only fills the console log.
chroot "$ROOTFS" systemctl mask console-getty.service
"""
BACKPORTS_SYSTEMD = r"""
set -euo pipefail
cat > "$ROOTFS/etc/apt/sources.list.d/backports.sources" <<SOURCES
Types: deb
URIs: $MIRROR
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
chroot "$ROOTFS" apt-get update -q
chroot "$ROOTFS" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
  --no-install-recommends -t bookworm-backports systemd systemd-sysv
chroot "$ROOTFS" apt-get clean
rm -rf "$ROOTFS"/var/lib/apt/lists/*
"""
# Debian 12's own systemd (252, as on Debian 12 and RHEL 9 servers), and a newer one.
SYSTEMDS = {
    "252": (DEBIAN_12,),
    "254": (DEBIAN_12, BACKPORTS_SYSTEMD),
}


class GuestCommandFailed(AssertionError):
    """A command inside the container exited non-zero."""


def require_host_tools() -> None:
    """Fail (never skip) when the host cannot boot a container."""
    if os.geteuid() != 0:
        pytest.fail("booting systemd in a container needs root (CI runs as root)")
    for tool in ("systemd-nspawn", "debootstrap", "nsenter", "tar"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: run scripts/install_test_packages.sh")


def cache_folder() -> Path:
    """Where the built root file system is kept between runs."""
    explicit = os.environ.get("OCRD_TEST_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ocrd-tests"


def rootfs_tarball(cache: Path, systemd: str) -> Path:
    """The tarball of a bootable root file system with this systemd, built (a minute or
    two) when missing, on top of the tarball of its base."""
    return _tarball(cache, SYSTEMDS[systemd])


def _tarball(cache: Path, scripts: tuple[str, ...]) -> Path:
    key = hashlib.sha256("\0".join(scripts).encode()).hexdigest()[:16]
    tarball = cache / f"rootfs-bookworm-{key}.tar.gz"
    if tarball.exists():
        return tarball
    base = _tarball(cache, scripts[:-1]) if len(scripts) > 1 else None
    cache.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_name(tarball.name + f".{os.getpid()}.part")
    building = cache / f"build-{os.getpid()}"
    with tmpfs(building, ROOTFS_TMPFS_SIZE):
        if base is not None:
            _unpack(base, building)
        _build_tarball(scripts[-1], building, partial)
    building.rmdir()
    partial.rename(tarball)
    _remove_stale_tarballs(cache)
    return tarball


def _remove_stale_tarballs(cache: Path) -> None:
    """Tarballs that no script in SYSTEMDS makes any more."""
    keys = {
        hashlib.sha256("\0".join(scripts[:n]).encode()).hexdigest()[:16]
        for scripts in SYSTEMDS.values()
        for n in range(1, len(scripts) + 1)
    }
    for tarball in cache.glob("rootfs-bookworm-*.tar.gz"):
        if tarball.name.removeprefix("rootfs-bookworm-").removesuffix(".tar.gz") not in keys:
            tarball.unlink(missing_ok=True)


def _build_tarball(script: str, building: Path, partial: Path) -> None:
    try:
        run_host(
            ["bash", "-c", script],
            env={**os.environ, "ROOTFS": str(building), "MIRROR": DEBIAN_MIRROR},
            timeout=900,
            what="building the container's root file system (debootstrap, Debian's mirror)",
        )
        run_host(
            [
                "tar",
                "-C",
                str(building),
                "--numeric-owner",
                "--acls",
                "--xattrs",
                "-I",
                "gzip -1",
                "-cf",
                str(partial),
                ".",
            ],
            timeout=300,
            what="packing the root file system",
        )
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def unpacked_rootfs(tarball: Path, target: Path) -> Iterator[Path]:
    """A fresh copy of the root file system at `target` (a tmpfs), gone afterwards."""
    with tmpfs(target, ROOTFS_TMPFS_SIZE):
        _unpack(tarball, target)
        yield target


def _unpack(tarball: Path, target: Path) -> None:
    run_host(
        ["tar", "-C", str(target), "--numeric-owner", "--acls", "--xattrs", "-xf", str(tarball)],
        timeout=300,
        what=f"unpacking {tarball}",
    )


def trust_host_cas(rootfs: Path) -> None:
    """A network that inspects TLS (a company proxy) signs with a CA the host added locally;
    the container must trust it too to reach PyPI. Without such CAs this does nothing."""
    local = sorted(HOST_LOCAL_CAS.glob("*.crt")) if HOST_LOCAL_CAS.is_dir() else []
    target = rootfs / HOST_LOCAL_CAS.relative_to("/")
    target.mkdir(parents=True, exist_ok=True)
    for certificate in local:
        shutil.copy2(certificate, target / certificate.name)


def run_unbooted(
    rootfs: Path, script: str, binds: Sequence[tuple[Path, str]] = (), timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """`script` (sh) in the container without booting it, on the host's network: for steps
    that download (pip). Raises GuestCommandFailed with its output when it fails."""
    arguments = [
        "systemd-nspawn",
        "--quiet",
        f"--directory={rootfs}",
        f"--machine={_name('setup')}",
        "--register=no",
        "--keep-unit",
        "--as-pid2",
    ]
    arguments += [f"--bind={host}:{guest}" for host, guest in binds]
    arguments += [f"--setenv={k}={os.environ[k]}" for k in PROXY_VARIABLES if k in os.environ]
    arguments += ["/bin/sh", "-c", script]
    result = subprocess.run(
        arguments, capture_output=True, text=True, timeout=timeout, env=_host_environment()
    )
    if result.returncode != 0:
        raise GuestCommandFailed(
            f"in the container (not booted): {script}\nexit status {result.returncode}\n"
            f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
        )
    return result


@dataclass
class Guest:
    """A booted container: its root file system on the host and its systemd's host PID."""

    name: str
    rootfs: Path
    leader: int
    console: Path

    def run(
        self, *command: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """A command inside the container (all its namespaces), with a clean environment."""
        arguments = [
            "nsenter",
            "-t",
            str(self.leader),
            "-a",
            "env",
            "-i",
            f"PATH={GUEST_PATH}",
            "LANG=C.UTF-8",
            *command,
        ]
        result = subprocess.run(
            arguments, capture_output=True, text=True, input=input, timeout=timeout
        )
        if check and result.returncode != 0:
            raise GuestCommandFailed(
                f"in the container: {shlex.join(command)}\nexit status {result.returncode}\n"
                f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
            )
        return result

    def sh(self, script: str, check: bool = True, timeout: float = 120) -> str:
        """A shell script inside the container; its standard output."""
        return self.run("/bin/sh", "-c", script, check=check, timeout=timeout).stdout

    def path(self, guest_path: str) -> Path:
        """Where a guest's file lies on the host (not for /tmp, /run, /proc: mounted inside)."""
        return self.rootfs / guest_path.lstrip("/")

    def unit(self, unit: str, *properties: str) -> dict[str, str]:
        """`systemctl show` of a unit's properties."""
        output = self.run("systemctl", "show", unit, *(f"--property={p}" for p in properties))
        lines = (line.partition("=") for line in output.stdout.splitlines())
        return {key: value for key, _, value in lines}

    def journal(self, unit: str) -> str:
        """systemd's and the unit's own lines about `unit`, oldest first."""
        return self.run("journalctl", "--unit", unit, "--output=cat", "--no-pager").stdout


@contextlib.contextmanager
def booted(rootfs: Path, console: Path, boot_timeout: float = 180) -> Iterator[Guest]:
    """systemd booted in `rootfs`; powered off and its cgroups removed afterwards, whatever
    happened."""
    name = _name("boot")
    cgroups = _create_cgroups(name)
    process: subprocess.Popen[bytes] | None = None
    try:
        process = _start_nspawn(rootfs, name, cgroups, console)
        guest = Guest(name, rootfs, _wait_for_leader(process, console), console)
        _wait_until_booted(guest, boot_timeout)
        yield guest
    finally:
        if process is not None:
            _power_off(process, cgroups)
        _remove_cgroups(cgroups)
        # nspawn's folder for propagating mounts into the guest; empty once it is off.
        with contextlib.suppress(OSError):
            Path("/run/systemd/nspawn/propagate", name).rmdir()


def _name(purpose: str) -> str:
    return f"ocrd-test-{purpose}-{os.getpid()}"


def _host_environment() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", GUEST_PATH), "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}


def run_host(
    arguments: list[str], timeout: float, what: str, env: dict[str, str] | None = None
) -> None:
    """A command on the host; AssertionError with its output, saying `what`, if it fails."""
    result = subprocess.run(arguments, capture_output=True, text=True, timeout=timeout, env=env)
    if result.returncode != 0:
        raise AssertionError(
            f"{what} failed (exit status {result.returncode}):\n"
            f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
        )


def _cgroup_mounts() -> list[Path]:
    """The hierarchies the container needs a cgroup in: the unified one, and on a hybrid
    host also the named systemd one."""
    mounts: list[Path] = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _source, target, kind, options = line.split()[:4]
        if kind == "cgroup2" or (kind == "cgroup" and "name=systemd" in options.split(",")):
            mounts.append(Path(target))
    if not any(Path(m / "cgroup.controllers").exists() for m in mounts):
        pytest.fail("no cgroup2 hierarchy is mounted: systemd-nspawn cannot boot systemd here")
    return mounts


def _create_cgroups(name: str) -> list[Path]:
    cgroups = [mount / name for mount in _cgroup_mounts()]
    for cgroup in cgroups:
        cgroup.mkdir(exist_ok=True)
    return cgroups


def _start_nspawn(
    rootfs: Path, name: str, cgroups: list[Path], console: Path
) -> subprocess.Popen[bytes]:
    # The shell moves itself into the container's own cgroups and then becomes nspawn, so that
    # the guest's systemd is delegated a subtree (--keep-unit: no scope from a host manager).
    enter = "; ".join(f"echo $$ > {shlex.quote(str(c / 'cgroup.procs'))}" for c in cgroups)
    nspawn = [
        "systemd-nspawn",
        "--boot",
        f"--directory={rootfs}",
        f"--machine={name}",
        "--register=no",
        "--keep-unit",
        "--private-network",
        "--console=read-only",
        # The unit's DevicePolicy=/DeviceAllow= are BPF programs on the unified hierarchy.
        "--capability=CAP_BPF",
        "--system-call-filter=bpf",
    ]
    with console.open("wb") as log:
        return subprocess.Popen(
            ["/bin/sh", "-c", f'{enter}; exec "$@"', "sh", *nspawn],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_host_environment(),
            start_new_session=True,
        )


def _wait_for_leader(process: subprocess.Popen[bytes], console: Path, timeout: float = 60) -> int:
    """The host PID of the container's systemd: nspawn's child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"systemd-nspawn exited ({process.returncode}):\n{_tail(console)}")
        leader = _systemd_child(process.pid)
        if leader is not None:
            return leader
        time.sleep(0.1)
    raise AssertionError(f"no systemd started in the container:\n{_tail(console)}")


def _wait_until_booted(guest: Guest, timeout: float) -> None:
    """Until `systemctl is-system-running` says running (or degraded); before the guest's
    systemd listens it cannot even be asked ("Failed to connect to bus")."""
    deadline = time.monotonic() + timeout
    answer = ""
    while time.monotonic() < deadline:
        result = guest.run("systemctl", "is-system-running", "--wait", check=False, timeout=timeout)
        answer = (result.stdout + result.stderr).strip()
        if result.stdout.strip() in ("running", "degraded"):
            return
        time.sleep(0.2)
    failed = guest.run("systemctl", "--failed", "--no-pager", check=False).stdout
    raise AssertionError(
        f"the container's systemd did not finish booting ({answer}):\n{failed}\n"
        f"{_tail(guest.console)}"
    )


def _systemd_child(pid: int) -> int | None:
    for child in _children(pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                return child
    return None


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return children


def _power_off(process: subprocess.Popen[bytes], cgroups: list[Path]) -> None:
    """`systemctl poweroff` inside; SIGKILL to everything in its cgroups if that hangs."""
    leader = _systemd_child(process.pid)
    if process.poll() is None and leader is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                ["nsenter", "-t", str(leader), "-a", "systemctl", "poweroff"],
                capture_output=True,
                timeout=30,
            )
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=90)
        return
    for cgroup in cgroups:
        kill = cgroup / "cgroup.kill"
        if kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def _remove_cgroups(cgroups: list[Path]) -> None:
    """Remove the container's cgroups, deepest first (the guest's systemd leaves its own)."""
    for cgroup in cgroups:
        if not cgroup.exists():
            continue
        deadline = time.monotonic() + 20
        while True:
            for folder in sorted(
                (p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            try:
                cgroup.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def _tail(path: Path, characters: int = 4000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-characters:]
    return ""
