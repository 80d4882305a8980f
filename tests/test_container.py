"""Where PID 1 is not systemd (a container): the fleet's error and ``doctor`` say so (issue #27).

Fake /proc (``1/comm``, ``1/environ``, this process's ``cgroup``), a fake
file system root (``/.dockerenv``, ``/run/.containerenv``) and fake cgroup
trees; the CLI runs in-process as in test_cli.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import agentscope_systemd
from agentscope_systemd._cli import _doctor
from agentscope_systemd._kernel import _container
from agentscope_systemd._kernel._container import inspect_container, not_systemd_note, pid1_comm
from tests.fakefs import make_cgroup, make_cgroup_root, write
from tests.test_cli import _facts, run, run_json


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A container's view: PID 1 is a shell, /.dockerenv exists; returns the fake root."""
    root = tmp_path / "root"
    proc = root / "proc"
    (proc / "1").mkdir(parents=True)
    write(proc / "1" / "comm", "bash\n")
    write(root / ".dockerenv", "")
    monkeypatch.setattr(_container, "PROC_ROOT", proc)
    monkeypatch.setattr(_container, "FS_ROOT", root)
    monkeypatch.delenv("container", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return root


def test_the_fleets_error_says_pid_1_is_not_systemd_not_a_bus_address(box: Path) -> None:
    exc = agentscope_systemd.SystemdUnavailable(
        "system", "unix:path=/run/dbus/system_bus_socket", "ENOENT"
    )
    text = str(exc)
    assert "PID 1 is not systemd: this looks like a container (docker: /.dockerenv)" in text
    assert "PID 1 is 'bash'" in text
    assert "agentscope exec --fallback run" in text
    assert "unix:path=" not in text  # the address is an attribute, the reason is told
    assert text.endswith("(ENOENT)")
    assert exc.bus == "unix:path=/run/dbus/system_bus_socket"  # still there for a program


def test_on_a_systemd_host_the_error_is_the_bus_as_before(box: Path) -> None:
    write(box / "proc" / "1" / "comm", "systemd\n")
    assert not_systemd_note() is None
    text = str(
        agentscope_systemd.SystemdUnavailable("user", "unix:path=/run/user/1000/bus", "ENOENT")
    )
    assert "unix:path=/run/user/1000/bus" in text
    assert "enable-linger" in text
    assert "PID 1" not in text


def test_pid1_unreadable_says_nothing_new(box: Path) -> None:
    (box / "proc" / "1" / "comm").unlink()
    assert pid1_comm() is None
    assert not_systemd_note() is None


@pytest.mark.parametrize(
    ("files", "env", "kind", "evidence"),
    [
        ({"run/.containerenv": ""}, {}, "podman", ("/run/.containerenv",)),
        ({}, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "kubernetes", ("KUBERNETES_SERVICE_HOST",)),
        ({}, {"container": "lxc"}, "lxc", ("container=lxc",)),
        ({}, {"container": "oci\x1b[31m"}, "container", ("container=oci31m",)),
        ({"proc/sys/kernel/osrelease": "6.6.36-microsoft-standard-WSL2\n"}, {}, "wsl", None),
        ({}, {}, None, ()),
    ],
)
def test_the_kind_of_container_and_what_says_so(
    box: Path, files: dict[str, str], env: dict[str, str], kind: str | None, evidence: Any
) -> None:
    (box / ".dockerenv").unlink()
    for rel, text in files.items():
        (box / rel).parent.mkdir(parents=True, exist_ok=True)
        write(box / rel, text)
    view = inspect_container(env=env, cgroup_root=box / "nocgroup")
    assert view.kind == kind
    if evidence is not None:
        assert view.evidence == evidence
    assert not view.systemd_pid1
    note = not_systemd_note() or ""
    if kind == "wsl":
        assert "WSL without systemd" in note
        assert "systemd=true" in note
    elif kind is None and not env:
        assert "a container, or a host booted without systemd" in note


def test_pid_1s_environment_tells_when_this_process_s_does_not(box: Path) -> None:
    (box / ".dockerenv").unlink()
    write(box / "proc" / "1" / "environ", b"PATH=/bin\0container=podman\0")
    assert inspect_container(env={}, cgroup_root=box / "nocgroup").kind == "podman"


def test_the_container_s_cgroup_its_limit_and_group_kill(box: Path, tmp_path: Path) -> None:
    # Inside a cgroup namespace this process is at "/", the container's own
    # cgroup, which carries the container's limit and the kubelet's oom.group.
    cg = make_cgroup_root(tmp_path / "cg")
    write(cg / "memory.max", f"{400 << 20}\n")
    write(cg / "memory.high", "max\n")
    write(cg / "memory.oom.group", "1\n")
    mine = box / "proc" / str(os.getpid())
    mine.mkdir()
    write(mine / "cgroup", "0::/\n")
    view = inspect_container(cgroup_root=cg, env={})
    assert (view.cgroup_v2, view.own_cgroup) == (True, "/")
    assert (view.limit, view.limit_path, view.oom_group) == (400 << 20, "/", True)
    assert view.writable is os.access(cg, os.W_OK)
    # A leaf with no limit of its own: the nearest above it is named.
    make_cgroup(cg, "harness/leaf")
    write(mine / "cgroup", "0::/harness/leaf\n")
    view = inspect_container(cgroup_root=cg, env={})
    assert (view.own_cgroup, view.limit_path, view.limit) == ("/harness/leaf", "/", 400 << 20)
    # A v1 or hybrid host: cgroup v2 is not there, nothing more is read.
    hybrid = inspect_container(cgroup_root=tmp_path / "tmpfs", env={})
    assert (hybrid.cgroup_v2, hybrid.own_cgroup, hybrid.limit) == (False, None, None)


def container_facts(box: Path, tmp_path: Path, **over: Any) -> _doctor.Facts:
    cg = make_cgroup_root(tmp_path / "cg")
    write(cg / "memory.max", f"{400 << 20}\n")
    write(cg / "memory.oom.group", "1\n")
    mine = box / "proc" / str(os.getpid())
    mine.mkdir(exist_ok=True)
    write(mine / "cgroup", "0::/\n")
    view = inspect_container(cgroup_root=cg, env={})
    return _facts(
        manager="system",
        capabilities=None,
        unreachable="cannot reach the system systemd manager",
        linger=None,
        container=view,
        **over,
    )


def test_doctor_in_a_container_says_what_it_is_and_what_to_do(
    box: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = container_facts(box, tmp_path)
    monkeypatch.setattr(_doctor, "gather", lambda opts: facts)
    result, data = run_json("doctor")
    assert result.code == 4  # systemd unreachable: the exit code stays
    checks = {c["name"]: c for c in data["checks"]}
    first = data["checks"][0]
    assert first["name"] == "systemd"
    assert first["status"] == "fail"
    assert (
        "PID 1 is not systemd: this looks like a container (docker: /.dockerenv)"
        in (first["detail"])
    )
    assert "--fallback run" in first["fix"]
    assert checks["container"]["status"] == "warn"
    assert checks["cgroup_v2"]["status"] == "pass"  # checked, not "not checked"
    limit = checks["container_memory_limit"]
    assert limit["status"] == "warn"
    assert "400 MiB" in limit["detail"]
    assert "memory.oom.group=1" in limit["detail"]
    assert "singleProcessOOMKill" in limit["fix"]
    assert "cgroup_writable" in checks
    # systemd-oomd is no part of a container without systemd: never suggested.
    for check in data["checks"]:
        assert "oomd" not in (check["fix"] or "")
        assert "not checked" not in check["detail"]
    assert checks["systemd_oomd"]["status"] == "pass"
    human = run("doctor")
    assert human.code == 4
    assert "FAIL  systemd: PID 1 is not systemd" in human.stdout


def test_doctor_on_a_systemd_host_is_unchanged_by_a_container_view(
    box: Path, tmp_path: Path
) -> None:
    write(box / "proc" / "1" / "comm", "systemd\n")
    facts = container_facts(box, tmp_path)
    names = [c["name"] for c in _doctor.checks(facts)]
    assert "container" not in names
    assert "container_memory_limit" not in names
    assert names[:2] == ["systemd", "cgroup_v2"]


def test_exec_in_a_container_says_pid_1_is_not_systemd_and_keeps_125(
    box: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    env = {
        "DBUS_SESSION_BUS_ADDRESS": "garbage",
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "AGENTSCOPE_EXEC_FALLBACK": None,
    }
    done = run("--user", "exec", "me", "--", "touch", str(marker), env=env)
    assert done.code == 125, done.stderr
    assert "PID 1 is not systemd: this looks like a container (docker: /.dockerenv)" in done.stderr
    assert "--fallback run" in done.stderr
    # What failed on the way is still told, after what it means.
    assert done.stderr.index("PID 1 is not systemd") < done.stderr.index("garbage")
    assert not marker.exists()
