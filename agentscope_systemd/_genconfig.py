"""The generator's config file: its records, every value's check, the loading.

Half of :mod:`agentscope_systemd.generator`, kept apart by concern: this
reads and validates ``/etc/agentscope/agentscope.toml``; the generator
renders and writes the units. The same rules hold: the standard library
only, and a bad value is reported and replaced by its default, never
raised. ``agentscope install`` copies the code below the marker into the
installed generator, so that it stays one file (_install.generator_script).
"""

from __future__ import annotations

# Not `from typing import ...`: importing typing costs about 9 ms, a third of
# the generator's run time without a config file.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Self

__all__ = [
    "DEFAULT_FLEETS",
    "DEFAULT_PRESSURE_LIMIT",
    "DEFAULT_SLICE",
    "DEFAULT_WATCHDOG_SEC",
    "GUARD_OPTIONS",
    "Config",
    "FleetEntry",
    "load_config",
    "parse_config",
    "validate_exec",
    "validate_fleet_name",
    "validate_pressure_limit",
    "validate_slice_name",
]

# agentscope install: the installed generator holds what follows this line.

DEFAULT_SLICE = "app-agentscope-agents.slice"
DEFAULT_PRESSURE_LIMIT = "80%"
DEFAULT_WATCHDOG_SEC = 30

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
