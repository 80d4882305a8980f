"""Install and uninstall plans: exactly these files, applied into a fake root, undone cleanly."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from agentscope_systemd import _install, generator
from agentscope_systemd._errors import InstallError, InvalidName
from agentscope_systemd._install import apply_plan, plan_install, plan_uninstall
from tests.test_cli import run

EXEC = "/opt/agentscope/bin/agentscope"
HOME = PurePosixPath("/home/alice")
GEN = "/usr/local/lib/systemd/{}-generators/agentscope-generator"
USER_UNITS = "/home/alice/.config/systemd/user"
#: systemd-oomd's drop-ins of a user install (numbered after the distributions' 10-).
OOMD_DROPINS = [
    f"{USER_UNITS}/{unit}.d/50-agentscope-oomd.conf"
    for unit in (
        "app-agentscope-agents.slice",
        "app-agentscope.slice",
        "agentscope-.scope",
        "agentscope-monitor@.service",
    )
]


#: The generator's Python in a system plan: in the fake root, as EXEC is.
PYTHON = "/usr/bin/python3"
#: What a system install runs, made in the fake root by :func:`runnable`.
_RUNTIME = frozenset(
    ("opt", "opt/agentscope", "opt/agentscope/bin", EXEC[1:], "usr", "usr/bin", PYTHON[1:])
)


def runnable(root: Path) -> None:
    """EXEC (a script run by PYTHON) and PYTHON under ``root``: root's, as on a sound host."""
    if os.geteuid() != 0:
        pytest.skip("a system install checks that root owns what it runs: needs root")
    for path, content in ((EXEC, f"#!{PYTHON} -I\n".encode()), (PYTHON, b"\x7fELF")):
        real = root / path.lstrip("/")
        real.parent.mkdir(parents=True, exist_ok=True)
        real.write_bytes(content)
        real.chmod(0o755)


