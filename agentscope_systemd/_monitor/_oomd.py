"""systemd-oomd and the fleet: which of its rules cover the agents, and its kills, named.

systemd-oomd (systemd-oomd.service(8)) acts only on cgroups whose unit opted
in with ``ManagedOOMSwap=kill`` or ``ManagedOOMMemoryPressure=kill``, and
kills a whole *leaf* cgroup below the one whose rule fired: below the agents
slice that is an agent's scope, the agent with its tool calls, or in a
delegated scope one of its calls or the agent's own leaf (docs/calls.md).
Distributions opt in high up: Ubuntu's ``user@.service`` (memory pressure
50 % for 20 s) and ``-.slice`` (swap), Fedora's ``systemd-oomd-defaults``
every slice of every user manager (80 % for 20 s) and ``-.slice``.

This module reads what applies (I/O: :func:`read_oomd_config`,
:func:`read_oomd_chain`, :func:`oomd_state`) and judges it without I/O
(:func:`assess_oomd`: which ancestor monitors the agents, at what limit and for
how long, and whether oomd honours the agents' ``ManagedOOMPreference=``),
for ``agentscope doctor``. And it reads oomd's own journal line about a kill
(:func:`parse_oomd_line`), which the monitor turns into an
:class:`OomdKill` event naming the agent.

What oomd does, from its source (src/oom/oomd-util.c, oomd-manager.c,
systemd 247-262):

- candidates are the leaf cgroups (or those with ``memory.oom.group=1``)
  below every cgroup monitored by the rule; the pressure rule picks the one
  reclaiming most (pgscan rate), the swap rule the largest swap user above
  5 % of swap;
- a candidate's preference is its *own* ``user.oomd_avoid``/``user.oomd_omit``
  xattr, set by its manager from ``ManagedOOMPreference=``: not inherited
  from a slice. It counts only when the candidate is root's, or has the owner
  of the monitored cgroup (the swap rule's is ``/``, root's);
- the swap rule acts as soon as memory *and* swap are more than
  ``SwapUsedLimit=`` (90 %) used; the pressure rule once a cgroup's ``full``
  avg10 stays above its limit for the duration, with reclaim activity.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from .._calls._calls import call_in
from .._dicts import as_dict
from .._events import OomdKill as OomdKill  # the event is the monitor's (one union there)
from .._managers import _wire
from ._recovery import unit_of_memcg

if TYPE_CHECKING:
    from .._managers._bus import SystemdBus

__all__ = [
    "OOMD_DEFAULTS",
    "OOMD_UNIT",
    "OomdConfig",
    "OomdKill",
    "OomdLine",
    "OomdRepeats",
    "OomdRule",
    "OomdView",
    "UnitRules",
    "agents_ancestors",
    "assess_oomd",
    "oomd_kill_event",
    "oomd_state",
    "parse_oomd_conf",
    "parse_oomd_line",
    "parse_unit_rules",
    "read_oomd_chain",
    "read_oomd_config",
]

OOMD_UNIT: Final = "systemd-oomd.service"
#: The socket systemd-oomd listens on for user managers (systemd-oomd.socket):
#: there while oomd is installed and enabled, even before it first started.
OOMD_SOCKET: Final = Path("/run/systemd/oom/io.systemd.ManagedOOM")
_UNIT_IFACE: Final = _wire.SD_UNIT
_IFACES: Final = {".slice": _wire.SD_SLICE, ".service": _wire.SD_SERVICE, ".scope": _wire.SD_SCOPE}
_USEC_INFINITY: Final = (1 << 64) - 1
#: Bounds on what is read: bytes of one config file, files of oomd.conf.d.
_MAX_CONF: Final = 65_536
_MAX_DROPINS: Final = 128
#: oomd's line is at most this long (a cgroup path is at most a few hundred).
MAX_LINE: Final = 4096
_MAX_CGROUP: Final = 1024


@dataclass(frozen=True, slots=True)
class OomdConfig:
    """oomd's global settings (oomd.conf(5)): percentages, seconds, and what was wrong.

    ``problems`` lists values that were not understood (the default is kept).
    """

    swap_used_limit: float = 90.0
    pressure_limit: float = 60.0
    pressure_duration: float = 30.0
    problems: tuple[str, ...] = ()


#: systemd's compiled-in defaults (oomd.conf(5)).
OOMD_DEFAULTS: Final = OomdConfig()

_PERCENT = re.compile(r"([0-9]{1,5})(?:\.([0-9]{1,4}))?\s*(%|‰|‱)")
_TIME_UNITS: Final = {
    "us": 1e-6,
    "usec": 1e-6,
    "ms": 1e-3,
    "msec": 1e-3,
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
}
_TIME_PART = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,6})?)\s*([a-z]{0,7})")


def _percent(text: str) -> float | None:
    """``"90%"``, ``"90.5%"``, ``"900‰"``, ``"9000‱"`` as a percentage; None if not one."""
    m = _PERCENT.fullmatch(text.strip())
    if m is None:
        return None
    value = float(f"{m.group(1)}.{m.group(2) or 0}")
    value /= {"%": 1, "‰": 10, "‱": 100}[m.group(3)]
    return value if 0 <= value <= 100 else None


def _timespan(text: str) -> float | None:
    """A systemd timespan (``"20s"``, ``"1min 30s"``, ``"20"``) in seconds; None if not one."""
    text = text.strip()
    if not text or len(text) > 64:
        return None
    total, pos = 0.0, 0
    while pos < len(text):
        m = _TIME_PART.match(text, pos)
        if m is None or m.end() == pos or m.group(2) not in _TIME_UNITS:
            return None
        total += float(m.group(1)) * _TIME_UNITS[m.group(2)]
        pos = m.end()
        while pos < len(text) and text[pos] == " ":
            pos += 1
    return total


def parse_oomd_conf(texts: Iterable[tuple[str, str]]) -> OomdConfig:
    """oomd's settings from ``(name, text)`` config files in the order oomd reads them.

    The ``[OOM]`` section's ``SwapUsedLimit=``, ``DefaultMemoryPressureLimit=``
    and ``DefaultMemoryPressureDurationSec=``; a later file wins, an empty
    value resets to the default, a bad one is reported and ignored.
    """
    values: dict[str, float] = {}
    problems: list[str] = []
    defaults = {
        "SwapUsedLimit": OOMD_DEFAULTS.swap_used_limit,
        "DefaultMemoryPressureLimit": OOMD_DEFAULTS.pressure_limit,
        "DefaultMemoryPressureDurationSec": OOMD_DEFAULTS.pressure_duration,
    }
    for name, text in texts:
        section = ""
        for raw in text[:_MAX_CONF].splitlines():
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip()
                continue
            key, sep, value = line.partition("=")
            key, value = key.strip(), value.strip()
            if section != "OOM" or not sep or key not in defaults:
                continue
            if not value:
                values.pop(key, None)
                continue
            parsed = _timespan(value) if key.endswith("Sec") else _percent(value)
            if key.endswith("Sec") and parsed == 0:
                values.pop(key, None)  # oomd maps 0 to its default
                continue
            if key.endswith("Sec") and parsed is not None and parsed < 1:
                parsed = None  # oomd ignores a duration under 1 s
            if parsed is None:
                problems.append(f"{name}: {key}={value[:40]!r} not understood; ignored")
            else:
                values[key] = parsed
    merged = {**defaults, **values}
    return OomdConfig(
        swap_used_limit=merged["SwapUsedLimit"],
        pressure_limit=merged["DefaultMemoryPressureLimit"],
        pressure_duration=merged["DefaultMemoryPressureDurationSec"],
        problems=tuple(problems),
    )


def _read_text(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_CONF).decode("utf-8", "replace")
    except OSError:
        return None


def read_oomd_config(root: Path = Path("/")) -> OomdConfig:
    """oomd's settings as it would read them under ``root``.

    The main file (the first of ``/etc``, ``/run``, ``/usr/local/lib``,
    ``/usr/lib`` ``systemd/oomd.conf``), then ``oomd.conf.d/*.conf`` of all
    four sorted by file name, a name in an earlier directory hiding the same
    name in a later one (systemd.syntax(7)). Unreadable files are skipped.
    """
    dirs = ("etc/systemd", "run/systemd", "usr/local/lib/systemd", "usr/lib/systemd")
    texts: list[tuple[str, str]] = []
    for d in dirs:
        text = _read_text(root / d / "oomd.conf")
        if text is not None:
            texts.append((f"/{d}/oomd.conf", text))
            break
    dropins: dict[str, Path] = {}
    for d in dirs:
        try:
            names = sorted(p.name for p in (root / d / "oomd.conf.d").iterdir())
        except OSError:
            continue
        for name in names[:_MAX_DROPINS]:
            if name.endswith(".conf"):
                dropins.setdefault(name, root / d / "oomd.conf.d" / name)
    for name in sorted(dropins)[:_MAX_DROPINS]:
        text = _read_text(dropins[name])
        if text is not None:
            texts.append(("/" + str(dropins[name].relative_to(root)), text))
    return parse_oomd_conf(texts)


@dataclass(frozen=True, slots=True)
class UnitRules:
    """One unit's ``ManagedOOM*`` properties, as its manager reports them.

    ``manager`` is the manager holding the unit (``"system"`` or ``"user"``);
    ``pressure_limit`` is a percentage and ``pressure_duration`` seconds, None
    where the unit leaves them to oomd's defaults (or, for the duration, the
    systemd version has no such property: before 257).
    """

    unit: str
    manager: str
    cgroup: str | None = None
    swap: str = "auto"
    pressure: str = "auto"
    pressure_limit: float | None = None
    pressure_duration: float | None = None
    preference: str = "none"
    error: str | None = None


def _mode(value: object, choices: tuple[str, ...], default: str) -> str:
    return value if isinstance(value, str) and value in choices else default


def parse_unit_rules(unit: str, manager: str, props: Mapping[str, Any]) -> UnitRules:
    """A unit's rules from its properties (``GetAll`` of its Slice/Service/Scope interface).

    ``ManagedOOMMemoryPressureLimit`` is a fraction of 2^32 (systemd 248+;
    0: oomd's default); 247 spelled it ``ManagedOOMMemoryPressureLimitPercent``.
    ``ManagedOOMMemoryPressureDurationUSec`` (257+) is infinity when unset.
    Values of the wrong type or out of range count as unset.
    """
    limit: float | None = None
    raw = props.get("ManagedOOMMemoryPressureLimit")
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 < raw < 1 << 32:
        limit = round(raw * 100 / (1 << 32), 2)
    old = props.get("ManagedOOMMemoryPressureLimitPercent")
    if limit is None and isinstance(old, str):
        limit = _percent(old) or None
    duration: float | None = None
    usec = props.get("ManagedOOMMemoryPressureDurationUSec")
    if isinstance(usec, int) and not isinstance(usec, bool) and 0 < usec < _USEC_INFINITY:
        duration = usec / 1e6
    cgroup = props.get("ControlGroup")
    return UnitRules(
        unit=unit,
        manager=manager,
        cgroup=cgroup[:_MAX_CGROUP] if isinstance(cgroup, str) and cgroup else None,
        swap=_mode(props.get("ManagedOOMSwap"), ("auto", "kill"), "auto"),
        pressure=_mode(props.get("ManagedOOMMemoryPressure"), ("auto", "kill"), "auto"),
        pressure_limit=limit,
        pressure_duration=duration,
        preference=_mode(props.get("ManagedOOMPreference"), ("none", "avoid", "omit"), "none"),
    )


def agents_ancestors(slice_name: str, manager: str, uid: int) -> list[tuple[str, str]]:
    """The agents slice and every unit above it, nearest first, as (unit, manager).

    Slice names are the hierarchy (``app-agentscope-agents.slice`` in
    ``app-agentscope.slice`` in ``app.slice`` in ``-.slice``). Under a user
    manager its root is ``user@UID.service`` of the system manager, in
    ``user-UID.slice``, ``user.slice`` and the system's ``-.slice``.

    >>> agents_ancestors("app-a-b.slice", "system", 0)
    [('app-a-b.slice', 'system'), ('app-a.slice', 'system'), ('app.slice', 'system'), \
('-.slice', 'system')]
    """
    parts = slice_name.removesuffix(".slice").split("-")
    chain = [("-".join(parts[:n]) + ".slice", manager) for n in range(len(parts), 0, -1)]
    if manager == "user":
        chain += [
            (f"user@{uid}.service", "system"),
            (f"user-{uid}.slice", "system"),
            ("user.slice", "system"),
        ]
    return [*chain, ("-.slice", "system")]


async def read_oomd_chain(
    buses: Mapping[str, SystemdBus], chain: Sequence[tuple[str, str]]
) -> list[UnitRules]:
    """The rules of each unit of ``chain`` (:func:`agents_ancestors`), read from its manager.

    ``buses`` maps ``"system"``/``"user"`` to a connection; a unit that cannot
    be read (no such bus, an error) is kept with its ``error`` and no rule.
    """
    from .._errors import AgentscopeError

    found: list[UnitRules] = []
    for unit, manager in chain:
        bus = buses.get(manager)
        if bus is None:
            found.append(UnitRules(unit, manager, error=f"no {manager} manager to ask"))
            continue
        iface = next((i for s, i in _IFACES.items() if unit.endswith(s)), _UNIT_IFACE)
        try:
            path = await bus.unit_path(unit)
            props = await bus.get_all(path, iface)
        except AgentscopeError as exc:
            found.append(UnitRules(unit, manager, error=str(exc)[:300]))
            continue
        found.append(parse_unit_rules(unit, manager, props))
    return found


async def oomd_state(system: SystemdBus | None, *, socket_present: bool = False) -> str | None:
    """systemd-oomd.service's ActiveState on the system bus (``"not-found"``, ``"masked"``
    for a unit that is not there or masked); else ``"listening"`` when its socket is there
    (``socket_present``: :data:`OOMD_SOCKET` exists), ``None`` when neither tells."""
    from .._errors import AgentscopeError

    if system is not None:
        try:
            path = await system.unit_path(OOMD_UNIT)
            state = await system.get_property(path, _UNIT_IFACE, "ActiveState")
            load = await system.get_property(path, _UNIT_IFACE, "LoadState")
        except AgentscopeError:
            pass
        else:
            if load == "loaded" and isinstance(state, str):
                return state[:32]
            if load in ("not-found", "masked"):
                return str(load)
    return "listening" if socket_present else None


@dataclass(frozen=True, slots=True)
class OomdRule:
    """One oomd rule that covers the agents: which unit holds it, what it does.

    ``kind`` ``"pressure"``: kill when the unit's memory pressure stays above
    ``limit`` % for ``duration`` s; ``"swap"``: kill at once when memory and
    swap are both more than ``limit`` % used. ``honours_avoid``: whether oomd
    honours the agent scopes' ``ManagedOOMPreference=`` under this rule.
    """

    unit: str
    manager: str
    cgroup: str | None
    kind: Literal["pressure", "swap"]
    limit: float
    duration: float | None
    honours_avoid: bool
    #: The agents slice's own rule (agentscope's backstop): its candidates are agents only.
    own: bool = False

    def describe(self) -> str:
        """One line: the rule and what it does to an agent."""
        where = f"{self.unit} ({self.manager} manager)"
        if self.own and self.kind == "pressure":
            return (
                f"the agents slice's own rule (agentscope's backstop): memory pressure over "
                f"{self.limit:g}% for {self.duration:g} s kills the tool call or agent reclaiming "
                "most"
            )
        if self.kind == "swap":
            what = f"swap rule on {where}: memory and swap over {self.limit:g}% used"
        else:
            what = (
                f"pressure rule on {where}: memory pressure over {self.limit:g}% "
                f"for {self.duration:g} s"
            )
        avoid = (
            "it honours the scopes' ManagedOOMPreference=avoid (agents last)"
            if self.honours_avoid
            else "it ignores the scopes' ManagedOOMPreference= (their owner is not the rule's)"
        )
        # A delegated scope's candidates are its calls and its agent leaf, an
        # undelegated scope is one (docs/calls.md, "systemd-oomd and calls").
        return f"{what} would kill a tool call, or a whole agent; {avoid}"


@dataclass(frozen=True, slots=True)
class OomdView:
    """What systemd-oomd would do to the fleet (:func:`assess_oomd`).

    ``state`` is oomd's ActiveState (``"active"``...), ``"listening"`` (its
    socket only), ``"not-found"``, or None (cannot tell); ``rules`` the rules
    covering the agents slice, nearest first; ``chain`` every unit read;
    ``agents_rule`` is the agents slice's own pressure rule (agentscope's
    backstop), None without one.
    """

    state: str | None
    config: OomdConfig
    chain: tuple[UnitRules, ...]
    rules: tuple[OomdRule, ...]

    @property
    def running(self) -> bool:
        """oomd runs (or starts on its socket's first connection)."""
        return self.state in ("active", "activating", "reloading", "listening")

    @property
    def foreign_rules(self) -> tuple[OomdRule, ...]:
        """The rules not on the agents slice itself: a distribution's or an administrator's."""
        agents = self.chain[0].unit if self.chain else None
        return tuple(r for r in self.rules if r.unit != agents)

    def summary(self) -> str:
        """What oomd would do to the fleet, in one paragraph."""
        if not self.running:
            state = self.state or "not installed"
            return f"systemd-oomd is {state}: it kills nothing"
        if not self.rules:
            return (
                f"systemd-oomd is {self.state}, and no rule covers the agents slice: "
                "it kills no agent"
            )
        return f"systemd-oomd is {self.state}; " + "; ".join(r.describe() for r in self.rules)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "state": self.state,
            "running": self.running,
            "config": as_dict(self.config),
            "rules": [as_dict(r) for r in self.rules],
            "chain": [as_dict(u) for u in self.chain],
        }


def assess_oomd(state: str | None, config: OomdConfig, chain: Sequence[UnitRules]) -> OomdView:
    """The rules of ``chain`` (the agents slice first, then its ancestors) that cover agents.

    A unit with ``ManagedOOMMemoryPressure=kill`` covers every leaf below it,
    at its limit or ``config``'s default, for its duration or the default;
    ``ManagedOOMSwap=kill`` anywhere means the host-wide swap rule, whose
    candidates' preference oomd checks against ``/`` (root's). Under the
    user manager the scopes are the user's, so their preference counts for a
    rule on a unit of the user manager or on ``user@UID.service`` (delegated
    to the user), not above; under the system manager always.
    """
    rules: list[OomdRule] = []
    for index, u in enumerate(chain):
        if u.error is not None:
            continue
        system_agents = chain[0].manager == "system" if chain else True
        same_owner = system_agents or u.manager == "user" or u.unit.startswith("user@")
        if u.pressure == "kill":
            rules.append(
                OomdRule(
                    u.unit,
                    u.manager,
                    u.cgroup,
                    "pressure",
                    u.pressure_limit if u.pressure_limit is not None else config.pressure_limit,
                    u.pressure_duration
                    if u.pressure_duration is not None
                    else config.pressure_duration,
                    same_owner,
                    own=index == 0,
                )
            )
        if u.swap == "kill":
            rules.append(
                OomdRule(
                    u.unit, u.manager, u.cgroup, "swap", config.swap_used_limit, None, system_agents
                )
            )
    return OomdView(state, config, tuple(chain), tuple(rules))


# ---------------------------------------------------------------------------
# oomd's kills


@dataclass(frozen=True, slots=True)
class OomdLine:
    """oomd's journal line about one kill, parsed (:func:`parse_oomd_line`).

    ``rule`` ``"swap"`` (memory and swap used over ``limit`` %) or
    ``"pressure"`` (``monitored``'s pressure ``pressure`` % over ``limit`` %
    for longer than ``duration``, as oomd wrote it).
    """

    cgroup: str
    rule: Literal["swap", "pressure"]
    limit: float | None
    monitored: str | None = None
    pressure: float | None = None
    duration: str | None = None


_PATH = r"(/[^\s]{0,1023})"
_PCT = r"([0-9]{1,3}\.[0-9]{2})%"
_HEAD = re.compile(r"(?:Killed|Marked) " + _PATH + r"(?: for killing)? due to (.*)")
_SWAP = re.compile(
    r"(?:memory used \([0-9]{1,20}\) / total \([0-9]{1,20}\) and )?"
    r"swap used \([0-9]{1,20}\) / total \([0-9]{1,20}\) being more than " + _PCT
)
_PRESSURE = re.compile(
    r"memory pressure for "
    + _PATH
    + r" being "
    + _PCT
    + r" > "
    + _PCT
    + r" for > ([0-9a-z .]{1,32}?) with reclaim activity"
)


def parse_oomd_line(text: str) -> OomdLine | None:
    """systemd-oomd's line about a kill; None for any other text.

    ``Killed PATH due to memory used (N) / total (N) and swap used (N) /
    total (N) being more than 90.00%`` (systemd 247-259; ``Marked PATH for
    killing due to ...`` later), or ``... due to memory pressure for PATH
    being 61.23% > 50.00% for > 20s with reclaim activity``. Bounded: a line
    longer than :data:`MAX_LINE` is not one.
    """
    if len(text) > MAX_LINE:
        return None
    head = _HEAD.fullmatch(text.strip())
    if head is None:
        return None
    cgroup, reason = head.group(1), head.group(2)
    swap = _SWAP.fullmatch(reason)
    if swap is not None:
        return OomdLine(cgroup, "swap", float(swap.group(1)))
    pressure = _PRESSURE.fullmatch(reason)
    if pressure is not None:
        return OomdLine(
            cgroup,
            "pressure",
            float(pressure.group(3)),
            monitored=pressure.group(1),
            pressure=float(pressure.group(2)),
            duration=pressure.group(4).strip(),
        )
    return None


#: How long a second line of oomd's about the same cgroup is the same kill: oomd
#: names its victim again at its next reading while the killed processes are still
#: freeing their memory (measured: 1.2 s later, the call still holding 380 MiB of
#: swap; trixie under TCG, integration/tests/test_oomd_calls.py).
OOMD_REPEAT_SECONDS: Final = 10.0


class OomdRepeats:
    """oomd's kills of one cgroup told once: :meth:`first` is False for a line
    naming a cgroup already named less than ``window`` seconds before (the
    window slides with each repeat). Holds only the cgroups of that window."""

    def __init__(self, window: float = OOMD_REPEAT_SECONDS) -> None:
        self.window = window
        self._seen: dict[str, float] = {}

    def first(self, cgroup: str, now: float) -> bool:
        """Whether this kill of ``cgroup`` at ``now`` (monotonic seconds) is a new one."""
        self._seen = {c: t for c, t in self._seen.items() if now - t < self.window}
        new = cgroup not in self._seen
        self._seen[cgroup] = now
        return new


def oomd_kill_event(
    line: OomdLine, slice_cgroup: str, unit_agent: Callable[[str], str | None], ts: float
) -> OomdKill | None:
    """The event for an oomd kill of a scope in the agents slice (``slice_cgroup``, the
    slice's path as /proc/PID/cgroup names it); None for a kill elsewhere.

    The scope is the path's component right below the slice
    (:func:`~agentscope_systemd._monitor._recovery.unit_of_memcg`, the rule the kernel's kills
    are mapped by); ``unit_agent`` maps it to its agent.
    """
    unit = unit_of_memcg(line.cgroup, slice_cgroup)
    if unit is None:
        return None
    agent = unit_agent(unit)
    return OomdKill(
        ts,
        agent,
        unit,
        line.cgroup[:_MAX_CGROUP],
        line.rule,
        line.limit,
        None if line.monitored is None else line.monitored[:_MAX_CGROUP],
        line.pressure,
        line.duration,
        call=call_in(line.cgroup, unit),
    )
