#!/usr/bin/env python3
"""agentscope-generator: the agents slice and the fleet monitors, from one config file.

A systemd generator (systemd.generator(7)), installed by ``agentscope install
--system`` as ``/usr/local/lib/systemd/system-generators/agentscope-generator``
and ``.../user-generators/agentscope-generator``. On boot and on every
daemon-reload the manager runs it with three output directories (normal,
early, late); it writes into the normal one only:

- the agents slice (``app-agentscope-agents.slice`` unless configured),
- the monitor template ``agentscope-monitor@.service``,
- one wants link per fleet, ``multi-user.target.wants/`` for the system
  manager and ``default.target.wants/`` for user managers, pointing at
  ``../agentscope-monitor@.service``,
- the systemd-oomd drop-ins (``50-agentscope-oomd.conf``) of the agents
  slice, the monitor's slice, the agent scopes (``agentscope-.scope.d/``)
  and the monitor template: see :func:`oomd_dropins`.

Units in the normal directory rank below /etc and /run, so an administrator
can still override anything with ``systemctl edit``.

Rules it keeps (systemd.generator(7)): standard library only (it imports
nothing else from agentscope, so it runs on the system's python3 whatever
virtual environment agentscope lives in), no D-Bus and no subprocess, nothing
written outside the output directory, fast (it runs before most of boot).
An unreadable or invalid config never fails boot or daemon-reload: the
problem is logged (to /dev/kmsg when writable and ``$SYSTEMD_LOG_TARGET`` is
not ``console``, else to stderr, prefixed ``agentscope-generator:``), every
invalid value is replaced by its default, and the exit status is 0.

Manager detection: ``--user`` or ``--system`` on the command line wins; then
``$SYSTEMD_SCOPE`` (``system`` or ``user``, set for generators by systemd 251
and later); then the directory it was started from (``user-generators``);
else system. The config path is ``/etc/agentscope/agentscope.toml``, or
``$AGENTSCOPE_CONFIG`` when set (for tests).

Run it by hand to see what it would generate::

    python3 -I agentscope_systemd/generator.py --user /tmp/out
"""

from __future__ import annotations

import os
import sys

# Not `from typing import ...`: importing typing costs about 9 ms, a third of
# this generator's run time without a config file.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Self

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_EXEC",
    "DEFAULT_FLEETS",
    "DEFAULT_PRESSURE_LIMIT",
    "DEFAULT_SLICE",
    "DEFAULT_WATCHDOG_SEC",
    "MONITOR_TEMPLATE",
    "OOMD_DROPIN",
    "TEMPLATE_FILES",
    "Config",
    "FleetEntry",
    "Rendered",
    "find_templates",
    "load_config",
    "main",
    "monitor_slice",
    "oomd_dropins",
    "parse_config",
    "render",
    "select_fleets",
    "validate_exec",
    "validate_fleet_name",
    "validate_pressure_limit",
    "validate_slice_name",
    "write_rendered",
]

DEFAULT_CONFIG_PATH = "/etc/agentscope/agentscope.toml"
DEFAULT_SLICE = "app-agentscope-agents.slice"
DEFAULT_EXEC = "/usr/local/bin/agentscope"
DEFAULT_PRESSURE_LIMIT = "80%"
DEFAULT_WATCHDOG_SEC = 30
MONITOR_TEMPLATE = "agentscope-monitor@.service"
#: The file name of every systemd-oomd drop-in: numbered after the
#: distributions' ``10-`` ones (Ubuntu's, Fedora's systemd-oomd-defaults), so
#: that its values win (drop-ins apply in file name order, the last one wins).
OOMD_DROPIN = "50-agentscope-oomd.conf"

#: Template name -> file name in ``units/`` (``agentscope_systemd/_units/`` in a wheel).
TEMPLATE_FILES = {
    "slice": "app-agentscope-agents.slice",
    "monitor": "agentscope-monitor@.service",
    "oom_policy": "agentscope-oom-policy.conf",
}

