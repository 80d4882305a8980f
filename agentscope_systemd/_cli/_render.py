"""Rendering: pure functions from plain data (lists of dicts) to rich renderables.

No I/O and no fleet here, so every table can be snapshot-tested with
:func:`render_text` at a fixed width without a terminal.
"""

from __future__ import annotations

import io
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

__all__ = [
    "add_row",
    "doctor_view",
    "event_line",
    "format_age",
    "format_bytes",
    "format_pressure",
    "ls_table",
    "render_text",
    "report_view",
    "top_view",
]

_STATE_STYLE = {
    "running": "green",
    "frozen": "cyan",
    "starting": "yellow",
    "stopping": "yellow",
    "lingering": "magenta",
    "exited": "dim",
    "failed": "red",
    "lost": "red",
}
_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def format_bytes(n: int | None) -> str:
    """``1.5 GiB``; ``-`` for unknown."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_age(seconds: float | None) -> str:
    """``45s``, ``12m``, ``3h05m``, ``2d04h``; ``-`` for unknown."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _num(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def format_pressure(pressure: Mapping[str, Any] | None) -> str:
    """One line from a PSI dict: ``some avg10=0.00 avg60=... full avg10=...``."""
    if not pressure:
        return "no PSI"
    parts: list[str] = []
    for key, value in pressure.items():
        if isinstance(value, Mapping):
            inner = " ".join(f"{k}={_num(v)}" for k, v in value.items() if k != "total")
            parts.append(f"{key} {inner}" if inner else key)
        elif value is not None:
            parts.append(f"{key}={_num(value)}")
    return "  ".join(parts) or "no PSI"


_RIGHT = frozenset(
    {"PID", "MEMORY", "PEAK", "OOM KILLS", "OOM", "CALLS", "PROCESSES", "AGE", "RSS"}
)


def _columns(table: Table, names: Sequence[str]) -> None:
    # Long unit names fold onto a second line before any other column is cut.
    for name in names:
        justify: JustifyMethod = "right" if name in _RIGHT else "left"
        if name == "UNIT":
            table.add_column(name, justify=justify, overflow="fold", min_width=12)
        else:
            table.add_column(name, justify=justify, no_wrap=True, min_width=len(name))


def add_row(table: Table, *cells: RenderableType) -> None:
    """``table.add_row`` with every string cell taken as plain text, never markup.

    Cells hold names others chose (agents, processes, units): a comm of
    ``[/]`` would make rich fail and one of ``[bold red]FAKE`` forge output.
    """
    table.add_row(*(Text(c) if isinstance(c, str) else c for c in cells))


def _styled(value: str, style: str | None) -> Text:
    return Text(value, style=style or "")


def _state_cell(agent: Mapping[str, Any]) -> Text:
    """An agent's state; a lingering one says how many processes it left."""
    state = str(agent.get("state") or "-")
    shown = f"{state} ({agent.get('leftovers', 0)} left)" if state == "lingering" else state
    return _styled(shown, _STATE_STYLE.get(state))


def ls_table(agents: Sequence[Mapping[str, Any]], now: float | None = None) -> Table:
    """The ``ls`` table: name, state, pid, memory, peak, OOM kills, tool calls now, age, unit."""
    now = time.time() if now is None else now
    table = Table(box=None, pad_edge=False, header_style="bold")
    _columns(table, ("NAME", "STATE", "PID", "MEMORY", "PEAK", "OOM KILLS", "CALLS", "AGE", "UNIT"))
    for a in agents:
        started = a.get("started")
        add_row(
            table,
            str(a.get("name", "-")),
            _state_cell(a),
            str(a.get("pid") or "-"),
            format_bytes(a.get("memory_current")),
            format_bytes(a.get("memory_peak")),
            _styled(str(a.get("oom_kills", 0)), "bold red" if a.get("oom_kills") else None),
            str(a.get("calls") or "-"),
            format_age(now - started if started else None),
            str(a.get("unit", "-")),
        )
    return table


def _host_line(host: Mapping[str, Any]) -> Text:
    parts: list[str] = []
    for key, value in host.items():
        if isinstance(value, int) and not isinstance(value, bool) and _is_size(key):
            parts.append(f"{key}={format_bytes(value)}")
        elif not isinstance(value, Mapping | list):
            parts.append(f"{key}={_num(value)}")
    return Text("host  " + "  ".join(parts))


def _is_size(key: str) -> bool:
    return key.startswith(("mem", "swap")) or key.endswith(
        ("_bytes", "total", "available", "free", "used", "rss")
    )


