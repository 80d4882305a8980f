"""dashboards/: every metric the Grafana dashboard and the alert rules use is one the face exports.

The exported names come from a real scrape: the monitor's HTTP face serving
a sample the library took (``Fleet.agents()`` and ``Fleet.report()`` over the
fake systemd manager and cgroup tree), with a guard and every event kind
counted, so each family the face can emit is there.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import agentscope_systemd
from agentscope_systemd._cli._http import FaceState, start_face
from tests import fakefs
from tests.fakesystemd import FakeSystemd

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "dashboards" / "agentscope.json"
ALERTS = ROOT / "dashboards" / "alerts.yml"

#: Kept out of the expressions before names are read: strings, label
#: matchers, range and subquery brackets.
_NOT_NAMES = re.compile(r'"(?:[^"\\]|\\.)*"|\{[^}]*\}|\[[^\]]*\]')
_NAME = re.compile(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")
_PROMQL_WORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"and", "or", "unless", "inf", "nan"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not its functions, labels or keywords)."""
    text = _NOT_NAMES.sub(" ", expr)
    # The label lists of by (...), on (...), group_left (...) are not metrics.
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    return {m for m in _NAME.findall(text) if m.lower() not in _PROMQL_WORDS}


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        query = var.get("query")
        if var["type"] == "query":
            text = query["query"] if isinstance(query, dict) else query
            # label_values(METRIC, label): the metric is what Grafana queries.
            exprs.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", text))
    return exprs


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every sample name one scrape of the face shows, over the library's real data."""
    tmp = tmp_path_factory.mktemp("face")
    bus = FakeSystemd(tmp / "cgroup")
    # The slice's own memory files, as the kernel has them.
    fakefs.make_cgroup(bus.slice_dir.parent, bus.slice_dir.name, current=64 << 20)
    fleet = agentscope_systemd.Fleet(
        "default",
        registry=tmp / "registry.db",
        manager_oom_score_adj=None,
        tmux_dir=tmp / "tmux",
        _bus=bus,
    )
    agent = fleet.launch("builder", ["sleep", "30"])
    fakefs.write(bus.slice_dir / agent.unit / "memory.peak", "8192\n")  # kernel 5.19+
    try:
        state = FaceState(fleet.name, fleet.manager, 1.0, "0")
        state.guard = lambda: True
        state.sampled([a.to_dict() for a in fleet.agents()], fleet.report(top=0).to_dict(), "ok")
        for kind in ("oom_kill", "throttled", "pressure", "guard_kill", "limit_found"):
            state.event({"kind": kind, "ts": 1.0, "agent": "builder"})
        face = start_face(("127.0.0.1", 0), state)
        try:
            with urllib.request.urlopen(face.url + "/metrics", timeout=10) as r:
                text = r.read().decode()
        finally:
            face.close()
    finally:
        fleet.stop(agent.name, timeout=1)
        fleet.close()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    return names


def test_the_scrape_has_every_family_of_the_face(exported: set[str]) -> None:
    # So that the checks below cannot pass on a scrape that lacks a family.
    for name in (
        "agentscope_agent_memory_current_bytes",
        "agentscope_agent_oom_kills_total",
        "agentscope_slice_memory_current_bytes",
        "agentscope_host_mem_available_bytes",
        "agentscope_memory_pressure_ratio",
        "agentscope_guard_running",
        "agentscope_monitor_last_sample_timestamp_seconds",
    ):
        assert name in exported


def test_docs_install_md_names_every_metric_of_the_face(exported: set[str]) -> None:
    """docs/install.md's list of /metrics is the face's: nothing missing, nothing extra
    (``agentscope_host_mem_*_bytes`` stands for a family of names)."""
    text = (ROOT / "docs" / "install.md").read_text()
    section = text.partition("## The monitor's HTTP face")[2].partition("\n## ")[0]
    documented = set(re.findall(r"`(agentscope_[a-z_*]+)`", section))
    ours = {name for name in exported if name.startswith("agentscope_")}

    def named(metric: str) -> bool:
        return any(re.fullmatch(d.replace("*", "[a-z_]+"), metric) for d in documented)

    assert {m for m in ours if not named(m)} == set()
    assert {
        d for d in documented if not any(re.fullmatch(d.replace("*", "[a-z_]+"), m) for m in ours)
    } == set()


