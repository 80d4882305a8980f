"""Draws the dashboard as Grafana lays it out: its grid, panel types, units, legends, dark theme.

Only the drawing; the numbers come from Prometheus (dashboards/shot.py).
Needs matplotlib (``pip install '.[shot]'``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # a file, never a window
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from dashboards import panels as P

if TYPE_CHECKING:
    from dashboards.shot import Series

__all__ = ["draw"]

# Grafana's dark theme.
PAGE = "#111217"
PANEL = "#181b1f"
BORDER = "#2c3235"
TEXT = "#ccccdc"
WEAK = "#8e8e9e"
GRID = "#2a2d33"
#: palette-classic, Grafana's default series colours, in order.
CLASSIC = (
    "#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0",
    "#508642", "#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62", "#584477",
)  # fmt: skip
NAMED = {
    "green": "#73BF69",
    "red": "#F2495C",
    "yellow": "#FADE2A",
    "orange": "#FF9830",
    "blue": "#5794F2",
    "purple": "#B877D9",
    "text": TEXT,
}
HEADER_PX = 56
GAP_PX = 8
DPI = 100
CALC_NAMES = {"lastNotNull": "Last *", "last": "Last", "max": "Max", "min": "Min", "mean": "Mean"}


def _px(fig: Figure, x: float, y: float, w: float, h: float) -> tuple[float, float, float, float]:
    """A rectangle in pixels from the top left, as figure fractions for add_axes."""
    width, height = fig.get_size_inches() * fig.dpi
    return (x / width, 1 - (y + h) / height, w / width, h / height)


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def _with_gaps(series: Series, step: float) -> tuple[list[float], list[float]]:
    """The points, with a NaN where steps are missing: Grafana draws a gap there."""
    times: list[float] = []
    values: list[float] = []
    for t, v in zip(series.times, series.values, strict=True):
        if times and t - times[-1] > 1.5 * step:
            times.append(times[-1] + step)
            values.append(math.nan)
        times.append(t)
        values.append(v)
    return times, values


def _no_data(ax: Axes) -> None:
    ax.text(0.5, 0.45, "No data", color=WEAK, fontsize=15, ha="center", va="center")


def _timeseries(
    fig: Figure, box: Sequence[float], panel: P.Panel, series: Sequence[Series], rng: P.TimeRange
) -> None:
    x, y, w, h = box
    calcs = panel.legend_calcs
    legend_w = min(0.46 * w, 170 + 76 * len(calcs)) if series else 0
    plot = fig.add_axes(_px(fig, x + 52, y + 34, w - legend_w - 66, h - 60))
    plot.set_facecolor(PANEL)
    for side in plot.spines.values():
        side.set_visible(False)
    plot.grid(True, color=GRID, linewidth=0.8)
    plot.tick_params(colors=WEAK, labelsize=9, length=0)
    plot.set_xlim(rng.start, rng.end)
    plot.xaxis.set_major_locator(MaxNLocator(5))
    plot.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _clock(v)))
    plot.yaxis.set_major_locator(MaxNLocator(4))
    plot.yaxis.set_major_formatter(FuncFormatter(lambda v, _: P.format_value(v, panel.unit)))
    if not series:
        plot.set_yticks([])
        plot.set_xticks([])
        _no_data(plot)
        return
    top = max((v for s in series for v in s.values if not math.isnan(v)), default=0.0)
    low = min((v for s in series for v in s.values if not math.isnan(v)), default=0.0)
    plot.set_ylim(min(0.0, low), top * 1.1 if top > 0 else 1.0)
    if panel.unit == "bytes" and top > 0:
        # Ticks at round MiB or GiB, as Grafana puts them, not at round bytes.
        scale = 1024.0 ** math.floor(math.log(top * 1.1, 1024))
        ticks = MaxNLocator(4, steps=[1, 2, 2.5, 5, 10]).tick_values(0, top * 1.1 / scale)
        plot.set_yticks([t * scale for t in ticks if t * scale <= top * 1.1])
    legend = fig.add_axes(_px(fig, x + w - legend_w - 6, y + 34, legend_w, h - 40))
    legend.set_axis_off()
    legend.set_xlim(0, legend_w)
    legend.set_ylim(h - 40, 0)
    row = 19.0
    columns = [legend_w - 76 * (len(calcs) - i) for i in range(len(calcs))]
    for cx, calc in zip(columns, calcs, strict=True):
        legend.text(
            cx + 70,
            6,
            CALC_NAMES.get(calc, calc),
            color="#6e9fff",
            fontsize=9,
            ha="right",
            va="center",
        )
    for i, s in enumerate(series):
        colour = CLASSIC[i % len(CLASSIC)]
        times, values = _with_gaps(s, rng.step)
        plot.plot(times, values, color=colour, linewidth=1.2)
        ly = 6 + row * (i + 1)
        if ly > h - 48:
            legend.text(4, ly, f"+{len(series) - i} more", color=WEAK, fontsize=9, va="center")
            continue
        legend.plot([4, 16], [ly, ly], color=colour, linewidth=3, solid_capstyle="butt")
        name = s.name if len(s.name) <= 28 else s.name[:27] + "…"
        legend.text(22, ly, name, color=TEXT, fontsize=9, va="center")
        for cx, calc in zip(columns, calcs, strict=True):
            value = P.reduce(s.values, calc)
            legend.text(
                cx + 70,
                ly,
                P.format_value(value, panel.unit, panel.decimals),
                color=TEXT,
                fontsize=9,
                ha="right",
                va="center",
            )


def _stat(
    fig: Figure, box: Sequence[float], panel: P.Panel, series: Sequence[Series], rng: P.TimeRange
) -> None:
    x, y, w, h = box
    if not series:
        ax = fig.add_axes(_px(fig, x, y + 28, w, h - 28))
        ax.set_axis_off()
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        _no_data(ax)
        return
    width = (w - 16) / len(series)
    for i, s in enumerate(series):
        value = P.reduce(s.values, "lastNotNull")
        colour = NAMED.get(P.threshold_colour(panel, value or 0.0), TEXT)
        spark = fig.add_axes(_px(fig, x + 8 + i * width, y + h - 44, width - 8, 38))
        spark.set_axis_off()
        spark.set_xlim(rng.start, rng.end)
        times, values = _with_gaps(s, rng.step)
        known = [v for v in values if not math.isnan(v)]
        top, low = max(known, default=1.0), min(known, default=0.0)
        spark.set_ylim(min(0.0, low), top * 1.15 if top > 0 else 1.0)
        spark.fill_between(times, values, color=colour, alpha=0.18, linewidth=0)
        spark.plot(times, values, color=colour, linewidth=1)
        text = fig.add_axes(_px(fig, x + 8 + i * width, y + 26, width - 8, h - 34))
        text.set_axis_off()
        text.set_xlim(0, 1)
        text.set_ylim(0, 1)
        big = 26 if len(series) == 1 else 17
        if len(series) > 1:
            text.text(0.5, 0.83, s.name, color=TEXT, fontsize=9, ha="center", va="center")
        text.text(
            0.5,
            0.52 if len(series) > 1 else 0.58,
            P.format_value(value, panel.unit, panel.decimals),
            color=colour,
            fontsize=big,
            fontweight="bold",
            ha="center",
            va="center",
        )


def draw(
    dashboard: Mapping[str, Any],
    panels: Sequence[P.Panel],
    answers: Mapping[int, Sequence[Series]],
    rng: P.TimeRange,
    capture: P.Capture,
    out: Path,
) -> None:
    """Draw every panel where its gridPos puts it; write a PNG to ``out``."""
    rows = max(p.y + p.h for p in panels)
    width = P.WIDTH_PX
    height = HEADER_PX + rows * P.ROW_PX + GAP_PX
    plt.rcParams["font.family"] = "DejaVu Sans"
    fig = plt.figure(figsize=(width / DPI, height / DPI), dpi=DPI, facecolor=PAGE)
    head = fig.add_axes(_px(fig, 0, 0, width, HEADER_PX))
    head.set_axis_off()
    head.set_xlim(0, width)
    head.set_ylim(HEADER_PX, 0)
    head.text(
        GAP_PX + 4, 20, f"Dashboards / {dashboard['title']}", color=TEXT, fontsize=13, va="center"
    )
    host = capture.host
    head.text(
        GAP_PX + 4,
        42,
        "Fleet: All   ·   datasource: Prometheus   ·   "
        f"{_clock(rng.start)} to {_clock(rng.end)} UTC, "
        f"{time.strftime('%Y-%m-%d', time.gmtime(rng.start))}",
        color=WEAK,
        fontsize=9,
        va="center",
    )
    mem = int(host.get("mem_total") or 0)
    head.text(
        width - GAP_PX - 4,
        20,
        f"real data: a {host.get('distro', '?')} VM "
        f"(systemd {host.get('systemd', '?')}, kernel {host.get('kernel', '?')}, "
        f"{P.format_value(mem, 'bytes')}), {host.get('manager', '?')} manager",
        color=WEAK,
        fontsize=9,
        ha="right",
        va="center",
    )
    head.text(
        width - GAP_PX - 4,
        42,
        "each panel: Prometheus's answer to the panel's own query"
        " (drawn by dashboards/shot.py; Grafana is not packaged in Debian)",
        color=WEAK,
        fontsize=9,
        ha="right",
        va="center",
    )
    col = (width - GAP_PX) / P.GRID_COLUMNS
    for panel in panels:
        x = GAP_PX + panel.x * col
        y = HEADER_PX + panel.y * P.ROW_PX
        w = panel.w * col - GAP_PX
        h = panel.h * P.ROW_PX - GAP_PX
        frame = fig.add_axes(_px(fig, x, y, w, h))
        frame.set_axis_off()
        frame.set_xlim(0, w)
        frame.set_ylim(h, 0)
        frame.add_patch(
            FancyBboxPatch(
                (1, 1),
                w - 2,
                h - 2,
                boxstyle="round,pad=0,rounding_size=3",
                facecolor=PANEL,
                edgecolor=BORDER,
                linewidth=1,
            )
        )
        frame.text(10, 15, panel.title, color=TEXT, fontsize=11, fontweight="bold", va="center")
        series = answers.get(panel.id, [])
        if panel.type == "timeseries":
            _timeseries(fig, (x, y, w, h), panel, series, rng)
        elif panel.type == "stat":
            _stat(fig, (x, y, w, h), panel, series, rng)
        else:  # load_panels refuses these; kept so a new type cannot pass silently
            raise ValueError(f"no drawing for panel type {panel.type!r}")
    fig.savefig(out, dpi=DPI, facecolor=PAGE)
    plt.close(fig)
