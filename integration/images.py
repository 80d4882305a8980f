"""Debian VM images for the integration test bed: recipes, cache and build.

Each distro is a root filesystem built with mmdebstrap, turned into an ext4
disk image without root mounts (``mke2fs -d``), plus the kernel and initrd
to boot it directly. As root mmdebstrap builds into a directory; as a user
it builds a tarball in a user namespace (``--mode=unshare``: newuidmap from
``uidmap`` and a range in /etc/subuid), which ``unshare --map-root-user
--map-auto`` unpacks into the disk image with its owners intact. Images are
cached outside the checkout (/var/tmp/agentscope-vm for root, the user's
cache directory otherwise), keyed by a hash of the recipe (the distro, its
packages, hooks and guest files, the guest's Python requirements), so an
image is rebuilt only when its recipe changes.

Standard library only: this runs on fresh CI machines before anything else
is installed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

__all__ = ["DISTROS", "Distro", "Image", "ensure_image"]

_HERE = Path(__file__).resolve().parent
_PROJECT = _HERE.parent


def _default_cache() -> str:
    if os.geteuid() == 0:
        return "/var/tmp/agentscope-vm"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "agentscope-vm")


CACHE_DIR = Path(os.environ.get("AGENTSCOPE_VM_CACHE") or _default_cache())
# mke2fs and chroot (mmdebstrap's hooks) live in /usr/sbin, which a Debian
# user's PATH lacks; the runner and every command it starts look there too.
for _sbin in ("/usr/sbin", "/sbin"):
    if _sbin not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.environ.get("PATH", "") + os.pathsep + _sbin
# Bumped when what an image holds changes in a way the recipe's text does not show.
_RECIPE_VERSION = 2
MIRROR = "http://deb.debian.org/debian"
TEST_USER = "agent"
TEST_UID = 1000


@dataclasses.dataclass(frozen=True)
class Distro:
    name: str
    suite: str
    systemd: str  # major version the image must boot with
    python: str  # the guest's python3, for picking wheels on the host
    extra_mirrors: tuple[str, ...] = ()
    aptopts: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()  # extra mmdebstrap --customize-hook commands
    # Packages beyond _PACKAGES: systemd-oomd for the host profiles (roothelper.sh
    # profile), on the distros whose suites run them (integration/tests/test_hosts.py).
    # Not on sd247: bullseye's systemd 247 has no systemd-oomd package.
    packages: tuple[str, ...] = ()


# bullseye's systemd 247.3 under a bookworm userland (Python 3.11), as in
# FIELD-NOTES.md: bullseye's own Python 3.9 is older than we support.
_SD247_DOWNGRADE = (
    'chroot "$1" apt-get install -y -q --allow-downgrades '
    "systemd/bullseye systemd-sysv/bullseye libsystemd0/bullseye "
    "libpam-systemd/bullseye udev/bullseye libudev1/bullseye"
)

DISTROS: dict[str, Distro] = {
    d.name: d
    for d in (
        Distro(
            "sd247",
            "bookworm",
            "247",
            "3.11",
            extra_mirrors=(f"deb {MIRROR} bullseye main",),
            hooks=(_SD247_DOWNGRADE,),
        ),
        Distro("bookworm", "bookworm", "252", "3.11"),
        # nodejs: the Node client's VM test (integration/tests/test_node.py) runs here.
        # podman, crun, conmon: the container bed (integration/tests/test_containers.py);
        # catatonit is its --init and kube play's pause, uidmap its rootless user
        # namespace. No network packages (netavark's nft, passt): the bed's
        # containers run with --network=none.
        Distro(
            "trixie",
            "trixie",
            "257",
            "3.13",
            packages=(
                "systemd-oomd",
                "nodejs",
                "podman",
                "crun",
                "conmon",
                "catatonit",
                "uidmap",
            ),
        ),
        Distro(
            "sid",
            "sid",
            "262",
            "3.14",
            # The sid index here is a snapshot whose Release file has expired.
            aptopts=('Acquire::Check-Valid-Until "false"',),
            packages=("systemd-oomd",),
        ),
    )
}

_PACKAGES = (
    "linux-image-cloud-amd64",
    "systemd",
    "systemd-sysv",
    "dbus",
    "dbus-user-session",
    "libpam-systemd",
    "python3",
    "python3-venv",
    "tmux",
    "procps",
    "util-linux",
    "e2fsprogs",
    "passwd",  # useradd: not Essential from trixie on
    # Debian's early OOM killer, for bench_squeeze.py's comparison round only:
    # masked below so it never acts in a test (roothelper.sh unmasks it for
    # that round).
    "earlyoom",
)

# The unit that runs the payload once the system and the lingering user's
# manager are up, then powers off at once: a normal poweroff can wait minutes
# on leftover processes.
_GUEST_UNIT = f"""\
[Unit]
Description=agentscope integration payload
After=multi-user.target user@{TEST_UID}.service
Wants=user@{TEST_UID}.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/agentscope-guest
StandardOutput=journal+console
TimeoutStartSec=infinity
# Tests provoke OOM kills; one of them must not stop the test runner.
OOMPolicy=continue

