"""Installing the agents slice, the monitor units and the generator: plan, apply, undo.

Planning does no I/O beyond reading the packaged templates: :func:`plan_install`
returns an :class:`InstallPlan` listing every file (path, content, mode) and the
``systemctl``/``loginctl`` commands to run afterwards. :func:`apply_plan`
writes the files (each atomically: a temporary file in the same directory,
then a rename) and records what it created in a manifest, so that
:func:`plan_uninstall` removes exactly that and nothing else: a file that was
there before install (a config an administrator wrote) is never recorded, and
a recorded file changed since is kept. Commands are returned as argv lists for
the caller to run; nothing here runs a process.

Paths in plans are the real ones (``/etc/agentscope/agentscope.toml``); the
``root`` a plan carries is prepended when applying, so tests write into a
temporary directory. See docs/install.md for what goes where and why.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Literal

from . import generator
from ._errors import InstallError, UntrustedExecutable
from ._names import validate_name
from ._trust import who_could_change

__all__ = [
    "OOM_POLICY_FIXED_IN",
    "InstallPlan",
    "Manifest",
    "ManifestEntry",
    "PlannedFile",
    "Scope",
    "UninstallPlan",
    "UntrustedExecutable",
    "apply_plan",
    "detect_systemd_version",
    "find_agentscope_exec",
    "generator_script",
    "load_manifest",
    "load_templates",
    "manifest_path",
    "mglru_protection",
    "plan_install",
    "plan_uninstall",
]

Scope = Literal["system", "user"]

#: From this systemd version on the launcher sets OOMPolicy=continue on each
#: scope itself, so the manager-wide DefaultOOMPolicy drop-in is not needed.
OOM_POLICY_FIXED_IN = 253
CONFIG_PATH = PurePosixPath(generator.DEFAULT_CONFIG_PATH)
USR_LOCAL = PurePosixPath("/usr/local")
_OOM_DROPIN = "60-agentscope-oom-policy.conf"
# Measured in the VM matrix: the user manager of systemd 252 applies a
# DefaultOOMPolicy= from ~/.config/systemd/user.conf.d, that of 247 ignores it.
_HOME_CONF_READ_FROM = 252
_GENERATOR_NAME = "agentscope-generator"
_MANIFEST_VERSION = 1


@dataclass(frozen=True)
class PlannedFile:
    """One file (or symlink, when ``link`` is set) an install writes."""

    path: PurePosixPath
    content: bytes
    mode: int = 0o644
    link: str | None = None
    #: Write only if nothing is there yet, and then own it (the config).
    if_missing: bool = False


@dataclass(frozen=True)
class InstallPlan:
    """Everything one install does: files to write, then commands to run."""

    scope: Scope
    root: Path
    files: tuple[PlannedFile, ...]
    actions: tuple[tuple[str, ...], ...]
    manifest: PurePosixPath
    fleets: tuple[str, ...]
    notes: tuple[str, ...] = ()
    #: What the installed units make root run (system installs): the
    #: monitor's command and the generator's Python, paths as root sees them.
    runs_as_root: tuple[str, ...] = ()


@dataclass(frozen=True)
class ManifestEntry:
    """A file install created: its sha256 (files) or target (symlinks) when written."""

    path: PurePosixPath
    sha256: str | None = None
    link: str | None = None


@dataclass(frozen=True)
class Manifest:
    """What an install created, read back from its manifest file."""

    scope: Scope
    root: Path
    path: PurePosixPath
    files: tuple[ManifestEntry, ...]
    dirs: tuple[PurePosixPath, ...]
    fleets: tuple[str, ...]


@dataclass(frozen=True)
class UninstallPlan:
    """Everything one uninstall does: files and empty directories to remove, then commands."""

    scope: Scope
    root: Path
    files: tuple[ManifestEntry, ...]
    dirs: tuple[PurePosixPath, ...]
    actions: tuple[tuple[str, ...], ...]
    manifest: PurePosixPath


def load_templates() -> dict[str, str]:
    """The unit templates shipped in the wheel (``_units`` here), or a checkout's ``units/``.

    Raises:
        FileNotFoundError: neither is there (a broken install).
    """
    shipped = resources.files("agentscope_systemd") / "_units"
    if shipped.is_dir():
        return {k: (shipped / n).read_text("utf-8") for k, n in generator.TEMPLATE_FILES.items()}
    return generator.find_templates()


def detect_systemd_version(root: Path = Path("/")) -> int | None:
    """The installed systemd's major version, or None when it cannot be told.

    Read from the name of systemd's private shared library,
    ``libsystemd-shared-NNN.so`` (``-NNN.N-R.fcXX.so`` on Fedora), which every
    systemd since 240 installs next to its binaries: no D-Bus, no process,
    and it works in a chroot. It is the version on disk, which the manager
    runs after the next boot or daemon-reexec.
    """
    best: int | None = None
    patterns = ("usr/lib/systemd", "lib/systemd", "usr/lib64/systemd", "usr/lib/*/systemd")
    for pattern in patterns:
        for directory in root.glob(pattern):
            for lib in directory.glob("libsystemd-shared-*.so*"):
                digits = lib.name.removeprefix("libsystemd-shared-")
                number = digits[: len(digits) - len(digits.lstrip("0123456789"))]
                if number:
                    best = max(best or 0, int(number))
    return best


def find_agentscope_exec() -> str:
    """Where the ``agentscope`` command is: next to this Python, on PATH, or /usr/local/bin."""
    beside = Path(sys.executable).parent / "agentscope"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("agentscope") or generator.DEFAULT_EXEC


def manifest_path(scope: Scope, *, home: PurePosixPath | None = None) -> PurePosixPath:
    """Where install records what it created."""
    if scope == "system":
        return PurePosixPath("/var/lib/agentscope/install-manifest.json")
    return _home(home) / ".local/state/agentscope/install-manifest.json"


# The installed generator is one file: _genconfig.py's code (what follows its
# marker) in place of the block of generator.py that imports it.
_GENCONFIG_CODE = "# agentscope install: the installed generator holds what follows this line.\n"
_GENCONFIG_BLOCK = (
    "# The config file's half, _genconfig.py",
    "# The end of the config file's half.\n",
)


def generator_script(templates: dict[str, str], *, agentscope_exec: str, python: str) -> bytes:
    """The installed generator: one file of generator.py and _genconfig.py, with built-ins.

    The built-ins: the unit templates and the monitor's executable.

    Raises:
        RuntimeError: generator.py or _genconfig.py no longer has the lines this replaces.
    """
    source = Path(generator.__file__).read_text("utf-8")
    config_half = Path(generator.__file__).with_name("_genconfig.py").read_text("utf-8")
    _, marker, config_code = config_half.partition(_GENCONFIG_CODE)
    start, end = source.find(_GENCONFIG_BLOCK[0]), source.find(_GENCONFIG_BLOCK[1])
    if not marker or start < 0 or end < start:
        raise RuntimeError("generator.py and _genconfig.py no longer have the lines joined here")
    end += len(_GENCONFIG_BLOCK[1])
    source = f"{source[:start]}{config_code.strip()}\n{source[end:]}"
    replacements = {
        "_EMBEDDED_TEMPLATES: dict[str, str] | None = None\n": (
            f"_EMBEDDED_TEMPLATES: dict[str, str] | None = {templates!r}\n"
        ),
        "_INSTALLED_EXEC: str | None = None\n": (
            f"_INSTALLED_EXEC: str | None = {agentscope_exec!r}\n"
        ),
    }
    for old, new in replacements.items():
        if source.count(old) != 1:
            raise RuntimeError(f"generator.py must contain {old.strip()!r} exactly once")
        source = source.replace(old, new)
    first, _, rest = source.partition("\n")
    if not first.startswith("#!"):
        raise RuntimeError("generator.py must start with a #! line")
    # -I: the environment of PID 1 must not change what Python imports.
    return f"#!{python} -I\n{rest}".encode()


def plan_install(
    scope: Scope,
    *,
    systemd_version: int | None,
    linger: bool,
    fleets: list[str],
    root: Path = Path("/"),
    prefix: PurePosixPath = USR_LOCAL,
    home: PurePosixPath | None = None,
    agentscope_exec: str | None = None,
    python: str = "/usr/bin/python3",
    user: str | None = None,
    mglru_min_ttl_ms: int | None = None,
) -> InstallPlan:
    """Plan an install for the system manager (``"system"``) or one user's manager (``"user"``).

    ``system``: the generator into ``PREFIX/lib/systemd/system-generators/``
    and ``.../user-generators/`` (so every user manager gets the slice and
    monitor template too), the config ``/etc/agentscope/agentscope.toml``
    listing ``fleets`` if there is none yet, and for systemd older than 253
    (or unknown, ``None``) the ``DefaultOOMPolicy=continue`` drop-in for both
    managers. ``user``: no generator can live in a home directory, so the
    slice, the monitor template and one wants link per fleet go into
    ``~/.config/systemd/user/``, plus the drop-in in
    ``~/.config/systemd/user.conf.d/`` below 253. ``linger`` (user only)
    adds ``loginctl enable-linger [user]`` so the monitor runs without a login.
    ``mglru_min_ttl_ms`` (system only, opt-in) adds MGLRU's thrashing
    protection: see :func:`mglru_protection`.

    Raises:
        InvalidName: a fleet name is invalid.
        ValueError: ``linger`` with ``"system"``, or an unusable ``agentscope_exec``,
            or ``mglru_min_ttl_ms`` out of range or with ``"user"``.
        FileNotFoundError: the packaged templates are missing.
    """
    for name in fleets:
        validate_name("fleet", name)
    if scope == "system" and linger:
        raise ValueError("linger applies to a user install (scope='user') only")
    exec_path = agentscope_exec if agentscope_exec is not None else find_agentscope_exec()
    why = generator.validate_exec(exec_path)
    if why is not None:
        raise ValueError(f"agentscope_exec {exec_path!r} {why}")
    templates = load_templates()
    need_dropin = systemd_version is None or systemd_version < OOM_POLICY_FIXED_IN
    dropin = templates["oom_policy"].encode()
    unique = tuple(dict.fromkeys(fleets))
    files: list[PlannedFile] = []
    notes: list[str] = []
    if scope == "system":
        script = generator_script(templates, agentscope_exec=exec_path, python=python)
        for kind in ("system", "user"):
            path = prefix / f"lib/systemd/{kind}-generators" / _GENERATOR_NAME
            files.append(PlannedFile(path, script, 0o755))
        files.append(PlannedFile(CONFIG_PATH, _config_text(unique, exec_path), if_missing=True))
        notes.append(
            f"{CONFIG_PATH} is written only if missing; if it exists, its [[fleet]] "
            "entries decide which monitors start at boot"
        )
        if need_dropin:
            for kind in ("system", "user"):
                path = PurePosixPath(f"/etc/systemd/{kind}.conf.d") / _OOM_DROPIN
                files.append(PlannedFile(path, dropin))
            notes.append(
                "user managers read the user.conf.d drop-in when they next start or reload"
            )
        systemctl: tuple[str, ...] = ("systemctl",)
    else:
        base = _home(home) / ".config/systemd"
        header = "Written by agentscope install --user; agentscope uninstall --user removes it."
        config = generator.Config(monitor_exec=exec_path)
        rendered = generator.render(
            config, templates, user_mode=True, fleets=list(unique), header=header
        )
        for rel, text in rendered.files.items():
            files.append(PlannedFile(base / "user" / rel, text.encode()))
        for rel, target in rendered.links.items():
            files.append(PlannedFile(base / "user" / rel, b"", 0o777, link=target))
        if need_dropin:
            files.append(PlannedFile(base / "user.conf.d" / _OOM_DROPIN, dropin))
            if systemd_version is not None and systemd_version < _HOME_CONF_READ_FROM:
                notes.append(
                    f"systemd {systemd_version}'s user manager may not read "
                    "~/.config/systemd/user.conf.d (247 does not), so the DefaultOOMPolicy "
                    "drop-in may have no effect: root can pin it for every user with "
                    "agentscope install --system (/etc/systemd/user.conf.d)"
                )
        systemctl = ("systemctl", "--user")
    actions = [(*systemctl, "daemon-reload")]
    # `start`, not `enable --now`: the system units are generated (systemctl
    # refuses to enable those) and the user wants links are files of this
    # install already, recorded in the manifest.
    actions += [(*systemctl, "start", f"agentscope-monitor@{name}.service") for name in unique]
    if linger:
        actions.append(("loginctl", "enable-linger", *([user] if user else [])))
    if mglru_min_ttl_ms is not None:
        if scope != "system":
            raise ValueError("MGLRU thrashing protection is host-wide: a system install only")
        mglru_file, mglru_action = mglru_protection(mglru_min_ttl_ms)
        files.append(mglru_file)
        actions.append(mglru_action)
    return InstallPlan(
        scope=scope,
        root=root,
        files=tuple(files),
        actions=tuple(actions),
        manifest=manifest_path(scope, home=home),
        fleets=unique,
        notes=tuple(notes),
        runs_as_root=(exec_path, python) if scope == "system" else (),
    )


def _home(home: PurePosixPath | None) -> PurePosixPath:
    return home if home is not None else PurePosixPath(Path.home())


def _config_text(fleets: tuple[str, ...], exec_path: str) -> bytes:
    lines = [
        "# agentscope: read by agentscope-generator at boot and on every",
        "# `systemctl daemon-reload`. An invalid value is logged (journalctl -k)",
        "# and replaced by its default. See docs/install.md.",
        "",
    ]
    if not fleets:
        lines += ["fleet = []  # no monitor starts at boot", ""]
    lines += [
        "[slice]",
        "# The slice every agent scope runs in; the monitor runs in its parent.",
        f'name = "{generator.DEFAULT_SLICE}"',
        "# systemd-oomd kills the worst agent scope when the slice's memory",
        "# pressure stays above this (ManagedOOMMemoryPressureLimit=).",
        f'oomd_pressure_limit = "{generator.DEFAULT_PRESSURE_LIMIT}"',
        "",
        "[monitor]",
        f'exec = "{exec_path}"',
        f"watchdog_sec = {generator.DEFAULT_WATCHDOG_SEC}",
        "",
        "[guard]",
        "# The monitor's memory guard kills an agent's runaway before the host",
        "# thrashes (docs/guard.md). These are its defaults.",
        "enabled = true",
        "mem_available_percent = 10  # act when MemAvailable <= 10% of MemTotal",
        "swap_free_percent = 20      # ... and SwapFree <= 20% of SwapTotal",
        'psi_full_percent = 60       # or when PSI memory full avg10 >= 60% ("off": never)',
        "psi_full_seconds = 10       # ... for this long",
    ]
    for name in fleets:
        lines += [
            "",
            "[[fleet]]",
            f'name = "{name}"',
            '# manager = "system"  # or "user": started by user managers instead',
            '# users = ["alice"]   # with manager = "user": only these users',
        ]
    return ("\n".join(lines) + "\n").encode()


def _real(root: Path, path: PurePosixPath) -> Path:
    return root / path.relative_to("/")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _state(real: Path) -> ManifestEntry | None:
    """What is at ``real`` now, in manifest terms (path left empty), or None."""
    if real.is_symlink():
        return ManifestEntry(PurePosixPath(), link=os.readlink(real))
    if real.is_file():
        return ManifestEntry(PurePosixPath(), sha256=_sha256(real.read_bytes()))
    if real.exists():
        return ManifestEntry(PurePosixPath(), sha256="(not a regular file)")
    return None


def _matches(real: Path, entry: ManifestEntry) -> bool:
    now = _state(real)
    return now is not None and (now.sha256, now.link) == (entry.sha256, entry.link)


def apply_plan(plan: InstallPlan | UninstallPlan, *, dry_run: bool = False) -> list[str]:
    """Carry out an install or uninstall plan; the lines say what was (or would be) done.

    Install: refuses (before writing anything) to overwrite a file it did not
    create unless the content is already the same; writes each file
    atomically; records created files and directories in the manifest.
    Uninstall: removes recorded files that are unchanged, then empty recorded
    directories, then the manifest; files changed since install are kept and
    reported. The commands in ``plan.actions`` are listed (``run: ...``),
    not run.

    Raises:
        UntrustedExecutable: a system install would make root run a file
            another user could change (checked before anything is written,
            also by a dry run).
        InstallError: install would overwrite files it does not own.
        OSError: from the file system (permissions, a full disk).
    """
    if isinstance(plan, UninstallPlan):
        lines = _uninstall(plan, dry_run)
    else:
        lines = _install(plan, dry_run)
    return lines + [f"run: {' '.join(argv)}" for argv in plan.actions]


def _refuse_untrusted(plan: InstallPlan) -> None:
    """Raise UntrustedExecutable when root would run a file another user could change (#31).

    Also the monitor command of a config the install keeps: the generator
    takes that one at boot.
    """
    paths = list(plan.runs_as_root)
    config = _real(plan.root, CONFIG_PATH)
    if plan.runs_as_root and config.is_file():
        kept, _problems = generator.load_config(str(config))
        if kept.monitor_exec is not None:
            paths.append(kept.monitor_exec)
    problems = [
        why for path in dict.fromkeys(paths) if (why := who_could_change(path, root=plan.root))
    ]
    if problems:
        raise UntrustedExecutable(problems)


def _install(plan: InstallPlan, dry_run: bool) -> list[str]:
    _refuse_untrusted(plan)
    old = load_manifest_file(plan.scope, plan.root, plan.manifest)
    owned = {e.path: e for e in old.files} if old else {}
    lines: list[str] = []
    write: list[PlannedFile] = []
    record: list[ManifestEntry] = []
    conflicts: list[str] = []
    for f in plan.files:
        real = _real(plan.root, f.path)
        wanted = ManifestEntry(f.path, None if f.link else _sha256(f.content), f.link)
        now = _state(real)
        if now is None:
            write.append(f)
            record.append(wanted)
        elif f.path in owned:
            record.append(wanted if not f.if_missing else owned[f.path])
            if f.if_missing:
                lines.append(f"keep {f.path} (written by an earlier install)")
            elif not _matches(real, wanted):
                write.append(f)
                if not _matches(real, owned[f.path]):
                    lines.append(f"note: {f.path} was changed since install; replacing it")
            else:
                lines.append(f"unchanged {f.path}")
        elif f.if_missing:
            lines.append(f"keep existing {f.path} (not ours: left alone, also by uninstall)")
        elif (now.sha256, now.link) == (wanted.sha256, wanted.link):
            lines.append(f"keep existing {f.path} (already identical; not ours)")
        else:
            conflicts.append(str(f.path))
    if conflicts:
        raise InstallError(
            "files exist that agentscope did not install",
            conflicts,
            "move them away (or merge them into a drop-in) and install again",
        )
    stale = [e for e in owned.values() if e.path not in {f.path for f in plan.files}]
    dirs: list[PurePosixPath] = list(old.dirs) if old else []
    for path in [f.path for f in write] + [plan.manifest]:
        for parent in reversed(path.parents):
            if parent not in dirs and not _real(plan.root, parent).exists():
                dirs.append(parent)
    for d in dirs:
        if not _real(plan.root, d).exists():
            lines.append(f"mkdir {d}")
    for f in write:
        what = f"symlink {f.path} -> {f.link}" if f.link else f"write {f.path} ({f.mode:04o})"
        lines.append(what)
    for e in stale:
        lines.append(f"remove {e.path} (no longer part of the install)")
    for note in plan.notes:
        lines.append(f"note: {note}")
    lines.append(f"record {plan.manifest}")
    if dry_run:
        return lines
    for d in dirs:
        _real(plan.root, d).mkdir(mode=0o755, exist_ok=True)
    for f in write:
        _atomic_write(_real(plan.root, f.path), f)
    for e in stale:
        real = _real(plan.root, e.path)
        if _matches(real, e):
            real.unlink()
    manifest = {
        "version": _MANIFEST_VERSION,
        "scope": plan.scope,
        "fleets": list(plan.fleets),
        "files": [
            {"path": str(e.path), "sha256": e.sha256, "link": e.link}
            for e in sorted(record, key=lambda e: e.path)
        ],
        "dirs": [str(d) for d in dirs],
    }
    text = json.dumps(manifest, indent=2) + "\n"
    _atomic_write(_real(plan.root, plan.manifest), PlannedFile(plan.manifest, text.encode()))
    return lines


def _atomic_write(real: Path, f: PlannedFile) -> None:
    tmp = real.with_name(f".{real.name}.agentscope-{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    if f.link is not None:
        os.symlink(f.link, tmp)
    else:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, f.mode)
        try:
            os.fchmod(fd, f.mode)  # not masked by the umask
            with open(fd, "wb", closefd=False) as out:
                out.write(f.content)
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, real)


def load_manifest_file(scope: Scope, root: Path, path: PurePosixPath) -> Manifest | None:
    """The manifest at ``path`` (under ``root``), or None when there is none.

    Raises:
        InstallError: the file is not a manifest this version understands.
    """
    real = _real(root, path)
    try:
        data = json.loads(real.read_text("utf-8"))
        if data["version"] != _MANIFEST_VERSION or data["scope"] != scope:
            raise ValueError(f"version {data['version']!r}, scope {data['scope']!r}")
        files = tuple(
            ManifestEntry(PurePosixPath(e["path"]), e["sha256"], e["link"]) for e in data["files"]
        )
        dirs = tuple(PurePosixPath(d) for d in data["dirs"])
        fleets = tuple(str(f) for f in data["fleets"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InstallError(
            f"unreadable install manifest ({exc})",
            [str(path)],
            "remove the installed files by hand (docs/install.md lists them)",
        ) from exc
    return Manifest(scope, root, path, files, dirs, fleets)


def load_manifest(
    scope: Scope, *, root: Path = Path("/"), home: PurePosixPath | None = None
) -> Manifest | None:
    """The manifest of the ``scope`` install, or None when nothing is installed.

    Raises:
        InstallError: the manifest is damaged.
    """
    return load_manifest_file(scope, root, manifest_path(scope, home=home))


def plan_uninstall(manifest: Manifest) -> UninstallPlan:
    """Plan removing exactly what the install recorded in ``manifest``.

    Directories are removed deepest first, and only when empty; the monitors
    of the recorded fleets are stopped and the manager reloaded. Linger is
    left as it is (other services of the user may need it).
    """
    systemctl: tuple[str, ...] = (
        ("systemctl",) if manifest.scope == "system" else ("systemctl", "--user")
    )
    actions = [(*systemctl, "stop", f"agentscope-monitor@{n}.service") for n in manifest.fleets]
    actions.append((*systemctl, "daemon-reload"))
    if any(e.path == MGLRU_TMPFILES for e in manifest.files):
        actions.append(_MGLRU_OFF)
    return UninstallPlan(
        scope=manifest.scope,
        root=manifest.root,
        files=manifest.files,
        dirs=tuple(sorted(manifest.dirs, key=lambda d: len(d.parts), reverse=True)),
        actions=tuple(actions),
        manifest=manifest.path,
    )


def _uninstall(plan: UninstallPlan, dry_run: bool) -> list[str]:
    lines: list[str] = []
    for e in plan.files:
        real = _real(plan.root, e.path)
        if _state(real) is None:
            lines.append(f"gone already {e.path}")
        elif not _matches(real, e):
            lines.append(f"keep {e.path} (changed since install)")
        else:
            lines.append(f"remove {e.path}")
            if not dry_run:
                real.unlink()
    lines.append(f"remove {plan.manifest}")
    if not dry_run:
        _real(plan.root, plan.manifest).unlink(missing_ok=True)
    for d in plan.dirs:
        real = _real(plan.root, d)
        if dry_run:
            lines.append(f"rmdir {d} (if empty)")
            continue
        try:
            real.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            lines.append(f"keep {d} (not empty)")
        else:
            lines.append(f"rmdir {d}")
    return lines


#: MGLRU's thrashing protection, an opt-in of ``agentscope install --system
#: --mglru-protection``: when the working set of the last ``min_ttl_ms`` cannot
#: stay resident, kswapd OOM-kills at once instead of reclaiming page cache for
#: minutes (Documentation/admin-guide/mm/multigen_lru.rst). Debian leaves it
#: off (0); the guard acts before either, this is the kernel's own backstop.
MGLRU_TMPFILES = PurePosixPath("/etc/tmpfiles.d/agentscope-mglru.conf")
_MGLRU = "/sys/kernel/mm/lru_gen"
MGLRU_MIN_TTL_RANGE = (100, 60_000)
#: What ``--mglru-protection`` sets: the kernel documentation's example value.
MGLRU_MIN_TTL_DEFAULT = 1000
# (tmpfiles.d "w" skips a path that does not exist: kernels without MGLRU.)
# Uninstall puts back the kernel's default (0: off) at once, not at the next boot.
_MGLRU_OFF = ("sh", "-c", f"if [ -w {_MGLRU}/min_ttl_ms ]; then echo 0 > {_MGLRU}/min_ttl_ms; fi")


def mglru_protection(min_ttl_ms: int) -> tuple[PlannedFile, tuple[str, ...]]:
    """The tmpfiles.d lines setting MGLRU's ``min_ttl_ms`` at boot, and the command to apply them.

    Raises:
        ValueError: ``min_ttl_ms`` outside 100..60000 ms.
    """
    low, high = MGLRU_MIN_TTL_RANGE
    if (
        isinstance(min_ttl_ms, bool)
        or not isinstance(min_ttl_ms, int)
        or not (low <= min_ttl_ms <= high)
    ):
        raise ValueError(
            f"mglru_min_ttl_ms must be an integer {low}..{high} (ms), not {min_ttl_ms!r}"
        )
    text = (
        "# Written by agentscope install --mglru-protection; agentscope uninstall removes it.\n"
        "# MGLRU thrashing protection: OOM-kill when the working set of the last\n"
        f"# {min_ttl_ms} ms cannot stay in memory (see docs/install.md).\n"
        f"w {_MGLRU}/enabled - - - - y\n"
        f"w {_MGLRU}/min_ttl_ms - - - - {min_ttl_ms}\n"
    )
    return PlannedFile(MGLRU_TMPFILES, text.encode()), (
        "systemd-tmpfiles",
        "--create",
        str(MGLRU_TMPFILES),
    )
