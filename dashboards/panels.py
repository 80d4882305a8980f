"""What the dashboard's picture needs, without Prometheus or matplotlib.

The capture (a VM run's scrapes of ``/metrics``, integration/dashboard_capture.py)
turned into the OpenMetrics that ``promtool tsdb create-blocks-from openmetrics``
reads; the panels of dashboards/agentscope.json as Grafana would query and
show them: its template variables and ``$__`` macros substituted, the step it
would choose, units and legends formatted its way.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CAPTURE",
    "DASHBOARD",
    "DRAWN_TYPES",
    "GRID_COLUMNS",
    "ROW_PX",
    "WIDTH_PX",
    "Capture",
    "Panel",
    "Target",
    "TimeRange",
    "format_value",
    "interpolate",
    "legend_name",
    "load_capture",
    "load_panels",
    "reduce",
    "template_values",
    "threshold_colour",
    "time_range",
    "to_openmetrics",
]

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE / "agentscope.json"
CAPTURE = HERE / "sample" / "capture.json.gz"
CAPTURE_FORMAT = "agentscope-dashboard-capture/1"
#: Panel types the renderer draws; a panel of another type fails the render
#: (and tests/test_dashboard_shot.py) instead of going missing from the picture.
DRAWN_TYPES = frozenset({"timeseries", "stat"})
#: Grafana's grid: 24 columns; a row is 30 px high, with 8 px between panels.
GRID_COLUMNS = 24
ROW_PX = 30
#: The picture's width in pixels, which is what Grafana's step depends on.
WIDTH_PX = 1800


@dataclass(frozen=True)
class Capture:
    """A VM run's scrapes of the monitor's /metrics, with what happened when."""

    scrape_interval: float
    job: str
    instance: str
    host: Mapping[str, Any]
    timeline: tuple[tuple[float, str], ...]
    events: tuple[Mapping[str, Any], ...]
    scrapes: tuple[tuple[float, str], ...]

    @property
    def start(self) -> float:
        return self.scrapes[0][0]

    @property
    def end(self) -> float:
        return self.scrapes[-1][0]


def load_capture(path: Path = CAPTURE) -> Capture:
    """Read a capture file (gzip'd JSON).

    Raises:
        ValueError: not a capture of this format, or without scrapes.
    """
    data = json.loads(gzip.decompress(path.read_bytes()))
    if data.get("format") != CAPTURE_FORMAT:
        raise ValueError(f"{path}: not a dashboard capture ({data.get('format')!r})")
    scrapes = tuple((float(ts), str(text)) for ts, text in data["scrapes"])
    if not scrapes:
        raise ValueError(f"{path}: the capture has no scrapes")
    return Capture(
        scrape_interval=float(data["scrape_interval_seconds"]),
        job=str(data["job"]),
        instance=str(data["instance"]),
        host=data.get("host") or {},
        timeline=tuple((float(t), str(what)) for t, what in data.get("timeline") or ()),
        events=tuple(data.get("events") or ()),
        scrapes=tuple(sorted(scrapes)),
    )


def _om_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _om_number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def to_openmetrics(capture: Capture) -> str:
    """Every scrape as one OpenMetrics text, each sample at its scrape's time.

    As Prometheus stores a scrape: ``job`` and ``instance`` labels added to
    every series, the timestamp the scrape started. Each metric family is
    contiguous and each series in time order, as promtool wants; ``# EOF``
    ends it.
    """
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    # family -> (type, help, {(sample name, labels): [(ts, value)]}), in first-seen order.
    families: dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], Any]]] = {}
    extra = {"job": capture.job, "instance": capture.instance}
    for ts, text in capture.scrapes:
        for family in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
            _, _, series = families.setdefault(family.name, (family.type, family.documentation, {}))
            for sample in family.samples:
                labels = tuple(sorted({**sample.labels, **extra}.items()))
                series.setdefault((sample.name, labels), []).append((ts, sample.value))
    lines = []
    for name, (kind, doc, series) in families.items():
        lines.append(f"# TYPE {name} {kind}")
        if doc:
            lines.append(f"# HELP {name} {_om_label_value(doc)}")
        for (sample_name, labels), points in series.items():
            text = ",".join(f'{k}="{_om_label_value(v)}"' for k, v in labels)
            for ts, value in sorted(points):
                lines.append(f"{sample_name}{{{text}}} {_om_number(value)} {ts:.3f}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Target:
    """One query of a panel."""

    ref: str
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A panel of the dashboard, as far as the picture draws it."""

    id: int
    type: str
    title: str
    unit: str
    x: int
    y: int
    w: int
    h: int
    targets: tuple[Target, ...]
    #: The legend table's columns (timeseries), e.g. ("lastNotNull", "max").
    legend_calcs: tuple[str, ...]
    #: Absolute thresholds, (value, colour) from the lowest: a stat's colour.
    thresholds: tuple[tuple[float, str], ...]
    #: Decimals shown (fieldConfig ``decimals``); None: Grafana's automatic ones.
    decimals: int | None = None


#: Grafana's default thresholds of a new panel: green, red from 80.
_DEFAULT_THRESHOLDS = ((-math.inf, "green"), (80.0, "red"))


def load_panels(dashboard: Mapping[str, Any]) -> list[Panel]:
    """The dashboard's panels in reading order (top to bottom, left to right).

    Raises:
        ValueError: a panel of a type the renderer does not draw, or outside the grid.
    """
    panels = []
    for raw in dashboard["panels"]:
        if raw["type"] not in DRAWN_TYPES:
            raise ValueError(
                f"panel {raw.get('title')!r} is a {raw['type']!r}: the renderer draws "
                f"{', '.join(sorted(DRAWN_TYPES))} (dashboards/draw.py)"
            )
        grid = raw["gridPos"]
        if grid["x"] < 0 or grid["w"] < 1 or grid["x"] + grid["w"] > GRID_COLUMNS:
            raise ValueError(f"panel {raw['title']!r} is outside Grafana's 24 columns")
        defaults = raw.get("fieldConfig", {}).get("defaults", {})
        steps = (defaults.get("thresholds") or {}).get("steps")
        thresholds = (
            tuple(
                (-math.inf if s.get("value") is None else float(s["value"]), str(s["color"]))
                for s in steps
            )
            if steps
            else _DEFAULT_THRESHOLDS
        )
        legend = (raw.get("options") or {}).get("legend") or {}
        panels.append(
            Panel(
                id=int(raw["id"]),
                type=str(raw["type"]),
                title=str(raw["title"]),
                unit=str(defaults.get("unit") or "short"),
                x=int(grid["x"]),
                y=int(grid["y"]),
                w=int(grid["w"]),
                h=int(grid["h"]),
                targets=tuple(
                    Target(str(t["refId"]), str(t["expr"]), str(t.get("legendFormat") or ""))
                    for t in raw.get("targets", [])
                    if not t.get("hide")
                ),
                legend_calcs=tuple(legend.get("calcs") or ()),
                thresholds=thresholds,
                decimals=None if defaults.get("decimals") is None else int(defaults["decimals"]),
            )
        )
    return sorted(panels, key=lambda p: (p.y, p.x))


def template_values(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """Each template variable's value as Grafana puts it into a query.

    The dashboard's saved selection: "All" becomes the variable's
    ``allValue`` (a regex matching every value, ``.*``); the datasource
    variable is not part of any expression.
    """
    values: dict[str, str] = {}
    for var in dashboard["templating"]["list"]:
        if var["type"] == "datasource":
            continue
        current = (var.get("current") or {}).get("value")
        if current in ("$__all", ["$__all"]) or current is None:
            if not var.get("includeAll"):
                raise ValueError(f"variable {var['name']!r} has no value and no All")
            values[var["name"]] = str(var.get("allValue") or ".*")
        elif isinstance(current, list):
            values[var["name"]] = "(" + "|".join(re.escape(str(v)) for v in current) + ")"
        else:
            values[var["name"]] = str(current)
    return values


@dataclass(frozen=True)
class TimeRange:
    """The range the picture shows, and the step and intervals Grafana would use."""

    start: float
    end: float
    step: float
    #: The data source's scrape interval (Grafana's setting; the capture's).
    scrape_interval: float

    @property
    def rate_interval(self) -> float:
        """Grafana's ``$__rate_interval``: max($__interval + scrape interval, 4 scrapes)."""
        return max(self.step + self.scrape_interval, 4 * self.scrape_interval)


def time_range(capture: Capture, width_px: int = WIDTH_PX) -> TimeRange:
    """The capture's span, at the step Grafana picks for a panel ``width_px`` wide.

    Grafana's ``$__interval``: the span over the panel's data points (one
    per pixel), never under the data source's scrape interval, rounded to
    whole seconds here (Grafana rounds to "nice" durations too).
    """
    span = capture.end - capture.start
    step = max(capture.scrape_interval, math.ceil(span / width_px))
    return TimeRange(capture.start, capture.end, float(step), capture.scrape_interval)


def _seconds(value: float) -> str:
    return f"{round(value * 1000)}ms" if value < 1 else f"{round(value)}s"


_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


def interpolate(expr: str, values: Mapping[str, str], rng: TimeRange) -> str:
    """``expr`` with the dashboard's variables and Grafana's ``$__`` macros substituted.

    Raises:
        ValueError: a ``$name`` that is neither a dashboard variable nor a
            macro the renderer knows (a new one must be taught, not skipped).
    """
    span = rng.end - rng.start
    macros = {
        "__interval": _seconds(rng.step),
        "__interval_ms": str(round(rng.step * 1000)),
        "__rate_interval": _seconds(rng.rate_interval),
        "__range": _seconds(span),
        "__range_s": str(round(span)),
        "__range_ms": str(round(span * 1000)),
    }

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name in macros:
            return macros[name]
        if name in values:
            return values[name]
        raise ValueError(f"{expr!r}: unknown variable ${name}")

    return _VARIABLE.sub(one, expr)


_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend_name(fmt: str, metric: Mapping[str, str]) -> str:
    """A series' name in the legend: ``legendFormat`` with ``{{label}}`` filled in.

    Without a format, Grafana shows the series as Prometheus writes it:
    ``name{label="value", ...}``.
    """
    if fmt and fmt != "__auto":
        return _LEGEND_LABEL.sub(lambda m: metric.get(m.group(1), ""), fmt)
    name = metric.get("__name__", "")
    labels = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{name}{{{labels}}}" if labels else name or "{}"


_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI = ("", " K", " Mil", " Bil", " Tri")


def _decimals(value: float, decimals: int | None = None) -> str:
    """At most three significant digits, without trailing zeros (Grafana's auto decimals)."""
    if decimals is not None:
        return f"{value:.{decimals}f}"
    size = abs(value)
    text = f"{value:.0f}" if size >= 100 else f"{value:.1f}" if size >= 10 else f"{value:.2f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_value(value: float | None, unit: str, decimals: int | None = None) -> str:
    """A value as Grafana shows it in that unit (``bytes``, ``percentunit``, ``s``, ``short``).

    ``decimals`` fixes the digits after the point, as the panel's ``decimals`` does.
    """
    if value is None or math.isnan(value):
        return "-"
    if decimals is not None and unit in ("short", "none"):
        return _decimals(value, decimals)
    if unit == "bytes":
        size, index = abs(value), 0
        while size >= 1024 and index < len(_IEC) - 1:
            size, index = size / 1024, index + 1
        return f"{_decimals(math.copysign(size, value))} {_IEC[index]}"
    if unit == "percentunit":
        return f"{_decimals(value * 100)}%"
    if unit == "percent":
        return f"{_decimals(value)}%"
    if unit == "s":
        size = abs(value)
        if size and size < 1:
            return f"{_decimals(value * 1000)} ms"
        if size < 60:
            return f"{_decimals(value)} s"
        if size < 3600:
            return f"{_decimals(value / 60)} min"
        return f"{_decimals(value / 3600)} hour"
    size, index = abs(value), 0
    while size >= 1000 and index < len(_SI) - 1:
        size, index = size / 1000, index + 1
    return f"{_decimals(math.copysign(size, value))}{_SI[index]}"


def threshold_colour(panel: Panel, value: float) -> str:
    """The colour name of the highest threshold ``value`` reaches."""
    colour = panel.thresholds[0][1]
    for at, name in panel.thresholds:
        if value >= at:
            colour = name
    return colour


def reduce(values: Sequence[float], calc: str) -> float | None:
    """A legend or stat reduction (Grafana's ``lastNotNull``, ``max``, ``min``, ``mean``...)."""
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return None
    if calc in ("lastNotNull", "last"):
        return known[-1]
    if calc == "max":
        return max(known)
    if calc == "min":
        return min(known)
    if calc == "mean":
        return sum(known) / len(known)
    if calc == "sum":
        return sum(known)
    raise ValueError(f"unknown reduction {calc!r}")