def tree(top: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every file, symlink and directory under ``top`` (but what :func:`runnable` made)."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for path in sorted(top.rglob("*")):
        rel = str(path.relative_to(top))
        if rel in _RUNTIME:
            continue
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            out[rel] = ("dir", b"")
        else:
            out[rel] = ("file", path.read_bytes())
    return out


def system_plan(
    root: Path, version: int | None = 252, fleets: tuple[str, ...] = ("default",)
) -> _install.InstallPlan:
    runnable(root)
    return plan_install(
        "system",
        root=root,
        systemd_version=version,
        linger=False,
        fleets=list(fleets),
        agentscope_exec=EXEC,
        python=PYTHON,
    )


def user_plan(root: Path, version: int | None = 252, linger: bool = False) -> _install.InstallPlan:
    return plan_install(
        "user",
        root=root,
        home=HOME,
        systemd_version=version,
        linger=linger,
        fleets=["default", "ci"],
        agentscope_exec=EXEC,
        user="alice",
    )


@pytest.mark.parametrize(
    ("version", "dropins"),
    [(247, True), (252, True), (None, True), (253, False), (257, False)],
)
def test_system_plan_lists_exactly_these_files(
    tmp_path: Path, version: int | None, dropins: bool
) -> None:
    plan = system_plan(tmp_path, version, ("default", "ci", "default"))
    expected = {
        GEN.format("system"),
        GEN.format("user"),
        "/etc/agentscope/agentscope.toml",
    }
    if dropins:
        expected |= {
            "/etc/systemd/system.conf.d/60-agentscope-oom-policy.conf",
            "/etc/systemd/user.conf.d/60-agentscope-oom-policy.conf",
        }
    assert {str(f.path) for f in plan.files} == expected
    assert plan.actions == (
        ("systemctl", "daemon-reload"),
        ("systemctl", "start", "agentscope-monitor@default.service"),
        ("systemctl", "start", "agentscope-monitor@ci.service"),
    )
    assert str(plan.manifest) == "/var/lib/agentscope/install-manifest.json"
    modes = {str(f.path): f.mode for f in plan.files}
    assert modes[GEN.format("system")] == 0o755
    assert tree(tmp_path) == {}, "planning must not write"


@pytest.mark.parametrize(("version", "dropin"), [(252, True), (None, True), (262, False)])
def test_user_plan_lists_exactly_these_files(
    tmp_path: Path, version: int | None, dropin: bool
) -> None:
    plan = user_plan(tmp_path, version, linger=True)
    expected = {
        f"{USER_UNITS}/app-agentscope-agents.slice",
        f"{USER_UNITS}/agentscope-monitor@.service",
        f"{USER_UNITS}/default.target.wants/agentscope-monitor@default.service",
        f"{USER_UNITS}/default.target.wants/agentscope-monitor@ci.service",
        *OOMD_DROPINS,
    }
    if dropin:
        expected.add("/home/alice/.config/systemd/user.conf.d/60-agentscope-oom-policy.conf")
    assert {str(f.path) for f in plan.files} == expected
    assert plan.actions == (
        ("systemctl", "--user", "daemon-reload"),
        ("systemctl", "--user", "start", "agentscope-monitor@default.service"),
        ("systemctl", "--user", "start", "agentscope-monitor@ci.service"),
        ("loginctl", "enable-linger", "alice"),
    )
    assert str(plan.manifest) == "/home/alice/.local/state/agentscope/install-manifest.json"


def test_dry_run_lists_and_writes_nothing(tmp_path: Path) -> None:
    lines = apply_plan(system_plan(tmp_path), dry_run=True)
    assert f"write {GEN.format('system')} (0755)" in lines
    assert "write /etc/systemd/system.conf.d/60-agentscope-oom-policy.conf (0644)" in lines
    assert "record /var/lib/agentscope/install-manifest.json" in lines
    assert lines[-2:] == [
        "run: systemctl daemon-reload",
        "run: systemctl start agentscope-monitor@default.service",
    ]
    assert tree(tmp_path) == {}


def test_system_install_then_uninstall_leaves_nothing(tmp_path: Path) -> None:
    plan = system_plan(tmp_path)
    apply_plan(plan)
    generated = tmp_path / GEN.format("system").lstrip("/")
    assert stat.S_IMODE(generated.stat().st_mode) == 0o755
    dropin = tmp_path / "etc/systemd/system.conf.d/60-agentscope-oom-policy.conf"
    assert "[Manager]\nDefaultOOMPolicy=continue\n" in dropin.read_text()
    config, problems = generator.load_config(str(tmp_path / "etc/agentscope/agentscope.toml"))
    assert problems == []
    assert config.monitor_exec == EXEC
    assert [f.name for f in config.fleets] == ["default"]
    manifest = json.loads((tmp_path / "var/lib/agentscope/install-manifest.json").read_text())
    assert len(manifest["files"]) == 5

    # The installed generator, run on the installed config, makes the units.
    out = tmp_path / "run/systemd/generator"
    env = {
        "AGENTSCOPE_CONFIG": str(tmp_path / "etc/agentscope/agentscope.toml"),
        "SYSTEMD_LOG_TARGET": "console",
        "SYSTEMD_SCOPE": "system",
    }
    subprocess.run([sys.executable, "-I", generated, out], env=env, check=True, timeout=60)
    monitor = (out / "agentscope-monitor@.service").read_text()
    # The installed config spells out the guard's defaults, so the unit does too.
    guard = (
        "--guard --guard-mem-available 10 --guard-swap-free 20 --guard-psi-full 60 "
        "--guard-psi-seconds 10"
    )
    assert f"\nExecStart={EXEC} --manager system --fleet %i monitor {guard}\n" in monitor
    assert (out / "multi-user.target.wants/agentscope-monitor@default.service").is_symlink()
    for path in sorted(out.rglob("*"), reverse=True):  # not part of the install
        path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
    for d in (out, out.parent, out.parent.parent):
        d.rmdir()

    manifest_obj = _install.load_manifest("system", root=tmp_path)
    assert manifest_obj is not None
    uninstall = plan_uninstall(manifest_obj)
    assert uninstall.actions[-1] == ("systemctl", "daemon-reload")
    assert ("systemctl", "stop", "agentscope-monitor@default.service") in uninstall.actions
    apply_plan(uninstall)
    assert tree(tmp_path) == {}


def test_user_install_then_uninstall_leaves_nothing(tmp_path: Path) -> None:
    apply_plan(user_plan(tmp_path))
    units = tmp_path / USER_UNITS.lstrip("/")
    link = units / "default.target.wants/agentscope-monitor@ci.service"
    assert os.readlink(link) == "../agentscope-monitor@.service"
    monitor = (units / "agentscope-monitor@.service").read_text()
    assert f"\nExecStart={EXEC} --manager user --fleet %i monitor --guard\n" in monitor
    assert "\nWantedBy=default.target\n" in monitor
    assert "\nSlice=app-agentscope.slice\n" in monitor
    assert (units / "app-agentscope-agents.slice").is_file()
    manifest = _install.load_manifest("user", root=tmp_path, home=HOME)
    assert manifest is not None
    apply_plan(plan_uninstall(manifest))
    assert tree(tmp_path) == {}


def test_user_install_writes_the_oomd_drop_ins_and_uninstall_removes_them(
    tmp_path: Path,
) -> None:
    lines = apply_plan(user_plan(tmp_path, 257))
    for path in OOMD_DROPINS:
        assert f"write {path} (0644)" in lines
    units = tmp_path / USER_UNITS.lstrip("/")
    agents = (units / "app-agentscope-agents.slice.d/50-agentscope-oomd.conf").read_text()
    assert "\n[Slice]\n" in agents
    for line in (
        "ManagedOOMMemoryPressure=kill",
        "ManagedOOMMemoryPressureLimit=80%",
        "ManagedOOMSwap=auto",
        "ManagedOOMPreference=avoid",
    ):
        assert f"\n{line}\n" in agents
    scopes = (units / "agentscope-.scope.d/50-agentscope-oomd.conf").read_text()
    assert "\n[Scope]\nManagedOOMPreference=avoid\n" in scopes
    monitor = (units / "agentscope-monitor@.service.d/50-agentscope-oomd.conf").read_text()
    assert "\n[Service]\nManagedOOMPreference=avoid\n" in monitor
    parent = (units / "app-agentscope.slice.d/50-agentscope-oomd.conf").read_text()
    assert "\nManagedOOMMemoryPressure=auto\nManagedOOMSwap=auto\n" in parent
    # A distribution's 10- drop-in beside ours sorts first: ours wins.
    fedora = units / "app-agentscope-agents.slice.d/10-oomd-per-slice-defaults.conf"
    fedora.write_text("[Slice]\nManagedOOMMemoryPressure=kill\n")
    assert sorted(p.name for p in fedora.parent.iterdir())[-1] == "50-agentscope-oomd.conf"
    manifest = _install.load_manifest("user", root=tmp_path, home=HOME)
    assert manifest is not None
    lines = apply_plan(plan_uninstall(manifest))
    for path in OOMD_DROPINS:
        assert f"remove {path}" in lines
        assert not (tmp_path / path.lstrip("/")).exists()
    # The distribution's file stays, and so does the directory that holds it.
    assert fedora.is_file()
    assert not (units / "agentscope-.scope.d").exists()


def test_system_install_s_generator_writes_the_oomd_drop_ins(tmp_path: Path) -> None:
    apply_plan(system_plan(tmp_path, 257))
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-I", str(tmp_path / GEN.format("system").lstrip("/")), str(out)],
        env={"AGENTSCOPE_CONFIG": str(tmp_path / "etc/agentscope/agentscope.toml")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for unit in ("app-agentscope-agents.slice", "app-agentscope.slice", "agentscope-.scope"):
        assert (out / f"{unit}.d/50-agentscope-oomd.conf").is_file()
    text = (out / "agentscope-monitor@.service.d/50-agentscope-oomd.conf").read_text()
    assert "ManagedOOMPreference=avoid" in text


def test_pre_existing_files_survive_install_and_uninstall(tmp_path: Path) -> None:
    config = tmp_path / "etc/agentscope/agentscope.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[[fleet]]\nname = "mine"\n')
    conf_d = tmp_path / "etc/systemd/system.conf.d"
    conf_d.mkdir(parents=True)
    (conf_d / "10-admin.conf").write_text("[Manager]\n")
    before = tree(tmp_path)

    lines = apply_plan(system_plan(tmp_path))
    assert any(line.startswith("keep existing /etc/agentscope/agentscope.toml") for line in lines)
    assert config.read_text() == '[[fleet]]\nname = "mine"\n'
    manifest = _install.load_manifest("system", root=tmp_path)
    assert manifest is not None
    assert "/etc/agentscope/agentscope.toml" not in {str(e.path) for e in manifest.files}

    apply_plan(plan_uninstall(manifest))
    assert tree(tmp_path) == before


def test_conflicting_file_stops_the_install_before_any_write(tmp_path: Path) -> None:
    units = tmp_path / USER_UNITS.lstrip("/")
    units.mkdir(parents=True)
    (units / "agentscope-monitor@.service").write_text("[Service]\nExecStart=/bin/true\n")
    before = tree(tmp_path)
    with pytest.raises(InstallError, match=r"did not install: .*agentscope-monitor@\.service"):
        apply_plan(user_plan(tmp_path))
    assert tree(tmp_path) == before


def test_identical_pre_existing_file_is_kept_not_taken_over(tmp_path: Path) -> None:
    plan = user_plan(tmp_path)
    slice_file = next(f for f in plan.files if f.path.name == "app-agentscope-agents.slice")
    real = tmp_path / str(slice_file.path).lstrip("/")
    real.parent.mkdir(parents=True)
    real.write_bytes(slice_file.content)
    apply_plan(plan)
    manifest = _install.load_manifest("user", root=tmp_path, home=HOME)
    assert manifest is not None
    apply_plan(plan_uninstall(manifest))
    assert real.read_bytes() == slice_file.content


def test_file_changed_after_install_is_kept_by_uninstall(tmp_path: Path) -> None:
    apply_plan(system_plan(tmp_path))
    config = tmp_path / "etc/agentscope/agentscope.toml"
    config.write_text(config.read_text() + '\n[[fleet]]\nname = "added"\n')
    manifest = _install.load_manifest("system", root=tmp_path)
    assert manifest is not None
    lines = apply_plan(plan_uninstall(manifest))
    assert "keep /etc/agentscope/agentscope.toml (changed since install)" in lines
    assert "added" in config.read_text()
    remaining = {k for k, v in tree(tmp_path).items() if v[0] != "dir"}
    assert remaining == {"etc/agentscope/agentscope.toml"}


def test_reinstall_is_idempotent_and_upgrade_drops_stale_files(tmp_path: Path) -> None:
    apply_plan(system_plan(tmp_path, 252))
    first = tree(tmp_path)
    lines = apply_plan(system_plan(tmp_path, 252))
    assert tree(tmp_path) == first
    assert not any(line.startswith("write ") for line in lines)
    # systemd upgraded to 253: the drop-ins are no longer needed.
    apply_plan(system_plan(tmp_path, 255))
    assert not (tmp_path / "etc/systemd/system.conf.d/60-agentscope-oom-policy.conf").exists()
    manifest = _install.load_manifest("system", root=tmp_path)
    assert manifest is not None
    apply_plan(plan_uninstall(manifest))
    assert tree(tmp_path) == {}


def test_damaged_manifest_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "var/lib/agentscope/install-manifest.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(InstallError, match="unreadable install manifest"):
        _install.load_manifest("system", root=tmp_path)
    assert _install.load_manifest("user", root=tmp_path, home=HOME) is None


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidName):
        plan_install(
            "user",
            root=tmp_path,
            home=HOME,
            systemd_version=255,
            linger=False,
            fleets=["../etc"],
            agentscope_exec=EXEC,
        )
    with pytest.raises(ValueError, match="linger"):
        plan_install(
            "system",
            root=tmp_path,
            systemd_version=255,
            linger=True,
            fleets=[],
            agentscope_exec=EXEC,
        )
    with pytest.raises(ValueError, match="absolute"):
        plan_install(
            "system",
            root=tmp_path,
            systemd_version=255,
            linger=False,
            fleets=[],
            agentscope_exec="agentscope",
        )


def test_no_fleets_writes_an_explicitly_empty_fleet_list(tmp_path: Path) -> None:
    plan = system_plan(tmp_path, fleets=())
    apply_plan(plan)
    config, problems = generator.load_config(str(tmp_path / "etc/agentscope/agentscope.toml"))
    assert (config.fleets, problems) == ((), [])
    assert plan.actions == (("systemctl", "daemon-reload"),)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["usr/lib/systemd/libsystemd-shared-252.so"], 252),
        (["lib/systemd/libsystemd-shared-247.so"], 247),
        (["usr/lib64/systemd/libsystemd-shared-255.5-1.fc40.so"], 255),
        (["usr/lib/x86_64-linux-gnu/systemd/libsystemd-shared-257.13-1.so"], 257),
        (
            [
                "usr/lib/systemd/libsystemd-shared-252.so",
                "usr/lib/systemd/libsystemd-shared-257.so",
            ],
            257,
        ),
        (["usr/lib/systemd/libsystemd-core-257.so"], None),
        ([], None),
    ],
)
def test_systemd_version_from_library_names(
    tmp_path: Path, names: list[str], expected: int | None
) -> None:
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert _install.detect_systemd_version(tmp_path) == expected