[Install]
WantedBy=multi-user.target
"""

_GUEST_SCRIPT = """\
#!/bin/sh
# Mount the payload disk, run its script with output on the second serial
# port, then power off without waiting for anything.
out=/dev/ttyS1
stty -F "$out" raw -echo 2>/dev/null
mkdir -p /payload
if mount -o noatime /dev/vdb /payload; then
    sh /payload/guest.sh >"$out" 2>&1
else
    echo "@@AGENTSCOPE-STATUS payload=mount-failed@@" >"$out"
fi
cd /
sync
umount /payload 2>/dev/null
sync
echo o >/proc/sysrq-trigger
"""


def _guest_requirements() -> list[str]:
    """What the guest needs besides agentscope itself: its deps and test deps."""
    meta = tomllib.loads((_PROJECT / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    return sorted(
        set(meta["dependencies"])
        | {r for k in ("cli", "monitor", "tmux", "test") for r in extras[k]}
    )


def _recipe_key(distro: Distro) -> str:
    # The recipe, not this file: how an image is built (as root or in a user
    # namespace) does not change what it holds.
    recipe = (
        _RECIPE_VERSION,
        distro,
        _PACKAGES,
        _GUEST_UNIT,
        _GUEST_SCRIPT,
        _hooks(distro, Path("/files"), Path("/wheels")),
        _guest_requirements(),
    )
    return hashlib.sha256(repr(recipe).encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Image:
    distro: Distro
    root: Path
    kernel: Path
    initrd: Path


def _log(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], log: Path) -> None:
    with log.open("ab") as f:
        f.write(("\n$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        raise SystemExit(f"image build step failed (exit {rc}): {cmd[0]}\n" + "\n".join(tail))


def _download_wheels(distro: Distro, dest: Path, log: Path) -> None:
    ver = distro.python.replace(".", "")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "--python-version",
            distro.python,
            "--implementation",
            "cp",
            "--abi",
            f"cp{ver}",
            "--abi",
            "abi3",
            "--abi",
            "none",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            "--platform",
            "any",
            "-d",
            str(dest),
            *_guest_requirements(),
        ],
        log,
    )


def _hooks(distro: Distro, files: Path, wheels: Path) -> list[str]:
    """mmdebstrap's customize hooks: the test user, the payload unit, the guest's venv."""
    user_setup = (
        f'chroot "$1" useradd -m -u {TEST_UID} -s /bin/bash {TEST_USER} && '
        f'mkdir -p "$1/var/lib/systemd/linger" && touch "$1/var/lib/systemd/linger/{TEST_USER}"'
    )
    return [
        *distro.hooks,
        user_setup,
        f'install -m 0755 {files}/agentscope-guest "$1/usr/local/sbin/agentscope-guest"',
        f'install -m 0644 {files}/agentscope-guest.service "$1/etc/systemd/system/"',
        'chroot "$1" systemctl enable agentscope-guest.service',
        'echo agentscope-vm > "$1/etc/hostname"',
        # Nothing to wait for without a network.
        'chroot "$1" systemctl mask systemd-networkd-wait-online.service '
        "apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer "
        "man-db.timer || true",
        'chroot "$1" systemctl mask earlyoom.service',
        # Debian's default host has no systemd-oomd: installed for the host profiles,
        # masked until one is applied (roothelper.sh profile).
        *(
            ['chroot "$1" systemctl mask systemd-oomd.service systemd-oomd.socket']
            if "systemd-oomd" in distro.packages
            else []
        ),
        f'cp -r {wheels} "$1/tmp/wheels"',
        'chroot "$1" python3 -m venv /opt/agentscope',
        'chroot "$1" /opt/agentscope/bin/python -m pip install --quiet --no-index '
        "--disable-pip-version-check --find-links /tmp/wheels "
        + " ".join(f"'{r}'" for r in _guest_requirements()),
        'rm -rf "$1/tmp/wheels"',
        'chroot "$1" /opt/agentscope/bin/python -c "import dbus_fast, psutil, pytest"',
    ]


# As a user: unpack mmdebstrap's tarball in a user namespace where the user is
# root and the subordinate ids are the image's other owners, so files keep their
# owners and modes (/etc/shadow, setuid bits), and make the disk image there.
# Device nodes cannot be made in a user namespace; the guest's devtmpfs has them.
_UNPACK = """\
set -e
cd "$1"
mkdir root
tar -xpf root.tar -C root --exclude='./dev/*'
cp root/boot/vmlinuz-* vmlinuz
cp root/boot/initrd.img-* initrd.img
mke2fs -q -t ext4 -d root root.img 3G
rm -rf root root.tar
"""


def _build(distro: Distro, out: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"build-{distro.name}-", dir=CACHE_DIR))
    log = out.with_suffix(".log")
    as_root = os.geteuid() == 0
    try:
        wheels = work / "wheels"
        wheels.mkdir()
        _download_wheels(distro, wheels, log)
        rootdir = work / "root"
        files = work / "files"
        files.mkdir()
        (files / "agentscope-guest").write_text(_GUEST_SCRIPT)
        (files / "agentscope-guest.service").write_text(_GUEST_UNIT)
        hooks = _hooks(distro, files, wheels)
        if as_root:
            # mke2fs -d needs a readable tree; the kernel and initrd are copied out.
            hooks += [
                f'cp "$1"/boot/vmlinuz-* {work}/vmlinuz',
                f'cp "$1"/boot/initrd.img-* {work}/initrd.img',
            ]
        else:
            # The hooks run as the namespace's root, to whom the user's files
            # belong to someone else: the inputs must be readable by all.
            for d in (work, files, wheels):
                d.chmod(0o755)
            for f in [*files.iterdir(), *wheels.iterdir()]:
                f.chmod(0o644)
        cmd = [
            "mmdebstrap",
            "--mode=root" if as_root else "--mode=unshare",
            "--variant=apt",
            "--include=" + ",".join((*_PACKAGES, *distro.packages)),
            *(f"--aptopt={o}" for o in distro.aptopts),
            *(f"--customize-hook={h}" for h in hooks),
            distro.suite,
            str(rootdir if as_root else work / "root.tar"),
            f"deb {MIRROR} {distro.suite} main",
            *distro.extra_mirrors,
        ]
        t0 = time.monotonic()
        _run(cmd, log)
        if as_root:
            _run(
                ["mke2fs", "-q", "-t", "ext4", "-d", str(rootdir), str(work / "root.img"), "3G"],
                log,
            )
            shutil.rmtree(rootdir)
        else:
            unpack = ["unshare", "--map-root-user", "--map-auto", "sh", "-c", _UNPACK]
            _run([*unpack, "sh", str(work)], log)
        (work / "key").write_text(out.name + "\n")
        work.rename(out)
        _log(f"built {distro.name} in {time.monotonic() - t0:.0f}s: {out}")
    finally:
        if work.exists():
            _remove(work)


def _remove(path: Path) -> None:
    """Remove a build's tree; as a user, files owned by subordinate ids go in the namespace."""
    shutil.rmtree(path, ignore_errors=True)
    if path.exists() and os.geteuid() != 0:
        subprocess.call(
            ["unshare", "--map-root-user", "--map-auto", "rm", "-rf", "--", str(path)],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


@contextlib.contextmanager
def _build_lock(name: str) -> Iterator[None]:
    """One builder per distro at a time: runs started together wait for one build."""
    with open(CACHE_DIR / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_image(name: str, *, rebuild: bool = False) -> Image:
    """Return the cached image of a distro, building it if its recipe changed."""
    distro = DISTROS[name]
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    out = CACHE_DIR / f"{distro.name}-{_recipe_key(distro)}"
    with _build_lock(distro.name):
        _ensure(distro, out, rebuild)
    return Image(distro, out / "root.img", out / "vmlinuz", out / "initrd.img")


def _ensure(distro: Distro, out: Path, rebuild: bool) -> None:
    if rebuild and out.exists():
        shutil.rmtree(out)
    if not out.exists():
        # Older recipes of this distro, and builds that were interrupted.
        for old in [*CACHE_DIR.glob(f"{distro.name}-*"), *CACHE_DIR.glob(f"build-{distro.name}-*")]:
            if old.is_dir():
                _remove(old)
            else:
                old.unlink(missing_ok=True)
        _log(f"building the {distro.name} image (systemd {distro.systemd}); log: {out}.log")
        _build(distro, out)
