"""The kernel log readers (_kernel/_journal.py): journalctl's output, who may read it."""

from __future__ import annotations

import grp
import json
import os
import struct
from pathlib import Path

import pytest

from agentscope_systemd._kernel._journal import (
    journal_access,
    parse_acl_read_groups,
    read_boot_id,
    read_journal,
    read_journal_boot,
    valid_cursor,
)

BOOT = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
MACHINE = "1234567890abcdef1234567890abcdef"


def cursor(i: int) -> str:
    return f"s=ab;i={i:x};b={BOOT};m=1;t=2;x=3"


def fake_journalctl(tmp_path: Path, entries: list[str], *, tail: str = "") -> Path:
    """A journalctl that prints ``entries`` (one JSON object a line) and records its argv."""
    data = tmp_path / "entries.json"
    data.write_text("".join(e + "\n" for e in entries))
    script = tmp_path / "journalctl"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >"{tmp_path}/argv"\ncat "{data}"\n{tail}\n')
    script.chmod(0o755)
    return script


def entry(i: int, message: str) -> str:
    return json.dumps(
        {"__CURSOR": cursor(i), "_BOOT_ID": BOOT, "_TRANSPORT": "kernel", "MESSAGE": message}
    )


def test_read_journal_after_a_cursor_returns_lines_and_the_last_cursor(tmp_path: Path) -> None:
    script = fake_journalctl(tmp_path, [entry(1, "a"), "garbage", entry(2, "b")])
    got = read_journal(cursor(0), journalctl=str(script))
    assert got is not None
    assert got.complete
    assert [line.text for line in got.lines] == ["a", "b"]
    assert got.cursor == cursor(2)
    argv = (tmp_path / "argv").read_text().split("\n")
    assert f"--after-cursor={cursor(0)}" in argv
    assert "_TRANSPORT=kernel" in argv


def test_read_journal_without_a_cursor_only_finds_where_to_start(tmp_path: Path) -> None:
    script = fake_journalctl(tmp_path, [entry(7, "old news")])
    got = read_journal(None, journalctl=str(script))
    assert got is not None
    assert got.lines == ()
    assert got.cursor == cursor(7)
    assert "-n" in (tmp_path / "argv").read_text().split("\n")


def test_read_journal_is_bounded_in_entries_and_time(tmp_path: Path) -> None:
    script = fake_journalctl(tmp_path, [entry(i, f"m{i}") for i in range(1, 11)])
    got = read_journal(cursor(0), journalctl=str(script), max_entries=3)
    assert got is not None
    assert not got.complete
    assert got.cursor == cursor(3)
    slow = fake_journalctl(tmp_path, [entry(1, "a")], tail="exec sleep 30")
    got = read_journal(cursor(0), journalctl=str(slow), timeout=1.0)
    assert got is not None
    assert not got.complete
    assert [x.text for x in got.lines] == ["a"]


def test_a_cursor_that_is_not_one_never_reaches_the_argv(tmp_path: Path) -> None:
    assert valid_cursor(cursor(1))
    for bad in ("", "s=1 --since=yesterday", "-n 5", "s=1;;i=2", "x" * 2000):
        assert not valid_cursor(bad)
    script = fake_journalctl(tmp_path, [])
    with pytest.raises(ValueError, match="not a journal cursor"):
        read_journal("--output=cat", journalctl=str(script))
    assert not (tmp_path / "argv").exists()


def test_no_journalctl_is_none(tmp_path: Path) -> None:
    assert read_journal(cursor(0), journalctl=str(tmp_path / "missing")) is None