def test_user_install_on_247_says_the_home_drop_in_may_not_apply(tmp_path: Path) -> None:
    old = user_plan(tmp_path, version=247)
    assert any(f.path.name == "60-agentscope-oom-policy.conf" for f in old.files)
    assert any("247 does not" in note and "--system" in note for note in old.notes)
    assert not any("user.conf.d" in note for note in user_plan(tmp_path, version=252).notes)


def test_mglru_protection_is_an_opt_in_that_uninstall_removes(tmp_path: Path) -> None:
    tmpfiles = tmp_path / "etc/tmpfiles.d/agentscope-mglru.conf"
    apply_plan(system_plan(tmp_path))
    assert not tmpfiles.exists(), "not without asking"
    plan = plan_install(
        "system",
        root=tmp_path,
        systemd_version=257,
        linger=False,
        fleets=["default"],
        agentscope_exec=EXEC,
        python=PYTHON,
        mglru_min_ttl_ms=1000,
    )
    assert ("systemd-tmpfiles", "--create", "/etc/tmpfiles.d/agentscope-mglru.conf") in (
        plan.actions
    )
    apply_plan(plan)
    lines = [x for x in tmpfiles.read_text().splitlines() if not x.startswith("#")]
    assert lines == [
        "w /sys/kernel/mm/lru_gen/enabled - - - - y",
        "w /sys/kernel/mm/lru_gen/min_ttl_ms - - - - 1000",
    ]
    manifest = _install.load_manifest("system", root=tmp_path)
    assert manifest is not None
    uninstall = plan_uninstall(manifest)
    # The running kernel gets Debian's default (off) back at once, not at the next boot.
    assert uninstall.actions[-1][:2] == ("sh", "-c")
    assert "echo 0 > /sys/kernel/mm/lru_gen/min_ttl_ms" in uninstall.actions[-1][2]
    apply_plan(uninstall)
    assert tree(tmp_path) == {}


