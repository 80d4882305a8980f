"""What the monitor face's ``/metrics`` says: the Prometheus families of its last sample.

Built from :class:`agentscope_systemd._cli._http.FaceState` on each scrape (prometheus-client's
custom-collector protocol), so a scrape costs no D-Bus call and no cgroup
read. docs/install.md lists the metrics; docs/dashboards.md the dashboard
built on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentscope_systemd import (
    AgentExited,
    Escaped,
    GuardHeld,
    GuardKill,
    LimitFound,
    OomKill,
    Pressure,
    Throttled,
)

if TYPE_CHECKING:
    from ._http import FaceState

__all__ = ["StateCollector", "metric_families"]

_PRESSURE_WINDOWS = ("avg10", "avg60", "avg300")
#: Every kind of monitor event, counted from 0: a series born at 1 hides its
#: first event from increase() and rate() (Prometheus sees no change), so the
#: dashboard's first OOM kill would count as none.
_EVENT_KINDS = tuple(
    sorted(
        cls.kind
        for cls in (
            OomKill,
            Throttled,
            Pressure,
            AgentExited,
            LimitFound,
            Escaped,
            GuardKill,
            GuardHeld,
        )
    )
)


def metric_families(state: FaceState) -> Iterable[Any]:
    """The Prometheus metric families of the latest sample (what ``/metrics`` shows)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    sample, counters = state.read()
    fleet = state.fleet
    info = GaugeMetricFamily(
        "agentscope_monitor_info",
        "The monitor serving these metrics (always 1).",
        labels=["fleet", "manager", "version"],
    )
    info.add_metric([fleet, state.manager, state.version], 1)
    yield info
    yield _of_fleet(
        CounterMetricFamily,
        "agentscope_monitor_samples",
        "Samples the monitor took.",
        fleet,
        counters.samples,
    )
    yield _of_fleet(
        CounterMetricFamily,
        "agentscope_monitor_sample_errors",
        "Samples that failed (a cgroup or /proc file that could not be read).",
        fleet,
        counters.errors,
    )
    yield _of_fleet(
        CounterMetricFamily,
        "agentscope_monitor_watch_sample_failures",
        "Samples of the OOM watch (memory.events, cgroup.procs) that failed.",
        fleet,
        counters.watch_failures,
    )
    events = CounterMetricFamily(
        "agentscope_monitor_events",
        "Monitor events by kind (oom_kill, throttled, pressure, ...) since it started.",
        labels=["fleet", "kind"],
    )
    for kind, count in sorted({**dict.fromkeys(_EVENT_KINDS, 0), **counters.events}.items()):
        events.add_metric([fleet, kind], count)
    yield events
    if state.guard is not None:
        yield _of_fleet(
            GaugeMetricFamily,
            "agentscope_guard_running",
            "1 while the monitor's memory guard runs, 0 once it stopped.",
            fleet,
            1 if state.guard() else 0,
        )
    yield _of_fleet(
        CounterMetricFamily,
        "agentscope_guard_kills",
        "Processes the memory guard killed since the monitor started.",
        fleet,
        counters.events.get("guard_kill", 0),
    )
    if sample is None:
        return
    yield _of_fleet(
        GaugeMetricFamily,
        "agentscope_monitor_last_sample_timestamp_seconds",
        "When the monitor last took a sample (Unix time).",
        fleet,
        sample.ts,
    )
    yield from _agent_families(fleet, sample.agents)
    if sample.report is not None:
        yield from _report_families(fleet, sample.report)


def _of_fleet(kind: Callable[..., Any], name: str, doc: str, fleet: str, value: float) -> Any:
    """A metric family of one series, labelled with the fleet (a counter or a gauge)."""
    family = kind(name, doc, labels=["fleet"])
    family.add_metric([fleet], value)
    return family