def report_view(report: Mapping[str, Any]) -> Group:
    """The ``report`` view: host line, PSI line, agents table, top processes table."""
    agents = Table(title="agents", title_justify="left", box=None, header_style="bold")
    # Only a fleet with escapees gets the column (docs/escapes.md).
    escapes = any(a.get("escaped") for a in report.get("agents", []))
    columns = ("NAME", "MEMORY", "PEAK", "OOM KILLS", *(["ESCAPED"] if escapes else []), "UNIT")
    _columns(agents, columns)
    for a in report.get("agents", []):
        escaped = (
            [f"{a.get('escaped') or 0} ({format_bytes(a.get('escaped_rss'))})"] if escapes else []
        )
        add_row(
            agents,
            str(a.get("agent") or "-"),
            format_bytes(a.get("memory_current")),
            format_bytes(a.get("memory_peak")),
            str(a.get("oom_kills", 0)),
            *escaped,
            str(a.get("unit", "-")),
        )
    procs = Table(title="top processes", title_justify="left", box=None, header_style="bold")
    _columns(procs, ("PID", "COMM", "RSS", "AGENT"))
    for p in report.get("processes", []):
        add_row(
            procs,
            str(p.get("pid", "-")),
            str(p.get("comm", "-")),
            format_bytes(p.get("rss")),
            str(p.get("agent") or "-") + (" (escaped)" if p.get("escaped") else ""),
        )
    return Group(
        _host_line(report.get("host") or {}),
        Text("pressure  " + format_pressure(report.get("pressure"))),
        Text(""),
        agents,
        *_calls_table(report.get("agents", [])),
        Text(""),
        procs,
    )


def _calls_table(agents: Sequence[Mapping[str, Any]]) -> list[RenderableType]:
    """The tool calls running in the agents' scopes (docs/calls.md); nothing when none."""
    rows = [(a, c) for a in agents for c in a.get("calls") or ()]
    if not rows:
        return []
    table = Table(title="calls", title_justify="left", box=None, header_style="bold")
    _columns(table, ("AGENT", "CALL", "MEMORY", "PEAK", "PROCESSES", "OOM KILLS"))
    for a, c in rows:
        add_row(
            table,
            str(a.get("agent") or "-"),
            str(c.get("call", "-")),
            format_bytes(c.get("memory_current")),
            format_bytes(c.get("memory_peak")),
            str(c.get("processes", 0)),
            str(c.get("oom_kills", 0)),
        )
    return [Text(""), table]


def doctor_view(
    systemd_version: str | None, manager: str, checks: Sequence[Mapping[str, Any]]
) -> Group:
    """One line per check, with the command that fixes each one that is not a pass."""
    lines: list[RenderableType] = [Text(f"{manager} manager, systemd {systemd_version or '?'}")]
    for c in checks:
        status = str(c["status"])
        line = Text(f"{status.upper():<5}", style=_STATUS_STYLE.get(status, ""))
        line.append(f" {c['name']}: {c['detail']}")
        lines.append(line)
        if c.get("fix") and status != "pass":
            lines.append(Text(f"      fix: {c['fix']}", style="dim"))
    return Group(*lines)