def test_mglru_protection_refuses_bad_values_and_user_installs(tmp_path: Path) -> None:
    for bad in (0, 99, 60_001, True, 1000.0):
        with pytest.raises(ValueError, match=r"mglru_min_ttl_ms must be an integer 100\.\.60000"):
            _install.mglru_protection(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="system install only"):
        plan_install(
            "user",
            root=tmp_path,
            home=HOME,
            systemd_version=257,
            linger=False,
            fleets=[],
            agentscope_exec=EXEC,
            mglru_min_ttl_ms=1000,
        )


# -- what root runs: only files no other user can change (#31 item 6) -------------------

ALICE = 1000


def _alice_owns(path: Path) -> None:
    os.chown(path, ALICE, ALICE, follow_symlinks=False)


def _shared_bin(path: Path) -> None:
    os.chown(path.parent, 0, ALICE)
    path.parent.chmod(0o775)


def _world_writable(path: Path) -> None:
    path.chmod(0o757)


def _elsewhere(path: Path) -> None:
    home = path.parents[3] / "home/alice/venv/bin"
    home.mkdir(parents=True)
    (home / "agentscope").write_bytes(path.read_bytes())
    (home / "agentscope").chmod(0o755)
    _alice_owns(path.parents[3] / "home/alice")
    path.unlink()
    path.symlink_to("/home/alice/venv/bin/agentscope")