# `agentscope install` replaces these two lines in the copy it installs, so
# that the installed generator is one self-contained file. Keep them as they are.
_EMBEDDED_TEMPLATES: dict[str, str] | None = None
_INSTALLED_EXEC: str | None = None

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
# Characters that need no quoting or escaping in ExecStart= (no %, $, quotes,
# backslash, whitespace), which covers ordinary install paths.
_EXEC_CHARS = _NAME_CHARS | frozenset("/+@,:=~")
_KNOWN = {
    "": {"slice", "monitor", "fleet", "guard"},
    "slice": {"name", "oomd_pressure_limit"},
    "monitor": {"exec", "watchdog_sec"},
    "fleet": {"name", "manager", "users"},
    "guard": {
        "enabled",
        "process",
        "mem_available_percent",
        "swap_free_percent",
        "psi_full_percent",
        "psi_full_seconds",
    },
}
#: [guard] key -> (monitor option, lowest, highest): the ranges of
#: agentscope_systemd.GuardConfig, repeated here because the generator imports the
#: standard library only (tests/test_generator.py checks they agree).
GUARD_OPTIONS = {
    "mem_available_percent": ("--guard-mem-available", 0.0, 100.0),
    "swap_free_percent": ("--guard-swap-free", 0.0, 100.0),
    "psi_full_percent": ("--guard-psi-full", 0.01, 100.0),
    "psi_full_seconds": ("--guard-psi-seconds", 0.0, 3600.0),
}


class _Record:
    """A small immutable record, like a NamedTuple without importing typing."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, **values: Any) -> None:
        for name in self.__slots__:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied."""
        values = {name: getattr(self, name) for name in self.__slots__}
        return type(self)(**{**values, **changes})


class FleetEntry(_Record):
    """One ``[[fleet]]`` of the config.

    ``manager`` is ``"system"`` (the system manager starts its monitor at
    boot) or ``"user"`` (user managers do: every user's, or only those named
    in ``users``).
    """

    __slots__ = ("manager", "name", "users")
    name: str
    manager: str
    users: tuple[str, ...] | None

    def __init__(
        self, name: str, manager: str = "system", users: tuple[str, ...] | None = None
    ) -> None:
        super().__init__(name=name, manager=manager, users=users)


DEFAULT_FLEETS = (FleetEntry("default"),)


class Config(_Record):
    """The validated configuration; every field has a working default.

    ``monitor_exec`` None means: the default found at run time. ``guard``
    runs the monitor with its memory guard (on unless ``[guard] enabled =
    false``); ``guard_args`` are its threshold options, as the monitor
    command line takes them (only those the config sets).
    """

    __slots__ = (
        "fleets",
        "guard",
        "guard_args",
        "monitor_exec",
        "oomd_pressure_limit",
        "slice_name",
        "watchdog_sec",
    )
    slice_name: str
    oomd_pressure_limit: str
    monitor_exec: str | None
    watchdog_sec: int
    fleets: tuple[FleetEntry, ...]
    guard: bool
    guard_args: tuple[str, ...]

    def __init__(
        self,
        slice_name: str = DEFAULT_SLICE,
        oomd_pressure_limit: str = DEFAULT_PRESSURE_LIMIT,
        monitor_exec: str | None = None,
        watchdog_sec: int = DEFAULT_WATCHDOG_SEC,
        fleets: tuple[FleetEntry, ...] = DEFAULT_FLEETS,
        guard: bool = True,
        guard_args: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            slice_name=slice_name,
            oomd_pressure_limit=oomd_pressure_limit,
            monitor_exec=monitor_exec,
            watchdog_sec=watchdog_sec,
            fleets=fleets,
            guard=guard,
            guard_args=guard_args,
        )


class Rendered(_Record):
    """Generated output: relative path -> file text, relative path -> symlink target."""

    __slots__ = ("files", "links")
    files: dict[str, str]
    links: dict[str, str]

    def __init__(self, files: dict[str, str], links: dict[str, str]) -> None:
        super().__init__(files=files, links=links)


