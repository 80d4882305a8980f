"""The one number grammar (agentscope_systemd._numbers) and every path that uses it (#31 item 1).

A table of bad numbers over the CLI (exit 2, the fleet never opened), the
Python API (InvalidConfig before anything exists) and the property and
environment parsers; property tests of the grammar itself.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentscope_systemd import AsyncFleet, InvalidConfig, Monitor, _numbers
from agentscope_systemd._cli._errors import EXIT_EXEC_FAILED
from agentscope_systemd._cli._notify import _watchdog_seconds
from agentscope_systemd._cli._parse import parse_signal, parse_size
from agentscope_systemd._managers import _scopeprops
from agentscope_systemd._registry._registry_file import DEFAULT_RETENTION, _retention_from_env
from tests.test_cli import FakeFleet, fleet, run  # noqa: F401 - the fixture

# Digits that str.isdigit() (and int(), float()) take but no field means.
NOT_ASCII = ["\u00b2", "\u0663", "\u0661\u0660", "\uff13", "1\u00b2", "\u0969"]


# -- the grammar -------------------------------------------------------------------


@pytest.mark.parametrize("text", [*NOT_ASCII, "1_000", "1e3", "2.0", "0x10", "", " ", "--1"])
def test_whole_takes_ascii_digits_only(text: str) -> None:
    with pytest.raises(InvalidConfig, match="not a number"):
        _numbers.whole("n", text, low=0, high=10**9)


@pytest.mark.parametrize("text", [*NOT_ASCII, "nan", "inf", "-inf", "infinity", "1e309", "1e", "."])
def test_real_is_finite_and_ascii(text: str) -> None:
    with pytest.raises(InvalidConfig):
        _numbers.real("x", text, low=-1e300, high=1e300)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400, True, None, "1" * 100])
def test_real_refuses_non_finite_and_foreign_values(value: object) -> None:
    with pytest.raises(InvalidConfig):
        _numbers.real("x", value, low=-1e300, high=1e300)


def test_bounds_are_inclusive_and_a_value_outside_them_is_out_of_range() -> None:
    assert _numbers.whole("n", " 7 ", low=7, high=7) == 7
    with pytest.raises(InvalidConfig, match="out of range"):
        _numbers.whole("n", 8, low=0, high=7)
    with pytest.raises(InvalidConfig, match="above 0"):
        _numbers.real("x", 0, low=0, high=1, above_low=True)


@pytest.mark.parametrize("text", [*NOT_ASCII, "\u00b2G", "\u0663%", "18446744073709551615", "9E"])
def test_sizes_refuse_foreign_digits_and_more_than_8_eib(text: str) -> None:
    with pytest.raises(InvalidConfig):
        _numbers.size("MemoryMax", text)


@pytest.mark.parametrize("text", ["\u0663s", "1e3s", "nan", "inf", "1" * 41 + "s"])
def test_durations_refuse_foreign_digits_and_non_finite_values(text: str) -> None:
    with pytest.raises(InvalidConfig):
        _numbers.duration("d", text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20) | st.text(alphabet="0123456789+-. \u00b2\u0663eE_", max_size=20))
def test_whole_is_an_ascii_number_in_range_or_invalid_config(text: str) -> None:
    try:
        value = _numbers.whole("n", text, low=-(10**6), high=10**6)
    except InvalidConfig:
        return
    assert -(10**6) <= value <= 10**6
    assert text.strip(" \t\n").lstrip("+-").isascii()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20) | st.text(alphabet="0123456789+-. \u00b2\u0663eEnaif", max_size=20))
def test_real_is_finite_in_range_or_invalid_config(text: str) -> None:
    try:
        value = _numbers.real("x", text, low=-5.0, high=5.0)
    except InvalidConfig:
        return
    assert math.isfinite(value)
    assert -5.0 <= value <= 5.0
    assert text.isascii()


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789.kKmMgGtTpPeEiIbB %\u00b2\u0663", max_size=24))
def test_size_is_in_range_or_invalid_config(text: str) -> None:
    try:
        value = _numbers.size("s", text, low=0, physical=2**34)
    except InvalidConfig:
        return
    assert value is None or 0 <= value <= _numbers.MAX_SIZE
    assert text.isascii()


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789. smhdwMyusec\u00b5\u00b2\u0663", max_size=24))
def test_duration_is_finite_in_range_or_invalid_config(text: str) -> None:
    try:
        value = _numbers.duration("d", text, high=86400)
    except InvalidConfig:
        return
    assert math.isfinite(value)
    assert 0 <= value <= 86400
    assert "\u00b2" not in text
    assert "\u0663" not in text


# -- resource properties -----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TasksMax", "\u00b2"),
        ("TasksMax", "\u0663"),
        ("CPUWeight", "\u00b2"),
        ("IOWeight", "\u0661\u0660"),
        ("MemoryMax", "\u00b2"),
        ("MemoryMax", "\u0663G"),
        ("MemoryMax", "18446744073709551615"),
        ("MemorySwapMax", "\u00b2"),
        ("AllowedCPUs", "\u00b2"),
        ("AllowedCPUs", "0-\u0663"),
        ("CPUQuota", "\u00b2%"),
        ("CPUQuota", "\u0663%"),
        ("CPUQuota", "nan%"),
        ("CPUQuota", "1e3%"),
        ("TasksMax", "9" * 5000),
    ],
)
def test_properties_refuse_foreign_digits_cleanly(name: str, value: str) -> None:
    with pytest.raises(InvalidConfig, match=name):
        _scopeprops.parse_property(name, value)


@pytest.mark.parametrize("value", ["nan", "inf", "\u0663", math.nan, math.inf, "1e309", True])
def test_reap_after_is_finite(value: object) -> None:
    with pytest.raises(InvalidConfig, match="reap_after"):
        _scopeprops.parse_reap_after(value)


def test_memory_max_takes_the_size_grammar_of_the_cli() -> None:
    assert _scopeprops.parse_property("MemoryMax", "1.5G")[2] == 3 * 2**29
    assert _scopeprops.parse_property("MemoryMax", "infinity")[2] == 2**64 - 1


# -- the command line: exit 2 and the fleet never opened ----------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("run", "a", "--tasks-max", "\u00b2", "--", "true"),
        ("run", "a", "--tasks-max", "\u0663", "--", "true"),
        ("run", "a", "--cpu-weight", "\u00b2", "--", "true"),
        ("run", "a", "-p", "TasksMax=\u00b2", "--", "true"),
        ("run", "a", "-p", "MemoryMax=\u00b2", "--", "true"),
        ("run", "a", "-p", "AllowedCPUs=\u00b2", "--", "true"),
        ("run", "a", "-p", "CPUQuota=\u00b2%", "--", "true"),
        ("run", "a", "--memory-max", "18446744073709551615", "--", "true"),
        ("run", "a", "--memory-max", "\u0663G", "--", "true"),
        ("run", "a", "--reap-after", "nan", "--", "true"),
        ("run", "a", "--", ""),
        ("run", "a", "--", "/nonexistent/agentscope-test"),
        ("run", "a", "--cwd", "/nonexistent/agentscope-test", "--", "true"),
        ("events", "--limit", "10000000000000000000000000"),
        ("events", "--limit", "\u0663"),
        ("events", "--limit", "-1"),
        ("demo", "--agents", "10000000000000000000000000"),
        ("demo", "--agents", "\u0663"),
        ("demo", "--timeout", "inf"),
        ("top", "--interval", "1e308"),
        ("top", "--interval", "nan"),
        ("monitor", "--interval", "1e309"),
        ("monitor", "--interval", "inf"),
        ("monitor", "--top", "\u00b2"),
        ("monitor", "--listen", "127.0.0.1:\u00b2"),
        ("monitor", "--listen", "127.0.0.1:\u0663"),
        ("monitor", "--listen", "127.0.0.1:" + "9" * 5000),
        ("monitor", "--guard", "--guard-psi-full", "\u0663"),
        ("monitor", "--guard", "--guard-mem-available", "nan"),
        ("stop", "a", "--timeout", "inf"),
        ("stop", "a", "--timeout", "nan"),
        ("stop", "a", "--timeout", "\u0663"),
        ("logs", "a", "-n", "\u0663"),
        ("kill", "a", "--signal", "\u0669"),
        ("report", "--top", "10000000000000000000000000"),
    ],
    ids=repr,
)
def test_bad_numbers_exit_2_before_the_fleet_opens(fleet: FakeFleet, args: tuple[str, ...]) -> None:  # noqa: F811
    result = run(*args)
    assert result.code == 2, (result.stdout, result.stderr)
    assert "a bug in agentscope" not in result.stderr
    assert "Traceback" not in result.stderr
    assert fleet.opened == []  # type: ignore[attr-defined]
    assert fleet.calls == []


@pytest.mark.parametrize("value", ["\u00b2", "\u0663"], ids=repr)
def test_exec_s_bad_numbers_are_its_own_125_before_the_fleet_opens(
    fleet: FakeFleet,  # noqa: F811
    value: str,
) -> None:
    # exec's own input errors are 125, apart from the command's codes (docs/json.md).
    result = run("exec", "a", "--tasks-max", value, "--", "true")
    assert result.code == EXIT_EXEC_FAILED, (result.stdout, result.stderr)
    assert "--tasks-max" in result.stderr
    assert "a bug in agentscope" not in result.stderr
    assert "Traceback" not in result.stderr
    assert fleet.opened == []  # type: ignore[attr-defined]
    assert fleet.calls == []


# -- the Python API: InvalidConfig before anything exists ---------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"agent_oom_score_adj": 5000}, "agent_oom_score_adj"),
        ({"agent_oom_score_adj": -1001}, "agent_oom_score_adj"),
        ({"agent_oom_score_adj": True}, "agent_oom_score_adj"),
        ({"agent_oom_score_adj": 1.5}, "agent_oom_score_adj"),
        ({"manager_oom_score_adj": 1001}, "manager_oom_score_adj"),
        ({"admission_wait": math.nan}, "admission_wait"),
        ({"admission_wait": math.inf}, "admission_wait"),
    ],
)
def test_fleet_numbers_are_checked_before_anything_is_created(
    tmp_path: Path, kwargs: dict[str, object], field: str
) -> None:
    registry = tmp_path / "r.db"
    with pytest.raises(InvalidConfig, match=field):
        AsyncFleet("t", "user", registry=registry, **kwargs)  # type: ignore[arg-type]
    assert not registry.exists()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"interval": math.nan}, "interval"),
        ({"interval": math.inf}, "interval"),
        ({"interval": 1e308}, "interval"),
        ({"interval": 0}, "interval"),
        ({"top": -1}, "top"),
        ({"top": 10**30}, "top"),
        ({"pressure_some_avg10": math.nan}, "pressure_some_avg10"),
        ({"available_fraction": 2.0}, "available_fraction"),
        ({"pressure_window": math.inf}, "pressure_window"),
    ],
)
def test_monitor_numbers_are_finite_and_bounded(
    tmp_path: Path, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidConfig, match=field):
        Monitor(slice_path=tmp_path, unit_agent=lambda _u: None, **kwargs)  # type: ignore[arg-type]


# -- environment variables ----------------------------------------------------------


@pytest.mark.parametrize("raw", ["\u0663", "nan", "inf", "1e309", "1_0", "-1"])
def test_retention_days_takes_the_grammar_or_the_default(raw: str) -> None:
    assert _retention_from_env({"AGENTSCOPE_RETENTION_DAYS": raw}) == DEFAULT_RETENTION


def test_retention_days_in_ascii_is_taken() -> None:
    assert _retention_from_env({"AGENTSCOPE_RETENTION_DAYS": "2"}) == 2 * 86400


@pytest.mark.parametrize("raw", ["\u0663000000", "1_000_000", "9" * 5000, "-5", "nan"])
def test_watchdog_usec_takes_ascii_digits_only(raw: str) -> None:
    assert _watchdog_seconds({"WATCHDOG_USEC": raw}) is None


def test_a_signal_number_is_ascii() -> None:
    assert parse_signal("9").name == "SIGKILL"
    with pytest.raises(ValueError, match="no signal"):
        parse_signal("\u0669")


def test_cli_sizes_use_the_same_grammar() -> None:
    with pytest.raises(ValueError, match="8 EiB"):
        parse_size("18446744073709551615")


def test_registry_gc_and_events_take_the_grammar(tmp_path: Path) -> None:
    from agentscope_systemd.lowlevel import Registry

    with Registry(tmp_path / "r.db") as reg:
        for kwargs in ({"retention_seconds": math.nan}, {"retention_seconds": -1}):
            with pytest.raises(InvalidConfig, match="retention_seconds"):
                reg.gc(**kwargs)  # type: ignore[arg-type]
        with pytest.raises(InvalidConfig, match="limit"):
            reg.events(limit=10**25)
        with pytest.raises(InvalidConfig, match="since"):
            reg.events(since=math.inf)