def _alices_interpreter(path: Path) -> None:
    python = path.parents[3] / "usr/bin/python3"
    _alice_owns(python)


def _env_finds_alices(path: Path) -> None:
    path.write_bytes(b"#!/usr/bin/env python3\n")
    env = path.parents[3] / "usr/bin/env"
    env.write_bytes(b"\x7fELF")
    env.chmod(0o755)
    local = path.parents[3] / "usr/local/bin"
    local.mkdir(parents=True)
    _alice_owns(local)
    (local / "python3").write_bytes(b"\x7fELF")
    (local / "python3").chmod(0o755)


def _acl_for_alice(path: Path) -> None:
    # system.posix_acl_access: version 2, then (tag, perm, id) entries: owner
    # rwx, uid 1000 rwx, group r-x, mask rwx, other r-x.
    entries = [(0x01, 7, 0xFFFFFFFF), (0x02, 7, ALICE), (0x04, 5, 0xFFFFFFFF)]
    entries += [(0x10, 7, 0xFFFFFFFF), (0x20, 5, 0xFFFFFFFF)]
    data = (2).to_bytes(4, "little") + b"".join(
        t.to_bytes(2, "little") + p.to_bytes(2, "little") + i.to_bytes(4, "little")
        for t, p, i in entries
    )
    try:
        os.setxattr(path.parent, "system.posix_acl_access", data)
    except OSError as exc:
        pytest.skip(f"no POSIX ACLs on this file system ({exc.strerror})")