def validate_fleet_name(name: object) -> str | None:
    """Why ``name`` is not a fleet name (1-64 of ``[A-Za-z0-9._-]``, no leading . or -), or None.

    The same rule as :func:`agentscope_systemd.lowlevel` names use (``_names.validate_name``),
    repeated here because the generator imports the standard library only.
    """
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not 1 <= len(name) <= 64:
        return f"must be 1-64 characters long, not {len(name)}"
    if name[0] in ".-":
        return f"must not start with {name[0]!r}"
    bad = sorted(set(name) - _NAME_CHARS)
    if bad:
        return f"contains {''.join(bad)!r}"
    return None


def validate_slice_name(name: object) -> str | None:
    """Why ``name`` is not usable as the agents slice, or None.

    It must be a slice below some parent (at least one dash, like
    ``app-agentscope-agents.slice``): the monitor runs in that parent, next
    to the agents and never among them.
    """
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not name.endswith(".slice") or len(name) > 255:
        return "must be a slice unit name ending in .slice"
    parts = name[: -len(".slice")].split("-")
    if len(parts) < 2 or not all(parts) or any(set(p) - _NAME_CHARS for p in parts):
        return "must look like app-agentscope-agents.slice (dashes are the hierarchy)"
    return None


def validate_exec(path: object) -> str | None:
    """Why ``path`` cannot be the monitor's executable in ExecStart=, or None."""
    if not isinstance(path, str):
        return f"must be a string, not {type(path).__name__}"
    if not path.startswith("/") or path.endswith("/"):
        return "must be an absolute path to a file"
    bad = sorted(set(path) - _EXEC_CHARS)
    if bad:
        return f"contains {''.join(bad)!r}, which ExecStart= would need quoted"
    return None


def validate_pressure_limit(value: object) -> str | None:
    """Why ``value`` is not a ManagedOOMMemoryPressureLimit= like ``"80%"``, or None."""
    if not isinstance(value, str):
        return f"must be a string like {DEFAULT_PRESSURE_LIMIT!r}, not {type(value).__name__}"
    number, _, tail = value.partition("%")
    whole, dot, frac = number.partition(".")
    if (
        tail
        or not value.endswith("%")
        or not whole.isdigit()
        or not whole.isascii()
        or (dot and not (frac.isdigit() and frac.isascii() and len(frac) <= 2))
        or float(number) > 100
    ):
        return f"must be a percentage from 0% to 100% like {DEFAULT_PRESSURE_LIMIT!r}"
    return None


def _table(data: dict[str, object], key: str, problems: list[str]) -> dict[str, object]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        problems.append(f"[{key}] must be a table, not {type(value).__name__}; using defaults")
        return {}
    _unknown(value, key, f"[{key}]", problems)
    return value


def _unknown(table: dict[str, object], kind: str, where: str, problems: list[str]) -> None:
    for key in sorted(set(table) - _KNOWN[kind]):
        problems.append(f"{where}: unknown key {key!r} ignored")


def _fleets(data: dict[str, object], problems: list[str]) -> tuple[FleetEntry, ...]:
    if "fleet" not in data:
        return DEFAULT_FLEETS
    raw = data["fleet"]
    if not isinstance(raw, list):
        problems.append("fleet must be an array of [[fleet]] tables; using the default fleet")
        return DEFAULT_FLEETS
    fleets: dict[str, FleetEntry] = {}
    for index, entry in enumerate(raw):
        where = f"[[fleet]] #{index + 1}"
        if not isinstance(entry, dict):
            problems.append(f"{where}: must be a table, not {type(entry).__name__}; skipped")
            continue
        _unknown(entry, "fleet", where, problems)
        name = entry.get("name")
        why = validate_fleet_name(name)
        if why is not None or not isinstance(name, str):
            problems.append(f"{where}: name {name!r} {why}; fleet skipped")
            continue
        manager = entry.get("manager", "system")
        if manager not in ("system", "user"):
            problems.append(f"{where} {name}: manager must be 'system' or 'user'; fleet skipped")
            continue
        users = entry.get("users")
        if users is not None and not (
            isinstance(users, list) and all(isinstance(u, str) and u for u in users)
        ):
            problems.append(f"{where} {name}: users must be a list of user names; fleet skipped")
            continue
        if name in fleets:
            problems.append(f"{where}: fleet {name!r} listed twice; the first one counts")
            continue
        fleets[name] = FleetEntry(name, str(manager), None if users is None else tuple(users))
    if raw and not fleets:
        problems.append("no valid [[fleet]] left; using the default fleet")
        return DEFAULT_FLEETS
    return tuple(fleets.values())


