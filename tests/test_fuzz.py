"""Property tests of the parsers of kernel files others control (#16).

A cgroup or /proc file of another user's process, a kmsg line, an event row
of the registry: each parser gives a value or its documented clean error
(ValueError), never another exception. max_examples stays modest so
``make unit`` stays fast.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentscope_systemd._kernel import _cgroup, _journal, _proc
from agentscope_systemd._monitor import _attribution, _sampling
from agentscope_systemd._registry import _records

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text shaped like the kernel's key/value files, plus arbitrary bytes.
_WORDS = st.sampled_from(
    [b"low", b"high", b"max", b"oom", b"oom_kill", b"oom_group_kill", b"anon", b"file",
     b"some", b"full", b"avg10=", b"avg60=", b"avg300=", b"total=", b"MemTotal:",
     b"MemAvailable:", b"kB", b"-1", b"0", b"18446744073709551615", b"99999999999999999999999",
     b"1.5", b"nan", b"\xff", b"(", b")", b" ", b"\n", b"\t", b"="]
)  # fmt: skip
KERNEL_BYTES = st.lists(_WORDS, max_size=40).map(b"".join) | st.binary(max_size=200)

PARSERS = [
    _cgroup.parse_memory_events,
    _cgroup.parse_memory_stat,
    _cgroup.parse_pressure,
    _cgroup.parse_procs,
    _cgroup.parse_limit,
    _proc.parse_stat,
    _proc.parse_meminfo,
]


@pytest.mark.parametrize("parse", PARSERS, ids=lambda p: p.__name__)
@FAST
@given(data=KERNEL_BYTES)
def test_kernel_file_parsers_give_a_value_or_value_error(parse: object, data: bytes) -> None:
    with contextlib.suppress(ValueError):
        parse(data)  # type: ignore[operator]


_KMSG = st.sampled_from(
    ["Memory cgroup out of memory: Killed process ", "Out of memory: Killed process ",
     "oom-kill:constraint=CONSTRAINT_MEMCG,", "task_memcg=/", "task=", "pid=", "uid=",
     "total-vm:", "anon-rss:", "kB", ",", " ", "(", ")", "1234", "-1", "99999999999999999999",
     "\u00e9", "\x00"]
)  # fmt: skip
KMSG_LINES = st.lists(_KMSG, max_size=25).map("".join) | st.text(max_size=120)


@FAST
@given(line=KMSG_LINES)
def test_kmsg_lines_give_a_kill_or_none(line: str) -> None:
    kill = _attribution.parse_oom_kill_line(line)
    assert kill is None or isinstance(kill, _attribution.KernelOomKill)
    task = _sampling._parse_oom_task_line(line)
    assert task is None or isinstance(task[0], int)


_MEMCG = "/a.slice/x.scope"


@FAST
@given(comm=st.text(max_size=15) | st.lists(_KMSG, max_size=4).map("".join).map(lambda t: t[:15]))
def test_no_comm_rewrites_the_summary_lines_fields(comm: str) -> None:
    # #31: a process names itself; its comm may not move the victim's cgroup or pid.
    line = (
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"oom_memcg={_MEMCG},task_memcg={_MEMCG},task={comm},pid=77,uid=0"
    )
    task = _attribution.parse_oom_task_line(line)
    assert task is None or (task.pid, task.memcg) == (77, _MEMCG)


_RECORD_HEADS = st.sampled_from(
    [
        b"3,1,0,-;",
        b"12,2,0,-;",
        b"14,3,0,c;",
        b"0,4,0,-;",
        b"\xc2\xb2,5,0,-;",
        b"",
        b" ",
        b"6,x,0,-;",
    ]
)


@FAST
@given(head=_RECORD_HEADS, body=KMSG_LINES)
def test_kmsg_records_are_the_kernels_or_none(head: bytes, body: str) -> None:
    record = _journal.kmsg_record(head + body.encode("utf-8", "replace") + b"\n")
    if record is not None:
        prio = int(head.split(b",")[0])
        assert prio >> 3 == 0  # the kernel's facility only
        assert isinstance(record[0], int)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@FAST
@given(detail=st.text(max_size=60) | JSONISH.map(json.dumps), argv=st.text(max_size=40))
def test_registry_rows_with_any_json_are_read(
    tmp_path_factory: pytest.TempPathFactory, detail: str, argv: str
) -> None:
    event = _records._event_from_row((1, 2.0, "f", "a", "k", detail))
    assert isinstance(event.detail, dict)
    json.dumps(event.to_dict(), default=str)
    row = (1, "f", "a", "u", 1, 2, argv, "/", 3.0, "running", None, None, 0, None, None, None, None)
    agent = _records._agent_from_row(row)
    assert all(isinstance(a, str) for a in agent.argv)


def test_a_deeply_nested_detail_is_shown_as_unreadable() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert _records._event_from_row((1, 2.0, "f", "a", "k", deep)).detail == {
        "unreadable": deep[:200]
    }


@FAST
@given(data=KERNEL_BYTES)
def test_stat_lines_with_hostile_comms_parse_or_refuse(data: bytes) -> None:
    line = b"42 (" + data + b") S 1 42 42 0 -1 4194560 " + b" ".join([b"0"] * 44)
    try:
        stat = _proc.parse_stat(line)
    except ValueError:
        return
    assert stat.pid == 42


def test_readers_tolerate_a_tree_of_junk(tmp_path: Path) -> None:
    scope = tmp_path / "agents.slice" / "a.scope"
    scope.mkdir(parents=True)
    for name in ("memory.events", "memory.current", "memory.stat", "memory.pressure",
                 "memory.max", "memory.high", "cgroup.procs", "memory.peak"):  # fmt: skip
        (scope / name).write_bytes(b"\xff\x00 junk ( ) -1\n")
    with contextlib.suppress(ValueError):
        _cgroup.read_cgroup_memory(scope)


# -- the number grammar and the spool (#31) -----------------------------------------------

# Digits and look-alikes: ASCII, superscripts, Arabic-Indic, full-width, and the
# characters of exponents, signs, units and words.
_NUMBERISH = st.text(
    alphabet="0123456789+-.eE_ %kKmMgGtTpPiIbBsnaf\u00b2\u00b3\u0660\u0663\u06f5\uff13\u0969 \t",
    max_size=24,
)


@pytest.mark.parametrize("parse", ["whole", "real", "size", "duration"])
@FAST
@given(text=_NUMBERISH | st.text(max_size=16))
def test_the_number_grammar_gives_an_ascii_value_in_range_or_invalid_config(
    parse: str, text: str
) -> None:
    from agentscope_systemd import InvalidConfig, _numbers

    try:
        if parse == "whole":
            value: float | None = _numbers.whole("f", text, low=-1000, high=1000)
            assert value is not None
            assert -1000 <= value <= 1000
        elif parse == "real":
            value = _numbers.real("f", text, low=-1e6, high=1e6)
            assert value is not None
            assert -1e6 <= value <= 1e6
        elif parse == "size":
            value = _numbers.size("f", text, low=0, physical=2**34)
            assert value is None or 0 <= value <= _numbers.MAX_SIZE
        else:
            value = _numbers.duration("f", text, high=10**6)
            assert 0 <= value <= 10**6
    except InvalidConfig:
        return
    digits = [c for c in text if c.isdigit()]
    assert all(c.isascii() for c in digits)  # never a number read from other digits


@FAST
@given(
    fields=st.lists(st.binary(max_size=12) | _NUMBERISH.map(str.encode), min_size=9, max_size=14)
)
def test_spool_entries_decode_whole_and_checked_or_not_at_all(fields: list[bytes]) -> None:
    from agentscope_systemd._registry import _spool

    data = b"\0".join([b"agentscope-spool-2", *fields])
    entry = _spool.Entry.decode(data)
    if entry is None:
        return
    assert 1 <= entry.pid <= 4 * 1024 * 1024
    assert entry.start_time >= 0
    assert entry.unit.startswith(f"agentscope-{entry.fleet}-{entry.name}-")
    assert entry.argv


# -- every other parser #31 touched ---------------------------------------------------------

_JOURNAL_VALUES = st.one_of(
    st.sampled_from(["kernel", "syslog", "stdout", "journal", "systemd-oomd.service", "x.service"]),
    st.text(max_size=12),
    st.integers(),
    st.none(),
    st.lists(st.integers(min_value=-2, max_value=300), max_size=8),
)


@FAST
@given(
    fields=st.dictionaries(
        st.sampled_from(["_BOOT_ID", "MESSAGE", "_TRANSPORT", "_SYSTEMD_UNIT", "PRIORITY"]),
        _JOURNAL_VALUES,
    ),
    cursor=st.sampled_from(["s=0a;i=1;b=2;m=3;t=4;x=5", "", "s=\n", "x" * 600]),
)
def test_journal_entries_are_believed_kernel_only_by_their_transport(
    fields: dict[str, object], cursor: str
) -> None:
    entry = {"__CURSOR": cursor, **fields}
    line = _journal.parse_journal_entry(json.dumps(entry).encode())
    if line is None:
        return
    assert isinstance(line.text, str)
    assert line.from_kernel == (fields.get("_TRANSPORT") == "kernel")


@FAST
@given(
    name=st.sampled_from(
        [
            "TasksMax",
            "MemoryMax",
            "MemorySwapMax",
            "CPUWeight",
            "IOWeight",
            "CPUQuota",
            "AllowedCPUs",
        ]
    ),
    value=_NUMBERISH | st.text(alphabet="0123456789-,%.² ", max_size=16) | st.integers(),
)
def test_scope_properties_give_a_bus_value_or_invalid_config(name: str, value: object) -> None:
    from agentscope_systemd import InvalidConfig
    from agentscope_systemd._managers import _scopeprops

    try:
        _dbus, _sig, parsed = _scopeprops.parse_property(name, value)
    except InvalidConfig:
        return
    assert isinstance(parsed, (int, bytes, list)), parsed
    text = str(value)
    assert all(c.isascii() for c in text if c.isdigit())
    if name == "CPUQuota":
        assert text.strip().endswith("%")
        assert len(text.strip()[:-1].partition(".")[2]) <= 2


@pytest.mark.parametrize("parse", ["size", "duration", "since", "signal", "listen", "env"])
@FAST
@given(text=_NUMBERISH | st.text(max_size=24))
def test_the_command_lines_parsers_give_a_value_or_bad_input(parse: str, text: str) -> None:
    from agentscope_systemd import AgentscopeError
    from agentscope_systemd._cli import _http, _parse
    from agentscope_systemd._cli._errors import BadInput

    try:
        if parse == "size":
            _parse.parse_size(text)
        elif parse == "duration":
            assert _parse.parse_duration(text) >= 0
        elif parse == "since":
            assert math.isfinite(_parse.parse_since(text, 1.7e9))
        elif parse == "signal":
            assert 1 <= int(_parse.parse_signal(text)) <= 64
        elif parse == "listen":
            _host, port = _http.parse_listen(text)
            assert 0 <= port <= 65535
        else:
            assert all("=" not in k and k for k in _parse.parse_env([text]))
    except (BadInput, AgentscopeError):
        return


@FAST
@given(line=st.binary(max_size=300))
def test_a_shebang_line_gives_an_interpreter_or_a_reason(
    tmp_path_factory: pytest.TempPathFactory, line: bytes
) -> None:
    from agentscope_systemd import _trust

    root = tmp_path_factory.mktemp("root")
    (root / "x").write_bytes(b"#!" + line)
    try:
        interpreter = _trust._interpreter("/x", root)
    except ValueError:
        return
    assert interpreter is None or isinstance(interpreter, str)
    if interpreter is not None:
        assert "\n" not in interpreter
        assert interpreter.strip() == interpreter


@FAST
@given(data=st.binary(max_size=200) | _NUMBERISH.map(str.encode))
def test_children_files_give_pids_only(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    from agentscope_systemd._monitor import _escape

    proc = tmp_path_factory.mktemp("proc")
    task = proc / "42/task/42"
    task.mkdir(parents=True)
    (task / "children").write_bytes(data)
    children = _escape.read_children(42, proc)
    assert all(isinstance(p, int) and p > 0 for p in children)