def _config_names_alices(path: Path) -> None:
    root = path.parents[3]
    (root / "etc/agentscope").mkdir(parents=True)
    (root / "etc/agentscope/agentscope.toml").write_text(
        '[monitor]\nexec = "/home/alice/agentscope"\n'
    )
    (root / "home/alice").mkdir(parents=True)
    (root / "home/alice/agentscope").write_bytes(b"\x7fELF")
    (root / "home/alice/agentscope").chmod(0o755)
    _alice_owns(root / "home/alice/agentscope")


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        (_alice_owns, r"/opt/agentscope/bin/agentscope is owned by uid 1000, not root"),
        (lambda p: _alice_owns(p.parents[1]), r"/opt/agentscope is owned by uid 1000"),
        (_shared_bin, r"/opt/agentscope/bin is writable by group 1000 \(mode 0775\)"),
        (_world_writable, r"agentscope is writable by every user \(mode 0757\)"),
        (_elsewhere, r"/home/alice is owned by uid 1000"),
        (_alices_interpreter, r"\(#! /usr/bin/python3\): /usr/bin/python3 is owned by uid 1000"),
        (_env_finds_alices, r"\(#! /usr/local/bin/python3\): /usr/local/bin is owned by uid 1000"),
        (_acl_for_alice, r"/opt/agentscope/bin is writable by uid 1000 through an ACL"),
        (_config_names_alices, r"/home/alice/agentscope: /home/alice/agentscope is owned by uid"),
        (lambda p: p.chmod(0o644), r"agentscope is not executable"),
        (lambda p: p.unlink(), r"/opt/agentscope/bin/agentscope does not exist"),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True])