def parse_config(data: dict[str, object]) -> tuple[Config, list[str]]:
    """Validate a parsed TOML document: the config, and one message per problem found.

    Never raises on bad input: an invalid value is replaced by its default
    (a bad fleet entry is skipped; if none is left, the default fleet is
    used) and the problem is reported, so a typo cannot cost a boot.
    """
    problems: list[str] = []
    _unknown(data, "", "top level", problems)
    slice_table = _table(data, "slice", problems)
    monitor_table = _table(data, "monitor", problems)
    slice_name = _pick(slice_table, "slice", "name", validate_slice_name, problems)
    limit = _pick(slice_table, "slice", "oomd_pressure_limit", validate_pressure_limit, problems)
    exec_path = _pick(monitor_table, "monitor", "exec", validate_exec, problems)
    watchdog = _pick(monitor_table, "monitor", "watchdog_sec", _check_watchdog, problems)
    guard, guard_args = _guard(_table(data, "guard", problems), problems)
    defaults = Config()
    config = Config(
        slice_name=slice_name if isinstance(slice_name, str) else defaults.slice_name,
        oomd_pressure_limit=limit if isinstance(limit, str) else defaults.oomd_pressure_limit,
        monitor_exec=exec_path if isinstance(exec_path, str) else None,
        watchdog_sec=watchdog if isinstance(watchdog, int) else defaults.watchdog_sec,
        guard=guard,
        guard_args=guard_args,
    )
    return config.replace(fleets=_fleets(data, problems)), problems


def _guard(table: dict[str, object], problems: list[str]) -> tuple[bool, tuple[str, ...]]:
    """``[guard]``: whether it runs, and the monitor options of its thresholds."""
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        problems.append(f"[guard] enabled = {enabled!r} must be true or false; using true")
        enabled = True
    args: list[str] = []
    process = table.get("process", False)
    if process is True:
        args.append("--guard-process")
    elif process is not False:
        problems.append(f"[guard] process = {process!r} must be true or false; using false")
    for key, (option, low, high) in GUARD_OPTIONS.items():
        if key not in table:
            continue
        value = table[key]
        if key == "psi_full_percent" and (value is False or value == "off"):
            args += [option, "off"]
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (low <= value <= high)
        ):
            off = ', or "off"' if key == "psi_full_percent" else ""
            problems.append(
                f"[guard] {key} = {value!r} must be a number from {low:g} to {high:g}{off}; "
                "using the default"
            )
            continue
        # Fixed-point and exact: the monitor's options take no exponent (a time
        # span has none: 1e-05 is not one), and :g would round to 6 digits.
        args += [option, f"{float(value):.6f}".rstrip("0").rstrip(".")]
    return enabled, tuple(args)


def _pick(
    table: dict[str, object],
    section: str,
    key: str,
    check: Callable[[object], str | None],
    problems: list[str],
) -> object:
    """``table[key]`` if present and valid, else None (and a problem when invalid)."""
    if key not in table:
        return None
    why = check(table[key])
    if why is None:
        return table[key]
    problems.append(f"[{section}] {key} = {table[key]!r} {why}; using the default")
    return None


