"""The dashboard's picture (dashboards/shot.py): every panel drawn, every query resolved, real data.

Host only and cheap: the renderer's Grafana side (variables, macros, layout,
units, legends) against dashboards/agentscope.json, and the committed
capture of a VM run against the metrics the dashboard reads. Prometheus
itself runs only in ``make dashboard-shot``; promtool, where installed,
checks that the capture converts into blocks.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dashboards import panels as P
from dashboards import shot
from dashboards.shot import MARK_BEGIN, MARK_END, decode
from tests.test_dashboards import dashboard_exprs, metric_names

ROOT = Path(__file__).resolve().parent.parent
PICTURE = ROOT / "docs" / "img" / "dashboard.png"


def dashboard() -> dict[str, Any]:
    return dict(json.loads(P.DASHBOARD.read_text()))


@pytest.fixture(scope="module")
def capture() -> P.Capture:
    return P.load_capture()


@pytest.fixture(scope="module")
def openmetrics(capture: P.Capture) -> str:
    return P.to_openmetrics(capture)


def test_every_panel_is_one_the_renderer_draws_and_fits_the_grid() -> None:
    dash = dashboard()
    drawn = P.load_panels(dash)
    assert {p.id for p in drawn} == {p["id"] for p in dash["panels"]}
    cells: dict[tuple[int, int], str] = {}
    for panel in drawn:
        assert panel.type in P.DRAWN_TYPES
        assert panel.x + panel.w <= P.GRID_COLUMNS
        assert panel.targets, panel.title
        for cx in range(panel.x, panel.x + panel.w):
            for cy in range(panel.y, panel.y + panel.h):
                # Grafana would push an overlapping panel down; the picture would lie.
                assert (cx, cy) not in cells, (panel.title, cells.get((cx, cy)))
                cells[(cx, cy)] = panel.title


def test_a_panel_type_the_renderer_does_not_draw_fails_the_render() -> None:
    dash = dashboard()
    extra = copy.deepcopy(dash["panels"][0])
    extra.update(id=99, type="piechart", title="New")
    dash["panels"].append(extra)
    with pytest.raises(ValueError, match="piechart"):
        P.load_panels(dash)


def test_every_query_is_resolved_as_grafana_would_send_it() -> None:
    dash = dashboard()
    rng = P.TimeRange(start=1000.0, end=1270.0, step=2.0, scrape_interval=2.0)
    values = P.template_values(dash)
    assert values == {"fleet": ".*"}  # the saved selection: All
    for panel in P.load_panels(dash):
        for target in panel.targets:
            expr = P.interpolate(target.expr, values, rng)
            assert "$" not in expr, (panel.title, expr)
            assert 'fleet=~".*"' in expr
    kills = P.interpolate("increase(x[$__rate_interval])", values, rng)
    assert kills == "increase(x[8s])"  # max(step + scrape, 4 scrapes)
    wide = P.TimeRange(start=0.0, end=3 * 3600.0, step=6.0, scrape_interval=15.0)
    assert P.interpolate("rate(x[$__rate_interval]) $__range ${fleet}", values, wide) == (
        "rate(x[60s]) 10800s .*"
    )
    with pytest.raises(ValueError, match=r"\$instance"):
        P.interpolate('up{instance="$instance"}', values, rng)


def test_the_step_is_grafanas_interval_never_under_the_scrape_interval(
    capture: P.Capture,
) -> None:
    rng = P.time_range(capture)
    assert rng.start == capture.start
    assert rng.end == capture.end
    assert rng.step >= capture.scrape_interval
    assert (rng.end - rng.start) / rng.step <= P.WIDTH_PX


def test_legends_and_units_read_as_in_grafana() -> None:
    metric = {"__name__": "m", "agent": "coder-1", "fleet": "shot"}
    assert P.legend_name("OOM {{agent}}", metric) == "OOM coder-1"
    assert P.legend_name("{{ source }} {{kind}}", {"source": "host", "kind": "some"}) == (
        "host some"
    )
    assert P.legend_name("", metric) == 'm{agent="coder-1", fleet="shot"}'
    assert P.format_value(163 << 20, "bytes") == "163 MiB"
    assert P.format_value(1.5 * 2**30, "bytes") == "1.5 GiB"
    assert P.format_value(0.4567, "percentunit") == "45.7%"
    assert P.format_value(3.0, "short") == "3"
    assert P.format_value(12_300, "short") == "12.3 K"
    assert P.format_value(1.2, "s") == "1.2 s"
    assert P.format_value(0.25, "s") == "250 ms"
    assert P.format_value(None, "bytes") == "-"


def test_the_capture_covers_every_metric_the_dashboard_reads(openmetrics: str) -> None:
    names = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{", openmetrics, re.M))
    for expr in dashboard_exprs():
        assert metric_names(expr) <= names, (expr, metric_names(expr) - names)


def test_the_capture_tells_the_story_the_docs_promise(capture: P.Capture) -> None:
    kinds = {e.get("kind") for e in capture.events}
    assert {"oom_kill", "guard_kill", "throttled"} <= kinds
    assert capture.end - capture.start >= 180
    assert len(capture.scrapes) >= 60
    assert capture.host["manager"] == "system"
    last = capture.scrapes[-1][1]
    assert re.search(r'^agentscope_guard_kills_total\{fleet="shot"\} [1-9]', last, re.M)
    assert re.search(r'^agentscope_agent_oom_kills_total\{agent="tester",.*\} [1-9]', last, re.M)


def test_the_openmetrics_has_timestamps_contiguous_families_and_eof(openmetrics: str) -> None:
    lines = openmetrics.splitlines()
    assert lines[-1] == "# EOF"
    types = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))  # each family once: contiguous
    last: dict[str, float] = {}
    for line in lines:
        if line.startswith("#"):
            continue
        series, value, ts = line.rsplit(" ", 2)
        float(value)
        assert 'job="agentscope"' in series
        assert 'instance="127.0.0.1:9464"' in series
        assert float(ts) > last.get(series, 0.0)  # each series in time order
        last[series] = float(ts)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian: prometheus)")
def test_promtool_makes_blocks_of_the_capture(openmetrics: str, tmp_path: Path) -> None:
    source = tmp_path / "capture.om"
    source.write_text(openmetrics)
    done = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(tmp_path / "d")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "d").glob("*/meta.json"))


@pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="prometheus and promtool (Debian: prometheus)",
)
def test_prometheus_answers_every_panel_and_counts_every_kill(
    capture: P.Capture, tmp_path: Path
) -> None:
    dash = dashboard()
    with shot.prometheus(capture, tmp_path) as url:
        answers = shot.evaluate(url, dash, P.time_range(capture))
    by_title = {p.title: answers[p.id] for p in P.load_panels(dash)}
    # On real data no panel may say "No data": that would be a wrong query.
    assert [title for title, series in by_title.items() if not series] == []
    kinds = [e.get("kind") for e in capture.events]
    (oom,) = by_title["OOM kills (1h)"]
    (guard,) = by_title["Guard kills (1h)"]
    # The first kill of a kind counts too (its series exists at 0 before it).
    assert round(P.reduce(oom.values, "lastNotNull") or 0) == kinds.count("oom_kill")
    assert round(P.reduce(guard.values, "lastNotNull") or 0) == kinds.count("guard_kill")


def test_the_vm_output_decodes_with_the_runners_prefix() -> None:
    blob = base64.b64encode(gzip.compress(b'{"format": "x"}')).decode()
    output = "\n".join(
        ["[trixie] guest: booted", f"[trixie] {MARK_BEGIN}"]
        + [f"[trixie] {blob[i : i + 10]}" for i in range(0, len(blob), 10)]
        + [f"[trixie] {MARK_END}", "[trixie] capture: done"]
    )
    assert gzip.decompress(decode(output)) == b'{"format": "x"}'
    with pytest.raises(SystemExit, match="markers"):
        decode("guest: the capture failed\n")


def test_the_picture_is_committed_and_shown_in_the_docs() -> None:
    head = PICTURE.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, _height = struct.unpack(">II", head[16:24])
    assert width == P.WIDTH_PX
    assert "img/dashboard.png" in (ROOT / "docs" / "dashboards.md").read_text()
