"""Names: what is accepted, what is refused and why, and the unit naming scheme."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentscope_systemd import InvalidName
from agentscope_systemd._names import (
    describe,
    is_unit_name,
    parse_description,
    scope_pattern,
    scope_unit_name,
    validate_name,
    validate_slice,
)

_VALID = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}", fullmatch=True)


@pytest.mark.parametrize("name", ["a", "builder-1", "x.y_z", "A" * 64, "0"])
def test_valid_names(name: str) -> None:
    assert validate_name("agent", name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "must not be empty"),
        ("A" * 65, "65 characters"),
        (".hidden", "starts with '.'"),
        ("-x", "starts with '-'"),
        ("a b", "contains ' '"),
        ("a/b", "contains '/'"),
        ("ünï", "contains"),
        (5, "must be a string"),
    ],
)
def test_refused_names_say_why(name: object, reason: str) -> None:
    with pytest.raises(InvalidName, match=reason) as info:
        validate_name("agent", name)
    assert "[A-Za-z0-9._-]" in str(info.value)
    assert isinstance(info.value, ValueError)


@given(_VALID, _VALID)
def test_unit_names_are_unique_valid_and_short(fleet: str, agent: str) -> None:
    a, b = scope_unit_name(fleet, agent), scope_unit_name(fleet, agent)
    assert a != b
    assert len(a) <= 255
    assert a.startswith(f"agentscope-{fleet}-{agent}-")
    assert a.endswith(".scope")


@given(_VALID, _VALID)
def test_description_round_trips(fleet: str, agent: str) -> None:
    assert parse_description(describe(fleet, agent)) == (fleet, agent)


def test_description_of_foreign_units_is_none() -> None:
    assert parse_description("User Manager for UID 1000") is None


def test_scope_pattern_matches_one_agent_only() -> None:
    import fnmatch

    pat = scope_pattern("f", "a")
    assert fnmatch.fnmatchcase(scope_unit_name("f", "a"), pat)
    assert not fnmatch.fnmatchcase(scope_unit_name("f", "a-b"), pat)
    assert fnmatch.fnmatchcase(scope_unit_name("f", "a-b"), scope_pattern("f"))


@pytest.mark.parametrize("bad", ["x", "a b.slice", "-.slice.x", "a--b.slice", 3])
def test_bad_slice_names(bad: object) -> None:
    with pytest.raises(InvalidName, match="slice"):
        validate_slice(bad)


def test_default_slice_is_valid() -> None:
    assert validate_slice("app-agentscope-agents.slice") == "app-agentscope-agents.slice"


@pytest.mark.parametrize(
    ("unit", "valid"),
    [
        ("agentscope-f-a-0a1b2c.scope", True),
        ("user@1000.service", True),  # a template's instance
        ("a b.scope", False),  # a path a process chose, not a unit
        ("x" * 250 + ".scope", False),  # over 255 characters
        ("caf\u00e9.scope", False),
    ],
)
def test_every_cgroup_path_reader_takes_a_unit_name_by_one_rule(
    tmp_path: Path, unit: str, valid: bool
) -> None:
    # One rule (_names.is_unit_name) for the escape audit's unit of a cgroup,
    # the OOM kills' unit under the slice, the cgroup manager's unit of a
    # cgroup and the escape reclaim's target: none may take another name.
    from agentscope_systemd._managers._cgroupmode import CgroupManager
    from agentscope_systemd._monitor._escape import unit_of_cgroup, write_procs
    from agentscope_systemd._monitor._recovery import unit_of_memcg

    assert is_unit_name(unit) is valid
    slice_cg = "/base/app-agentscope-agents.slice"
    assert unit_of_cgroup(f"{slice_cg}/{unit}") == (unit if valid else None)
    scope = unit.replace(".service", ".scope")
    assert unit_of_memcg(f"{slice_cg}/{scope}/agent", slice_cg) == (scope if valid else None)
    manager = CgroupManager("system", "f", "app-agentscope-agents.slice", tmp_path)
    assert manager.unit_of_cgroup(f"{slice_cg}/{scope}") == (scope if valid else None)
    if not valid:
        with pytest.raises(ValueError, match="not a scope unit's name"):
            write_procs(tmp_path, scope, 1)