def _check_watchdog(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 3600:
        return "must be a whole number of seconds from 0 (off) to 3600"
    return None


_MAX_CONFIG = 1 << 20  # bytes; a real config is a few hundred


def load_config(path: str) -> tuple[Config, list[str]]:
    """Read and validate the config at ``path``: the config, and the problems found.

    A missing file is not a problem (the defaults apply); an unreadable file
    or invalid TOML is, and gives the defaults.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_CONFIG + 1)
    except FileNotFoundError:
        return Config(), []
    except OSError as exc:
        return Config(), [f"cannot read {path}: {exc.strerror}; using defaults"]
    if len(raw) > _MAX_CONFIG:
        return Config(), [f"{path} is larger than {_MAX_CONFIG} bytes; using defaults"]
    import tomllib  # only when there is a file: it is most of the start-up cost

    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return Config(), [f"{path} is not valid TOML ({exc}); using defaults"]
    except RecursionError:
        # tomllib recurses once per nesting level: a few KB of "[[[[" is enough.
        return Config(), [f"{path} nests arrays or tables too deeply; using defaults"]
    config, problems = parse_config(data)
    return config, [f"{path}: {p}" for p in problems]


def monitor_slice(slice_name: str) -> str:
    """The slice the monitor runs in: the agents slice's parent.

    >>> monitor_slice("app-agentscope-agents.slice")
    'app-agentscope.slice'
    """
    return slice_name[: -len(".slice")].rpartition("-")[0] + ".slice"


def oomd_dropins(config: Config, header: str) -> dict[str, str]:
    """systemd-oomd's settings for the fleet's units, as drop-ins: relative path -> text.

    systemd-oomd kills a whole leaf cgroup, which is an agent's scope. These
    keep it from doing so before the monitor's guard, which kills only the
    runaway tool call (docs/install.md, "systemd-oomd"):

    - every agent scope (``agentscope-.scope.d/``, a prefix drop-in: transient
      scopes read it from systemd 252 on) and the monitor get
      ``ManagedOOMPreference=avoid``: oomd picks them last. oomd reads the
      preference on the candidate cgroup itself (not inherited from the
      slice), and honours it only when the candidate is root's or has the
      owner of the cgroup whose rule fired (systemd-oomd(8)).
    - the agents slice keeps one pressure rule of its own, slower than the
      guard (``ManagedOOMMemoryPressureLimit=`` of the config, for oomd's
      default duration, 20-30 s, against the guard's 10 s): a backstop where
      no guard runs. Its ``ManagedOOMSwap=auto``: the swap rule acts the
      moment memory and swap are 90 % used, leaving the guard no time.
    - the monitor's slice (the agents slice's parent) monitors nothing: a
      distribution's per-slice rule there would cover the agents again.
    """
    agents = config.slice_name
    return {
        f"{agents}.d/{OOMD_DROPIN}": (
            f"# {header}\n"
            '# systemd-oomd and the agents (docs/install.md, "systemd-oomd"). Numbered\n'
            "# after the distributions' 10- drop-ins, so these values win.\n"
            "[Slice]\n"
            "# A backstop where no guard runs: after the slice's memory pressure stays\n"
            "# above the limit for oomd's DefaultMemoryPressureDurationSec= (20-30 s),\n"
            "# oomd kills the agent scope reclaiming most. The guard acts after 10 s\n"
            "# and kills only the runaway tool call.\n"
            "ManagedOOMMemoryPressure=kill\n"
            f"ManagedOOMMemoryPressureLimit={config.oomd_pressure_limit}\n"
            "# The swap rule kills at once (memory and swap 90 % used): not here.\n"
            "ManagedOOMSwap=auto\n"
            "# oomd reads the preference of each candidate itself: the scopes carry\n"
            "# theirs (agentscope-.scope.d/); this covers the slice as a leaf.\n"
            "ManagedOOMPreference=avoid\n"
        ),
        f"{monitor_slice(agents)}.d/{OOMD_DROPIN}": (
            f"# {header}\n"
            "# The monitor's slice: no oomd rule of its own (a distribution's rule for\n"
            "# every slice would cover the agents below it again).\n"
            "[Slice]\n"
            "ManagedOOMMemoryPressure=auto\n"
            "ManagedOOMSwap=auto\n"
        ),
        f"agentscope-.scope.d/{OOMD_DROPIN}": (
            f"# {header}\n"
            "# Every agent scope (agentscope-*.scope; transient units read drop-ins\n"
            "# from systemd 252 on): oomd kills other cgroups first. Honoured when the\n"
            "# scope is root's or has the owner of the cgroup whose rule fired (a user\n"
            "# manager's scopes: rules on user@UID.service and below, not -.slice's).\n"
            "[Scope]\n"
            "ManagedOOMPreference=avoid\n"
        ),
        f"{MONITOR_TEMPLATE}.d/{OOMD_DROPIN}": (
            f"# {header}\n"
            "# The monitor: oomd kills other cgroups first (same rule as the scopes').\n"
            "[Service]\n"
            "ManagedOOMPreference=avoid\n"
        ),
    }


def select_fleets(config: Config, *, user_mode: bool, user: str | None) -> list[str]:
    """The fleets whose monitor this manager starts at boot.

    The system manager starts the ``manager = "system"`` fleets; a user
    manager those with ``manager = "user"`` whose ``users`` is unset or
    names ``user``.
    """
    wanted = "user" if user_mode else "system"
    return [
        f.name
        for f in config.fleets
        if f.manager == wanted and (not user_mode or f.users is None or user in f.users)
    ]


def render(
    config: Config,
    templates: dict[str, str],
    *,
    user_mode: bool,
    fleets: list[str],
    header: str,
) -> Rendered:
    """Fill in the templates: the slice, the monitor template, the systemd-oomd drop-ins
    (:func:`oomd_dropins`) and one wants link per fleet.

    ``header`` is a comment line put at the top of each file, saying where it
    came from. Paths are relative to the output (or unit) directory.
    """
    values = {
        "@AGENTS_SLICE@": config.slice_name,
        "@OOMD_PRESSURE_LIMIT@": config.oomd_pressure_limit,
        "@MONITOR_EXEC@": config.monitor_exec or DEFAULT_EXEC,
        "@WATCHDOG_SEC@": f"{config.watchdog_sec}s",
        "@MONITOR_SLICE@": monitor_slice(config.slice_name),
        "@WANTED_BY@": "default.target" if user_mode else "multi-user.target",
        "@MANAGER@": "user" if user_mode else "system",
        "@GUARD@": " ".join(("--guard" if config.guard else "--no-guard", *config.guard_args)),
    }

    def fill(text: str) -> str:
        for key, value in values.items():
            text = text.replace(key, value)
        return f"# {header}\n{text}"

    target = "default.target" if user_mode else "multi-user.target"
    files = {
        config.slice_name: fill(templates["slice"]),
        MONITOR_TEMPLATE: fill(templates["monitor"]),
        **oomd_dropins(config, header),
    }
    links = {
        f"{target}.wants/agentscope-monitor@{name}.service": f"../{MONITOR_TEMPLATE}"
        for name in fleets
    }
    return Rendered(files, links)


def find_templates() -> dict[str, str]:
    """The unit templates: embedded in an installed generator, else read from disk.

    Looks in ``_units/`` next to this file (a wheel) and ``../units/`` (a
    source checkout).

    Raises:
        FileNotFoundError: no template directory was found.
    """
    if _EMBEDDED_TEMPLATES is not None:
        return dict(_EMBEDDED_TEMPLATES)
    here = os.path.dirname(os.path.abspath(__file__))
    for directory in (os.path.join(here, "_units"), os.path.join(here, os.pardir, "units")):
        if os.path.isdir(directory):
            templates = {}
            for key, name in TEMPLATE_FILES.items():
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    templates[key] = f.read()
            return templates
    raise FileNotFoundError(f"no unit templates in {here}/_units or {here}/../units")


def write_rendered(outdir: str, rendered: Rendered) -> None:
    """Write files (mode 0644) and symlinks under ``outdir``, and nowhere else.

    Raises:
        ValueError: a relative path would leave ``outdir``.
        OSError: from writing.
    """
    base = os.path.abspath(outdir)

    def place(relative: str) -> str:
        path = os.path.normpath(os.path.join(base, relative))
        if not path.startswith(base + os.sep):
            raise ValueError(f"{relative!r} is outside {base}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
        return path

    for relative, text in rendered.files.items():
        fd = os.open(place(relative), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        with open(fd, "w", encoding="utf-8") as f:
            os.fchmod(fd, 0o644)
            f.write(text)
    for relative, target in rendered.links.items():
        os.symlink(target, place(relative))


def _log(message: str) -> None:
    """Log one line where generator output is seen: the kernel log, else stderr.

    systemd's own generators do the same (log_setup_generator): /dev/kmsg is
    writable by the system manager's generators early in boot, when nothing
    else is listening; user generators fall back to stderr, which the user
    manager puts in its journal.
    """
    line = f"agentscope-generator: {message}"[:900]
    if os.environ.get("SYSTEMD_LOG_TARGET", "") not in ("console", "console-prefixed"):
        try:
            fd = os.open("/dev/kmsg", os.O_WRONLY | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError:
            pass
        else:
            try:
                os.write(fd, f"<4>{line}\n".encode("utf-8", "replace"))
                return
            except OSError:
                pass
            finally:
                os.close(fd)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _default_exec(argv0: str) -> str:
    # An installed generator knows where install found agentscope; a
    # generator started from a virtual environment's bin/ looks next to itself.
    if _INSTALLED_EXEC is not None:
        return _INSTALLED_EXEC
    beside = os.path.join(os.path.dirname(os.path.realpath(argv0)), "agentscope")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return DEFAULT_EXEC


def _user_mode(flags: set[str], argv0: str) -> bool:
    if "--user" in flags:
        return True
    if "--system" in flags:
        return False
    scope = os.environ.get("SYSTEMD_SCOPE")
    if scope in ("user", "system"):
        return scope == "user"
    return os.path.basename(os.path.dirname(os.path.abspath(argv0))) == "user-generators"


USAGE = "usage: agentscope-generator [--user|--system] NORMAL_DIR [EARLY_DIR LATE_DIR]"
HELP = """\
The systemd generator of agentscope (systemd.generator(7)): writes the agents
slice, the monitor template, one wants link per fleet and the systemd-oomd
drop-ins into NORMAL_DIR, from /etc/agentscope/agentscope.toml
($AGENTSCOPE_CONFIG). systemd runs it at boot and on every daemon-reload;
an invalid config is logged and never fails either. agentscope install puts
it in place.

Options:
  --user       generate for a user manager (else $SYSTEMD_SCOPE, else the
               directory it runs from: user-generators)
  --system     generate for the system manager
  -h, --help   show this message and exit

Example:
  agentscope-generator --user /tmp/out    # see what it would generate
"""


def main(argv: list[str] | None = None) -> int:
    """Generate into the first (normal) output directory; 0 unless it could not write.

    Usage: ``agentscope-generator [--user|--system] NORMAL [EARLY LATE]``.
    """
    args = list(sys.argv if argv is None else argv)
    argv0, rest = (args[0] if args else "agentscope-generator"), args[1:]
    if "-h" in rest or "--help" in rest:
        sys.stdout.write(f"{USAGE}\n\n{HELP}")
        return 0
    flags = {a for a in rest if a.startswith("--")}
    dirs = [a for a in rest if not a.startswith("--")]
    if len(dirs) not in (1, 3) or flags - {"--user", "--system"}:
        sys.stderr.write(f"{USAGE}\nTry 'agentscope-generator --help' for help.\n")
        return 2
    user_mode = _user_mode(flags, argv0)
    path = os.environ.get("AGENTSCOPE_CONFIG") or DEFAULT_CONFIG_PATH
    config, problems = load_config(path)
    if config.monitor_exec is None:
        config = config.replace(monitor_exec=_default_exec(argv0))
    for problem in problems:
        _log(problem)
    user = os.environ.get("USER") or os.environ.get("LOGNAME")
    fleets = select_fleets(config, user_mode=user_mode, user=user)
    header = f"Generated by agentscope-generator from {path}; edit that file, not this one."
    rendered = render(config, find_templates(), user_mode=user_mode, fleets=fleets, header=header)
    write_rendered(dirs[0], rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