def test_system_install_refuses_what_another_user_could_change(
    tmp_path: Path, spoil: object, why: str, dry_run: bool
) -> None:
    plan = system_plan(tmp_path)
    spoil(tmp_path / EXEC.lstrip("/"))  # type: ignore[operator]
    before = tree(tmp_path)
    with pytest.raises(_install.UntrustedExecutable, match=why) as info:
        apply_plan(plan, dry_run=dry_run)
    assert "install --user" in str(info.value)  # and what to do
    assert "/opt/agentscope/bin/pip install agentscope-systemd" in str(info.value)
    assert tree(tmp_path) == before  # nothing written, no manifest


def test_the_generator_s_python_is_checked_too(tmp_path: Path) -> None:
    plan = system_plan(tmp_path)
    (tmp_path / "usr/bin").chmod(0o777)
    with pytest.raises(_install.UntrustedExecutable, match=r"/usr/bin is writable by every user"):
        apply_plan(plan)
    assert not (tmp_path / "var").exists()


def test_root_s_own_sticky_or_root_group_directories_pass(tmp_path: Path) -> None:
    # A sticky world-writable directory (as /tmp) lets no one else rename or
    # remove root's entries in it; a group-writable one of group root is root's.
    plan = system_plan(tmp_path)
    (tmp_path / "opt").chmod(0o1777)
    (tmp_path / "opt/agentscope/bin").chmod(0o775)
    apply_plan(plan)
    assert (tmp_path / "var/lib/agentscope/install-manifest.json").is_file()


def test_user_installs_are_not_checked(tmp_path: Path) -> None:
    # The user's own manager runs the user's own files: nothing to guard.
    apply_plan(user_plan(tmp_path))
    assert (tmp_path / USER_UNITS.lstrip("/") / "agentscope-monitor@.service").is_file()


# -- the install command ------------------------------------------------------------------


def _alices_agentscope(tmp_path: Path) -> str:
    alices = tmp_path / "alice/venv/bin"
    alices.mkdir(parents=True)
    (alices / "agentscope").write_bytes(b"\x7fELF")
    (alices / "agentscope").chmod(0o755)
    _alice_owns(tmp_path / "alice")
    return str(alices / "agentscope")


def test_install_system_with_another_user_s_agentscope_is_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # `sudo ~alice/venv/bin/agentscope install --system`: root would run alice's files.
    if os.geteuid() != 0:
        pytest.skip("install --system needs root")
    alices = _alices_agentscope(tmp_path)
    monkeypatch.setattr(_install, "find_agentscope_exec", lambda: alices)
    before = tree(tmp_path)
    # --dry-run: were the check ever gone, this test must not write into the host.
    result = run("install", "--system", "--dry-run")
    assert result.code == 2, result.stderr
    assert f"{tmp_path}/alice is owned by uid 1000, not root" in result.stderr
    assert "install --user" in result.stderr
    assert "Traceback" not in result.stderr
    assert tree(tmp_path) == before
    data = json.loads(run("--json", "install", "--system", "--dry-run").stderr)
    assert data["kind"] == "bad_input"
    assert "could change" in data["error"]


def _systemctl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script: str) -> tuple[Path, Path]:
    """A HOME and a ``systemctl`` on PATH that runs ``script`` (sh): both in ``tmp_path``."""
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(f"#!/bin/sh\n{script}\n")
    systemctl.chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return home, systemctl


def test_install_user_failing_at_daemon_reload_leaves_no_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # No user manager to reload (no bus): the files it never read are taken back.
    home, _ = _systemctl(
        monkeypatch, tmp_path, "echo 'Failed to connect to bus: No medium' >&2; exit 1"
    )
    result = run("install", "--user")
    assert result.code == 1
    assert "systemctl --user daemon-reload failed (exit 1): Failed to connect to bus" in (
        result.stderr
    )
    assert "nothing was installed" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(home.rglob("*")) == []


def test_install_user_over_an_earlier_install_keeps_it_when_reload_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # An earlier install is the user's working setup: a failed reload leaves it.
    home, systemctl = _systemctl(monkeypatch, tmp_path, "exit 0")
    assert run("install", "--user").code == 0
    installed = tree(home)
    systemctl.write_text("#!/bin/sh\nexit 1\n")
    result = run("install", "--user")
    assert result.code == 1
    assert "nothing was installed" not in result.stderr
    assert tree(home) == installed