def _agent_families(fleet: str, agents: Sequence[Mapping[str, Any]]) -> Iterable[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    states: dict[str, int] = dict.fromkeys(("running", "frozen", "starting", "stopping"), 0)
    for agent in agents:
        states[str(agent.get("state"))] = states.get(str(agent.get("state")), 0) + 1
    by_state = GaugeMetricFamily(
        "agentscope_agents", "Agents of the fleet by state.", labels=["fleet", "state"]
    )
    for name, count in sorted(states.items()):
        by_state.add_metric([fleet, name], count)
    yield by_state
    # An agent's identity is its fleet and name: a relaunch (a new unit, a
    # new PID) continues its series instead of starting a new label set.
    labels = ["fleet", "agent"]
    current = GaugeMetricFamily(
        "agentscope_agent_memory_current_bytes",
        "memory.current of the agent's scope.",
        labels=labels,
    )
    peak = GaugeMetricFamily(
        "agentscope_agent_memory_peak_bytes",
        "memory.peak of the agent's scope (kernel 5.19 and later).",
        labels=labels,
    )
    kills = CounterMetricFamily(
        "agentscope_agent_oom_kills",
        "Processes of the agent the kernel OOM-killed.",
        labels=labels,
    )
    # Per agent, never per call: a call label would start a series per call made.
    calls = GaugeMetricFamily(
        "agentscope_agent_calls",
        "Tool calls the agent runs now (call-* cgroups of its scope, docs/calls.md).",
        labels=labels,
    )
    # One series per name: a row that is closing while its successor starts
    # would otherwise give the same labels twice; the later row wins.
    by_name = {str(agent.get("name")): agent for agent in agents}
    for name, agent in sorted(by_name.items()):
        values = [fleet, name]
        if agent.get("memory_current") is not None:
            current.add_metric(values, agent["memory_current"])
        if agent.get("memory_peak") is not None:
            peak.add_metric(values, agent["memory_peak"])
        kills.add_metric(values, agent.get("oom_kills") or 0)
        calls.add_metric(values, agent.get("calls") or 0)
    yield from (current, peak, kills, calls)


def _report_families(fleet: str, report: Mapping[str, Any]) -> Iterable[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if report.get("slice_memory_current") is not None:
        slice_current = GaugeMetricFamily(
            "agentscope_slice_memory_current_bytes",
            "memory.current of the agents slice (every agent together).",
            labels=["fleet"],
        )
        slice_current.add_metric([fleet], report["slice_memory_current"])
        yield slice_current
    host = report.get("host")
    if host:
        for key, help_text in (
            ("mem_total", "MemTotal of the host."),
            ("mem_available", "MemAvailable of the host."),
        ):
            family = GaugeMetricFamily(f"agentscope_host_{key}_bytes", help_text, labels=["fleet"])
            family.add_metric([fleet], host[key])
            yield family
    ratio = GaugeMetricFamily(
        "agentscope_memory_pressure_ratio",
        "PSI memory pressure: share of time stalled over the window (0-1).",
        labels=["fleet", "source", "kind", "window"],
    )
    stall = CounterMetricFamily(
        "agentscope_memory_pressure_stall_seconds",
        "PSI memory pressure: total time stalled.",
        labels=["fleet", "source", "kind"],
    )
    for source, key in (("host", "pressure"), ("slice", "slice_pressure")):
        psi = report.get(key) or {}
        for kind in ("some", "full"):
            line = psi.get(kind)
            if not line:
                continue
            for window in _PRESSURE_WINDOWS:
                ratio.add_metric([fleet, source, kind, window[3:]], line[window] / 100)
            stall.add_metric([fleet, source, kind], line["total"] / 1e6)
    yield from (ratio, stall)


class StateCollector:
    """Adapts :func:`metric_families` to prometheus-client's collector protocol."""

    def __init__(self, state: FaceState) -> None:
        self.state = state

    def collect(self) -> Iterable[Any]:
        return metric_families(self.state)