def test_boot_id(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n")
    assert read_boot_id(tmp_path) == BOOT
    (tmp_path / "sys/kernel/random/boot_id").write_text("nope\n")
    with pytest.raises(ValueError, match="not a boot id"):
        read_boot_id(tmp_path)


def acl(*entries: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def test_acl_groups_that_may_read() -> None:
    user_obj, group_obj, group, mask, other = 0x01, 0x04, 0x08, 0x10, 0x20
    raw = acl((user_obj, 6, 0), (group_obj, 4, 0), (group, 4, 4), (group, 0, 5), (mask, 4, 0))
    assert parse_acl_read_groups(raw) == [4]
    assert parse_acl_read_groups(acl((group, 4, 4), (mask, 0, 0), (other, 0, 0))) == []
    assert parse_acl_read_groups(b"\x02\x00") == []


def test_journal_access_names_the_files_group(tmp_path: Path) -> None:
    mid = tmp_path / "machine-id"
    mid.write_text(MACHINE + "\n")
    logdir = tmp_path / "log"
    (logdir / MACHINE).mkdir(parents=True)
    assert journal_access([logdir], machine_id=mid).files is False
    journal = logdir / MACHINE / "system.journal"
    journal.write_bytes(b"LPKSHHRH")
    journal.chmod(0o640)
    got = journal_access([logdir], machine_id=mid)
    own = grp.getgrgid(os.getgid()).gr_name
    assert got.files
    assert got.readable == os.access(journal, os.R_OK)
    assert got.groups == (() if own == "root" else (own,))
    journal.chmod(0o600)
    assert journal_access([logdir], machine_id=mid).groups == ()


def test_read_journal_boot_reads_that_boot_and_checks_its_id(tmp_path: Path) -> None:
    script = fake_journalctl(tmp_path, [entry(1, "a"), entry(2, "b")])
    got = read_journal_boot(BOOT, journalctl=str(script))
    assert got is not None
    assert [(x.text, x.boot) for x in got.lines] == [("a", BOOT), ("b", BOOT)]
    argv = (tmp_path / "argv").read_text().split("\n")
    assert f"--boot={BOOT}" in argv
    assert "_TRANSPORT=kernel" in argv
    (tmp_path / "argv").unlink()
    for bad in ("-1", "all", BOOT + "0", "--since=today"):
        with pytest.raises(ValueError, match="not a boot id"):
            read_journal_boot(bad, journalctl=str(script))
    assert not (tmp_path / "argv").exists()


# -- the kernel's lines only (#31 item 4) ---------------------------------------------


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (
            b"3,999,123,-;Out of memory: Killed process 7 (x)\n",
            (999, "Out of memory: Killed process 7 (x)"),
        ),
        (b"0,5,1,c;kernel line\n SUBSYSTEM=x\n", (5, "kernel line")),
        # A user's write to /dev/kmsg gets facility 1 (user) or more: prio 8 and up.
        (b"12,1000,5,-;Out of memory: Killed process \xc2\xb2 (x)\n", None),
        (b"14,1001,5,-;Memory cgroup out of memory: Killed process 7 (x)\n", None),
        (b"Out of memory: Killed process 7 (x)\n", None),  # no header: not a record
        (b"\xc2\xb2,1,1,-;x\n", None),
        (b"3,\xd9\xa3,1,-;x\n", None),
        (b"99999999999,1,1,-;x\n", None),
    ],
)
def test_kmsg_records_are_read_only_from_the_kernel_facility(
    record: bytes, expected: tuple[int, str] | None
) -> None:
    from agentscope_systemd._kernel._journal import kmsg_record

    assert kmsg_record(record) == expected


def test_read_kmsg_skips_injected_records_but_moves_its_position(tmp_path: Path) -> None:
    from agentscope_systemd._kernel._journal import read_kmsg

    kmsg = tmp_path / "kmsg"
    # A regular file gives all its bytes to one read: one record per file here.
    kmsg.write_bytes(b"12,41,0,-;Out of memory: Killed process \xc2\xb2 (x)\n")
    got = read_kmsg(0, kmsg)
    assert got is not None
    assert (got.lines, got.last_seq) == ((), 41)
    kmsg.write_bytes(b"6,42,0,-;Out of memory: Killed process 9 (y)\n")
    got = read_kmsg(0, kmsg)
    assert got is not None
    assert [line.text for line in got.lines] == ["Out of memory: Killed process 9 (y)"]


def test_a_journal_entry_not_from_the_kernel_transport_is_not_the_kernel_s() -> None:
    from agentscope_systemd._kernel._journal import parse_journal_entry

    line = {"__CURSOR": cursor(1), "_BOOT_ID": BOOT, "MESSAGE": "Killed process 1 (x)"}
    got = parse_journal_entry(json.dumps(line).encode())
    assert got is not None
    assert (got.transport, got.unit, got.from_kernel) == (None, None, False)
    for transport in ("syslog", "stdout", "journal", "audit", ["kernel"]):
        got = parse_journal_entry(json.dumps({**line, "_TRANSPORT": transport}).encode())
        assert got is not None
        assert not got.from_kernel
    oomd = {**line, "_TRANSPORT": "journal", "_SYSTEMD_UNIT": "systemd-oomd.service"}
    got = parse_journal_entry(json.dumps(oomd).encode())
    assert got is not None
    assert (got.unit, got.from_kernel) == ("systemd-oomd.service", False)
    got = parse_journal_entry(json.dumps({**line, "_TRANSPORT": "kernel"}).encode())
    assert got is not None
    assert got.from_kernel


def test_read_journal_keeps_only_the_kernel_s_lines(tmp_path: Path) -> None:
    """Whatever the argv's match did, a line the kernel did not write is not read (#31)."""
    forged = json.dumps(
        {"__CURSOR": cursor(2), "_BOOT_ID": BOOT, "_TRANSPORT": "syslog", "MESSAGE": "forged"}
    )
    script = fake_journalctl(tmp_path, [entry(1, "a"), forged, entry(3, "c")])
    got = read_journal(cursor(0), journalctl=str(script))
    assert got is not None
    assert [line.text for line in got.lines] == ["a", "c"]
    assert got.cursor == cursor(3)