def _local(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _guard_kill_text(d: Mapping[str, Any]) -> str:
    """What a guard kill did and why, as ``key=value`` words (``d``: the event's fields)."""
    size = format_bytes(int(d.get("rss") or 0) + int(d.get("swap") or 0)).replace(" ", "")
    reading = (
        f"mem_available={_num(d.get('mem_available_percent'))}% "
        f"swap_free={_num(d.get('swap_free_percent'))}%"
    )
    psi = d.get("psi_full_avg10")
    if d.get("trigger") == "psi" or psi is not None:
        reading += f" psi_full={_num(psi)}%"
    reaction = d.get("reaction_seconds")
    took = f"{float(reaction) * 1000:.0f}ms" if isinstance(reaction, int | float) else "-"
    comm = _plain(d.get("comm") or "-")
    released = "" if d.get("released") else " released=no"
    limit = d.get("limit")
    if isinstance(limit, str) and limit != "host":  # a container's or a MemoryMax's limit
        cap = format_bytes(int(d.get("limit_bytes") or 0)).replace(" ", "")
        reading = (
            f"limit={_plain(limit)}({cap}) available={_num(d.get('limit_available_percent'))}% "
            + reading
        )
    return (
        f"pid={d.get('pid')} comm={comm} size={size} trigger={d.get('trigger')} "
        f"{reading} reaction={took}{released}"
    )


#: Control characters in names others chose are shown as '?' in a text line:
#: C0 and DEL, C1 (U+0080-U+009F: U+009B is a CSI to many terminals, #31),
#: the line and paragraph separators, and the bidirectional overrides that
#: make a line read otherwise than it is.
_UNPRINTABLE = (
    dict.fromkeys(range(32), "?")
    | dict.fromkeys(range(0x7F, 0xA0), "?")
    | dict.fromkeys((0x2028, 0x2029), "?")
    | dict.fromkeys((*range(0x202A, 0x202F), *range(0x2066, 0x206A)), "?")
)


def event_line(event: Mapping[str, Any]) -> str:
    """One line for an event: a live one (``monitor``) or a recorded one (``events``).

    Both read the same, from the same fields (a recorded event keeps them
    in ``detail``): ``2024-05-01 12:00:00 oom_kill builder-1 pid=5001
    comm=node rss=5.0GiB source=kmsg unit=...``; a throttle ends with the
    command that lifts it (``fix: systemctl ...``). A guard kill reads as
    ``... guard_kill builder-1 pid=123 comm=node size=1.2GiB trigger=memory
    mem_available=4.50% swap_free=0.00% psi_full=12.00% reaction=40ms``; an
    escape as ``... escaped builder-1 pid=77 comm=sleep to=run-r1.scope
    reclaimed=yes``.
    """
    detail = event.get("detail")
    fields: Mapping[str, Any] = detail if isinstance(detail, Mapping) else event
    kind = _plain(event.get("kind") or "-")
    ts = event.get("ts")
    stamp = _local(float(ts)) if isinstance(ts, int | float) else "-"
    unit = fields.get("unit")
    who = _plain(event.get("agent") or fields.get("agent") or unit or "-")
    if kind == "guard_kill":
        return f"{stamp} guard_kill {who} {_guard_kill_text(fields)}"
    if kind == "escaped":
        return f"{stamp} escaped {who} {_escaped_text(fields)}"
    words = _event_words(kind, fields, shown_unit=who == _plain(unit))
    return f"{stamp} {kind} {who} {words}".rstrip()


def _plain(value: Any) -> str:
    """A value others chose, as one line of text: control characters are '?'."""
    return str(value).translate(_UNPRINTABLE)


#: The fields of an event, in the order a line shows them; the rest follow.
_FIRST = ("pid", "comm", "rss_last_seen", "status", "source", "unit")
_SIZES = frozenset({"rss_last_seen", "rss", "swap", "memory_current", "memory_peak"})
_NAMES = {"rss_last_seen": "rss", "high_events_delta": "high_events", "d_state_pids": "stalled"}
_NOT_WORDS = frozenset({"kind", "ts", "agent", "id", "fleet", "detail", "fix", "report"})


def _event_words(kind: str, fields: Mapping[str, Any], *, shown_unit: bool) -> str:
    order = [k for k in _FIRST if k in fields] + [k for k in fields if k not in _FIRST]
    words: list[str] = []
    for key in order:
        value = fields[key]
        if key in _NOT_WORDS or value is None or (key == "unit" and shown_unit):
            continue
        if key == "recovered" and not value:  # said only of a kill recovered after the fact
            continue
        name = _NAMES.get(key, key)
        if key in _SIZES and isinstance(value, int):
            words.append(f"{name}={format_bytes(value).replace(' ', '')}")
        elif isinstance(value, list | tuple):
            words.append(f"{name}={','.join(_plain(v) for v in value) or '-'}")
        elif isinstance(value, Mapping):
            inner = ",".join(f"{_plain(k)}={_plain(v)}" for k, v in value.items() if v is not None)
            words.append(f"{name}={inner or '-'}")
        else:
            words.append(f"{name}={_plain(value)}")
    if kind == "oom_kill" and fields.get("pid") is None:
        words.insert(0, "victim=unknown")
    report = fields.get("report")
    if kind == "pressure" and isinstance(report, Mapping):
        words.append(format_pressure(report.get("pressure")))
    if kind == "throttled":
        fix = fields.get("fix")
        words.append(f"fix: {_plain(fix)}" if fix else "fix: none found (no MemoryHigh holder)")
    return " ".join(words)


def _escaped_text(fields: Mapping[str, Any]) -> str:
    where = _plain(fields.get("to_unit") or fields.get("cgroup") or "-")
    text = f"pid={fields.get('pid', '-')} comm={_plain(fields.get('comm', '-'))} to={where}"
    reclaimed = fields.get("reclaimed")
    if reclaimed is True:
        text += " reclaimed=yes"
    elif reclaimed is False:
        text += f" reclaimed=no ({_plain(fields.get('reclaim_error') or 'unknown')})"
    return text


def top_view(
    agents: Sequence[Mapping[str, Any]],
    pressure: Mapping[str, Any] | None,
    events: Sequence[Mapping[str, Any]],
    now: float,
) -> Group:
    """The ``top`` screen: agents with memory bars, PSI, recent events."""
    biggest = max((a.get("memory_current") or 0 for a in agents), default=0) or 1
    table = Table(box=None, header_style="bold", expand=False)
    _columns(table, ("NAME", "STATE", "MEMORY", "", "PEAK", "OOM", "CALLS", "AGE"))
    for a in agents:
        current = a.get("memory_current") or 0
        started = a.get("started")
        add_row(
            table,
            str(a.get("name", "-")),
            _state_cell(a),
            format_bytes(a.get("memory_current")),
            ProgressBar(total=biggest, completed=current, width=24),
            format_bytes(a.get("memory_peak")),
            str(a.get("oom_kills", 0)),
            str(a.get("calls") or "-"),
            format_age(now - started if started else None),
        )
    recent = [Text(event_line(e)) for e in events] or [Text("no recent events", style="dim")]
    return Group(
        Text(f"agentscope top  {_local(now)}  {len(agents)} agents  (q quits)", style="bold"),
        Text("pressure  " + format_pressure(pressure)),
        Text(""),
        table,
        Text(""),
        Text("recent events", style="bold"),
        *recent,
    )


def render_text(renderable: RenderableType, width: int = 100) -> str:
    """Plain text of a renderable at a fixed width, as the snapshots hold it."""
    console = Console(
        record=True, width=width, color_system=None, file=io.StringIO(), force_terminal=False
    )
    console.print(renderable)
    return console.export_text()