def test_the_metric_name_reader_sees_metrics_only() -> None:
    expr = (
        'sum by (agent) (increase(agentscope_agent_oom_kills_total{fleet=~"$fleet",'
        'kind="x"}[5m])) / on (instance) group_left (fleet) agentscope_monitor_info > 0.2'
        " or time() - agentscope_monitor_last_sample_timestamp_seconds > 120"
    )
    assert metric_names(expr) == {
        "agentscope_agent_oom_kills_total",
        "agentscope_monitor_info",
        "agentscope_monitor_last_sample_timestamp_seconds",
    }
    assert metric_names("agentscope_agents_typo > 0") == {"agentscope_agents_typo"}


def test_every_dashboard_metric_is_exported(exported: set[str]) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        assert names <= exported, (expr, names - exported)


def test_every_alert_metric_is_exported_and_the_rules_are_well_formed(
    exported: set[str],
) -> None:
    rules = alert_rules()
    alerts = {rule["alert"] for rule in rules}
    for wanted in (
        "AgentscopeOomKill",
        "AgentscopeGuardKill",
        "AgentscopeMemoryPressureSome",
        "AgentscopeMemoryPressureFull",
        "AgentscopeMonitorStale",
        "AgentscopeMonitorUnhealthy",
    ):
        assert wanted in alerts
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= exported, (rule["alert"], names - exported)


def _datasources(node: object) -> list[dict[str, Any]]:
    """Every ``datasource`` object anywhere in a dashboard model."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource" and isinstance(value, dict):
                found.append(value)
            found += _datasources(value)
    elif isinstance(node, list):
        for item in node:
            found += _datasources(item)
    return found


def test_the_dashboard_imports_into_grafana_as_it_is() -> None:
    """Grafana's import (Dashboards, New, Import) asks for each of ``__inputs`` and puts
    the chosen data source's uid for ``${DS_PROMETHEUS}``: no uid of ours is in it.
    Provisioned from a file, nothing is substituted: ``${DS_PROMETHEUS}`` is then the
    data source variable of that name (the default Prometheus), the workaround of
    grafana/grafana#10786 ("Datasource ${DS_PROMETHEUS} was not found")."""
    text = DASHBOARD.read_text()
    dash = json.loads(text)
    assert dash["__inputs"] == [
        {
            "name": "DS_PROMETHEUS",
            "label": "Prometheus",
            "description": dash["__inputs"][0]["description"],
            "type": "datasource",
            "pluginId": "prometheus",
            "pluginName": "Prometheus",
        }
    ]
    assert dash["id"] is None  # a fresh dashboard in the Grafana it goes to
    required = {(r["type"], r["id"]) for r in dash["__requires"]}
    assert {("grafana", "grafana"), ("datasource", "prometheus")} <= required
    assert {("panel", p["type"]) for p in dash["panels"]} <= required
    sources = _datasources(dash)
    assert len(sources) > len(dash["panels"])  # the panels', their targets', the variables'
    for source in sources:
        assert source == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    # The import: the one substitution Grafana makes leaves no input unfilled.
    imported = json.loads(text.replace("${DS_PROMETHEUS}", "P1809F7CD0C75ACF3"))
    assert "DS_" not in json.dumps(imported["panels"] + imported["templating"]["list"][1:])
    assert {s["uid"] for s in _datasources(imported)} == {"P1809F7CD0C75ACF3"}
    # Provisioned: the variable of the same name stands for it.
    variable = dash["templating"]["list"][0]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "DS_PROMETHEUS",
        "datasource",
        "prometheus",
    )


def test_every_variable_a_query_uses_is_defined() -> None:
    dash = json.loads(DASHBOARD.read_text())
    defined = {v["name"] for v in dash["templating"]["list"]}
    for panel in dash["panels"]:
        for target in panel["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
            builtins = {u for u in used if u.startswith("__")}  # $__rate_interval, ...
            assert used - builtins <= defined, (panel["title"], used - builtins - defined)


def test_the_dashboard_is_a_grafana_model_with_a_datasource_and_a_fleet_variable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert "fleet" in variables
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        for target in panel["targets"]:
            assert 'fleet=~"$fleet"' in target["expr"], panel["title"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian: prometheus)")
@pytest.mark.parametrize(
    "command",
    [
        ["check", "rules", "alerts.yml"],
        # dashboards/alerts_test.yml: each alert fires on series as the face
        # exports them (and the quiet ones stay quiet).
        ["test", "rules", "alerts_test.yml"],
    ],
)
def test_promtool_accepts_the_rules_and_they_fire(command: list[str]) -> None:
    done = subprocess.run(
        ["promtool", *command],
        capture_output=True,
        text=True,
        check=False,
        cwd=ALERTS.parent,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
